"""Deferred work against stock, as a matrix of deferral x input x moment.

Two paths put stock's work off: a batch made ahead at ``num_workers=0`` (made before ``next()`` asks for it:
``data/threads/batches_ahead.py``) and a lazy JPEG (decoded after ``load()`` or ``convert`` returned:
``vision/images/lazy_jpeg.py``). Each is exact only if, at hand-over, everything stock's code reads at its own
moment is proved unchanged. Every input that code reads is here changed, replaced, deleted or corrupted, at each
moment of the deferred work (before it starts, while it runs, after it finished but before use), and the outcome
(each batch or image, each error's class and message, and the generators) must be stock's, where the same
change is made at the same point of the script.

At ``num_workers=2`` a stock worker freezes what it reads when the iterator starts it (a fork), so the same changes
made between batches reach no batch of that epoch, and all of the next; the virtual workers must do the same.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
import torchvision.transforms as T
from _rng import rng_differences, rng_state
from PIL import Image, ImageFile
from torch.utils.data import DataLoader, Subset
from torchvision.datasets import ImageFolder

import nano_patch
from nano_patch.data.batches import drawn_batches

BATCH = 4


@pytest.fixture(scope="module")
def source_folder(tmp_path_factory, photos) -> Path:
    root = tmp_path_factory.mktemp("deferred-source")
    for k in range(16):
        im = photos[k % len(photos)]
        w, h = im.size
        (root / f"c{k % 2}").mkdir(exist_ok=True)
        im.crop((k * 3, k * 2, w - k, h - 2 * k)).save(root / f"c{k % 2}" / f"{k:02d}.jpg", quality=80 + k)
    return root


def _tf(size: int = 24) -> Any:
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor()])


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jpg"))


def _rotate_contents(root: Path, how: str) -> None:
    """Each file given another file's content: ``copy2`` (in place, the source's times kept), ``replace`` (a new
    inode put in its place), ``inplace`` (the bytes written over, size and modification time put back)."""
    files = _files(root)
    saved = [f.read_bytes() for f in files]
    for k, f in enumerate(files):
        other = files[(k + 5) % len(files)]
        if how == "copy2":
            shutil.copy2(other, f)
        elif how == "replace":
            tmp = f.with_suffix(".tmp")
            tmp.write_bytes(saved[(k + 5) % len(files)])
            os.replace(tmp, f)
        else:
            st = f.stat()
            with open(f, "r+b") as fh:
                fh.write(saved[(k + 5) % len(files)][:st.st_size])
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


class _Relabelled(ImageFolder):
    """A subclass with its own ``__getitem__`` (user code), put in place of the dataset's class mid-epoch."""

    def __getitem__(self, index: int) -> Any:
        x, y = super().__getitem__(index)
        return x, y + 100


def _int_collate(batch: list[int]) -> torch.Tensor:
    return torch.tensor(batch) * 7


#: each input stock's fetch reads, and how it is changed: ``(dataset, root, folder) -> None``; the dataset is the
#: loader's (an ImageFolder, or a Subset of one), ``root`` the ImageFolder under it
CHANGES: dict[str, Callable[[Any, Any, Path], None]] = {
    "transform replaced": lambda ds, root, folder: setattr(root, "transform", _tf(32)),
    "transform set to None": lambda ds, root, folder: setattr(root, "transform", None),
    "crop size changed in place": lambda ds, root, folder: setattr(root.transform.transforms[0], "size", (16, 16)),
    "a step of the user's added": lambda ds, root, folder: root.transform.transforms.insert(
        2, T.Lambda(lambda im: im.rotate(90))),
    "target_transform set": lambda ds, root, folder: setattr(root, "target_transform", lambda t: t + 10),
    "loader replaced": lambda ds, root, folder: setattr(root, "loader", lambda p: Image.open(p).convert("L")
                                                        .convert("RGB")),
    "samples replaced": lambda ds, root, folder: setattr(root, "samples", list(reversed(root.samples))),
    "samples swapped in place": lambda ds, root, folder: root.samples.reverse(),
    "samples appended": lambda ds, root, folder: root.samples.append(root.samples[0]),
    "class replaced": lambda ds, root, folder: setattr(root, "__class__", _Relabelled),
    "getitems set on the instance": lambda ds, root, folder: setattr(
        ds, "__getitems__", lambda idx: [ds[i] for i in reversed(idx)]),
    "collate of ints replaced": lambda ds, root, folder: torch.utils.data._utils.collate.default_collate_fn_map
    .__setitem__(int, lambda batch, *, collate_fn_map=None: _int_collate(batch)),
    "files copied over (copy2)": lambda ds, root, folder: _rotate_contents(folder, "copy2"),
    "files replaced (os.replace)": lambda ds, root, folder: _rotate_contents(folder, "replace"),
    "files overwritten, times put back": lambda ds, root, folder: _rotate_contents(folder, "inplace"),
    "files deleted": lambda ds, root, folder: [f.unlink() for f in _files(folder)],
    "files truncated": lambda ds, root, folder: [os.truncate(f, f.stat().st_size // 2) for f in _files(folder)],
    "default dtype float64": lambda ds, root, folder: torch.set_default_dtype(torch.float64),
    "truncated images allowed": lambda ds, root, folder: setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True),
    "pixel limit lowered": lambda ds, root, folder: setattr(Image, "MAX_IMAGE_PIXELS", 5000),
    "grad mode off": lambda ds, root, folder: torch.set_grad_enabled(False),
    "a draw from torch's generator": lambda ds, root, folder: torch.rand(3),
}
#: inputs the Subset case adds
SUBSET_CHANGES: dict[str, Callable[[Any, Any, Path], None]] = {
    "subset indices replaced": lambda ds, root, folder: setattr(ds, "indices", list(reversed(ds.indices))),
    "subset indices changed in place": lambda ds, root, folder: ds.indices.reverse(),
    "subset dataset replaced": lambda ds, root, folder: setattr(ds, "dataset", ImageFolder(str(folder), _tf(20))),
}


@pytest.fixture
def restored():
    """What a change may leave set: put back after each run."""
    from torch.utils.data._utils import collate

    saved = (torch.get_default_dtype(), ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS,
             dict(collate.default_collate_fn_map), torch.is_grad_enabled())

    def restore() -> None:
        torch.set_default_dtype(saved[0])
        ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS = saved[1], saved[2]
        collate.default_collate_fn_map.clear()
        collate.default_collate_fn_map.update(saved[3])
        torch.set_grad_enabled(saved[4])

    yield restore
    restore()


def _outcome(fn: Callable[[], Any], folder: Path) -> Any:
    try:
        x, y = fn()
    except StopIteration:
        return "end"
    except Exception as exc:  # noqa: BLE001 - compared with stock's
        # (a worker's error: its first line, and the original error's last; the traceback between is the code's)
        lines = str(exc).replace(str(folder), "<folder>").strip().splitlines()
        return ("raised", type(exc).__name__, (lines[0], lines[-1]) if len(lines) > 1 else lines)
    return (x.dtype, x.shape, x.double().sum().item(), x.clone(), y.tolist() if isinstance(y, torch.Tensor) else y)


class _Moment:
    """Holds the loader thread at one moment of the deferred batch made second (the batch after the one handed
    over before the change): ``before`` it starts, ``during`` (its first file's identity taken, its read not
    yet), ``after`` it finished."""

    def __init__(self, monkeypatch: Any, moment: str) -> None:
        self.moment, self.calls = moment, 0
        self.reached, self.go = threading.Event(), threading.Event()
        real_load, real_source = drawn_batches.load_drawn, drawn_batches.source_of
        self.in_target = False

        def load_drawn(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            target = self.calls == 2
            if target and moment == "before":
                self._hold()
            self.in_target = target
            try:
                return real_load(*args, **kwargs)
            finally:
                self.in_target = False
                if target and moment == "after":
                    self.reached.set()

        def source_of(*args: Any, **kwargs: Any) -> Any:
            if self.in_target and moment == "during" and not self.reached.is_set():
                self._hold()
            return real_source(*args, **kwargs)

        monkeypatch.setattr(drawn_batches, "load_drawn", load_drawn)
        monkeypatch.setattr(drawn_batches, "source_of", source_of)

    def _hold(self) -> None:
        self.reached.set()
        self.go.wait(30)

    def wait(self) -> bool:
        return self.reached.wait(10)


def _run_ahead(folder: Path, change: Callable[..., None], subset: bool, moment: _Moment | None,
               restore: Callable[[], None]) -> tuple[list[Any], bool]:
    torch.manual_seed(11)
    root = ImageFolder(str(folder), _tf())
    ds: Any = Subset(root, list(range(len(root)))) if subset else root
    it = iter(DataLoader(ds, batch_size=BATCH, shuffle=True))
    out: list[Any] = [_outcome(lambda: next(it), folder), rng_state(), _outcome(lambda: next(it), folder),
                      rng_state()]
    reached = moment.wait() if moment is not None else True
    try:
        change(ds, root, folder)
    finally:
        if moment is not None:
            moment.go.set()
    for _ in range(3):
        out += [_outcome(lambda: next(it), folder), rng_state()]
    restore()
    return out, reached


def _assert_same(stock: list[Any], patched: list[Any]) -> None:
    assert len(stock) == len(patched)
    for k, (want, got) in enumerate(zip(stock, patched)):
        if isinstance(want, tuple) and len(want) == 3 and not isinstance(want[0], str):
            assert rng_differences(got, want) == [], f"generators after step {k // 2}"
        elif isinstance(want, tuple) and len(want) == 5:
            assert got[:3] == want[:3] and got[4] == want[4] and torch.equal(got[3], want[3]), f"step {k // 2}"
        else:
            assert got == want, f"step {k // 2}"


@pytest.mark.parametrize("moment", ["before", "during", "after"])
@pytest.mark.parametrize("change", [*CHANGES, *SUBSET_CHANGES])
def test_a_batch_made_ahead_proves_what_stock_reads(source_folder, tmp_path, change, moment, monkeypatch,
                                                     restored):
    subset = change in SUBSET_CHANGES or change == "getitems set on the instance"
    fn = SUBSET_CHANGES.get(change) or CHANGES[change]
    shutil.copytree(source_folder, tmp_path / "stock")
    stock, _ = _run_ahead(tmp_path / "stock", fn, subset, None, restored)
    shutil.copytree(source_folder, tmp_path / "patched")
    nano_patch.patch_torch(loader_threads=2)
    hold = _Moment(monkeypatch, moment)
    patched, reached = _run_ahead(tmp_path / "patched", fn, subset, hold, restored)
    assert reached, "the batch was not made ahead: the moment was not reached"
    _assert_same(stock, patched)


# -- num_workers=2: what a stock worker froze at the iterator's start --------------------------------------------

FROZEN = ("transform replaced", "crop size changed in place", "target_transform set", "loader replaced",
          "samples swapped in place", "default dtype float64", "pixel limit lowered")


@pytest.mark.parametrize("change", FROZEN)
def test_virtual_workers_see_what_a_forked_worker_froze(source_folder, tmp_path, change, restored):
    def run(folder: Path) -> list[Any]:
        torch.manual_seed(5)
        root = ImageFolder(str(folder), _tf())
        loader = DataLoader(root, batch_size=BATCH, shuffle=True, num_workers=2,
                            multiprocessing_context="fork")
        out: list[Any] = []
        for epoch in range(2):
            take = iter(loader).__next__
            out.append(_outcome(take, folder))
            if epoch == 0:
                CHANGES[change](root, root, folder)
            out += [_outcome(take, folder) for _ in range(3)]
            out.append(rng_state())
            del take
        restored()
        return out

    shutil.copytree(source_folder, tmp_path / "stock")
    stock = run(tmp_path / "stock")
    shutil.copytree(source_folder, tmp_path / "patched")
    nano_patch.patch_torch()
    patched = run(tmp_path / "patched")
    _assert_same(stock, patched)


# -- lazy images: the file or buffer, and PIL's flags, between open, load/convert and the pixels' first read ------

def _other_photo(photos: list[Image.Image]) -> bytes:
    buf = io.BytesIO()
    photos[1].resize((80, 60)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


LAZY_CHANGES: dict[str, Callable[[Path, io.BytesIO, bytes], None]] = {
    "file overwritten in place": lambda path, buf, other: path.write_bytes(other),
    "file replaced": lambda path, buf, other: (path.with_suffix(".tmp").write_bytes(other),
                                               os.replace(path.with_suffix(".tmp"), path)),
    "file deleted": lambda path, buf, other: path.unlink(),
    "file truncated": lambda path, buf, other: os.truncate(path, path.stat().st_size // 2),
    "file's header corrupted": lambda path, buf, other: path.write_bytes(path.read_bytes()[:200] + b"\xff\xc4\x00\x03"
                                                                        + path.read_bytes()[204:]),
    "buffer overwritten": lambda path, buf, other: (buf.seek(0), buf.write(other)),
    "buffer truncated": lambda path, buf, other: buf.truncate(len(buf.getvalue()) // 2),
    "truncated images allowed": lambda path, buf, other: setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True),
    "pixel limit lowered": lambda path, buf, other: setattr(Image, "MAX_IMAGE_PIXELS", 100),
}


def _lazy_steps(how: str, moment: str, change: Callable[..., None], path: Path, data: bytes,
                other: bytes) -> list[Any]:
    """open, then ``load()`` (a statement), then ``convert``, then the pixels read; the change at ``moment``."""
    buf = io.BytesIO(data)
    steps: list[Any] = []

    def step(fn: Callable[[], Any]) -> Any:
        try:
            got = fn()
            steps.append(("ok", got.tobytes() if isinstance(got, Image.Image) else got))
            return got
        except Exception as exc:  # noqa: BLE001 - compared with stock's
            steps.append(("raised", type(exc).__name__, str(exc).replace(str(path), "<path>")))
            return None

    handle = open(path, "rb") if how == "file" else None  # noqa: SIM115 - closed below
    try:
        source: Any = {"path": path, "file": handle, "bytes": buf}[how]
        img = step(lambda: Image.open(source))
        if img is None:
            return steps
        if moment == "before load":
            change(path, buf, other)
        step(lambda: img.load() and None)
        if moment == "before convert":
            change(path, buf, other)
        rgb = step(lambda: img.convert("RGB"))
        if moment == "before the pixels":
            change(path, buf, other)
        if rgb is not None:
            step(lambda: rgb)
            step(lambda: T.ToTensor()(rgb).sum().item())
    finally:
        if handle is not None:
            handle.close()
    return steps


@pytest.mark.parametrize("moment", ["before load", "before convert", "before the pixels"])
@pytest.mark.parametrize("how", ["path", "file", "bytes"])
@pytest.mark.parametrize("change", list(LAZY_CHANGES))
def test_a_lazy_image_proves_what_stock_reads(photos, tmp_path, change, how, moment, restored):
    buf = io.BytesIO()
    photos[0].resize((96, 72)).save(buf, "JPEG", quality=88)
    data, other = buf.getvalue(), _other_photo(photos)

    def run(name: str) -> list[Any]:
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(data)
        out = _lazy_steps(how, moment, LAZY_CHANGES[change], path, data, other)
        restored()
        return out

    stock = run("stock")
    nano_patch.patch_torch()
    assert run("patched") == stock


def test_the_backend_is_read_at_each_batch(source_folder, tmp_path):
    """torchvision's image backend is among what a batch made ahead proves (``accimage`` is not installed here:
    the backend read is checked directly)."""
    from nano_patch.data.threads import batches_ahead

    nano_patch.patch_torch(loader_threads=2)
    it = iter(DataLoader(ImageFolder(str(source_folder), _tf()), batch_size=BATCH))
    next(it)
    then = batches_ahead._Reads.now(it)
    assert then is not None and then.changed(then) is None
    real = torchvision.get_image_backend
    try:
        torchvision.get_image_backend = lambda: "accimage"  # type: ignore[assignment]
        now = batches_ahead._Reads.now(it)
    finally:
        torchvision.get_image_backend = real  # type: ignore[assignment]
    assert now is not None and now.changed(then) == "torchvision's image backend changed"
