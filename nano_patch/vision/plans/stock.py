"""Stock's own modules, as the plan calls them: torchvision's ``transforms.functional`` and torch.

The plan makes stock's draws with torch's own generator and falls back to torchvision's own functions where a kernel
leaves an argument to stock. Both are resolved here on first use (an image plan runs only where torchvision is
imported), so that importing the plan needs neither and nothing outside sets them.
"""

from __future__ import annotations

from types import ModuleType

_functional: ModuleType | None = None
_torch: ModuleType | None = None


def functional() -> ModuleType:
    """``torchvision.transforms.functional`` (the patch redirects some of its functions in place: the same objects)."""
    global _functional
    module = _functional
    if module is None:
        from torchvision.transforms import functional as module

        _functional = module
    return module


def torch() -> ModuleType:
    """``torch``: its generator makes stock's draws."""
    global _torch
    module = _torch
    if module is None:
        import torch as module

        _torch = module
    return module
