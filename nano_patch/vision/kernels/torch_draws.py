"""torch's draws for the draw step, made natively from a copy of torch's generator (``csrc/torch_draws.c``).

The draw step of a batch (``batch_loader.py``) runs each sample's transforms on a :class:`pixels.Recording`, in the
calling thread, holding the GIL: every ``torch.rand(1)``, ``torch.randint`` and ``torch.empty(1).uniform_`` that
stock's ``get_params`` makes is a tensor made and read, 2-5 us each, 5-15 per sample. :class:`TorchDraws` holds a
copy of torch's default CPU generator (``torch.get_rng_state()``) and makes the same draws in C, a fraction of a
microsecond each; the run's final state is written back to torch (:meth:`TorchDraws.to_torch`), so torch's
generator ends where stock's draws leave it.

Exactness is checked, not assumed: before first use in a process, :func:`usable` compares every kind of draw
(and the composite ``get_params`` of RandomResizedCrop, RandomCrop and ColorJitter) with the installed torch's own,
on a private generator and on the global one (its state saved and put back). It also finds whether the installed
torch fuses ``uniform_``'s multiply and add (its AVX2 and AVX-512 kernels do). Any difference and the draw step
keeps torch's own draws. Per call, anything unusual (a transform's parameters that are not two plain numbers, a
default dtype or device that is not float32 on the CPU, a value stock would reject) gives None: the caller then
lends the state to torch (:meth:`TorchDraws.lent`) and runs stock's own ``get_params``.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import forks

#: words of a draw state: the twister's 624, then ``left`` and ``next`` as torch keeps them
STATE_WORDS = 626
#: outputs a run's draws may take from torch's generator (a batch takes about 20 a sample)
WORDS_LIMIT = 1 << 22

#: whether the installed torch's float32 uniform_ fuses its multiply and add (found by :func:`check`)
_fused = False


#: ``torch.log(torch.tensor(ratio))`` by ratio: stock's float32 values, computed by torch once per ratio
_log_ratios: dict[tuple[Any, ...], tuple[float, float] | None] = {}
_log_ratios_lock = threading.Lock()


def log_ratio(ratio: Any) -> tuple[float, float] | None:
    """``torch.log(torch.tensor(ratio))[:2]`` as stock computes it, for a ratio of two plain positive numbers; else
    None (stock's own code then draws)."""
    try:
        return _log_ratios[ratio]
    except (KeyError, TypeError):  # not seen yet, or a list
        pass
    key = tuple(ratio) if isinstance(ratio, (tuple, list)) else None
    if key is None or len(key) != 2 or not all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in key):
        return None
    with _log_ratios_lock:
        if key not in _log_ratios:
            import torch

            lr = torch.log(torch.tensor(key))
            if len(_log_ratios) > 256:  # a ratio drawn per call (unusual): keep the table small
                _log_ratios.clear()
            _log_ratios[key] = (float(lr[0]), float(lr[1])) if lr.dtype is torch.float32 else None
        return _log_ratios[key]


def defaults_are_stock() -> bool:
    """``torch.empty(1)`` is a float32 CPU tensor, as the draws here assume (a user may change both defaults)."""
    import torch

    if torch.get_default_dtype() is not torch.float32:
        return False
    # (a default device other than the CPU is a mode on torch's function-mode stack: none there, none set)
    return torch._C._len_torch_function_stack() == 0 or torch.get_default_device().type == "cpu"


def exact_exp(u: float) -> float:
    """torch's float32 exp of ``u``, as ``RandomResizedCrop.get_params`` computes it on a one-element tensor: the
    native draws ask for it where their own exp could round a crop's side otherwise. Pure: no generator is read."""
    import torch

    return torch.exp(torch.tensor([u], dtype=torch.float32)).item()


class GeneratorMoved(Exception):
    """Another thread drew from torch's generator while a run's draws were made from a copy of it."""


class TorchDraws:
    """A copy of torch's default generator that the draw step draws from, then hands back to torch.

    Not shared between threads: one per batch run, in the thread that draws.
    """

    __slots__ = ("_n", "_st", "_start", "_template", "fused")

    def __init__(self, fused: bool, n: Any) -> None:
        """``n``: the extension module, once ``native`` has checked this kernel (``native.kernel("torch_draws")``)."""
        self._n = n
        self.fused = fused
        self._st = np.empty(STATE_WORDS, np.uint32)
        self.from_torch()

    @classmethod
    def from_state(cls, n: Any, state: Any) -> TorchDraws:
        """Draws from a generator state of torch's CPU generator (``Generator.get_state()``), not torch's own: a
        private stream (a virtual DataLoader worker's) that no generator of torch's ever sees."""
        draws = cls.__new__(cls)
        draws._n = n
        draws.fused = _fused
        draws._st = np.empty(STATE_WORDS, np.uint32)
        draws.load(state)
        return draws

    def load(self, state: Any) -> None:
        """Take ``state`` (a torch CPU generator's state tensor) as this copy's state."""
        self._template = state.clone()
        self._n.draws_load(self._template.numpy(), self._st)
        self._start = self._st.copy()

    @property
    def kernel(self) -> Any:
        """The checked extension module whose functions make the draws (``draws_*``)."""
        return self._n

    @property
    def words(self) -> np.ndarray:
        """The generator copy's state (:data:`STATE_WORDS` words), which the ``draws_*`` functions advance."""
        return self._st

    def from_torch(self) -> None:
        """Take torch's generator state as it is now."""
        import torch

        self._template = torch.get_rng_state()
        self._n.draws_load(self._template.numpy(), self._st)
        self._start = self._st.copy()

    def to_torch(self) -> None:
        """Leave torch's generator where these draws have brought it."""
        import torch

        self._n.draws_store(self._st, self._template.numpy())
        torch.set_rng_state(self._template)

    def to_torch_unless_moved(self) -> bool:
        """Leave torch's generator where these draws have brought it, where it still stood where this copy was taken
        (True); else nothing (False): another thread drew from it meanwhile, and these draws are not the ones stock's
        would make now. Torch's generator is moved on by the draws' count of outputs in one locked operation of its
        own (``random_`` of an int32 tensor: one output each, checked with the kernel), not set: a draw another
        thread makes between the comparison and the move is kept, and torch's generator ends where stock's draws,
        all of them, would leave it."""
        import torch

        now = torch.default_generator.get_state()
        if now.numpy().tobytes() != self._template.numpy().tobytes():  # (5 KB, compared in C)
            return False
        n = self._n.draws_words_since(self._start, self._st, WORDS_LIMIT)
        if n < 0:  # (not reached from the start by a run's draws: never expected)
            self.to_torch()
        elif n:
            torch.empty(n, dtype=torch.int32).random_()
        return True

    def torch_state(self) -> Any:
        """torch's state tensor for where these draws are (torch's generator itself untouched)."""
        out = self._template.clone()
        self._n.draws_store(self._st, out.numpy())
        return out

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """Torch's own draws for a while (stock's ``get_params``), from this state and back into it. Raises
        :class:`GeneratorMoved` (nothing written) where another thread drew from torch's generator since the copy
        was taken: the caller draws its run again from where the generator stands."""
        if not self.to_torch_unless_moved():
            raise GeneratorMoved("another thread drew from torch's generator during the draws")
        try:
            yield
        finally:
            self.from_torch()

    # -- the draws of torchvision's v1 transforms; None: stock's own code must make them (see lent) --

    def below(self, p: Any) -> bool | None:
        """``torch.rand(1) < p``."""
        return self._n.draws_below(self._st, p)

    def resized_crop(self, hw: tuple[int, int], scale: Any, ratio: Any) -> tuple[int, int, int, int] | None:
        """``RandomResizedCrop.get_params`` on an image of ``hw``."""
        lr = log_ratio(ratio)
        if lr is None:
            return None
        return self._n.draws_resized_crop(self._st, hw[0], hw[1], scale, ratio, lr[0], lr[1], self.fused, exact_exp)

    def crop(self, hw: tuple[int, int], size: Any) -> tuple[int, int, int, int] | None:
        """``RandomCrop.get_params`` on an image of ``hw`` for an output of ``size``."""
        return self._n.draws_crop(self._st, hw[0], hw[1], size)

    def batch(self, program: np.ndarray, n: int) -> np.ndarray:
        """``n`` samples' draws in a row, each sample drawing ``program``'s steps in order (float64 triples: ``(0, a,
        b)`` for ``torch.randint(a, b, (1,))``, ``(1, p, 0)`` for ``torch.rand(1) < p``): an n x steps int64 array.
        ValueError (nothing drawn) for a step stock would reject."""
        steps = len(program) // 3
        return np.frombuffer(self._n.draws_batch(self._st, program, n), np.int64).reshape(n, steps)

    def jitter(self, t: Any) -> tuple[tuple[int, ...], Any, Any, Any, Any] | None:
        """``ColorJitter.get_params(t.brightness, t.contrast, t.saturation, t.hue)``, the order as a tuple."""
        return self._n.draws_jitter(self._st, t.brightness, t.contrast, t.saturation, t.hue, self.fused)


def start(n: Any) -> TorchDraws | None:
    """Native draws for a run of samples, from torch's generator as it is now (``n``: the checked extension module,
    ``native.kernel("torch_draws")``); None: torch's own draws."""
    return TorchDraws(_fused, n) if defaults_are_stock() else None


def check(n: Any) -> str | None:
    """``native``'s check of this kernel: None where every draw equals the installed torch's, else why not."""
    global _fused
    fused = _pick_uniform(n)
    if fused is None:
        return "torch's uniform_ is neither a plain nor a fused multiply-add here"
    problem = _check_primitives(n, fused) or _check_batch(n) or _check_exp() or _check_composites(n, fused)
    if problem:
        return problem
    _fused = fused
    return None


def _state_of(n: Any, g: Any) -> np.ndarray:
    st = np.empty(STATE_WORDS, np.uint32)
    n.draws_load(g.get_state().numpy(), st)
    return st


_UNIFORM_RANGES = [(0.08, 1.0), (-0.2876821, 0.2876821), (0.6, 1.4), (-0.1, 0.1), (0.0, 1.0), (-3.5, 7.25),
                   (0.5, 0.5), (1e-3, 2.0)]


def _pick_uniform(n: Any) -> bool | None:
    """Whether the installed torch's float32 ``uniform_`` fuses its multiply and add (None: neither matches)."""
    import torch

    for fused in (True, False):
        g = torch.Generator().manual_seed(20261124)
        st = _state_of(n, g)
        for k in range(600):
            a, b = _UNIFORM_RANGES[k % len(_UNIFORM_RANGES)]
            if torch.empty(1).uniform_(a, b, generator=g).item() != n.draws_uniform(st, a, b, fused):
                break
        else:
            return fused
    return None


def _check_primitives(n: Any, fused: bool) -> str:
    import torch

    g = torch.Generator().manual_seed(4242)
    st = _state_of(n, g)
    for k in range(1200):  # (past the twister's 624 words three times)
        kind = k % 4
        if kind == 0:
            a, b = _UNIFORM_RANGES[k % len(_UNIFORM_RANGES)]
            same = torch.empty(1).uniform_(a, b, generator=g).item() == n.draws_uniform(st, a, b, fused)
        elif kind == 1:
            hi = (2, 3, 97, 1025, (1 << 28) - 1, (1 << 28) + 3, 1 << 40)[k % 7]
            same = torch.randint(0, hi, (1,), generator=g).item() == n.draws_randint(st, 0, hi)
        elif kind == 2:
            m = 1 + k % 8
            same = tuple(torch.randperm(m, generator=g).tolist()) == n.draws_randperm(st, m)
        else:
            p = (0.5, 0.1, 0.3, 0.9, 0.0, 1.0)[k % 6]
            same = bool(torch.rand(1, generator=g) < p) == n.draws_below(st, p)
        if not same:
            return f"torch's draws differ from the native ones (kind {kind}, draw {k})"
    back = g.get_state().clone()
    n.draws_store(st, back.numpy())
    if not torch.equal(back, g.get_state()):
        return "torch's generator state after the draws differs from the native one"
    # the draws' count of outputs, and an int32 tensor's random_ of that many, move torch's generator where they
    # did (how a run's draws are handed back: TorchDraws.to_torch_unless_moved)
    moved = torch.Generator().manual_seed(4242)
    count = n.draws_words_since(_state_of(n, moved), st, WORDS_LIMIT)
    if count < 0:
        return "the native draws' count of outputs was not found"
    torch.empty(count, dtype=torch.int32).random_(generator=moved)
    if not torch.equal(moved.get_state(), g.get_state()):
        return "an int32 random_ of the draws' count of outputs does not move torch's generator where they did"
    return ""


def _check_batch(n: Any) -> str:
    """A batch's draws in one call (:meth:`TorchDraws.batch`) against torch's, drawn sample after sample."""
    import torch

    program = np.array([0, 0, 9, 0, 0, 9, 1, 0.5, 0, 0, 0, 1 << 30, 1, 0.3, 0, 0, 5, 7], np.float64)
    g = torch.Generator().manual_seed(5150)
    st = _state_of(n, g)
    got = np.frombuffer(n.draws_batch(st, program, 300), np.int64).reshape(300, 6)
    for row in got:
        want = [torch.randint(0, 9, (1,), generator=g).item(), torch.randint(0, 9, (1,), generator=g).item(),
                int(bool(torch.rand(1, generator=g) < 0.5)), torch.randint(0, 1 << 30, (1,), generator=g).item(),
                int(bool(torch.rand(1, generator=g) < 0.3)), torch.randint(5, 7, (1,), generator=g).item()]
        if list(row) != want:
            return "a batch's native draws differ from torch's"
    back = g.get_state().clone()
    n.draws_store(st, back.numpy())
    if not torch.equal(back, g.get_state()):
        return "torch's generator state after a batch's draws differs from the native one"
    return ""


def _check_exp() -> str:
    """torch's float32 exp of one value is within one float of the correctly rounded one (the crop's draws allow
    two either side, and let torch draw where that could change the crop)."""
    import torch

    g = torch.Generator().manual_seed(77)
    u = torch.empty(512).uniform_(-1.5, 1.5, generator=g)
    for x in u:
        got = torch.exp(x.reshape(1)).item()
        exact = float(np.float32(math.exp(float(x))))
        if got != exact and abs(got - exact) > 1.01 * abs(np.spacing(np.float32(exact))):
            return "torch's exp is further than one float from the correctly rounded value"
    return ""


class _PrivateTorch:
    """``torch`` as torchvision's ``get_params`` code sees it in :func:`_check_composites`: every draw it makes comes
    from a private generator (the global one is never read or moved: another thread may be drawing from it). A
    drawing function this does not route raises :class:`_Unrouted` (the check then fails, and torch draws)."""

    _ROUTED = ("rand", "randint", "randperm")
    _DRAWING = ("randn", "normal", "bernoulli", "multinomial", "poisson", "rand_like", "randint_like", "randn_like",
                "random", "seed", "manual_seed", "get_rng_state", "set_rng_state", "default_generator")

    def __init__(self, generator: Any) -> None:
        import torch

        self._torch, self._g = torch, generator

    def __getattr__(self, name: str) -> Any:
        if name in self._ROUTED:
            return lambda *args, **kwargs: getattr(self._torch, name)(*args, generator=self._g, **kwargs)
        if name in self._DRAWING:
            raise _Unrouted(name)
        return getattr(self._torch, name)

    def empty(self, *args: Any, **kwargs: Any) -> _PrivateEmpty:
        return _PrivateEmpty(self._torch.empty(*args, **kwargs), self._g)


class _PrivateEmpty:
    """``torch.empty(...)`` for ``.uniform_(a, b)`` drawn from the private generator; any other use raises."""

    def __init__(self, t: Any, g: Any) -> None:
        self._t, self._g = t, g

    def uniform_(self, a: float = 0.0, b: float = 1.0) -> Any:
        return self._t.uniform_(a, b, generator=self._g)

    def __getattr__(self, name: str) -> Any:
        raise _Unrouted(f"empty().{name}")


class _Unrouted(Exception):
    """torchvision's code made a draw :class:`_PrivateTorch` does not route."""


def _private(fn: Any, shim: _PrivateTorch) -> Any:
    """``fn`` (a torchvision function) running with ``torch`` replaced by ``shim`` in its globals."""
    import types

    return types.FunctionType(fn.__code__, {**fn.__globals__, "torch": shim}, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def _check_composites(n: Any, fused: bool) -> str:
    """Stock's ``get_params`` (torchvision's own code, its draws routed to a private generator) against the native
    ones, each from the same state; and the states after them."""
    import torch
    from torchvision import transforms as T

    g = torch.Generator().manual_seed(31337)
    shim = _PrivateTorch(g)
    resized_crop = _private(T.RandomResizedCrop.get_params, shim)
    crop = _private(T.RandomCrop.get_params, shim)
    jitter_params = _private(T.ColorJitter.get_params, shim)
    draws = TorchDraws.from_state(n, g.get_state())
    draws.fused = fused
    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    sizes = [(375, 500), (500, 333), (64, 64), (1200, 90), (31, 415)]
    try:
        for k in range(150):  # (each about 14 words: the twister's 624 three times)
            h, w = sizes[k % len(sizes)]
            img = torch.empty(1, h, w)  # get_params reads only the size
            scale, ratio = ((0.08, 1.0), (3 / 4, 4 / 3)) if k % 3 else ((0.5, 0.9), (0.2, 5.0))
            mine = draws.resized_crop((h, w), scale, ratio)
            if mine is None:  # the copy as it was: the private generator draws this one for both
                resized_crop(img, list(scale), list(ratio))
                draws.load(g.get_state())
            else:
                stock = resized_crop(img, list(scale), list(ratio))
                if tuple(stock) != tuple(mine) or not _same_state(draws, g):
                    return f"RandomResizedCrop's draws differ from stock's ({tuple(stock)} against {tuple(mine)})"
            mine_j = draws.jitter(jitter)
            order, *factors = jitter_params(jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
            if mine_j is None or tuple(order.tolist()) != mine_j[0] or tuple(factors) != tuple(mine_j[1:]):
                return "ColorJitter's draws differ from stock's"
            if not _same_state(draws, g):
                return "ColorJitter's draws leave torch's generator elsewhere"
            size = (min(h, 24), min(w, 32))
            mine_c = draws.crop((h, w), size)
            stock_c = crop(img, size)
            if mine_c is None or tuple(stock_c) != tuple(mine_c) or not _same_state(draws, g):
                return "RandomCrop's draws differ from stock's"
            p = (0.5, 0.1, 0.3)[k % 3]
            mine_b = draws.below(p)
            if bool(torch.rand(1, generator=g) < p) != mine_b or not _same_state(draws, g):
                return "torch.rand(1) < p differs from the native draw"
    except _Unrouted as exc:
        return f"torchvision's get_params draws in a way this check does not follow ({exc})"
    return ""


def _same_state(draws: TorchDraws, g: Any) -> bool:
    """The generator ``g``, after stock's draws, is where the native draws brought their copy."""
    import torch

    return torch.equal(g.get_state(), draws.torch_state())


forks.fresh_in_child(globals(), _log_ratios_lock=threading.Lock)
