"""torch's draws made natively (``vision/kernels/torch_draws.py``, ``csrc/torch_draws.c``): every draw, and the
generator's state after it, equal the installed torch's own; the draw step of a batch uses them, and its batches and
generator states stay stock's, also where a draw falls back to torch's own code or stock raises.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from _epochs import assert_same_epochs, loader_epochs
from _rng import rng_differences, rng_state, seed_all
from torch.utils.data import DataLoader

import nano_patch
from nano_patch.vision.kernels import native, torch_draws

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def mod():
    if not native.available("torch_draws"):
        pytest.fail(f"the native draws are not used here: {native.state()['torch_draws']}")
    return native.kernel("torch_draws")


def _copy(mod, g: torch.Generator) -> np.ndarray:
    st = np.empty(torch_draws.STATE_WORDS, np.uint32)
    mod.draws_load(g.get_state().numpy(), st)
    return st


def _same_state(mod, st: np.ndarray, g: torch.Generator) -> bool:
    mine = g.get_state().clone()
    mod.draws_store(st, mine.numpy())
    return torch.equal(mine, g.get_state())


@pytest.mark.parametrize("seed", [0, 1, 2024, 2**40 + 3])
def test_uniform_randint_randperm_and_rand_equal_torch_and_leave_its_state(mod, seed):
    g = torch.Generator().manual_seed(seed)
    st = _copy(mod, g)
    fused = torch_draws._fused
    for k in range(1500):  # past the twister's 624 words several times
        a, b = [(0.08, 1.0), (-0.28768, 0.28768), (0.6, 1.4), (-0.5, 0.5), (3.0, 3.0), (-1e6, 1e6)][k % 6]
        assert torch.empty(1).uniform_(a, b, generator=g).item() == mod.draws_uniform(st, a, b, fused)
        hi = [1, 2, 7, 500, 1 << 27, (1 << 28) + 1, 1 << 45][k % 7]
        assert torch.randint(0, hi, (1,), generator=g).item() == mod.draws_randint(st, 0, hi)
        assert torch.randint(-5, hi, (1,), generator=g).item() == mod.draws_randint(st, -5, hi)
        n = 1 + k % 12
        assert tuple(torch.randperm(n, generator=g).tolist()) == mod.draws_randperm(st, n)
        p = [0.5, 0.1, 0.3, 0.7, 1.0, 0.0][k % 6]
        assert bool(torch.rand(1, generator=g) < p) == mod.draws_below(st, p)
    assert _same_state(mod, st, g)


def test_the_state_goes_in_and_out_unchanged(mod):
    g = torch.Generator().manual_seed(99)
    torch.rand(700, generator=g)  # left and next part-way through the words
    torch.randn(3, generator=g)  # a cached normal sample the draws must keep
    st = _copy(mod, g)
    out = torch.zeros_like(g.get_state())
    out.copy_(g.get_state())
    out[8:12] = 0  # left, next and the first words: what the store writes back
    out[16:40] = 0
    mod.draws_store(st, out.numpy())
    assert torch.equal(out, g.get_state())


def test_a_state_torch_would_not_take_is_refused(mod):
    st = np.zeros(torch_draws.STATE_WORDS, np.uint32)  # left 0: not a state torch ever has
    with pytest.raises(ValueError, match="not a valid generator state"):
        mod.draws_uniform(st, 0.0, 1.0, False)
    with pytest.raises(ValueError, match="626 words|2504 bytes"):
        mod.draws_uniform(np.zeros(10, np.uint32), 0.0, 1.0, False)


SIZES = [(375, 500), (500, 375), (1, 1), (2, 900), (900, 2), (64, 64), (3000, 17), (33, 4000)]
SCALES_RATIOS = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (0.1, 10.0)), ((0.5, 0.5), (1.0, 1.0)),
                 ((0.01, 0.02), (2.0, 3.0)), ((1, 1), (1, 1))]


def test_resized_crop_draws_equal_stock_get_params_from_the_same_state(mod):
    seed_all(5)
    draws = torch_draws.TorchDraws(torch_draws._fused, mod)
    native_made = 0
    for k in range(3000):
        h, w = SIZES[k % len(SIZES)]
        scale, ratio = SCALES_RATIOS[k % len(SCALES_RATIOS)]
        mine = draws.resized_crop((h, w), scale, ratio)
        if mine is None:  # the copy is where it was: torch draws this one
            with draws.lent():
                T.RandomResizedCrop.get_params(torch.empty(1, h, w), list(scale), list(ratio))
            continue
        native_made += 1
        assert tuple(T.RandomResizedCrop.get_params(torch.empty(1, h, w), list(scale), list(ratio))) == mine
        assert torch.equal(draws.torch_state(), torch.get_rng_state())
    assert native_made == 3000  # (every crop: torch's own exp settles the last bit where it must)


@pytest.mark.parametrize(("seed", "hw"), [(1589, (375, 500)), (1589, (500, 375)), (2136, (400, 400))])
def test_a_crop_whose_side_the_exp_s_last_bit_decides_is_made_natively_as_stock(mod, seed, hw):
    """States where the float32 exp computed natively could round a crop's side otherwise (about one attempt in ten
    thousand): torch's own exp decides it, so the crop is still made natively (a virtual worker gives no batch to a
    stand-in for it) and equals stock's; without torch's exp the kernel gives it back, the state untouched."""
    g = torch.Generator().manual_seed(seed)
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    lr = torch_draws.log_ratio(ratio)
    alone = _copy(mod, g)
    assert mod.draws_resized_crop(alone, *hw, scale, ratio, *lr, torch_draws._fused) is None
    assert _same_state(mod, alone, g)
    draws = torch_draws.TorchDraws.from_state(mod, g.get_state())
    mine = draws.resized_crop(hw, scale, ratio)
    shim = torch_draws._PrivateTorch(g)
    stock = torch_draws._private(T.RandomResizedCrop.get_params, shim)(torch.empty(1, *hw), list(scale), list(ratio))
    assert mine is not None and tuple(mine) == tuple(stock)
    assert torch.equal(draws.torch_state(), g.get_state())


def test_jitter_and_crop_draws_equal_stock(mod):
    seed_all(6)
    draws = torch_draws.TorchDraws(torch_draws._fused, mod)
    jitters = [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ColorJitter(brightness=0.2), T.ColorJitter(hue=0.5),
               T.ColorJitter(contrast=(0.1, 3.0), saturation=(0.0, 0.0))]
    for k in range(1000):
        j = jitters[k % len(jitters)]
        order, *factors = draws.jitter(j)
        stock_order, *stock_factors = T.ColorJitter.get_params(j.brightness, j.contrast, j.saturation, j.hue)
        assert order == tuple(stock_order.tolist()) and tuple(factors) == tuple(stock_factors)
        h, w = SIZES[k % len(SIZES)]
        size = (max(1, h // 2), max(1, w // 3)) if k % 5 else (h, w)  # the whole image: stock draws nothing
        assert draws.crop((h, w), size) == T.RandomCrop.get_params(torch.empty(1, h, w), size)
        assert torch.equal(draws.torch_state(), torch.get_rng_state())


@pytest.mark.parametrize("bad", [
    ("resized_crop", ((10, 10), (1.0, 0.5), (0.75, 1.33))),  # scale reversed: stock's uniform_ raises
    ("resized_crop", ((10, 10), (0.1, math.nan), (0.75, 1.33))),
    ("resized_crop", ((10, 10), [0.1, 0.5, 0.9], (0.75, 1.33))),  # three numbers: stock reads two
    ("resized_crop", ((10, 10), (0.1, 1.0), (-1.0, 1.33))),  # a negative ratio: stock's log is NaN
    ("crop", ((10, 10), (11, 5))),  # larger than the image: stock raises ValueError
    ("below", (torch.tensor(0.5),)),  # a tensor p: torch's own promotion
    ("below", (True,)),
])
def test_what_the_native_draws_do_not_make_is_left_to_stock_with_the_state_untouched(mod, bad):
    seed_all(7)
    draws = torch_draws.TorchDraws(torch_draws._fused, mod)
    before = draws.torch_state()
    name, args = bad
    assert getattr(draws, name)(*args) is None
    assert torch.equal(draws.torch_state(), before)


def test_a_float64_default_dtype_keeps_torch_s_own_draws(mod):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch_draws.start(mod) is None  # torch.empty(1) is float64 now: its uniform_ draws 64 bits
    finally:
        torch.set_default_dtype(old)
    assert torch_draws.start(mod) is not None


# -- the draw step of a batch --

PIPELINES = {
    "pets": lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                               T.ToTensor(), T.Normalize(MEAN, STD)]),
    "crops, flips, greys": lambda: T.Compose([T.Resize(130), T.RandomCrop(112), T.RandomVerticalFlip(0.3),
                                              T.RandomGrayscale(0.4), T.RandomHorizontalFlip(), T.PILToTensor()]),
}


def _count(folder) -> int:
    from torchvision.datasets import ImageFolder

    return len(ImageFolder(str(folder)))


def _epochs(folder, make, epochs=2):
    return loader_epochs(folder, make, 11, epochs)


_assert_equal = assert_same_epochs


@pytest.fixture
def native_runs(monkeypatch):
    """Counts the batch runs whose draws were made natively, and the draws each kind made."""
    made = {"runs": 0, "resized_crop": 0, "crop": 0, "jitter": 0, "below": 0}
    real_start = torch_draws.start

    def start(n):
        d = real_start(n)
        made["runs"] += d is not None
        return d

    monkeypatch.setattr(torch_draws, "start", start)
    # counted where the draws are made: the kernel's functions (TorchDraws and the draw program both call them)
    mod = native.kernel("torch_draws")
    for name in ("resized_crop", "crop", "jitter", "below"):
        real = getattr(mod, f"draws_{name}")

        def counted(*args, _real=real, _name=name):
            got = _real(*args)
            made[_name] += got is not None
            return got

        monkeypatch.setattr(mod, f"draws_{name}", counted)
    return made


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_batch_drawn_natively_equals_stock(image_folder, native_runs, name):
    stock = _epochs(image_folder, PIPELINES[name])
    nano_patch.patch_torch(loader_threads=2, batches_ahead=False)  # (every batch through the draw step here)
    _assert_equal(stock, _epochs(image_folder, PIPELINES[name]))
    n = _count(image_folder)
    assert native_runs["runs"] >= 2 * math.ceil(n / 4)  # every batch of both epochs
    if name == "pets":  # every sample's crop, jitter and flip
        assert native_runs["resized_crop"] == native_runs["jitter"] == native_runs["below"] == 2 * n
    else:  # its crop, and the two flips and the grey
        assert native_runs["crop"] == 2 * n and native_runs["below"] == 3 * 2 * n


def test_draws_torch_must_make_run_stock_s_code_in_place(image_folder, monkeypatch):
    """About every third crop is left to stock's get_params (as for a value the native draws cannot be sure of:
    decided, as there, by the generator's state and the size alone): the batches and states are still stock's."""
    stock = _epochs(image_folder, PIPELINES["pets"])
    mod = native.kernel("torch_draws")
    real = mod.draws_resized_crop
    calls = {"made": 0, "declined": 0}

    def sometimes(st, height, *args):
        if (int(st[:16].sum()) + height) % 3 == 0:
            calls["declined"] += 1
            return None
        calls["made"] += 1
        return real(st, height, *args)

    monkeypatch.setattr(mod, "draws_resized_crop", sometimes)
    nano_patch.patch_torch(loader_threads=2)
    _assert_equal(stock, _epochs(image_folder, PIPELINES["pets"]))
    assert calls["declined"] >= 3 and calls["made"] >= _count(image_folder)


def test_stock_s_error_from_a_draw_is_raised_at_its_sample(image_folder):
    """A reversed scale: stock's uniform_ raises RuntimeError at the first sample; the patched batch too."""
    def make():
        return T.Compose([T.RandomResizedCrop(64, scale=(1.0, 0.5)), T.ToTensor()])

    with pytest.warns(UserWarning):
        errors = []
        for patched in (False, True):
            if patched:
                nano_patch.patch_torch(loader_threads=2)
            seed_all(3)
            from torchvision.datasets import ImageFolder

            loader = DataLoader(ImageFolder(str(image_folder), transform=make()), batch_size=4)
            with pytest.raises(RuntimeError) as info:
                next(iter(loader))
            errors.append((str(info.value), rng_state()))
    assert errors[0][0] == errors[1][0]
    assert rng_differences(errors[1][1], errors[0][1]) == []


def test_the_check_never_touches_the_global_generator(mod, monkeypatch):
    """The kernel's check compares torchvision's own get_params on private generators: another thread drawing from
    torch's global generator meanwhile never sees it seeded, read back or set."""
    state = torch.get_rng_state()

    def refused(*args, **kwargs):
        raise AssertionError("the check touched torch's global generator")

    for name in ("manual_seed", "set_rng_state", "seed"):
        monkeypatch.setattr(torch, name, refused)
    monkeypatch.setattr(torch.random, "set_rng_state", refused)
    assert torch_draws.check(mod) is None
    monkeypatch.undo()
    assert torch.equal(torch.get_rng_state(), state)


def test_a_private_generators_draws_come_from_its_own_state(mod):
    """A virtual worker's stream: draws from a state of its own, torch's generator neither read nor moved."""
    g = torch.Generator().manual_seed(123)
    stream = torch_draws.TorchDraws.from_state(mod, g.get_state())
    before = torch.get_rng_state()
    img = torch.empty(1, 300, 400)
    for _ in range(50):
        with torch.random.fork_rng():
            torch.set_rng_state(g.get_state())
            want = T.RandomCrop.get_params(img, (64, 64))
            g.set_state(torch.get_rng_state())
        assert stream.crop((300, 400), (64, 64)) == tuple(want)
    assert torch.equal(stream.torch_state(), g.get_state()) and torch.equal(torch.get_rng_state(), before)


def test_a_run_handed_back_keeps_another_threads_draws(mod):
    """A run's draws are handed back to torch's generator only where it did not move since the copy, and then by
    moving it on, under its own lock, by the run's count of outputs: whatever another thread drew meanwhile (its
    ops release the GIL), torch's generator ends where all the draws, the run's and the thread's, leave it."""
    import threading
    import time

    stop, drawn = threading.Event(), [0]

    def other() -> None:
        while not stop.is_set():
            torch.rand(1)
            drawn[0] += 1

    torch.manual_seed(0)
    start = torch.get_rng_state()
    thread = threading.Thread(target=other)
    thread.start()
    runs = retries = 0
    until = time.perf_counter() + 1.0
    while time.perf_counter() < until:
        while True:
            draws = torch_draws.start(mod)
            for _ in range(20):
                draws.below(0.5)
            if draws.to_torch_unless_moved():
                break
            retries += 1
        runs += 1
    stop.set()
    thread.join()
    g = torch.Generator()
    g.set_state(start)
    torch.empty(20 * runs + drawn[0], dtype=torch.int32).random_(generator=g)  # one output each
    assert drawn[0] > 0 and runs > 0
    assert torch.equal(g.get_state(), torch.get_rng_state())
