"""PIL's filters, by PIL's numbers (``Image.Resampling``), that the compiled kernels reproduce.

One home for what the kernels (``native_kernels.py``), their checks against the installed PIL
(``native_checks.py``), the functions on arrays and the plans all read.
"""

from __future__ import annotations

#: PIL's resampling filter numbers (Image.Resampling) that the resample kernel reproduces.
FILTERS = {1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

#: PIL's filter numbers that ``Image.transform`` takes, all reproduced by the warp kernel.
WARP_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}
