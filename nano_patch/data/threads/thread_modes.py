"""The calling thread's torch state, entered on the loader's threads for one batch's renders.

Torch keeps grad mode, inference mode, forward-mode AD, autocast (per device type: on or off, and its
dtype where on) and autocast's cache per thread. Stock renders a sample in the thread that iterates the loader, so
a render must see that thread's state: :func:`capture` reads it once per batch, :func:`entered` puts it on
a pool thread for that batch and puts the thread's own back afterwards. Torch's dispatch-key sets, which
these flags and any other per-thread switch end in, are compared after entering: where they differ (a
switch this module does not carry), or where the calling thread has a Python mode stack
(``TorchFunctionMode``, ``TorchDispatchMode``, ``with torch.device(...)``) or torch functions disabled, the
batch renders in the calling thread alone (:class:`NotEntered`), exactly as stock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_AUTOCAST_DEVICES: tuple[str, ...] | None = None


class NotEntered(Exception):
    """The calling thread's torch state cannot be reproduced on another thread: render in the calling thread."""


@dataclass(frozen=True)
class ThreadModes:
    grad: bool
    inference: bool
    fwd_grad: bool
    #: (device type, enabled, dtype) for every device type this torch has autocast for; the dtype where autocast
    #: is on for it (where it is off, no torch op reads it, and reading CUDA's costs ~20 us without a GPU)
    autocast: tuple[tuple[str, bool, Any], ...]
    autocast_cache: bool
    #: the thread's dispatch-key include and exclude sets: every per-thread switch ends in them
    keys: tuple[Any, Any]


def _autocast_devices() -> tuple[str, ...]:
    global _AUTOCAST_DEVICES
    if _AUTOCAST_DEVICES is None:
        import torch

        found = []
        for device in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia",
                       torch._C._get_privateuse1_backend_name()):
            try:
                torch.is_autocast_enabled(device)
                torch.get_autocast_dtype(device)
            except (RuntimeError, ValueError, TypeError):
                continue
            if device not in found:
                found.append(device)
        _AUTOCAST_DEVICES = tuple(found)
    return _AUTOCAST_DEVICES


_AUTOCAST_OFF: tuple[tuple[str, bool, Any], ...] | None = None


def _read(full: bool = False) -> ThreadModes:
    """The thread's state (``full``: autocast's dtype also where autocast is off, to put a thread's own back)."""
    import torch

    global _AUTOCAST_OFF
    C = torch._C
    if not full and not C._is_any_autocast_enabled():  # (the usual case, in one call: autocast off everywhere)
        autocast = _AUTOCAST_OFF
        if autocast is None:
            autocast = _AUTOCAST_OFF = tuple((d, False, None) for d in _autocast_devices())
    else:
        autocast = tuple((d, on, torch.get_autocast_dtype(d) if on or full else None)
                         for d, on in ((d, torch.is_autocast_enabled(d)) for d in _autocast_devices()))
    return ThreadModes(
        grad=C.is_grad_enabled(),
        inference=C.is_inference_mode_enabled(),
        fwd_grad=C._is_fwd_grad_enabled(),
        autocast=autocast,
        autocast_cache=C.is_autocast_cache_enabled(),
        keys=(C._dispatch_tls_local_include_set(), C._dispatch_tls_local_exclude_set()),
    )


def caller_only() -> bool:
    """Whether the calling thread's state cannot be entered on another thread (a Python mode stack, or torch
    functions disabled): where :func:`capture` gives None, without reading the rest of the state."""
    import torch

    C = torch._C
    return bool(C._len_torch_function_stack() or C._len_torch_dispatch_stack() or not C._is_torch_function_enabled())


def capture() -> ThreadModes | None:
    """The calling thread's state, or None where it cannot be entered on another thread (see the module)."""
    if caller_only():
        return None
    return _read()


def _set_flags(state: ThreadModes, now: ThreadModes) -> None:
    """Set the flags of ``state`` that differ from ``now`` (the thread's)."""
    import torch

    if state.grad != now.grad:
        torch._C._set_grad_enabled(state.grad)
    if state.fwd_grad != now.fwd_grad:
        torch._C._set_fwd_grad_enabled(state.fwd_grad)
    for (device, enabled, dtype), (_, enabled_now, dtype_now) in zip(state.autocast, now.autocast):
        if enabled != enabled_now:
            torch.set_autocast_enabled(device, enabled)
        if dtype is not None and dtype != dtype_now:
            torch.set_autocast_dtype(device, dtype)
    if state.autocast_cache != now.autocast_cache:
        torch.set_autocast_cache_enabled(state.autocast_cache)


@contextlib.contextmanager
def entered(state: ThreadModes) -> Iterator[None]:
    """This thread in ``state`` for the block (raises :class:`NotEntered` where it cannot be), then its own."""
    import torch

    own = _read()
    if own == state:  # the usual case: both threads in torch's defaults
        yield
        return
    own = _read(full=True)
    with contextlib.ExitStack() as stack:
        if state.inference != own.inference:
            stack.enter_context(torch.inference_mode(state.inference))
        entering = _read()
        stack.callback(lambda: _set_flags(own, _read()))
        _set_flags(state, entering)
        now = _read()
        if now != state:
            raise NotEntered(f"{now} is not {state}")
        yield
