"""A virtual worker behaves as a forked stock worker: the process state it froze when the iterator started, what the
training loop sees of its batches (inference tensors, shared memory, the iterator's class, ``timeout``), its
stand-in processes (started with the iterator, one per worker, never left behind), and its warnings.

Each comparison runs the same loop stock (unpatched) and patched, in this process, from the same seeds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _rng import rng_differences, rng_state, seed_all
from PIL import Image, ImageFile
from torch.utils.data import DataLoader

import nano_patch


def _crop():
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])


def _save_all(root: Path, photos: list[Image.Image], n: int, extra: Any = None) -> None:
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True, exist_ok=True)
    for k in range(n):
        im = photos[k % len(photos)].resize((120 + 8 * (k % 3), 96))
        path = root / "ab"[k % 2] / f"{k:02d}.jpg"
        if extra is None:
            im.save(path, quality=90)
        else:
            extra(im, path, k)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, photos) -> Path:
    root = tmp_path_factory.mktemp("contract")
    _save_all(root, photos, 12)
    return root


@pytest.fixture(scope="module")
def cmyk_folder(tmp_path_factory, photos) -> Path:
    """Twelve CMYK JPEGs (PIL decodes them: every batch needs a stand-in)."""
    root = tmp_path_factory.mktemp("contract-cmyk")

    def save(im: Image.Image, path: Path, k: int) -> None:
        im.convert("CMYK").save(path, quality=90)

    _save_all(root, photos, 12, save)
    return root


@pytest.fixture(scope="module")
def truncated_folder(tmp_path_factory, photos) -> Path:
    """Twelve JPEGs, one of them cut short."""
    root = tmp_path_factory.mktemp("contract-truncated")
    _save_all(root, photos, 12)
    path = root / "a" / "04.jpg"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return root


def _loader(root: Any, workers: int = 2, persistent: bool = False, **kw: Any) -> DataLoader:
    from torchvision.datasets import ImageFolder

    return DataLoader(ImageFolder(str(root), transform=_crop()), batch_size=3, shuffle=True, num_workers=workers,
                      persistent_workers=persistent, **kw)


def _epochs(make: Any, seed: int, epochs: int = 2, between: Any = None, during: Any = None) -> list[Any]:
    """Every batch (or its error), and the generators after each, per epoch; ``between(epoch)`` runs before each
    later epoch, ``during()`` after each batch taken (a training step)."""
    seed_all(seed)
    loader = make()
    out: list[Any] = []
    for epoch in range(epochs):
        if epoch and between is not None:
            between(epoch)
        it = iter(loader)
        while True:
            try:
                x, y = next(it)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - compared with stock's
                out.append(("error", type(exc).__name__, str(exc).split("\nOriginal Traceback")[0]))
                continue
            out.append(("batch", x.clone(), y.clone(), x.dtype))
            out.append(("rng", rng_state()))
            if during is not None:
                during()
    return out


def _same(stock: list[Any], patched: list[Any]) -> None:
    assert [e[0] for e in stock] == [e[0] for e in patched]
    for want, got in zip(stock, patched):
        if want[0] == "batch":
            assert want[3] == got[3]
            assert torch.equal(want[1], got[1]) and torch.equal(want[2], got[2])
        elif want[0] == "rng":
            assert rng_differences(got[1], want[1]) == []
        else:
            assert want == got


def _both(make: Any, seed: int = 0, **kw: Any) -> tuple[list[Any], list[Any]]:
    stock = _epochs(make, seed, **kw)
    nano_patch.patch_torch()
    patched = _epochs(make, seed, **kw)
    _same(stock, patched)
    return stock, patched


def _virtual(loader: DataLoader) -> bool:
    return type(iter(loader)).__name__ == "VirtualWorkersIter"


# -- the state a worker froze --------------------------------------------------------------------------------------

def test_a_default_dtype_set_for_a_step_never_reaches_the_batches(folder):
    def step() -> None:  # a training step that computes in float64 for a while, then restores the default
        torch.set_default_dtype(torch.float64)
        time.sleep(0.03)
        torch.set_default_dtype(torch.float32)

    _, patched = _both(lambda: _loader(folder), seed=1, during=step)
    assert {e[3] for e in patched if e[0] == "batch"} == {torch.float32}


@pytest.mark.parametrize("change", ["dtype", "truncated", "max_pixels", "chdir"])
def test_a_persistent_worker_keeps_the_state_of_its_first_epoch(change, folder, truncated_folder, tmp_path,
                                                               monkeypatch):
    """What the script changes between epochs does not reach a persistent worker (it froze the first epoch's)."""
    root: Any = folder
    if change == "truncated":
        root = truncated_folder
    if change == "chdir":  # a relative root, then the working directory moves
        monkeypatch.chdir(folder.parent)
        root = folder.name
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)

    def between(epoch: int) -> None:
        if change == "dtype":
            torch.set_default_dtype(torch.float64)
        elif change == "truncated":
            ImageFile.LOAD_TRUNCATED_IMAGES = True
        elif change == "max_pixels":
            Image.MAX_IMAGE_PIXELS = 2000  # every photo would warn, most would raise
        else:
            os.chdir(tmp_path)

    def run() -> list[Any]:
        try:
            return _epochs(lambda: _loader(root, persistent=True), seed=2, between=between)
        finally:
            torch.set_default_dtype(torch.float32)
            ImageFile.LOAD_TRUNCATED_IMAGES = False
            Image.MAX_IMAGE_PIXELS = 89478485
            os.chdir(folder.parent)

    stock = run()
    nano_patch.patch_torch()
    assert _virtual(_loader(root))
    patched = run()
    _same(stock, patched)
    if change == "truncated":
        assert sum(e[0] == "error" for e in patched) == 2  # both epochs raise at the cut file, as stock's
    else:
        assert not any(e[0] == "error" for e in patched)


# -- what the training loop sees -------------------------------------------------------------------------------

@pytest.mark.parametrize("pin", [False, True])
def test_batches_are_shared_and_inference_tensors_as_stocks(folder, pin):
    def props(make: Any) -> list[Any]:
        seed_all(3)
        out = []
        loader = make()
        for x, y in loader:
            out.append((x.is_shared(), y.is_shared(), x.is_inference()))
        with torch.inference_mode():
            for x, y in loader:
                out.append((x.is_shared(), y.is_shared(), x.is_inference(), y.is_inference()))
        x, _ = next(iter(loader))
        try:
            x.add_(1)  # outside inference mode: allowed on a normal tensor only
            out.append("in-place allowed")
        except RuntimeError as exc:
            out.append(str(exc))
        return out

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (pin_memory without an accelerator)
        stock = props(lambda: _loader(folder, pin_memory=pin))
        nano_patch.patch_torch()
        assert _virtual(_loader(folder))
        assert props(lambda: _loader(folder, pin_memory=pin)) == stock


def test_a_loader_subclass_that_makes_its_own_iterator_is_called_as_on_stock(folder):
    calls: list[str] = []

    class Counting(DataLoader):
        def _get_iterator(self) -> Any:
            calls.append("get_iterator")
            return super()._get_iterator()

    def make() -> DataLoader:
        from torchvision.datasets import ImageFolder

        return Counting(ImageFolder(str(folder), transform=_crop()), batch_size=3, num_workers=2)

    stock, _ = _both(make, seed=4)
    assert calls == ["get_iterator"] * 4  # two epochs, stock then patched


def test_the_iterator_is_stocks_class_and_lightning_shuts_its_workers_down(folder):
    from lightning.pytorch.utilities.combined_loader import _shutdown_workers_and_reset_iterator
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    nano_patch.patch_torch()
    loader = _loader(cmyk_safe := folder, persistent=True)
    it = iter(loader)
    next(it)
    assert isinstance(it, _MultiProcessingDataLoaderIter) and type(it).__name__ == "VirtualWorkersIter"
    assert it._profile_name == "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    template = it._ctx.stand_ins_procs._template
    assert template.is_alive() and cmyk_safe
    _shutdown_workers_and_reset_iterator(loader)
    assert loader._iterator is None and it._shutdown
    template.join(5)
    assert not template.is_alive()


def test_a_timed_out_batch_stays_pending(folder, monkeypatch):
    """A caller that catches the timeout and asks again gets the pending batch, as from stock's workers."""
    from nano_patch.data.workers import virtual_streams

    def batches(patched: bool) -> list[Any]:
        seed_all(5)
        loader = _loader(folder, timeout=0.5)
        it = iter(loader)
        got = []
        slow = patched  # the first batch held back beyond the timeout (patched: its task completes late)
        if slow:
            original = virtual_streams._fast_batch

            def late(ctx: Any, stream: Any, indices: Any) -> Any:
                if stream.worker_id == 0 and stream.drawn == 0:
                    time.sleep(1.0)
                return original(ctx, stream, indices)

            monkeypatch.setattr(virtual_streams, "_fast_batch", late)
            with pytest.raises(RuntimeError, match="timed out after 0.5 seconds"):
                next(it)
            time.sleep(1.0)
        for x, y in it:
            got.append((x.clone(), y.clone()))
        return got

    stock = batches(False)
    nano_patch.patch_torch()
    patched = batches(True)
    assert len(stock) == len(patched)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(stock, patched))


# -- stand-ins ------------------------------------------------------------------------------------------------------

def test_stand_ins_start_with_the_iterator_one_per_worker(cmyk_folder):
    _, patched = _both(lambda: _loader(cmyk_folder, workers=2), seed=6)
    seed_all(6)
    loader = _loader(cmyk_folder, workers=2)
    it = iter(loader)
    batches = list(it)
    assert len(batches) == 4
    described = it.describe()
    assert described["stand_in_batches"] == 4
    reasons = described["stand_in_reasons"]  # the one cause that fired, named: CMYK JPEGs
    assert sum(reasons.values()) == 4 and all(r.startswith("a file PIL must open or decode (") for r in reasons)
    assert described["stand_in_processes"] == 2  # one process per worker, not one per batch
    assert not it._ctx.stand_ins_procs._template.is_alive()  # ended with the epoch, as stock's workers


def test_a_dead_stand_in_is_stocks_worker_exited_error(cmyk_folder):
    nano_patch.patch_torch()
    seed_all(7)
    loader = _loader(cmyk_folder, workers=1)
    it = iter(loader)
    next(it)
    pids = [pid for pid, _, _ in it._ctx.stand_ins_procs._workers.values()]
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError) as raised:
        for _ in it:
            pass
    assert re.fullmatch(r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", str(raised.value))


_EXITING_SCRIPT = """
import os, sys, time
import nano_patch
nano_patch.patch_torch()
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
from nano_patch.data.workers import stand_in

slow = stand_in._stand_in
def slow_stand_in(*args):  # the stand-in holds each batch for a while: the script ends mid-batch
    import torch.utils.data._utils.fetch as f
    fetch = f._MapDatasetFetcher.fetch
    def held(self, index):
        time.sleep(30)
        return fetch(self, index)
    f._MapDatasetFetcher.fetch = held
    return slow(*args)
stand_in._stand_in = slow_stand_in

loader = DataLoader(ImageFolder(sys.argv[1], transform=T.Compose([T.RandomCrop(32), T.ToTensor()])),
                    batch_size=3, num_workers=2, timeout=0)
it = iter(loader)  # (the producers send the first batches to the stand-ins now)
time.sleep(3)
print("started", flush=True)
time.sleep(60 if sys.argv[2] == "wait" else 2)  # ("exit": a normal end, the stand-in still holding its batch)
"""


@pytest.mark.parametrize("how", ["exit", "sigkill", "sigterm"])
def test_no_process_outlives_the_script(cmyk_folder, tmp_path, how):
    """The script ends (normally, or killed) while a stand-in holds a batch: within 10 s no process of it is left."""
    import psutil

    script = tmp_path / f"ends_{how}.py"
    script.write_text(textwrap.dedent(_EXITING_SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), str(cmyk_folder), "exit" if how == "exit" else "wait"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(1.0)
        mine = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
        assert len(mine) >= 3  # the script, the template, a stand-in
        if how != "exit":
            os.kill(proc.pid, signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        proc.wait(timeout=20)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [p for p in mine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not left:
                break
            time.sleep(0.2)
        assert not left, [p.pid for p in left]
    finally:
        for p in psutil.process_iter(["cmdline"]):
            if str(script) in " ".join(p.info["cmdline"] or []):
                p.kill()
        proc.stdout.close()


_WARNING_SCRIPT = """
import sys, warnings
from PIL import Image
if sys.argv[2] == "patched":
    import nano_patch
    nano_patch.patch_torch()
import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
Image.MAX_IMAGE_PIXELS = 8000  # every photo warns (120 x 96 to 136 x 96), none raises
torch.manual_seed(0)
loader = DataLoader(ImageFolder(sys.argv[1], transform=T.Compose([T.CenterCrop(32), T.ToTensor()])),
                    batch_size=3, num_workers=2, persistent_workers=True)
for epoch in range(2):
    for x, y in loader:
        pass
print("done", flush=True)
"""


def test_each_worker_warns_as_one_stock_worker(folder, tmp_path):
    """A warning a worker gives is printed once per message and place per worker (persistent: for the loader's
    life), as each stock worker's own warning registry has it; not once per batch."""
    script = tmp_path / "warns.py"
    script.write_text(textwrap.dedent(_WARNING_SCRIPT))

    def warnings_of(side: str) -> list[str]:
        out = subprocess.run([sys.executable, str(script), str(folder), side], capture_output=True, text=True,
                             timeout=120)
        assert out.stdout.strip() == "done", out.stderr[-3000:]
        return sorted(line for line in out.stderr.splitlines() if "DecompressionBombWarning" in line)

    stock = warnings_of("stock")
    assert stock
    assert warnings_of("patched") == stock


@pytest.mark.parametrize("lock", ["_draw_lock", "_one_by_one_lock"])
def test_a_stand_in_forked_while_a_loader_thread_holds_a_lock_still_loads(cmyk_folder, lock):
    """The stand-ins are forked when the iterator starts, while other loaders' threads may hold the batch path's
    locks: the child gets them free."""
    import threading

    from nano_patch.data.batches import batch_loader

    nano_patch.patch_torch()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with getattr(batch_loader, lock):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    it = iter(_loader(cmyk_folder, workers=1))  # (the template is forked now, the lock held)
    release.set()
    holder.join()
    counted: list[int] = []
    reader = threading.Thread(target=lambda: counted.append(len(list(it))), daemon=True)
    reader.start()
    reader.join(60)
    assert counted == [4]


def test_batches_kept_or_sent_to_another_process_are_never_written_again(folder, monkeypatch):
    """Virtual workers' batches are in shared memory used again once nothing holds them: a batch the loop keeps
    (the tensor, a view, a NumPy array) or pickles to another process keeps its values."""
    import multiprocessing

    from nano_patch.vision.plans import batch_memory

    def sums(kept: list[Any]) -> list[float]:
        return [float(t.double().sum()) for t in kept]

    monkeypatch.setattr(batch_memory, "_shared_batches", batch_memory.SharedBatchMemory())  # (none kept yet)
    nano_patch.patch_torch()
    ctx = multiprocessing.get_context("fork")
    queue, answers = ctx.Queue(), ctx.Queue()

    def summing() -> None:
        got = queue.get(timeout=60)
        time.sleep(1.5)  # (the main process loads several epochs meanwhile)
        answers.put(float(got.double().sum()))

    proc = ctx.Process(target=summing)
    proc.start()
    seed_all(11)
    loader = _loader(folder, workers=2, persistent=True)
    x, _ = next(iter(loader))
    sent = float(x.double().sum())
    queue.put(x)
    del x
    time.sleep(0.3)  # (the queue's thread has pickled it)
    for _ in range(10):
        for _ in loader:
            pass
    assert answers.get(timeout=60) == sent
    proc.join(10)

    seed_all(12)
    loader = _loader(folder, workers=2, persistent=True)
    kept: list[Any] = []
    for _ in range(4):
        for k, (x, _) in enumerate(loader):
            if k < 3:
                kept.append(x if k == 0 else x[1] if k == 1 else torch.from_numpy(x.numpy()[0]))
    want = sums(kept)
    nano_patch.unpatch_torch()
    seed_all(12)
    stock: list[Any] = []
    stock_loader = _loader(folder, workers=2, persistent=True)
    for _ in range(4):
        for k, (x, _) in enumerate(stock_loader):
            if k < 3:
                stock.append(x if k == 0 else x[1] if k == 1 else x[0])
    assert want == sums(stock)
