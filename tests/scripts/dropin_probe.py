"""Drop-in probe: ways a real project loads an image folder, each recorded as a list of events.

Run once per mode in a fresh process: ``python dropin_probe.py MODE ROOT OUT [CASE ...]``, MODE one of

- ``stock``: nothing patched, ``num_workers=0``;
- ``on`` / ``off``: ``nano_patch.patch_torch(loader_threads=2 / "off")``, ``num_workers=0``;
- ``stock-workers`` / ``workers``: stock, or patched with loader threads on, and ``num_workers=2`` (fork).

Each case seeds every generator, builds its dataset over the folders under ROOT (made by ``make_folders``), runs
its loader(s), and records every batch (dtype, shape, bytes; PIL images with mode, size and ``info``), the three
global generators' states after each batch, the exception it ends with (class and ``str``), every warning (under
``"always"``) and its own Python state (call counts, its own generators). The test compares the stock and
patched records of each case event by event (``tests/test_dropin_probe.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

MODE = "stock"
WORKERS = 0
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# --- the folders ------------------------------------------------------------------------------------------------

def make_folders(root: Path, photos: list[Image.Image]) -> None:
    """``plain``: 12 JPEGs in two classes; ``tiny``: one of them 30 x 20; ``small6``: the seventh 40 x 40;
    ``trunc<N>``: the N-th file (in ImageFolder's order) truncated; ``missing``: a file removed after listing is
    simulated by the cases; ``mixed``: a grey JPEG, a PNG, a JPEG with EXIF and DPI; ``bomb``: plain, for a lowered
    MAX_IMAGE_PIXELS."""
    plain = root / "plain"
    for cls in ("a", "b"):
        (plain / cls).mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(photos):
        for j in range(4):
            w, h = im.size
            crop = im.crop((j * 10, j * 7, w - j * 5, h - j * 3))
            crop.save(plain / ("a" if (i + j) % 2 else "b") / f"p{i}_{j}.jpg", quality=88, dpi=(72 + j, 72 + j))
    files = sorted(p for p in plain.rglob("*.jpg"))
    tiny = root / "tiny"
    shutil.copytree(plain, tiny)
    Image.open(files[3]).resize((30, 20)).save(tiny / files[3].relative_to(plain), quality=90)
    for n in range(4):
        t = root / f"trunc{n}"
        shutil.copytree(plain, t)
        data = (t / files[n].relative_to(plain)).read_bytes()
        (t / files[n].relative_to(plain)).write_bytes(data[: len(data) // 2])
    small = root / "small6"  # the seventh file (in ImageFolder's order) 40 x 40: too small for RandomCrop(64)
    shutil.copytree(plain, small)
    Image.open(files[6]).resize((40, 40)).save(small / files[6].relative_to(plain), quality=90)
    mixed = root / "mixed"
    shutil.copytree(plain, mixed)
    photos[0].convert("L").save(mixed / "a" / "grey.jpg", quality=90)
    photos[1].save(mixed / "b" / "png.png")
    exif = Image.Exif()
    exif[0x010F] = "probe camera"
    photos[2].resize((200, 150)).save(mixed / "b" / "exif.jpg", quality=85, exif=exif.tobytes(), dpi=(300, 300))


# --- recording --------------------------------------------------------------------------------------------------

def error(exc: BaseException) -> str:
    """The exception as a user's code sees it: class and ``str``. A worker's error is torch's re-raise, whose
    message holds the worker's traceback text (frame by frame, the patch's frames among them): its first line and
    the original error's line are kept (notes, printed after it, are left out as a traceback shows them)."""
    text = str(exc)
    if text.startswith("Caught ") and "Original Traceback" in text:
        lines = text.strip().splitlines()
        own = [line for line in lines if line.startswith(f"{type(exc).__name__}: ")]
        text = f"{lines[0]} ... {own[-1] if own else lines[-1]}"
    return f"raised {type(exc).__name__}: {text}"


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def add(self, what: str) -> None:
        self.events.append(what)

    def value(self, x: Any) -> str:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            flags = f" inference={t.is_inference()} grad={t.requires_grad}"
            data = t.contiguous().cpu()
            digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()[:16]
            return f"T[{t.dtype},{tuple(t.shape)},{tuple(t.stride())},{digest}{flags}]"
        if isinstance(x, Image.Image):
            digest = hashlib.sha256(x.tobytes()).hexdigest()[:16]
            info = {k: (hashlib.sha256(v).hexdigest()[:8] if isinstance(v, bytes) else v) for k, v in x.info.items()}
            return f"PIL[{type(x).__name__},{x.mode},{x.size},{digest},{sorted(info.items(), key=str)}]"
        if isinstance(x, (list, tuple)):
            inner = ",".join(self.value(v) for v in x)
            return f"{type(x).__name__}({inner})"
        if isinstance(x, dict):
            return "{" + ",".join(f"{k}:{self.value(v)}" for k, v in sorted(x.items(), key=str)) + "}"
        return repr(x)

    def generators(self, where: str) -> None:
        t = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:12]
        p = hashlib.sha256(repr(random.getstate()).encode()).hexdigest()[:12]
        n = hashlib.sha256(repr(np.random.get_state()).encode()).hexdigest()[:12]
        self.add(f"{where}: generators torch={t} random={p} numpy={n}")

    def warnings(self, caught: list[Any]) -> None:
        """The warnings caught, as the user sees them (the patch's own notices and ResourceWarnings left out)."""
        for w in caught:
            if "nano-patch" in str(w.message) or w.category.__name__ in ("NanoPatchWarning", "ResourceWarning"):
                continue
            self.add(f"warning {w.category.__name__}: {w.message}")


def seed(n: int = 3) -> None:
    torch.manual_seed(n)
    random.seed(n)
    np.random.seed(n)


def run_cases(run_case: Callable[[dict[str, Any], Path, bool], list[str]], preload: list[str],
              preload_stock_only: bool = False) -> None:
    """A matrix script's ``main``: ``SIDE START_METHOD ROOT CASES_JSON OUT_JSON`` from the command line, each case's
    events (``run_case(case, root, patched)``) written to OUT_JSON. ``preload``: what the forkserver imports once (a
    setting of the user's own, which changes no result); ``preload_stock_only``: only on stock's side.
    ``MATRIX_TIMES=1`` prints each case's seconds."""
    import multiprocessing
    import time

    side, method, root, cases_json, out = sys.argv[1:6]
    multiprocessing.set_start_method(method, force=True)
    if method == "forkserver" and (side == "stock" or not preload_stock_only):
        multiprocessing.set_forkserver_preload(preload)
    results = {}
    for c in json.loads(Path(cases_json).read_text()):
        start = time.perf_counter()
        results[c["id"]] = run_case(c, Path(root), side == "patched")
        if os.environ.get("MATRIX_TIMES"):
            print(f"{time.perf_counter() - start:6.2f} s  {c['id']}", file=sys.stderr)
    Path(out).write_text(json.dumps(results))


def loader(ds: Any, **kw: Any) -> torch.utils.data.DataLoader:
    kw.setdefault("num_workers", WORKERS)
    if kw["num_workers"]:
        kw.setdefault("multiprocessing_context", "fork")
    return torch.utils.data.DataLoader(ds, **kw)


def epochs(rec: Recorder, dl: Any, n: int = 1) -> None:
    for e in range(n):
        for b, batch in enumerate(dl):
            rec.add(f"epoch {e} batch {b}: {rec.value(batch)}")
            rec.generators(f"epoch {e} batch {b}")


def tf_crop(size: int = 64) -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def folder(root: Path, name: str, transform: Any = None, **kw: Any) -> Any:
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(root / name), transform=transform, **kw)


class Counter:
    """A target_transform that counts its calls (and optionally draws from its own or a global generator)."""

    def __init__(self, draw: str | None = None) -> None:
        self.calls: list[Any] = []
        self.draw = draw
        self.own = random.Random(7)

    def __call__(self, y: Any) -> Any:
        self.calls.append(y)
        if self.draw == "own":
            return y * 100 + self.own.randrange(100)
        if self.draw == "torch":
            return y * 100 + int(torch.randint(100, ()))
        if self.draw == "python":
            return y * 100 + random.randrange(100)
        return y

    def state(self) -> str:
        return f"calls={self.calls} own={self.own.random()}"


# --- the cases --------------------------------------------------------------------------------------------------

CASES: dict[str, Callable[[Recorder, Path], None]] = {}


def case(fn: Callable[[Recorder, Path], None]) -> Callable[[Recorder, Path], None]:
    CASES[fn.__name__] = fn
    return fn


@case
def target_transform_fallback_tiny(rec: Recorder, root: Path) -> None:
    """A crop larger than a small image sends a sample to stock's code; the user's target_transform
    runs once per sample."""
    import torchvision.transforms as T

    tt = Counter("own")
    ds = folder(root, "tiny", T.Compose([T.CenterCrop(64), T.ToTensor()]), target_transform=tt)
    epochs(rec, loader(ds, batch_size=4), 2)
    rec.add(tt.state())


@case
def target_transform_draws_torch(rec: Recorder, root: Path) -> None:
    tt = Counter("torch")
    ds = folder(root, "plain", tf_crop(), target_transform=tt)
    epochs(rec, loader(ds, batch_size=4, shuffle=True), 2)
    rec.add(tt.state())


@case
def target_transform_draws_python(rec: Recorder, root: Path) -> None:
    tt = Counter("python")
    ds = folder(root, "tiny", tf_crop(48), target_transform=tt)
    epochs(rec, loader(ds, batch_size=5, shuffle=True), 1)
    rec.add(tt.state())


def _truncated(rec: Recorder, root: Path, n: int, batch_size: int = 4, shuffle: bool = False) -> None:
    tt = Counter("own")
    ds = folder(root, f"trunc{n}", tf_crop(), target_transform=tt)
    try:
        epochs(rec, loader(ds, batch_size=batch_size, shuffle=shuffle))
    except Exception as exc:  # noqa: BLE001 - recorded
        rec.add(error(exc))
        rec.generators("after the error")
    rec.add(tt.state())


@case
def error_at_position_0(rec: Recorder, root: Path) -> None:
    _truncated(rec, root, 0)


@case
def error_at_position_1(rec: Recorder, root: Path) -> None:
    _truncated(rec, root, 1)


@case
def error_at_position_2(rec: Recorder, root: Path) -> None:
    _truncated(rec, root, 2)


@case
def error_at_position_3(rec: Recorder, root: Path) -> None:
    _truncated(rec, root, 3)


@case
def error_shuffled_batch_of_3(rec: Recorder, root: Path) -> None:
    _truncated(rec, root, 2, batch_size=3, shuffle=True)


@case
def missing_file_mid_batch(rec: Recorder, root: Path) -> None:
    tt = Counter("own")
    ds = folder(root, "plain", tf_crop(), target_transform=tt)
    path, y = ds.samples[2]
    ds.samples[2] = (path + ".gone", y)
    try:
        epochs(rec, loader(ds, batch_size=4))
    except Exception as exc:  # noqa: BLE001 - recorded
        rec.add(error(exc))
        rec.generators("after the error")
    rec.add(tt.state())


@case
def decompression_bomb_warning(rec: Recorder, root: Path) -> None:
    """A warning given in the draw is given once, also when the batch then falls back."""
    import torchvision.transforms as T

    tt = Counter()
    Image.MAX_IMAGE_PIXELS = 60_000  # the photos are ~100k-200k px: a warning each, no error
    try:
        ds = folder(root, "tiny", T.Compose([T.CenterCrop(64), T.ToTensor()]), target_transform=tt)
        epochs(rec, loader(ds, batch_size=4))
    finally:
        Image.MAX_IMAGE_PIXELS = 89478485
    rec.add(tt.state())


@case
def inference_mode_list_collate(rec: Recorder, root: Path) -> None:
    """Samples rendered under the caller's inference mode are inference tensors."""
    ds = folder(root, "plain", tf_crop())
    with torch.inference_mode():
        epochs(rec, loader(ds, batch_size=4, collate_fn=list))


@case
def no_grad_and_autocast_list_collate(rec: Recorder, root: Path) -> None:
    ds = folder(root, "plain", tf_crop())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        epochs(rec, loader(ds, batch_size=4, collate_fn=lambda b: b))


class Wrap(torch.utils.data.Dataset):
    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.lookups = 0

    def __getattr__(self, name: str) -> Any:
        self.__dict__["lookups"] = self.__dict__.get("lookups", 0) + 1
        return getattr(self.__dict__["ds"], name)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        return (*self.ds[i], i)


@case
def getattr_wrapper(rec: Recorder, root: Path) -> None:
    """A wrapper that forwards attributes keeps its own __getitem__."""
    w = Wrap(folder(root, "plain", tf_crop()))
    epochs(rec, loader(w, batch_size=4, shuffle=True))
    rec.add(f"lookups={w.lookups}")


@case
def getattr_wrapper_in_subset(rec: Recorder, root: Path) -> None:
    w = Wrap(folder(root, "plain", tf_crop()))
    epochs(rec, loader(torch.utils.data.Subset(w, [5, 3, 1, 0, 7, 9]), batch_size=4))
    rec.add(f"lookups={w.lookups}")


@case
def subclass_overrides_getitem(rec: Recorder, root: Path) -> None:
    from torchvision.datasets import ImageFolder

    class Tagged(ImageFolder):
        def __getitem__(self, i: int) -> Any:
            x, y = super().__getitem__(i)
            return x, y + 100, i

    epochs(rec, loader(Tagged(str(root / "plain"), transform=tf_crop()), batch_size=4, shuffle=True))


@case
def v2_wrapper(rec: Recorder, root: Path) -> None:
    from torchvision.datasets import wrap_dataset_for_transforms_v2

    ds = wrap_dataset_for_transforms_v2(folder(root, "plain", tf_crop()))
    epochs(rec, loader(ds, batch_size=4, shuffle=True))


@case
def subset_concat_stack(rec: Recorder, root: Path) -> None:
    from torch.utils.data import ConcatDataset, StackDataset, Subset

    a, b = folder(root, "plain", tf_crop()), folder(root, "mixed", tf_crop())
    epochs(rec, loader(Subset(a, [9, 2, 4, 7, 1]), batch_size=2))
    epochs(rec, loader(ConcatDataset([a, b]), batch_size=5, shuffle=True))
    epochs(rec, loader(StackDataset(a, Subset(b, range(12))), batch_size=4))
    epochs(rec, loader(StackDataset(x=a, y=a), batch_size=3))


@case
def random_split_and_subset_random_sampler(rec: Recorder, root: Path) -> None:
    from torch.utils.data import SubsetRandomSampler, random_split

    ds = folder(root, "plain", tf_crop())
    train, val = random_split(ds, [8, 4], generator=torch.Generator().manual_seed(1))
    epochs(rec, loader(train, batch_size=3, shuffle=True))
    epochs(rec, loader(val, batch_size=3))
    epochs(rec, loader(ds, batch_size=4, sampler=SubsetRandomSampler([1, 4, 6, 8, 10])))


@case
def samplers_and_drop_last(rec: Recorder, root: Path) -> None:
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, WeightedRandomSampler

    ds = folder(root, "plain", tf_crop())
    epochs(rec, loader(ds, batch_size=5, drop_last=True, shuffle=True))
    epochs(rec, loader(ds, batch_size=5, sampler=WeightedRandomSampler([1.0] * 12, 9)))
    epochs(rec, loader(ds, batch_size=4, sampler=RandomSampler(ds, replacement=True, num_samples=7)))
    epochs(rec, loader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 5, drop_last=False)))
    epochs(rec, loader(ds, batch_sampler=[[3, 3, 1], [11, 0], [5]]))
    epochs(rec, loader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)))


@case
def batch_size_none(rec: Recorder, root: Path) -> None:
    ds = folder(root, "plain", tf_crop())
    dl = loader(ds, batch_size=None, shuffle=True)
    for i, sample in enumerate(dl):
        rec.add(f"sample {i}: {rec.value(sample)}")
        if i == 5:
            break
    rec.generators("end")


@case
def collate_variants(rec: Recorder, root: Path) -> None:
    from torch.utils.data import default_collate

    ds = folder(root, "plain", tf_crop())
    seen: list[int] = []

    def as_dict(batch: list[Any]) -> dict[str, Any]:
        seen.append(len(batch))
        return {"x": torch.stack([b[0] for b in batch]), "y": [b[1] for b in batch], "draw": torch.rand(())}

    epochs(rec, loader(ds, batch_size=4, collate_fn=as_dict, shuffle=True))
    epochs(rec, loader(ds, batch_size=5, collate_fn=lambda b: default_collate(b[::-1])))
    epochs(rec, loader(ds, batch_size=6, collate_fn=list))
    rec.add(f"seen={seen}")


@case
def pil_samples_info(rec: Recorder, root: Path) -> None:
    """PIL samples carry stock's info (transform None; a Compose that ends on an image)."""
    import torchvision.transforms as T

    ds = folder(root, "mixed", None)
    epochs(rec, loader(ds, batch_size=4, collate_fn=list))
    ds2 = folder(root, "mixed", T.Compose([T.RandomResizedCrop(50), T.RandomHorizontalFlip()]))
    epochs(rec, loader(ds2, batch_size=4, collate_fn=list, shuffle=True))
    ds3 = folder(root, "mixed", T.Compose([T.Resize(40), T.ColorJitter(0.2, 0.2, 0.2, 0.05)]))
    epochs(rec, loader(ds3, batch_size=5, collate_fn=list))


@case
def error_message_is_stocks(rec: Recorder, root: Path) -> None:
    """str() of the error is stock's (the patch's path is a note)."""
    import torchvision.transforms as T

    ds = folder(root, "trunc1", T.Compose([T.Resize(40), T.ToTensor()]))
    for i in (0, 1):
        try:
            rec.add(f"sample {i}: {rec.value(ds[i])}")
        except Exception as exc:  # noqa: BLE001 - recorded
            rec.add(error(exc))
    try:
        epochs(rec, loader(ds, batch_size=4))
    except Exception as exc:  # noqa: BLE001 - recorded
        rec.add(error(exc))


@case
def lambda_and_stateful_transform(rec: Recorder, root: Path) -> None:
    import torchvision.transforms as T

    calls: list[tuple[int, int]] = []
    ds = folder(root, "plain", T.Compose([T.RandomResizedCrop(48), T.Lambda(lambda im: calls.append(im.size) or im),
                                          T.ToTensor()]))
    epochs(rec, loader(ds, batch_size=4, shuffle=True))
    rec.add(f"calls={calls}")


@case
def custom_loader(rec: Recorder, root: Path) -> None:
    from torchvision.datasets import ImageFolder

    opened: list[str] = []

    def load(path: str) -> Image.Image:
        opened.append(os.path.basename(path))
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    ds = ImageFolder(str(root / "plain"), transform=tf_crop(), loader=load)
    epochs(rec, loader(ds, batch_size=4, shuffle=True))
    rec.add(f"opened={opened}")


@case
def policies_and_mixed_files(rec: Recorder, root: Path) -> None:
    import torchvision.transforms as T

    tt = Counter("own")
    ds = folder(root, "mixed", T.Compose([T.RandomResizedCrop(64), T.RandAugment(), T.ToTensor()]),
                target_transform=tt)
    epochs(rec, loader(ds, batch_size=4, shuffle=True), 2)
    rec.add(tt.state())


@case
def timm_rand_augment_small_images(rec: Recorder, root: Path) -> None:
    try:
        from timm.data import ImageDataset, create_transform
    except ImportError:
        rec.add("timm not installed")
        return
    tt = Counter("own")
    tf = create_transform(48, is_training=True, auto_augment="rand-m9-mstd0.5")
    ds = ImageDataset(str(root / "tiny"), transform=tf, target_transform=tt)
    epochs(rec, loader(ds, batch_size=4, shuffle=True), 2)
    rec.add(tt.state())


@case
def two_loaders_interleaved(rec: Recorder, root: Path) -> None:
    a = loader(folder(root, "plain", tf_crop()), batch_size=4, shuffle=True)
    b = loader(folder(root, "tiny", tf_crop(40), target_transform=Counter("torch")), batch_size=3)
    for i, (x, y) in enumerate(zip(a, b)):
        rec.add(f"pair {i}: {rec.value(x)} {rec.value(y)}")
        rec.generators(f"pair {i}")


@case
def lightning_seed_everything(rec: Recorder, root: Path) -> None:
    try:
        from lightning.pytorch import seed_everything
    except ImportError:
        rec.add("lightning not installed")
        return
    seed_everything(11, workers=True, verbose=False)
    epochs(rec, loader(folder(root, "plain", tf_crop()), batch_size=4, shuffle=True), 2)


@case
def lightning_wrappers(rec: Recorder, root: Path) -> None:
    """Lightning re-creates a loader with its distributed sampler (``_update_dataloader``), records dataset
    arguments while datasets are built (``_replace_dunder_methods``), and combines loaders (``CombinedLoader``)."""
    try:
        from lightning.fabric.utilities.data import _replace_dunder_methods, _update_dataloader
        from lightning.pytorch.utilities import CombinedLoader
    except ImportError:
        rec.add("lightning not installed")
        return
    from torch.utils.data import Dataset, DistributedSampler

    with _replace_dunder_methods(Dataset, "dataset"):
        inner = folder(root, "plain", tf_crop())
        b = folder(root, "tiny", tf_crop(40), target_transform=Counter("own"))
    a = Wrap(inner)
    dl = _update_dataloader(loader(a, batch_size=3), DistributedSampler(a, num_replicas=2, rank=1, seed=4))
    epochs(rec, dl)
    combined = CombinedLoader({"a": loader(b, batch_size=2), "b": loader(a, batch_size=4, shuffle=True)},
                              "max_size_cycle")
    for i, (batch, _, _) in enumerate(combined):
        rec.add(f"combined {i}: {rec.value(batch)}")
        rec.generators(f"combined {i}")
    rec.add(b.target_transform.state())


def _workers_kw(**kw: Any) -> dict[str, Any]:
    """Worker arguments that only a loader with workers takes (the num_workers=0 modes leave them out)."""
    return kw if WORKERS else {}


@case
def persistent_workers_three_epochs(rec: Recorder, root: Path) -> None:
    dl = loader(folder(root, "plain", tf_crop()), batch_size=3, shuffle=True,
                **_workers_kw(persistent_workers=True, prefetch_factor=1))
    epochs(rec, dl, 3)


@case
def persistent_workers_epoch_left_early(rec: Recorder, root: Path) -> None:
    """An epoch left after one batch: stock's persistent workers load what was sent to them before the next."""
    dl = loader(folder(root, "plain", tf_crop()), batch_size=2, shuffle=True, **_workers_kw(persistent_workers=True))
    for e in range(3):
        for b, batch in enumerate(dl):
            rec.add(f"epoch {e} batch {b}: {rec.value(batch)}")
            rec.generators(f"epoch {e} batch {b}")
            if e == 0:
                break


def _own_init(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)
    random.seed(worker_id)


@case
def own_worker_init_fn(rec: Recorder, root: Path) -> None:
    epochs(rec, loader(folder(root, "plain", tf_crop()), batch_size=4, shuffle=True,
                       **_workers_kw(worker_init_fn=_own_init)), 2)


@case
def lightning_worker_seeding(rec: Recorder, root: Path) -> None:
    """``seed_everything(workers=True)``'s worker_init_fn, as Lightning's Trainer injects it (with the rank)."""
    import functools

    try:
        from lightning.fabric.utilities.seed import pl_worker_init_function
    except ImportError:
        rec.add("lightning not installed")
        return
    init = functools.partial(pl_worker_init_function, rank=0)
    epochs(rec, loader(folder(root, "plain", tf_crop()), batch_size=4, shuffle=True,
                       **_workers_kw(worker_init_fn=init)), 2)


@case
def dataset_changed_between_epochs(rec: Recorder, root: Path) -> None:
    import torchvision.transforms as T

    for persistent in (False, True):
        ds = folder(root, "plain", tf_crop())
        dl = loader(ds, batch_size=3, shuffle=True, **_workers_kw(persistent_workers=persistent))
        epochs(rec, dl)
        ds.transform.transforms[0] = T.RandomResizedCrop(40, scale=(0.5, 1.0))
        del ds.samples[-4:]
        epochs(rec, dl)


def _small_crop(rec: Recorder, root: Path, tt: Any, epochs_n: int = 2) -> None:
    """RandomCrop(64) over a folder whose seventh sample is 40 x 40, batch 4, in order: stock raises at it, after
    the batch's samples before it; each error is recorded and the epoch goes on."""
    import torchvision.transforms as T

    ds = folder(root, "small6", T.Compose([T.RandomCrop(64), T.RandomHorizontalFlip(), T.ToTensor()]),
                target_transform=tt)
    dl = loader(ds, batch_size=4)
    for e in range(epochs_n):
        it = iter(dl)
        b = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - recorded
                rec.add(f"epoch {e} batch {b}: {error(exc)}")
                rec.generators(f"epoch {e} batch {b}")
                b += 1
                continue
            rec.add(f"epoch {e} batch {b}: {rec.value(batch)}")
            rec.generators(f"epoch {e} batch {b}")
            b += 1
    if tt is not None:
        rec.add(tt.state())


@case
def draw_raises_mid_batch_counting(rec: Recorder, root: Path) -> None:
    """A draw that raises mid-batch (RandomCrop over a too-small image): the samples before it are taken first,
    their target_transform run, as stock's loop takes them; then stock's error."""
    _small_crop(rec, root, Counter())


@case
def draw_raises_mid_batch(rec: Recorder, root: Path) -> None:
    _small_crop(rec, root, None)


@case
def two_threads_one_loader(rec: Recorder, root: Path) -> None:
    """Two threads of the user's iterate one loader at once: whatever the interleaving, the global generator ends
    where stock's draws leave it (every draw of both made once, from the one generator)."""
    import threading

    import torchvision.transforms as T

    # a fixed number of draws per sample (RandomResizedCrop's retries would make the total depend on the
    # interleaving, on stock too)
    tf = T.Compose([T.RandomCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])
    dl = loader(folder(root, "plain", tf), batch_size=2, shuffle=True)
    counts = [0, 0]

    def run(k: int) -> None:
        for _ in range(3):
            for _ in dl:
                counts[k] += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.add(f"batches {counts}")


# --- the runner ---------------------------------------------------------------------------------------------------

def run(mode: str, root: Path, names: list[str]) -> dict[str, list[str]]:
    global MODE, WORKERS
    MODE = mode
    WORKERS = 2 if mode.endswith("workers") else 0
    if mode not in ("stock", "stock-workers"):
        import nano_patch

        nano_patch.patch_torch(loader_threads="off" if mode == "off" else 2)
    out: dict[str, list[str]] = {}
    for name in names:
        rec = Recorder()
        seed()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                CASES[name](rec, root)
            except Exception as exc:  # noqa: BLE001 - recorded
                rec.add(f"case {error(exc)}")
        rec.generators("case end")
        rec.warnings(caught)
        out[name] = rec.events
    return out


def main() -> None:
    mode, root, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    names = sys.argv[4:] or list(CASES)
    if mode == "make":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from conftest import photo_sources

        photos = []
        for i, p in enumerate(photo_sources()):
            im = Image.open(p).convert("RGB")
            im.thumbnail((400 - 60 * i, 400 - 60 * i))
            photos.append(im)
        make_folders(root, photos)
        return
    dest.write_text(json.dumps(run(mode, root, names)))


if __name__ == "__main__":
    main()
