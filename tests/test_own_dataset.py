"""A user's own Dataset (``Image.open(...).convert("RGB")`` then a torchvision ``Compose``) in a DataLoader: the
patched run's batches, draws, warnings and errors are stock's, and its JPEGs really took the lazy path.

Each case runs a training script the test writes (its Dataset classes at module top level, so that worker
processes can pickle them) in fresh processes: once stock, once patched (``patch_torch()`` at the top; the main
case through ``nano-patch run --report``). The script iterates one epoch per run (``torch.manual_seed(0)``,
shuffle, batch size 8, num_workers 0 and 2) and saves every batch, the three generators' states after the epoch,
the warnings caught and any exception (class, message, batch index). A probe at the user's call site counts the
``convert`` results whose pixels were pending (``lazy_jpeg.pending_of``): with the lazy images switched off
(``NANO_PATCH_LAZY_IMAGES=0``) those counts, and only those, differ.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import photo_sources
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import functools, io, json, os, random, sys, warnings

CFG = json.loads(open(os.environ["OWN_DATASET_CFG"]).read())
if CFG["patched"]:
    from nano_patch import patch_torch
    patch_torch()

from PIL import Image, ImageFile, ImageOps

if CFG.get("load_truncated"):
    ImageFile.LOAD_TRUNCATED_IMAGES = True

import numpy as np
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

if CFG["patched"]:
    from nano_patch.vision.images.lazy_jpeg import pending_of
else:  # stock: nothing of nano_patch imported; a lazy image would be a PendingDecode core
    def pending_of(img):
        return vars(img)["_im"] if type(vars(img).get("_im")).__name__ == "PendingDecode" else None


def probe(tag, img):
    """The user's call site, counted: was this convert result lazy?"""
    with open(os.path.join(CFG["probe_dir"], tag + ".txt"), "a") as f:
        f.write("1" if pending_of(img) is not None else "0")


def make_transform():
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.2, 0.2, 0.2),
                      T.ToTensor(), T.Normalize(MEAN, STD)])


class Base(Dataset):
    def __init__(self, files, labels, tag):
        self.files, self.labels, self.tag = files, labels, tag
        self.transform = make_transform()

    def __len__(self):
        return len(self.files)


class PathTuple(Base):
    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        return self.transform(img), self.labels[i]


class FileDict(Base):
    def __getitem__(self, i):
        with open(self.files[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        probe(self.tag, img)
        return {"pixel_values": self.transform(img), "label": self.labels[i]}


class FileLoadDict(Base):
    """Loads the image before its file closes (``img.load()`` as a statement), then converts it."""

    def __getitem__(self, i):
        with open(self.files[i], "rb") as f:
            img = Image.open(f)
            img.load()
            img = img.convert("RGB")
        probe(self.tag, img)
        return {"pixel_values": self.transform(img), "label": self.labels[i]}


class InMemory(Base):
    def __init__(self, files, labels, tag):
        super().__init__(files, labels, tag)
        self.raw = [open(p, "rb").read() for p in files]

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.raw[i])).convert("RGB")
        probe(self.tag, img)
        return self.transform(img), self.labels[i]


class Draws(Base):
    def __getitem__(self, i):
        r = random.random()
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        x = self.transform(img)
        n = np.random.rand()
        t = torch.rand(1)
        return x, self.labels[i], r, n, t


class Peek(Base):
    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        w, h = img.size
        mean = float(np.asarray(img).mean())
        return self.transform(img), self.labels[i], w, h, mean


class Touch(Base):
    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        x = self.transform(img)
        return x * 1.0 + 0, self.labels[i]


class Inplace(Base):
    """Writes to its sample in place inside __getitem__ (torch, then through a NumPy view)."""

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        x = self.transform(img)
        x.add_(0.25)
        a = x.numpy()
        a[0, :2, :2] = 0.0
        return x, self.labels[i], float(a.sum())


class Caching(Base):
    """Keeps every sample it made and returns the very same tensors later (a user's in-memory cache)."""

    def __init__(self, files, labels, tag):
        super().__init__(files, labels, tag)
        self.cache = {}

    def __getitem__(self, i):
        if i in self.cache:
            return self.cache[i]
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        out = (self.transform(img), self.labels[i])
        self.cache[i] = out
        return out


class Subset(torch.utils.data.Subset):
    """A random_split-like subset of the plain dataset (in reverse order)."""

    def __init__(self, files, labels, tag):
        super().__init__(PathTuple(files, labels, tag), list(range(len(files)))[::-1])


class Upright(Base):
    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        probe(self.tag, img)
        img = ImageOps.exif_transpose(img)
        return self.transform(img), self.labels[i]


def record_worker_warnings(tag, worker_id):
    """Warnings in a worker process do not reach the main process: each worker writes its own down."""
    warnings.simplefilter("always")

    def show(message, category, filename, lineno, file=None, line=None):
        with open(os.path.join(CFG["probe_dir"], f"{tag}.warnings-{worker_id}.jsonl"), "a") as f:
            f.write(json.dumps([category.__name__, str(message), os.path.basename(filename)]) + "\n")

    warnings.showwarning = show


def clone(batch):
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return {k: clone(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(clone(v) for v in batch)
    return batch


def scribble(batch):
    """What a training step may do to its batch: float tensors changed in place."""
    if isinstance(batch, torch.Tensor):
        if batch.is_floating_point():
            batch.mul_(-3.0).add_(1.0)
    elif isinstance(batch, dict):
        for v in batch.values():
            scribble(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            scribble(v)


def run(tag, dataset, files, num_workers, limit=None, epochs=1, scribbles=False):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    files, labels = CFG["files"][files]
    ds = globals()[dataset](files, labels, tag)
    kw = dict(batch_size=8, shuffle=True, num_workers=num_workers)
    if num_workers:
        kw["persistent_workers"] = False
        if limit is not None:
            kw["worker_init_fn"] = functools.partial(record_worker_warnings, tag)
    default_limit = Image.MAX_IMAGE_PIXELS
    if limit is not None:
        Image.MAX_IMAGE_PIXELS = limit
    batches, error = [], None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                loader = DataLoader(ds, **kw)
                for _ in range(epochs):
                    for batch in loader:
                        batches.append(clone(batch) if scribbles else batch)
                        if scribbles:
                            scribble(batch)
            except Exception as exc:
                error = [type(exc).__module__ + "." + type(exc).__qualname__, str(exc), len(batches)]
    finally:
        Image.MAX_IMAGE_PIXELS = default_limit
    worker_warnings = {}
    for name in sorted(os.listdir(CFG["probe_dir"])):
        if name.startswith(tag + ".warnings-"):
            with open(os.path.join(CFG["probe_dir"], name)) as f:
                worker_warnings[name.rsplit("-", 1)[1]] = [json.loads(line) for line in f]
    probe_path = os.path.join(CFG["probe_dir"], tag + ".txt")
    seen = open(probe_path).read() if os.path.exists(probe_path) else ""
    return {
        "batches": batches,
        "error": error,
        "torch_rng": torch.get_rng_state(),
        "random_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "warnings": [[w.category.__module__ + "." + w.category.__qualname__, str(w.message),
                      os.path.basename(w.filename)] for w in caught],
        "worker_warnings": worker_warnings,
        "lazy": seen.count("1"),
        "not_lazy": seen.count("0"),
    }


if __name__ == "__main__":
    if CFG.get("start_method"):
        import multiprocessing
        multiprocessing.set_start_method(CFG["start_method"])
    results = {}
    for spec in CFG["runs"]:
        results[spec["tag"]] = run(**spec)
    torch.save(results, CFG["out"])
    print("DONE")
'''

#: What each dataset file is: the plain kinds take the lazy path under the patch.
PLAIN = ("baseline", "progressive", "optimized", "restart", "exif6", "gray")
KINDS = ["baseline"] * 8 + ["progressive"] * 4 + ["optimized", "restart"] + ["exif6"] * 3 + ["gray"] * 3 + \
    ["cmyk"] * 2 + ["png"] * 3  # 25 files: 3 batches of 8 and one of 1
VARIANTS = ("PathTuple", "FileDict", "FileLoadDict", "InMemory", "Draws", "Peek", "Touch", "Inplace", "Upright",
            "Subset")


def _save(im: Image.Image, path: Path, kind: str) -> None:
    if kind == "png":
        im.save(path, format="PNG")
    elif kind == "cmyk":
        im.convert("CMYK").save(path, format="JPEG", quality=90)
    elif kind == "gray":
        im.convert("L").save(path, format="JPEG", quality=90)
    elif kind == "exif6":
        exif = Image.Exif()
        exif[0x0112] = 6
        im.save(path, format="JPEG", quality=90, exif=exif.tobytes())
    else:
        kw = {"progressive": dict(progressive=True), "optimized": dict(optimize=True),
              "restart": dict(restart_marker_rows=1)}.get(kind, {})
        im.save(path, format="JPEG", quality=88, **kw)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict[str, Any]:
    """Small real photos (about 200 x 150) of every kind, a truncated JPEG and one photo four times the size."""
    root = tmp_path_factory.mktemp("own_dataset")
    photos = []
    for p in photo_sources():
        im = Image.open(p).convert("RGB")
        im.thumbnail((400, 300))
        photos.append(im)
    files, labels, plain = [], [], []
    for i, kind in enumerate(KINDS):
        im = photos[i % len(photos)]
        w, h = im.size
        j = i // len(photos)
        crop = im.crop((j * 9, j * 5, w - j * 4, h - j * 7)).resize((200 - j % 3 * 8, 150 - j % 2 * 6),
                                                                     Image.BICUBIC)
        path = root / f"{i:02d}_{kind}.{'png' if kind == 'png' else 'jpg'}"
        _save(crop, path, kind)
        files.append(str(path))
        labels.append(i % 3)
        plain.append(kind in PLAIN)
    big = root / "big.jpg"
    photos[0].save(big, format="JPEG", quality=90)  # about 400 x 267: four times a small one's pixels
    data = (root / "00_baseline.jpg").read_bytes()
    sos = data.find(b"\xff\xda")
    truncated = root / "truncated.jpg"
    truncated.write_bytes(data[: sos + (len(data) - sos) // 2])
    at = 13  # replaces a plain JPEG
    with_truncated = files[:at] + [str(truncated)] + files[at + 1:]
    with_big = files[:at] + [str(big)] + files[at + 1:]
    big_pixels = Image.open(big).size[0] * Image.open(big).size[1]
    small_pixels = max(Image.open(f).size[0] * Image.open(f).size[1] for f in files)
    assert big_pixels > 3 * small_pixels
    return {
        "root": root,
        "files": {"main": [files, labels], "truncated": [with_truncated, labels], "big": [with_big, labels]},
        "plain": sum(plain),
        "n": len(files),
        # a limit the big photo is over (a warning), and one it is over twice (an error); the small ones pass
        "warn_limit": int(big_pixels * 0.75),
        "error_limit": int(big_pixels * 0.45),
    }


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def _child(dataset: dict, name: str, runs: list[dict], patched: bool, report: bool = False,
           env: dict[str, str] | None = None, **top: Any) -> dict[str, Any]:
    """Run the script once; its results by run tag (and the report, where asked)."""
    work = dataset["root"] / name
    work.mkdir()
    (work / "probe").mkdir()
    script = work / "train_own.py"
    script.write_text(SCRIPT)
    cfg = {"patched": patched, "runs": runs, "files": dataset["files"], "probe_dir": str(work / "probe"),
           "out": str(work / "results.pt"), **top}
    (work / "cfg.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, str(script)]
    if report:
        cmd = [sys.executable, "-m", "nano_patch", "run", "--report", str(work / "report.json"), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(work),
                          env=_env({"OWN_DATASET_CFG": str(work / "cfg.json"), **(env or {})}))
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-4000:]
    out = torch.load(work / "results.pt", weights_only=False)
    if report:
        out["__report__"] = json.loads((work / "report.json").read_text())
    return out


def _pair(dataset: dict, name: str, runs: list[dict], **kw: Any) -> tuple[dict, dict]:
    """Stock's results and the patch's, the two processes side by side (2 cores)."""
    report = kw.pop("report", False)
    with ThreadPoolExecutor(2) as pool:
        stock = pool.submit(_child, dataset, f"{name}-stock", runs, False, **kw)
        patched = pool.submit(_child, dataset, f"{name}-patched", runs, True, report=report, **kw)
        return stock.result(), patched.result()


def _assert_same(got: Any, want: Any, where: str) -> None:
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), (where, (got.float() - want.float()).abs().max().item())
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), (where, len(got), len(want))
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


def _error_view(error: list | None, script: str = "train_own.py") -> Any:
    """An exception as the user sees it: class, batch index, the message's first and last lines, and the
    frames of the user's script in its traceback (a worker's error carries the worker's traceback text; the
    patch's own frames and paths may differ)."""
    if error is None:
        return None
    kind, message, index = error
    lines = [ln for ln in message.splitlines() if ln.strip()]
    frames = [re.sub(r'File ".*?([^/"]+)"', r'File "\1"', ln.strip()) for ln in lines if script in ln]
    return kind, index, lines[0], lines[-1], frames


def _assert_run_equal(got: dict, want: dict, tag: str) -> None:
    assert _error_view(got["error"]) == _error_view(want["error"]), tag
    for key in ("batches", "torch_rng", "random_rng", "numpy_rng", "warnings", "worker_warnings"):
        _assert_same(got[key], want[key], f"{tag}.{key}")


MAIN_RUNS = [{"tag": f"{v}-w{nw}", "dataset": v, "files": "main", "num_workers": nw}
             for v in VARIANTS for nw in (0, 2)]
# Two epochs over a dataset that keeps its samples, the batches written to in place by the "training step":
# stock's batches are copies (default_collate stacks), so the kept samples stay as they were made.
MAIN_RUNS += [{"tag": f"Caching-w{nw}", "dataset": "Caching", "files": "main", "num_workers": nw, "epochs": 2,
               "scribbles": True} for nw in (0, 2)]
MAIN_RUNS += [{"tag": "PathTuple-scribbled-w0", "dataset": "PathTuple", "files": "main", "num_workers": 0,
               "epochs": 2, "scribbles": True}]
GUARD_RUNS = [
    *({"tag": f"truncated-w{nw}", "dataset": "PathTuple", "files": "truncated", "num_workers": nw} for nw in (0, 2)),
    *({"tag": f"bomb_warning-w{nw}", "dataset": "PathTuple", "files": "big", "num_workers": nw, "limit": "warn"}
      for nw in (0, 2)),
    *({"tag": f"bomb_error-w{nw}", "dataset": "FileDict", "files": "big", "num_workers": nw, "limit": "error"}
      for nw in (0, 2)),
]


def _with_limits(runs: list[dict], dataset: dict) -> list[dict]:
    out = []
    for r in runs:
        r = dict(r)
        if "limit" in r:
            r["limit"] = dataset[f"{r['limit']}_limit"]
        out.append(r)
    return out


@pytest.fixture(scope="module")
def main_runs(dataset) -> tuple[dict, dict]:
    """Every variant at num_workers 0 and 2, and the guard cases: stock, and patched under ``--report``."""
    return _pair(dataset, "main", _with_limits(MAIN_RUNS + GUARD_RUNS, dataset), report=True)


@pytest.mark.parametrize("tag", [r["tag"] for r in MAIN_RUNS])
def test_own_dataset_batches_equal_stock_and_take_the_lazy_path(main_runs, dataset, tag):
    stock, patched = main_runs
    want, got = stock[tag], patched[tag]
    epochs = 2 if "epochs" in next(r for r in MAIN_RUNS if r["tag"] == tag) else 1
    assert want["error"] is None and len(want["batches"]) == 4 * epochs, want["error"]
    _assert_run_equal(got, want, tag)
    # every convert at the user's call site: none lazy in stock; each plain JPEG lazy under the patch
    converts = epochs if not tag.startswith("Caching-w0") else 1  # (in the main process the cache outlives epochs)
    assert (want["lazy"], want["not_lazy"]) == (0, dataset["n"] * converts), tag
    assert (got["lazy"], got["not_lazy"]) == (dataset["plain"] * converts,
                                              (dataset["n"] - dataset["plain"]) * converts), tag


def test_own_dataset_cases_mean_something(main_runs):
    """Stock's own outputs vary where the comparisons need them to."""
    stock, _ = main_runs
    draws = stock["Draws-w0"]["batches"]
    assert len({float(x) for b in draws for x in b[2]}) > 20  # the Python draws differ per sample
    assert len({float(x) for b in draws for x in b[4].flatten()}) > 20
    first = stock["PathTuple-w0"]["batches"][0][0]
    assert first.shape == (8, 3, 64, 64) and first.dtype == torch.float32 and first.std() > 0.1
    assert not torch.equal(first, stock["PathTuple-w2"]["batches"][0][0])  # workers draw their own streams
    peek = stock["Peek-w0"]["batches"]
    assert {int(w) for b in peek for w in b[2]} > {200}
    cached = stock["Caching-w0"]["batches"]
    sums = [sorted(float(x.sum()) for b in half for x in b[0]) for half in (cached[:4], cached[4:])]
    assert sums[0] == sums[1]  # the second epoch: the kept samples, untouched by the scribbles, reshuffled
    upright = [tuple(b[0].shape) for b in stock["Upright-w0"]["batches"]]
    assert upright == [tuple(b[0].shape) for b in stock["PathTuple-w0"]["batches"]]  # 64 x 64 crops either way


def test_the_patched_run_reports_lazy_images(main_runs):
    """``nano-patch run --report``: the lazy images counted as accelerated (converts and deferred pixel work)."""
    _, patched = main_runs
    rep = patched["__report__"]
    lazy = [a for p in rep["patches"] for a in p.get("top_accelerated", []) if "laz" in a["what"].lower()]
    assert lazy and sum(a["count"] for a in lazy) > 0, rep["patches"]
    assert any("deferred" in a["what"] for a in lazy), lazy


@pytest.mark.parametrize("nw", [0, 2])
def test_truncated_jpeg_raises_stocks_error_at_stocks_batch(main_runs, nw):
    stock, patched = main_runs
    tag = f"truncated-w{nw}"
    want, got = stock[tag], patched[tag]
    assert want["error"] is not None and want["error"][0] == "builtins.OSError", want["error"]
    assert "image file is truncated" in want["error"][1]
    _assert_run_equal(got, want, tag)
    if nw == 0:
        assert got["error"] == want["error"]  # in the main process: the very message
    else:
        assert "Caught OSError in DataLoader worker process" in got["error"][1]


@pytest.mark.parametrize("case", ["bomb_warning", "bomb_error"])
@pytest.mark.parametrize("nw", [0, 2])
def test_lowered_max_image_pixels_as_stock(main_runs, case, nw):
    stock, patched = main_runs
    tag = f"{case}-w{nw}"
    want, got = stock[tag], patched[tag]
    _assert_run_equal(got, want, tag)
    warned = want["warnings"] if nw == 0 else [w for ws in want["worker_warnings"].values() for w in ws]
    if case == "bomb_warning":
        assert want["error"] is None and len(want["batches"]) == 4
        assert [w[0] for w in warned] == ["PIL.Image.DecompressionBombWarning" if nw == 0
                                          else "DecompressionBombWarning"], warned
    else:
        assert want["error"] is not None and "DecompressionBombError" in want["error"][0] + want["error"][1]
        assert want["error"][2] < 4
    if nw == 0:
        assert got["error"] == want["error"]


def test_load_truncated_images_at_the_scripts_top_gives_stocks_batches(dataset):
    runs = [{"tag": f"truncated-{v}-w{nw}", "dataset": v, "files": "truncated", "num_workers": nw}
            for v, nw in (("PathTuple", 0), ("PathTuple", 2), ("Touch", 0), ("InMemory", 2))]
    stock, patched = _pair(dataset, "load_truncated", runs, load_truncated=True)
    for r in runs:
        tag = r["tag"]
        assert stock[tag]["error"] is None and len(stock[tag]["batches"]) == 4, stock[tag]["error"]
        _assert_run_equal(patched[tag], stock[tag], tag)
        assert patched[tag]["lazy"] == dataset["plain"] - 1  # the truncated file replaced a plain one


def test_forkserver_workers_give_stocks_batches(dataset):
    """Python 3.14's default start method: the workers import the script again (its patch_torch() included)."""
    runs = [{"tag": f"{v}-w2", "dataset": v, "files": "main", "num_workers": 2} for v in ("PathTuple", "Draws")]
    stock, patched = _pair(dataset, "forkserver", runs, start_method="forkserver")
    for r in runs:
        tag = r["tag"]
        assert stock[tag]["error"] is None and len(stock[tag]["batches"]) == 4, stock[tag]["error"]
        _assert_run_equal(patched[tag], stock[tag], tag)
        assert patched[tag]["lazy"] == dataset["plain"], tag
        assert stock[tag]["lazy"] == 0


def test_lazy_images_off_gives_stocks_batches_without_the_lazy_path(dataset, main_runs):
    stock, _ = main_runs
    runs = [r for r in MAIN_RUNS if r["dataset"] in ("PathTuple", "Touch", "FileDict")]
    off = _child(dataset, "lazy-off", runs, True, report=True, env={"NANO_PATCH_LAZY_IMAGES": "0"})
    for r in runs:
        tag = r["tag"]
        _assert_run_equal(off[tag], stock[tag], tag)
        assert off[tag]["lazy"] == 0, tag
    lazy = [a for p in off["__report__"]["patches"] for a in p.get("top_accelerated", [])
            if "laz" in a["what"].lower()]
    assert lazy == [], lazy


def test_probe_matches_what_pending_of_sees():
    """The stock script's own probe (no nano_patch import) agrees with ``lazy_jpeg.pending_of``."""
    import nano_patch
    from nano_patch.vision.images import lazy_jpeg

    raw = io.BytesIO()
    Image.open(photo_sources()[0]).convert("RGB").resize((120, 90)).save(raw, format="JPEG")
    nano_patch.patch_torch()
    img = Image.open(io.BytesIO(raw.getvalue())).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    assert type(vars(img).get("_im")).__name__ == "PendingDecode"
