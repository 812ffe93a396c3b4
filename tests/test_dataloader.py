"""The DataLoader patch: thread caps in workers, chained worker_init_fn, defaults, stock batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import nano_patch


class ThreadProbe(Dataset):
    """Each item reports what the process that produced it sees."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import cv2  # imported inside the worker: under spawn, after the worker started

        return torch.tensor([i, torch.get_num_threads(), int(os.environ.get("OMP_NUM_THREADS", "0")),
                             cv2.getNumThreads(), os.getpid()])


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        yield from (torch.tensor([i, i * i]) for i in range(start, 24, step))


def _mark(worker_id):
    os.environ["USER_INIT_RAN"] = str(worker_id)


class InitProbe(ThreadProbe):
    def __getitem__(self, i):
        return torch.tensor([i, int(os.environ.get("USER_INIT_RAN", "-1"))])


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_workers_see_the_threads_and_environment_of_stock_workers(ctx):
    """torch on one thread, as stock's worker sets it; OMP_NUM_THREADS and OpenCV's thread count as stock leaves
    them (a user's __getitem__ reads them, and so does any process it starts)."""
    def rows(loader):
        return torch.cat(list(loader))

    stock = rows(DataLoader(ThreadProbe(), batch_size=4, num_workers=2, multiprocessing_context=ctx))
    nano_patch.patch_torch()
    ours = rows(DataLoader(ThreadProbe(), batch_size=4, num_workers=2, multiprocessing_context=ctx))
    assert ours[:, 1].tolist() == [1] * 8
    assert ours[:, :4].tolist() == stock[:, :4].tolist()
    assert os.getpid() not in ours[:, 4].tolist()
    ours = rows(DataLoader(InitProbe(), batch_size=4, num_workers=2, worker_init_fn=_mark,
                           multiprocessing_context=ctx))
    assert sorted(set(ours[:, 1].tolist())) == [0, 1]


def test_no_worker_processes_are_added(image_folder, monkeypatch):
    """Workers seed their own generators: an added worker would change the batches of a num_workers=0 loader."""
    from torchvision.datasets import ImageFolder

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))  # a machine with cores to spare
    nano_patch.patch_torch()
    assert DataLoader(ImageFolder(str(image_folder)), batch_size=2).num_workers == 0
    assert DataLoader(TensorDataset(torch.zeros(4)), batch_size=2).num_workers == 0
    assert DataLoader(Stream(), batch_size=2).num_workers == 0


def _init_a(worker_id):
    pass


@pytest.mark.parametrize("kwargs", [
    dict(num_workers=2),
    dict(num_workers=2, persistent_workers=False, pin_memory=False),
    dict(num_workers=2, persistent_workers=True, pin_memory=True, worker_init_fn=_init_a),
    dict(num_workers=1, worker_init_fn=_mark),
    dict(),
])
def test_arguments_a_loop_can_observe_are_left_as_given(image_folder, kwargs):
    """persistent_workers, pin_memory and worker_init_fn read as stock's, before and after iterating."""
    from torchvision.datasets import ImageFolder

    folder = ImageFolder(str(image_folder))
    names = ("num_workers", "persistent_workers", "pin_memory", "worker_init_fn")
    stock = DataLoader(folder, batch_size=2, collate_fn=lambda b: len(b), **kwargs)
    want = [getattr(stock, n) for n in names]
    nano_patch.patch_torch()
    patched = DataLoader(folder, batch_size=2, collate_fn=lambda b: len(b), **kwargs)
    assert [getattr(patched, n) for n in names] == want
    assert list(patched) == list(stock)
    assert [getattr(patched, n) for n in names] == want  # the caps went round the user's function only briefly


class EpochProbe(Dataset):
    """A dataset the main process changes between epochs (progressive resizing, curricula, set_epoch)."""

    def __init__(self):
        self.epoch = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([self.epoch])


def _epochs(loader, ds):
    seen = []
    for epoch in range(3):
        ds.epoch = epoch
        seen.append(sorted({int(x) for b in loader for x in b.flatten()}))
    return seen


def test_a_dataset_changed_between_epochs_is_seen_as_stock_sees_it():
    ds = EpochProbe()
    stock = _epochs(DataLoader(ds, batch_size=2, num_workers=2), ds)
    assert stock == [[0], [1], [2]]
    nano_patch.patch_torch()
    assert _epochs(DataLoader(ds, batch_size=2, num_workers=2), ds) == stock


def test_seed_everything_workers_adds_lightnings_worker_init_under_the_patch(monkeypatch):
    """Lightning seeds each rank's workers only in a loader whose worker_init_fn is None."""
    from lightning.fabric.utilities.data import _auto_add_worker_init_fn
    from lightning.fabric.utilities.seed import pl_worker_init_function

    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    nano_patch.patch_torch()
    loader = DataLoader(TensorDataset(torch.zeros(8)), batch_size=2, num_workers=2)
    _auto_add_worker_init_fn(loader, rank=1)
    assert loader.worker_init_fn.func is pl_worker_init_function and loader.worker_init_fn.keywords == {"rank": 1}
    list(loader)
    assert loader.worker_init_fn.func is pl_worker_init_function


class SeedProbe(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.rand(1)


def test_ranks_workers_draw_lightnings_streams_as_on_stock(monkeypatch):
    """Under seed_everything(workers=True), each rank's workers draw their own streams, the same as stock."""
    from lightning.fabric.utilities.data import _auto_add_worker_init_fn
    from lightning.fabric.utilities.seed import seed_everything

    # seed_everything writes PL_GLOBAL_SEED and PL_SEED_WORKERS into os.environ: set here through monkeypatch so
    # that they are put back afterwards, or every later Lightning run this process starts would reseed its ranks
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    monkeypatch.setenv("PL_SEED_WORKERS", "1")

    def draws(rank):
        seed_everything(7, workers=True, verbose=False)
        loader = DataLoader(SeedProbe(), batch_size=2, num_workers=2)
        _auto_add_worker_init_fn(loader, rank=rank)
        return torch.cat(list(loader)).flatten().tolist()

    stock = [draws(0), draws(1)]
    assert stock[0] != stock[1]
    nano_patch.patch_torch()
    assert [draws(0), draws(1)] == stock


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_batches_equal_stock(ctx):
    data = TensorDataset(torch.arange(40, dtype=torch.float32).view(20, 2), torch.arange(20))
    stock_map = [b for b in DataLoader(data, batch_size=6, num_workers=2, multiprocessing_context=ctx)]
    stock_iter = sorted(torch.cat(list(DataLoader(Stream(), batch_size=5, num_workers=2,
                                                  multiprocessing_context=ctx))).tolist())
    nano_patch.patch_torch()
    patched_map = [b for b in DataLoader(data, batch_size=6, num_workers=2, multiprocessing_context=ctx)]
    assert len(patched_map) == len(stock_map)
    for a, b in zip(patched_map, stock_map):
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))
    patched_iter = sorted(torch.cat(list(DataLoader(Stream(), batch_size=5, num_workers=2,
                                                    multiprocessing_context=ctx))).tolist())
    assert patched_iter == stock_iter


def test_worker_crash_surfaces_like_stock():
    class Boom(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise ValueError(f"bad item {i}")

    nano_patch.patch_torch()
    with pytest.raises(ValueError, match="bad item") as exc:
        list(DataLoader(Boom(), batch_size=2, num_workers=1))
    assert "Caught ValueError in DataLoader worker process" in str(exc.value)


def test_unknown_collate_and_dataset_get_stock_behaviour():
    nano_patch.patch_torch()
    out = list(DataLoader(list(range(6)), batch_size=3, collate_fn=lambda b: sum(b)))
    assert out == [3, 12]


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _exact_pipeline(normalize: bool = True):
    """Crops and flips only: stock and patched transforms are bit-identical, so batches can be compared to stock."""
    from torchvision import transforms as T

    tail = [T.ToTensor(), T.Normalize(MEAN, STD)] if normalize else [T.ToTensor()]
    return T.Compose([T.RandomCrop(96), T.RandomHorizontalFlip(), *tail])


def _batches(loader, seed=0):
    torch.manual_seed(seed)
    it = iter(loader)
    return it, list(it)


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
@pytest.mark.parametrize("normalize", [True, False])
def test_worker_processes_finish_the_tail_where_no_device_does(image_folder, ctx, normalize):
    """Without a device to finish the tensor tail, the worker processes finish it (float batches cross, as stock's):
    the main process does no per-batch pixel work."""
    from torchvision.datasets import ImageFolder

    from nano_patch.data.tail.uint8_batches import Uint8Batches

    ds = ImageFolder(str(image_folder), transform=_exact_pipeline(normalize))
    kw = dict(batch_size=4, num_workers=2, multiprocessing_context=ctx)
    _, stock = _batches(DataLoader(ds, **kw))
    nano_patch.patch_torch(virtual_workers=False)
    it, patched = _batches(DataLoader(ds, **kw))
    assert not isinstance(it, Uint8Batches) and type(it).__name__ == "_MultiProcessingDataLoaderIter"
    assert len(patched) == len(stock) == 3
    for (a, ya), (b, yb) in zip(stock, patched):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)
        assert torch.equal(ya, yb)
    assert ds[0][0].dtype == torch.float32  # dataset[i] in the main process stays stock


def test_a_worker_process_takes_its_batch_whole_into_shared_memory(image_folder, monkeypatch):
    """In a worker process the batch path renders each batch into one tensor in shared memory (where stock's
    ``default_collate`` allocates a worker's batch): it crosses as it is, with no stack and no copy."""
    from torch.utils.data import _DatasetKind, default_collate
    from torch.utils.data._utils import worker
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    from nano_patch.data.threads import loader_threads

    tf = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = ImageFolder(str(image_folder), transform=tf)
    torch.manual_seed(0)
    want_x, want_y = default_collate([ds[i] for i in (0, 3, 1, 4)])
    state = torch.get_rng_state()
    nano_patch.patch_torch()
    monkeypatch.setattr(worker, "_worker_info", worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=ds))
    assert loader_threads.threads() == 1
    fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, ds, True, default_collate, False)

    real_stack = torch.stack

    def no_stack(tensors, *args, **kwargs):
        if tensors[0].device.type != "meta":  # (the batch layout is found on the meta device: no memory)
            raise AssertionError("the batch was stacked")
        return real_stack(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "stack", no_stack)
    torch.manual_seed(0)
    x, y = fetcher.fetch([0, 3, 1, 4])
    assert x.is_shared() and x.stride() == want_x.stride() and torch.equal(x, want_x) and torch.equal(y, want_y)
    assert torch.equal(torch.get_rng_state(), state)


def test_uint8_batches_finished_here_equal_the_patched_float_path_on_a_resizing_pipeline(image_folder,
                                                                                          monkeypatch):
    """Persistent workers started for a device that finishes the tail keep sending uint8 batches; an iteration that
    does not defer (a plain loop over the same loader) gets them finished here: the float batches, straight into
    channels-last."""
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    from nano_patch.data.tail.uint8_batches import Uint8Batches
    from nano_patch.train import tail_deferral as trainer_tail

    tf = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = ImageFolder(str(image_folder), transform=tf)

    def second_epoch() -> tuple[Any, list[Any]]:
        torch.manual_seed(0)
        loader = DataLoader(ds, batch_size=4, num_workers=1, persistent_workers=True)
        with monkeypatch.context() as m:
            m.setattr(trainer_tail, "why_not", lambda loader: None)  # the first iteration defers (a device's)
            next(iter(loader))
        it = iter(loader)
        return it, list(it)

    nano_patch.patch_torch(uint8_batches=False, virtual_workers=False)
    _, floats = second_epoch()
    nano_patch.unpatch_torch()
    nano_patch.patch_torch(channels_last=True, virtual_workers=False)
    it, u8 = second_epoch()
    assert isinstance(it, Uint8Batches) and it.last_image_bytes * 4 == u8[-1][0].nbytes
    assert len(floats) == len(u8) == 3
    for (a, _), (b, _) in zip(floats, u8):
        assert b.is_contiguous(memory_format=torch.channels_last)  # straight into channels-last
        assert torch.equal(a, b)


def test_a_pinned_uint8_batch_becomes_a_pinned_float_batch(monkeypatch):
    """With pin_memory (a CUDA consumer) stock's float batch is pinned, so the finished one must be too.

    Pinning needs CUDA, which this machine lacks: the pinned state and the allocation are observed instead.
    """
    from nano_patch.data.tail.uint8_batches import TailSpec, to_float

    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    asked = []
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    spec = TailSpec(mean=tuple(MEAN), std=tuple(STD))
    for pinned in (False, True):
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, p=pinned: p)
        out = to_float(images, spec)
        want = (images.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        assert (out - want).abs().max() <= 1e-6
    assert asked == [False, True]


def test_uint8_batches_only_where_understood(image_folder):
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch()
    ds = ImageFolder(str(image_folder), transform=_exact_pipeline())
    assert DataLoader(ds, batch_size=2, num_workers=1)._nano_uint8 is not None
    odd = [
        DataLoader(ds, batch_size=2, num_workers=0),  # nothing crosses processes
        DataLoader(ds, batch_size=2, num_workers=1, collate_fn=lambda b: b),  # a collate_fn we do not know
        DataLoader(ds, batch_size=None, num_workers=1),  # no automatic batching
        DataLoader(ImageFolder(str(image_folder), transform=T.Compose([T.CenterCrop(8), T.ToTensor(),
                                                                       T.Lambda(lambda t: t * 2)])),
                   batch_size=2, num_workers=1),  # ends in a user's function
        DataLoader(ImageFolder(str(image_folder), transform=_exact_pipeline(), loader=_own_loader),
                   batch_size=2, num_workers=1),  # images from a user's loader
    ]
    assert all(dl._nano_uint8 is None for dl in odd)
    item, target = next(iter(odd[2]))
    assert item.dtype == torch.float32 and isinstance(target, int)
    nano_patch.unpatch_torch()
    nano_patch.patch_torch(vision=False)
    assert DataLoader(ds, batch_size=2, num_workers=1)._nano_uint8 is None  # needs the transforms patch


def _own_loader(path):
    from PIL import Image

    return Image.open(path).convert("RGB")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_lightning_reinjects_its_sampler_into_patched_loaders_on_two_ranks(tmp_path):
    """Lightning re-creates the DataLoader with a DistributedSampler in each rank; the patch survives it."""
    script = Path(__file__).parent / "scripts" / "sampler_ranks.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env["NANO_PATCH_NUM_PROCESSES"] = "2"
    proc = subprocess.run([sys.executable, "-m", "nano_patch", "run", str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for r in (r0, r1):
        assert r["sampler"] == "DistributedSampler"
        assert (r["worker_init"], r["persistent"], r["num_workers"]) == ("function", True, 1)  # as the user gave them
        assert r["user_init_kept"]
        assert len(r["seen"]) == 40  # 20 samples a rank, 2 epochs
        worker = json.loads((tmp_path / f"worker_of_{r['pid']}.json").read_text())
        assert worker["affinity"] == r["affinity"], "a worker left its rank's cores"
        assert worker["threads"] == 1 and worker["omp"] == "1"  # the caps, around the user's function
        assert worker["user_init"] == "0"
    assert not set(r0["affinity"]) & set(r1["affinity"])
    for epoch in range(2):
        a, b = set(r0["seen"][epoch * 20:(epoch + 1) * 20]), set(r1["seen"][epoch * 20:(epoch + 1) * 20])
        assert not a & b and a | b == set(range(40))
