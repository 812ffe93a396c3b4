"""``import nano_patch.auto`` patches with the options in the ``NANO_PATCH_*`` environment.

Put it in a file named by ``PYTHONSTARTUP`` to patch interactive sessions and notebooks.
"""

from nano_patch import patch_torch

patch_torch()
