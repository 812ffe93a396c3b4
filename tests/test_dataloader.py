"""The DataLoader patch: thread caps in workers, chained worker_init_fn, defaults, stock batches."""

from __future__ import annotations

import os

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
def test_workers_run_one_thread_and_the_users_init(ctx):
    nano_patch.patch_torch()
    rows = torch.cat(list(DataLoader(ThreadProbe(), batch_size=4, num_workers=2, multiprocessing_context=ctx)))
    assert rows[:, 1].tolist() == [1] * 8 and rows[:, 2].tolist() == [1] * 8 and rows[:, 3].tolist() == [1] * 8
    assert os.getpid() not in rows[:, 4].tolist()
    rows = torch.cat(list(DataLoader(InitProbe(), batch_size=4, num_workers=2, worker_init_fn=_mark,
                                     multiprocessing_context=ctx)))
    assert sorted(set(rows[:, 1].tolist())) == [0, 1]


def test_defaults_only_where_the_user_was_silent(image_folder):
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch()
    cores = len(os.sched_getaffinity(0))
    folder = ImageFolder(str(image_folder))
    auto = DataLoader(folder, batch_size=2)
    assert auto.num_workers == max(0, min(4, (cores - 2) // 2))
    assert DataLoader(TensorDataset(torch.zeros(4)), batch_size=2).num_workers == 0  # in memory: no workers
    assert DataLoader(Stream(), batch_size=2).num_workers == 0  # iterable: left alone
    explicit = DataLoader(folder, batch_size=2, num_workers=2, persistent_workers=False, pin_memory=False)
    assert (explicit.num_workers, explicit.persistent_workers, explicit.pin_memory) == (2, False, False)
    implicit = DataLoader(folder, batch_size=2, num_workers=2)
    assert implicit.persistent_workers is True
    assert implicit.pin_memory is torch.cuda.is_available()
    user_init = DataLoader(folder, batch_size=2, num_workers=1, worker_init_fn=_mark)
    assert user_init.worker_init_fn.user_fn is _mark
    again = DataLoader(folder, batch_size=2, num_workers=1, worker_init_fn=user_init.worker_init_fn)
    assert again.worker_init_fn is user_init.worker_init_fn  # Lightning's re-creation: not wrapped twice


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
