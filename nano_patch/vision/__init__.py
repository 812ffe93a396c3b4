"""The image work, in three layers, lowest first: ``kernels/`` (compiled kernels and the PIL-exact functions on
arrays), ``images/`` (decoding, the file index, the decoded-image cache) and ``plans/`` (a Compose's plan, its draws
and typed ops). The compiled extensions ``_native`` and ``_jpeg`` are built here, from ``csrc/``."""
