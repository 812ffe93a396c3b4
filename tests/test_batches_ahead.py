"""``num_workers=0`` made ahead (``data/threads/batches_ahead.py``): the next batches are made while the training step
runs
and handed over only where they are stock's. Every scenario runs stock (unpatched) and patched from the same seed,
with the same code of the user's between batches; the batches (values, dtypes, strides) and the three generators
after every batch must be equal, and the run report must say what was made ahead, used and thrown away, and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _rng import rng_differences, rng_state, seed_all
from PIL import ImageFile
from torch.utils.data import DataLoader, Subset

import nano_patch
from nano_patch import report
from nano_patch.data.threads import batches_ahead

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _pets():
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.2, 0.2),
                      T.ToTensor(), T.Normalize(MEAN, STD)])


# -- what the user's code does between two batches (after taking batch k of the epoch) ------------------------------

def _nothing(ds: Any, k: int) -> None:
    pass


def _draws_every_step(ds: Any, k: int) -> None:
    torch.rand(3)  # (dropout on the CPU)


def _draws_every_other(ds: Any, k: int) -> None:
    if k % 2:
        torch.randint(10, (2,))


def _draws_once(ds: Any, k: int) -> None:
    if k == 1:
        torch.rand(1)


def _crop_grows(ds: Any, k: int) -> None:
    root = ds.dataset if isinstance(ds, Subset) else ds
    if k == 1:
        root.transform.transforms[0].size = (56, 56)  # a curriculum's crop size, mid-epoch


def _flip_p_changes(ds: Any, k: int) -> None:
    root = ds.dataset if isinstance(ds, Subset) else ds
    root.transform.transforms[1].p = 0.9 if k % 2 else 0.5


def _samples_swapped(ds: Any, k: int) -> None:
    root = ds.dataset if isinstance(ds, Subset) else ds
    if k == 1:
        root.samples[0], root.samples[-1] = root.samples[-1], root.samples[0]


def _dtype_for_one_batch(ds: Any, k: int) -> None:
    torch.set_default_dtype(torch.float64 if k == 1 else torch.float32)


def _truncated_flag(ds: Any, k: int) -> None:
    ImageFile.LOAD_TRUNCATED_IMAGES = k == 1


def _inference_mode_toggled(ds: Any, k: int) -> None:
    torch._C._set_grad_enabled(k % 2 == 0)


BETWEEN: dict[str, Callable[[Any, int], None]] = {f.__name__.lstrip("_"): f for f in (
    _nothing, _draws_every_step, _draws_every_other, _draws_once, _crop_grows, _flip_p_changes, _samples_swapped,
    _dtype_for_one_batch, _truncated_flag, _inference_mode_toggled)}


def _epochs(folder: Any, between: Callable[[Any, int], None], subset: bool, seed: int,
            left_early: bool = False) -> list[Any]:
    from torchvision.datasets import ImageFolder

    seed_all(seed)
    ds: Any = ImageFolder(str(folder), transform=_pets())
    if subset:
        ds = Subset(ds, [8, 1, 6, 3, 7, 0, 5, 2])
    loader = DataLoader(ds, batch_size=2, shuffle=True)
    out: list[Any] = []
    grad = torch.is_grad_enabled()
    try:
        for _ in range(2):
            for k, (x, y) in enumerate(loader):
                out.append((x.clone(), y.clone(), x.requires_grad, x.is_inference()))
                out.append(rng_state())
                between(ds, k)
                if left_early and k == 2:
                    break
    finally:
        torch.set_default_dtype(torch.float32)
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        torch._C._set_grad_enabled(grad)
    return out


def _assert_same(stock: list[Any], patched: list[Any]) -> None:
    assert len(stock) == len(patched)
    for i, (want, got) in enumerate(zip(stock, patched)):
        if len(want) == 3:
            assert rng_differences(got, want) == [], f"generators after batch {i // 2}"
            continue
        (wx, wy, *wflags), (gx, gy, *gflags) = want, got
        assert (wx.dtype, wx.stride(), wflags) == (gx.dtype, gx.stride(), gflags), f"batch {i // 2}"
        assert torch.equal(wx, gx) and torch.equal(wy, gy), f"batch {i // 2}"


@pytest.fixture
def counts(tmp_path, monkeypatch):
    stats = report.Stats(str(tmp_path))
    monkeypatch.setattr(report, "stats", stats)

    def get() -> dict[str, int]:
        return {f"{'+' if fast else '-'} {why}": n for (patch, fast, why), n in stats.counts.items()
                if patch == "dataloader" and "ahead" in why}

    return get


@pytest.mark.parametrize("subset", [False, True], ids=["folder", "subset"])
@pytest.mark.parametrize("between", list(BETWEEN))
def test_batches_made_ahead_are_stocks_whatever_runs_between(image_folder, between, subset, counts):
    stock = _epochs(image_folder, BETWEEN[between], subset, seed=5)
    nano_patch.patch_torch(loader_threads=2)
    patched = _epochs(image_folder, BETWEEN[between], subset, seed=5)
    _assert_same(stock, patched)
    seen = counts()
    used = sum(n for k, n in seen.items() if k.startswith("+ num_workers=0: a batch made ahead"))
    thrown = {k: n for k, n in seen.items() if "thrown away" in k}
    if between in ("nothing", "crop_grows", "flip_p_changes", "samples_swapped", "dtype_for_one_batch",
                   "truncated_flag", "inference_mode_toggled", "draws_once", "draws_every_other"):
        assert used > 0, seen  # (most batches handed over: only those made around the change are thrown away)
    if between == "nothing":
        assert thrown == {}, seen
    reasons = {"draws_every_step": "torch's generator moved", "draws_once": "torch's generator moved",
               "crop_grows": "the transform changed", "flip_p_changes": "the transform changed",
               "samples_swapped": "the dataset's samples changed", "dtype_for_one_batch": "torch's default dtype",
               "truncated_flag": "PIL's flags", "inference_mode_toggled": "torch modes changed"}
    if between in reasons:
        assert any(reasons[between] in k for k in thrown), seen


def test_a_step_that_always_draws_stops_the_loader_making_batches_ahead(image_folder, counts):
    stock = _epochs(image_folder, _draws_every_step, False, seed=2)
    nano_patch.patch_torch(loader_threads=2)
    patched = _epochs(image_folder, _draws_every_step, False, seed=2)
    _assert_same(stock, patched)
    seen = counts()
    moved = sum(n for k, n in seen.items() if "torch's generator moved since" in k)
    assert moved == batches_ahead.MOVED_LIMIT, seen  # then no more for this loader, in either epoch
    assert any("no more batches made ahead for this loader" in k for k in seen), seen


def test_an_iterator_left_early_and_the_next_epoch_are_stocks(image_folder):
    stock = _epochs(image_folder, _nothing, True, seed=7, left_early=True)
    nano_patch.patch_torch(loader_threads=2)
    patched = _epochs(image_folder, _nothing, True, seed=7, left_early=True)
    _assert_same(stock, patched)


def test_where_batches_are_not_made_ahead_the_report_says_why(image_folder, counts):
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=2)
    ds = ImageFolder(str(image_folder), transform=_pets())
    g = torch.Generator().manual_seed(0)
    for loader in (DataLoader(ds, batch_size=2, shuffle=True, generator=g),
                   DataLoader(ImageFolder(str(image_folder), transform=_pets(), target_transform=int),
                              batch_size=2)):
        next(iter(loader))
    nano_patch.patch_torch(loader_threads=2, batches_ahead=False)
    next(iter(DataLoader(ds, batch_size=2)))
    why = [k for k in counts() if k.startswith("- num_workers=0: no batch made ahead")]
    assert any("a sampler whose next indices cannot be taken early" in k for k in why), why
    assert any("target_transform" in k for k in why), why
    assert any("batches_ahead is off" in k for k in why), why


def test_two_threads_iterating_one_loader_leave_torch_s_generator_where_stock_s_draws_would(image_folder):
    """Each thread's batches made ahead are checked against the generator at its own next(): a draw of the other
    thread's in between sends the batch to stock's code; every draw of both is made once."""
    import threading

    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    def run() -> Any:
        seed_all(3)
        tf = T.Compose([T.RandomCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])  # a fixed number of draws
        loader = DataLoader(ImageFolder(str(image_folder), transform=tf), batch_size=2, shuffle=True)
        counts = [0, 0]

        def go(k: int) -> None:
            for _ in range(3):
                for _ in loader:
                    counts[k] += 1

        threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return counts, rng_state()

    stock = run()
    nano_patch.patch_torch(loader_threads=2)
    patched = run()
    assert stock[0] == patched[0] and rng_differences(patched[1], stock[1]) == []
