"""``num_workers=N`` under the patch: stock's batches and generator states, whether the workers run as virtual
workers in this process or as processes (each reason a loader keeps processes has a test of its own).

Each test runs the same loop twice in this process, stock (unpatched) and patched, from the same seeds, and
compares every batch and the three global generators after every batch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from _rng import rng_differences, rng_state, seed_all
from PIL import Image
from torch.utils.data import DataLoader, Subset

import nano_patch

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _pets():
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                      T.ToTensor(), T.Normalize(MEAN, STD)])


def _crop(size: int = 64):
    from torchvision import transforms as T

    return T.Compose([T.RandomCrop(size), T.RandomHorizontalFlip(), T.ToTensor()])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, photos) -> Path:
    """Eleven JPEGs in two classes (an epoch of batch 4 ends in a short batch: the streams' turns shift)."""
    root = tmp_path_factory.mktemp("virtual")
    for cls in ("a", "b"):
        (root / cls).mkdir()
    k = 0
    for i, im in enumerate(photos):
        for j in range(4):
            if k == 11:
                break
            w, h = im.size
            im.crop((j * 11, j * 5, w - j * 7, h - j * 3)).save(root / "ab"[k % 2] / f"p{i}_{j}.jpg", quality=90)
            k += 1
    return root


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory, photos) -> Path:
    """Eight JPEGs; the seventh (sorted) is 40 x 40, too small for RandomCrop(64): stock raises at it."""
    root = tmp_path_factory.mktemp("virtual-small")
    (root / "a").mkdir()
    for k in range(8):
        im = photos[k % len(photos)]
        if k == 6:
            im = im.resize((40, 40))
        im.save(root / "a" / f"{k}.jpg", quality=90)
    return root


def _events(make_loader: Any, seed: int, epochs: int = 2, take: int | None = None,
            between: Any = None, catch: bool = False) -> list[Any]:
    """Every batch (copied) and the three generators after it, per epoch; ``take``: batches of the first epoch
    taken (the rest left); ``between(loader, epoch)``: run before each later epoch; ``catch``: an error at a batch
    is recorded (class and message) and the epoch goes on."""
    seed_all(seed)
    loader = make_loader()
    out: list[Any] = []
    for epoch in range(epochs):
        if epoch and between is not None:
            between(loader, epoch)
        it = iter(loader)
        out.append(("iterator", type(it).__name__))
        n = 0
        while True:
            if epoch == 0 and take is not None and n == take:
                break
            try:
                x, y = next(it)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - the test compares it with stock's
                if not catch:
                    raise
                out.append(("error", type(exc).__name__, _first_line(exc)))
                n += 1
                continue
            out.append(("batch", x.clone(), y.clone(), x.stride()))
            out.append(("rng", rng_state()))
            n += 1
        out.append(("rng", rng_state()))
    return out


def _first_line(exc: BaseException) -> str:
    """The wrapped error's first lines: the worker it came from and stock's own message (not the traceback)."""
    text = str(exc)
    return text.split("\nOriginal Traceback")[0] + " | " + text.strip().splitlines()[-1]


def _compare(stock: list[Any], patched: list[Any]) -> None:
    assert len(stock) == len(patched)
    for want, got in zip(stock, patched):
        assert want[0] == got[0]
        if want[0] == "batch":
            assert want[1].dtype == got[1].dtype and want[3] == got[3]
            assert torch.equal(want[1], got[1]) and torch.equal(want[2], got[2])
        elif want[0] == "rng":
            assert rng_differences(got[1], want[1]) == []
        elif want[0] == "error":
            assert want == got


def _iterators(events: list[Any]) -> list[str]:
    return [e[1] for e in events if e[0] == "iterator"]


def _stock_and_patched(make_loader: Any, seed: int = 0, **kw: Any) -> tuple[list[Any], list[Any]]:
    stock = _events(make_loader, seed, **kw)
    nano_patch.patch_torch()
    patched = _events(make_loader, seed, **kw)
    _compare(stock, patched)
    return stock, patched


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_virtual_workers_give_stocks_batches_and_generators(folder, workers, persistent):
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True,
                          num_workers=workers, persistent_workers=persistent)

    _, patched = _stock_and_patched(make, seed=workers)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_virtual_workers_under_lightnings_worker_seeding(folder):
    from lightning_fabric.utilities.seed import pl_worker_init_function
    from torchvision.datasets import ImageFolder

    for init in (functools.partial(pl_worker_init_function, rank=3), pl_worker_init_function):
        def make(init=init):
            return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True,
                              num_workers=2, worker_init_fn=init)

        nano_patch.unpatch_torch()
        _, patched = _stock_and_patched(make, seed=7)
        assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_a_subset_and_prefetch_factor(folder):
    from torchvision.datasets import ImageFolder

    def make():
        ds = ImageFolder(str(folder), transform=_pets())
        return DataLoader(Subset(ds, [9, 1, 4, 4, 7, 0, 2, 10]), batch_size=3, shuffle=True, num_workers=2,
                          prefetch_factor=1, drop_last=True)

    _, patched = _stock_and_patched(make, seed=3)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


class _CountingSampler(torch.utils.data.Sampler):
    """Batches of 2 in order; records how many indices the loader had taken when each batch came out."""

    def __init__(self, n: int, log: list[int]) -> None:
        self.n, self.log, self.taken = n, log, 0

    def __iter__(self):
        for i in range(0, self.n - 1, 2):
            self.taken += 1
            yield [i, i + 1]

    def __len__(self) -> int:
        return self.n // 2


@pytest.mark.parametrize("prefetch", [1, 3])
def test_the_sampler_is_advanced_as_stock_advances_it(folder, prefetch):
    from torchvision.datasets import ImageFolder

    logs: dict[str, list[int]] = {}
    for side in ("stock", "patched"):
        if side == "patched":
            nano_patch.patch_torch()
        ds = ImageFolder(str(folder), transform=_crop(48))
        sampler = _CountingSampler(len(ds), [])
        loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, prefetch_factor=prefetch)
        it = iter(loader)
        log = [sampler.taken]
        for _ in it:
            log.append(sampler.taken)
        logs[side] = log
        if side == "patched":
            assert type(it).__name__ == "VirtualWorkersIter"
    assert logs["stock"] == logs["patched"]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_dataset_changed_between_epochs(folder, persistent):
    """Non-persistent workers see the dataset as it is at each epoch; persistent ones keep their first copy."""
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True,
                          num_workers=2, persistent_workers=persistent)

    def between(loader, epoch):
        loader.dataset.transform.transforms[0] = T.RandomResizedCrop(40, scale=(0.5, 1.0))
        del loader.dataset.samples[-3:]

    _, patched = _stock_and_patched(make, seed=5, epochs=3, between=between)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_an_epoch_left_early_moves_persistent_workers_on(folder):
    """Stock's persistent workers load every batch sent to them before the next epoch: so do the streams."""
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=2, shuffle=True,
                          num_workers=2, persistent_workers=True)

    _stock_and_patched(make, seed=11, epochs=3, take=1)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_at_a_sample_is_raised_at_stocks_batch(small_folder, workers):
    """Sample 6 is too small for RandomCrop(64): stock's worker raises it at that batch, wrapped; the epoch goes on
    (the stand-in loads that batch by stock's code, in the stream's state)."""
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(small_folder), transform=_crop(64)), batch_size=3, shuffle=False,
                          num_workers=workers, persistent_workers=True)

    stock, patched = _stock_and_patched(make, seed=2, epochs=2, catch=True)
    assert [e for e in stock if e[0] == "error"][0][1] == "ValueError"
    assert "in DataLoader worker process" in [e for e in stock if e[0] == "error"][0][2]
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_the_main_processs_objects_are_untouched(folder):
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch()
    tf = _pets()
    ds = ImageFolder(str(folder), transform=tf)
    samples = ds.samples
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    for _ in loader:
        pass
    assert ds.transform is tf and ds.samples is samples and loader.worker_init_fn is None


def _own_init(worker_id: int) -> None:
    torch.manual_seed(1234 + worker_id)


def _own_collate(batch: Any) -> Any:
    return torch.utils.data.default_collate(batch)


def _other_loader(path: str) -> Any:
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


class _AsksWorkerInfo(torch.utils.data.Dataset):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        info = torch.utils.data.get_worker_info()
        x, y = self.inner[i]
        return x, y + 100 * (info.id if info is not None else -1)


def _processes_cases(folder: Path) -> dict[str, tuple[Any, str]]:
    """Loaders whose workers must stay processes, each with the reason the patch gives."""
    from torchvision.datasets import ImageFolder

    def ds(**kw):
        return ImageFolder(str(folder), transform=kw.pop("transform", _crop(48)), **kw)

    return {
        "worker_init_fn": (lambda: DataLoader(ds(), batch_size=4, num_workers=2, worker_init_fn=_own_init),
                           "a worker_init_fn of the user's"),
        "target_transform": (lambda: DataLoader(ds(target_transform=lambda t: t + 1), batch_size=4, num_workers=2),
                             "a target_transform"),
        "get_worker_info": (lambda: DataLoader(_AsksWorkerInfo(ds()), batch_size=4, num_workers=2),
                            "not a dataset the patch loads"),
        "own loader": (lambda: DataLoader(ds(loader=_other_loader), batch_size=4, num_workers=2),
                       "the dataset's own loader"),
        "collate_fn": (lambda: DataLoader(ds(), batch_size=4, num_workers=2, collate_fn=_own_collate),
                       "the loader's own collate_fn"),
    }


@pytest.mark.parametrize("case", ["worker_init_fn", "target_transform", "get_worker_info", "own loader",
                                  "collate_fn"])
def test_loaders_that_keep_processes_say_why_and_give_stocks_batches(folder, case):
    from nano_patch.data.workers import virtual_eligibility

    make, reason = _processes_cases(folder)[case]
    nano_patch.patch_torch()
    assert reason in virtual_eligibility.why_not(make(), "auto")
    nano_patch.unpatch_torch()
    _, patched = _stock_and_patched(make, seed=4, epochs=1)
    assert _iterators(patched) == ["_MultiProcessingDataLoaderIter"]


def test_a_folder_with_other_files_keeps_processes(tmp_path, photos):
    from torchvision.datasets import ImageFolder

    from nano_patch.data.workers import virtual_eligibility

    (tmp_path / "a").mkdir()
    photos[0].save(tmp_path / "a" / "0.jpg")
    photos[1].save(tmp_path / "a" / "1.png")
    nano_patch.patch_torch()
    loader = DataLoader(ImageFolder(str(tmp_path), transform=_crop(48)), batch_size=2, num_workers=2)
    assert "not JPEGs" in virtual_eligibility.why_not(loader, "auto")


def test_virtual_workers_can_be_switched_off(folder):
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True, num_workers=2)

    stock = _events(make, 9, epochs=1)
    nano_patch.patch_torch(virtual_workers=False)
    patched = _events(make, 9, epochs=1)
    _compare(stock, patched)
    assert _iterators(patched) == ["_MultiProcessingDataLoaderIter"]


def test_the_report_counts_virtual_workers_and_their_reasons(folder, tmp_path, monkeypatch):
    from torchvision.datasets import ImageFolder

    from nano_patch import report

    monkeypatch.setattr(report, "stats", report.Stats(str(tmp_path)))
    nano_patch.patch_torch()
    for loader in (DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, num_workers=2),
                   DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, num_workers=2,
                              worker_init_fn=_own_init)):
        for _ in loader:
            pass
    reasons = {(fast, why) for (patch, fast, why) in report.stats.counts if patch == "dataloader"}
    assert (True, "num_workers=2 as virtual workers in this process") in reasons
    assert any(not fast and why.startswith("num_workers=2 in worker processes: a worker_init_fn of the user's")
               for fast, why in reasons)
