"""The batch path runs the user's code as stock does, checked in-process against stock run first.

- a sample that needs stock's code is loaded at its place: every ``target_transform`` runs once per sample, each
  warning is given once, an error comes at stock's sample with stock's generators;
- renders on the loader's threads run in the calling thread's torch state (grad, inference mode, autocast...);
- batches reach the patched loader only where stock's fetcher would call the patched ``__getitem__``;
- errors carry stock's ``str()`` (the path is a note), PIL samples stock's ``info``.

``tests/test_dropin_probe.py`` runs the broader probe in fresh processes.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
import warnings
from typing import Any

import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state, seed_all
from PIL import Image
from torch.utils.data import DataLoader

import nano_patch
from nano_patch.data.batches import batch_render
from nano_patch.data.threads import render_pool
from nano_patch.vision.plans import compose_plan


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, image_folder):
    """``image_folder`` with its fourth file (ImageFolder's order) made 30 x 20: a CenterCrop(64) pads it, which
    the plan leaves to stock's code."""
    root = tmp_path_factory.mktemp("tiny")
    shutil.copytree(image_folder, root, dirs_exist_ok=True)
    files = sorted(root.rglob("*.jpg"))
    Image.open(files[3]).resize((30, 20)).save(files[3], quality=90)
    return root


class Labels:
    """A target_transform with its own generator, counting its calls."""

    def __init__(self):
        self.calls = 0
        self.own = random.Random(7)

    def __call__(self, y):
        self.calls += 1
        return y * 100 + self.own.randrange(100)


def _run(folder, make_tf, tt=None, batch_size=4, epochs=2, **kw):
    from torchvision.datasets import ImageFolder

    seed_all(3)
    ds = ImageFolder(str(folder), transform=make_tf(), target_transform=tt)
    out = []
    for _ in range(epochs):
        for x, y in DataLoader(ds, batch_size=batch_size, **kw):
            out.append((x.clone(), y.clone()))
        out.append(rng_state())
    return out


def _same(stock, patched):
    assert len(stock) == len(patched)
    for want, got in zip(stock, patched):
        if len(want) == 3:
            assert rng_differences(got, want) == []
        else:
            assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_a_sample_that_falls_back_runs_its_target_transform_once(tiny_folder):
    """Stock makes 9 calls an epoch; a batch path that replayed the batch would make more (and give other labels)."""
    def tf():
        return T.Compose([T.CenterCrop(64), T.ToTensor()])

    stock_tt, patched_tt = Labels(), Labels()
    stock = _run(tiny_folder, tf, stock_tt)  # the small file is the first batch's last sample
    nano_patch.patch_torch(loader_threads=2)
    patched = _run(tiny_folder, tf, patched_tt)
    assert patched_tt.calls == stock_tt.calls == 2 * 9  # 9 files, 2 epochs
    _same(stock, patched)


def _crop_flip_jitter():
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor()])


@pytest.mark.parametrize("with_target_transform", [False, True])
def test_a_sample_whose_draw_needs_pixels_is_loaded_at_its_place(tiny_folder, with_target_transform):
    """Without a target_transform the generators before it are found by drawing the run's samples again."""
    def tf():  # CenterCrop pads the 30 x 20 file: stock's code; draws before and after it
        return T.Compose([T.RandomHorizontalFlip(), T.CenterCrop(64), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor()])

    def run():
        tt = Labels() if with_target_transform else None
        seed_all(4)
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(tiny_folder), transform=tf(), target_transform=tt)
        try:
            return [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=4, shuffle=True)], None, rng_state()
        except Exception as exc:  # noqa: BLE001 - compared with stock's
            return None, (type(exc), str(exc)), rng_state()

    stock = run()
    nano_patch.patch_torch(loader_threads=2)
    patched = run()
    assert patched[1] == stock[1] is None
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(stock[0], patched[0]))
    assert rng_differences(patched[2], stock[2]) == []


@pytest.mark.parametrize("with_target_transform", [False, True])
@pytest.mark.parametrize("position", [0, 2, 3])
def test_a_render_that_fails_loads_that_sample_as_stock_in_its_place(image_folder, monkeypatch, position,
                                                                       with_target_transform):
    """A render the plan cannot make (simulated): that sample by stock's code from stock's state before it, the
    samples after it one by one, the next batch on the threads again."""
    from torchvision.datasets import ImageFolder

    def run():
        seed_all(6)
        tt = Labels() if with_target_transform else None
        ds = ImageFolder(str(image_folder), transform=_crop_flip_jitter(), target_transform=tt)
        out = [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=4)]
        return out, rng_state(), (tt.calls, tt.own.random()) if tt is not None else None

    stock = run()
    nano_patch.patch_torch(loader_threads=2)
    victim = sorted(str(p) for p in image_folder.rglob("*.jpg"))[position]
    real, failed = batch_render.render_job, []

    def render(job):
        if str(job.path) == victim:
            failed.append(job.path)
            raise compose_plan.RenderFailed("simulated")
        return real(job)

    monkeypatch.setattr(batch_render, "render_job", render)
    patched = run()
    assert failed == [victim]
    assert len(patched[0]) == len(stock[0])
    for (wx, wy), (gx, gy) in zip(stock[0], patched[0]):
        assert torch.equal(wx, gx) and torch.equal(wy, gy)
    assert rng_differences(patched[1], stock[1]) == []
    assert patched[2] == stock[2]


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_an_error_at_any_position_is_stocks_with_stocks_generators_and_calls(image_folder, tmp_path, position):
    from torchvision.datasets import ImageFolder

    root = tmp_path / "broken"
    shutil.copytree(image_folder, root)
    victim = sorted(root.rglob("*.jpg"))[position]
    victim.write_bytes(victim.read_bytes()[:3000])

    def run():
        seed_all(5)
        tt = Labels()
        ds = ImageFolder(str(root), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]), target_transform=tt)
        with pytest.raises(OSError) as raised:
            next(iter(DataLoader(ds, batch_size=4)))
        return str(raised.value), rng_state(), tt.calls, tt.own.random()

    stock = run()
    nano_patch.patch_torch(loader_threads=2)
    patched = run()
    assert patched[0] == stock[0]
    assert rng_differences(patched[1], stock[1]) == []
    assert patched[2:] == stock[2:] == (position, stock[3])


def test_a_warning_given_in_the_draw_is_given_once(tiny_folder, monkeypatch):
    """PIL's DecompressionBombWarning, under "always", once per opened file."""
    def count():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run(tiny_folder, lambda: T.Compose([T.CenterCrop(64), T.ToTensor()]), Labels(), epochs=1)
        return sum(issubclass(w.category, Image.DecompressionBombWarning) for w in caught)

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 90_000)  # the larger photos warn (none reaches twice that)
    stock = count()
    nano_patch.patch_torch(loader_threads=2)
    assert count() == stock >= 3


def test_a_target_transform_that_draws_from_torch_loads_that_dataset_one_by_one(image_folder, monkeypatch, tmp_path):
    def tt(y):
        return y * 100 + int(torch.randint(100, ()))

    def tf():
        return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])

    from nano_patch import report

    stock = _run(image_folder, tf, tt, shuffle=True)
    nano_patch.patch_torch(loader_threads=2)
    monkeypatch.setattr(report, "stats", report.Stats(str(tmp_path)))
    patched = _run(image_folder, tf, tt, shuffle=True)
    _same(stock, patched)
    reasons = [reason for (_, fast, reason) in report.stats.counts if not fast]
    assert "batch loaded one by one: its target_transform draws from the global random generators" in reasons


# --- torch state ----------------------------------------------------------------------------------------------

def _state_now():
    """What a render can observe (autocast's dtype matters where autocast is on)."""
    on = torch.is_autocast_enabled("cpu")
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), on,
            torch.get_autocast_dtype("cpu") if on else None, torch.is_autocast_cache_enabled(),
            torch._C._is_fwd_grad_enabled())


@pytest.fixture
def render_states(monkeypatch):
    """(thread, torch state) of every render; each render waits a little, so that the pool's threads take some."""
    seen = []
    real = batch_render.render_job

    def observed(job):
        seen.append((threading.get_ident(), _state_now()))
        time.sleep(0.02)
        return real(job)

    monkeypatch.setattr(batch_render, "render_job", observed)
    return seen


def _set_fwd_grad(enabled):
    class Ctx:
        def __enter__(self):
            self.old = torch._C._is_fwd_grad_enabled()
            torch._C._set_fwd_grad_enabled(enabled)

        def __exit__(self, *exc):
            torch._C._set_fwd_grad_enabled(self.old)

    return Ctx()


def _no_autocast_cache():
    class Ctx:
        def __enter__(self):
            self.old = torch.is_autocast_cache_enabled()
            torch.set_autocast_cache_enabled(False)

        def __exit__(self, *exc):
            torch.set_autocast_cache_enabled(self.old)

    return Ctx()


STATES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast cpu bfloat16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "autocast cpu float16": lambda: torch.autocast("cpu", dtype=torch.float16),
    "autocast cache off": _no_autocast_cache,
    "forward AD off": lambda: _set_fwd_grad(False),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_renders_on_the_pool_run_in_the_callers_torch_state(image_folder, render_states, name):
    """Each render sees the state of the thread that iterates the loader."""
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=3)
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]))
    with STATES[name]():
        caller = _state_now()
        samples = [s for b in DataLoader(ds, batch_size=6, collate_fn=list) for s in b]
    assert caller != _state_now()  # the state was not the default one
    assert {t for t, _ in render_states} - {threading.get_ident()}, "no render ran on a pool thread"
    assert [s for _, s in render_states] == [caller] * len(ds)
    if name == "inference_mode":
        assert all(x.is_inference() for x, _ in samples)


def test_under_inference_mode_the_samples_equal_stocks_and_are_inference_tensors(image_folder):
    from torchvision.datasets import ImageFolder

    def run():
        seed_all(1)
        ds = ImageFolder(str(image_folder), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]))
        with torch.inference_mode():
            return [s for b in DataLoader(ds, batch_size=6, collate_fn=list) for s in b]

    stock = run()
    nano_patch.patch_torch(loader_threads=3)
    patched = run()
    assert [x.is_inference() for x, _ in patched] == [x.is_inference() for x, _ in stock] == [True] * len(stock)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(stock, patched))


def test_a_torch_function_mode_keeps_the_renders_in_the_calling_thread(image_folder, render_states):
    """A mode stack (here ``with torch.device("cpu")``) cannot be entered on another thread: no pool thread."""
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=3)
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]))
    with torch.device("cpu"):
        list(DataLoader(ds, batch_size=6))
    assert {t for t, _ in render_states} == {threading.get_ident()}


def test_the_pool_threads_get_their_own_state_back(image_folder):
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=3)
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.float16):
        list(DataLoader(ds, batch_size=6))
    states: list[tuple[Any, ...]] = []
    for _ in range(6):  # (what the pool's threads hold once the batch is done, each asked on its own thread)
        render_pool.run_on_threads(lambda: states.append((*_state_now(), torch.get_autocast_dtype("cpu"))), 3)
    assert set(states) == {(True, False, False, None, True, True, torch.bfloat16)}


# --- __getitems__ ---------------------------------------------------------------------------------------------

class Wrap(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __getattr__(self, name):
        return getattr(self.__dict__["ds"], name)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return (*self.ds[i], i)


@pytest.mark.parametrize("threads", [2, "off"])
def test_a_getattr_wrapper_keeps_its_own_getitem(image_folder, threads):
    """A wrapper that forwards attributes keeps its own __getitem__: stock gives (img, label, index)."""
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=threads)
    ds = Wrap(ImageFolder(str(image_folder), transform=T.Compose([T.CenterCrop(32), T.ToTensor()])))
    first = next(iter(DataLoader(ds, batch_size=4)))
    assert len(first) == 3 and first[2].tolist() == [0, 1, 2, 3]


def test_the_patched_datasets_have_no_getitems_as_on_stock():
    from timm.data import ImageDataset
    from torchvision.datasets import DatasetFolder, Flowers102, ImageFolder

    nano_patch.patch_torch(loader_threads=2)
    for cls in (DatasetFolder, ImageFolder, Flowers102, ImageDataset):
        assert not hasattr(cls, "__getitems__"), cls


# --- messages and images --------------------------------------------------------------------------------------

def test_a_decode_errors_message_and_notes_are_stocks(image_folder, tmp_path):
    """str() of a decode error is stock's, and the patch adds no note (a worker's error message would carry it)."""
    from torchvision.datasets import ImageFolder

    root = tmp_path / "broken"
    shutil.copytree(image_folder, root)
    victim = sorted(root.rglob("*.jpg"))[1]
    victim.write_bytes(victim.read_bytes()[:3000])

    def error():
        ds = ImageFolder(str(root), transform=T.Compose([T.Resize(40), T.ToTensor()]))
        with pytest.raises(OSError) as raised:
            ds[1]
        return raised.value

    stock = error()
    nano_patch.patch_torch()
    patched = error()
    assert type(patched) is type(stock) and str(patched) == str(stock)
    assert getattr(patched, "__notes__", None) == getattr(stock, "__notes__", None)


@pytest.mark.parametrize("threads", [2, "off"])
def test_pil_samples_carry_stocks_info(image_folder, tmp_path, photos, threads):
    """PIL samples carry stock's info: transform None, and a Compose that ends on an image; JFIF, DPI, EXIF and ICC
    in the info."""
    from torchvision.datasets import ImageFolder

    root = tmp_path / "info"
    shutil.copytree(image_folder, root)
    exif = Image.Exif()
    exif[0x010F] = "test camera"
    photos[0].resize((120, 90)).save(root / "a" / "exif.jpg", exif=exif.tobytes(), dpi=(300, 300), quality=80)
    photos[1].convert("L").save(root / "b" / "grey.jpg", dpi=(96, 96), quality=80)

    def run():
        seed_all(2)
        out = []
        for tf in (None, T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip()])):
            ds = ImageFolder(str(root), transform=tf)
            out += [(im.info, im.tobytes()) for b in DataLoader(ds, batch_size=4, collate_fn=list) for im, _ in b]
        return out

    stock = run()
    assert any("exif" in info for info, _ in stock) and any(info.get("dpi") == (96, 96) for info, _ in stock)
    nano_patch.patch_torch(loader_threads=threads)
    assert run() == stock
