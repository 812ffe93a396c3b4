"""PIL's guards on every decode path of the patch (the decompression-bomb rule and EXIF warnings), stock first.

Each case runs in real processes: a fresh process without the patch (stock) and the same calls in a
fresh process with ``patch_torch()``. Compared per call: the exception's class and message, every
warning (category, message, and the file and line it is attributed to, in order), the output, and
the random generators' states afterwards (stock raises or warns inside ``Image.open``, before a
transform draws, so a crop drawn before the guard shows). The files are real JPEGs: 13,400 x 13,400
(over twice ``Image.MAX_IMAGE_PIXELS``), 10,000 x 10,000 (over it), a 640 x 427 photo (for lowered
limits), a header that claims 30,000 x 30,000, a photo with corrupt EXIF data, an MPO and a damaged
MPO. Paths: ``pil_loader``, ImageFolder with a full decode, with crop-region decode, with a crop past the
edges (the deferred JPEG decoded whole), timm's ImageDataset, Caltech101 (its own mode), the
decoded-image cache (fill and hits), and the batch-parallel DataLoader path. Peak RSS of a child
(``ru_maxrss``) stock against patched for the three bomb cases.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

# One process runs a list of calls; each call starts from the same seeds, under its own warnings
# filter and MAX_IMAGE_PIXELS, and reports what stock's user would see.
CHILD = textwrap.dedent(r'''
    import hashlib, json, os, random, resource, sys, warnings
    cfg = json.loads(sys.argv[1])
    import numpy as np
    import torch
    from PIL import Image
    if cfg["patched"]:
        import nano_patch
        nano_patch.patch_torch(vision=True, dataloader=cfg.get("dataloader", False), trainer=False,
                               **cfg.get("options", {}))
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import pil_loader
    from torch.utils.data import DataLoader

    DEFAULT = Image.MAX_IMAGE_PIXELS

    def crop():
        return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])

    def first_file(root):
        for d, _, files in sorted(os.walk(root)):
            for f in sorted(files):
                return os.path.join(d, f)

    def caltech(root):
        from torchvision.datasets import Caltech101
        ds = object.__new__(Caltech101)  # its folder layout without the download check
        ds.root, ds.target_type, ds.transform, ds.target_transform = root, ["category"], None, None
        ds.categories, ds.y, ds.index = ["c"], [0], [1]
        return ds[0]

    def timm_ds(root):
        from timm.data import ImageDataset
        return ImageDataset(root, transform=crop())[0]

    ENTRIES = {
        "loader": lambda root: pil_loader(first_file(root)),
        "full": lambda root: ImageFolder(root, transform=T.Compose([T.Resize(24), T.CenterCrop(24),
                                                                    T.ToTensor()]))[0],
        "crop": lambda root: ImageFolder(root, transform=crop())[0],
        # A first crop past the edges: the deferred JPEG is decoded whole after the guard ran in the loader.
        "pad": lambda root: ImageFolder(root, transform=T.Compose([T.CenterCrop(700), T.Resize(24),
                                                                   T.ToTensor()]))[0],
        "timm": timm_ds,
        # A num_workers=0 DataLoader's first batch: with loader threads, the batch-parallel path (batch_loader.py).
        "batch_crop": lambda root: next(iter(DataLoader(ImageFolder(root, transform=crop()), batch_size=2))),
        "batch_full": lambda root: next(iter(DataLoader(ImageFolder(root, transform=T.Compose([
            T.Resize(24), T.CenterCrop(24), T.ToTensor()])), batch_size=2))),
        "native": caltech,
    }

    def digest(out):
        if isinstance(out, tuple):
            return [digest(o) for o in out]
        if isinstance(out, torch.Tensor):
            return [list(out.shape), hashlib.sha1(out.numpy().tobytes()).hexdigest()]
        if isinstance(out, Image.Image):
            return [out.mode, list(out.size)]
        return repr(out)

    def rng():
        h = hashlib.sha1(torch.get_rng_state().numpy().tobytes())
        h.update(repr(random.getstate()).encode())
        return h.hexdigest()

    results = []
    for call in cfg["calls"]:
        limit = call.get("limit", "default")
        Image.MAX_IMAGE_PIXELS = DEFAULT if limit == "default" else limit
        if call.get("hit") and cfg["patched"]:
            from nano_patch.vision.images.cache import key_material, store_for
            store = store_for(ImageFolder(call["root"]))
            path = first_file(call["root"])
            call_hit = store is not None and store.get(key_material(path)) is not None
        torch.manual_seed(1)
        random.seed(1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = err = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(call["filter"])
            # Stock timm leaves the reader's file open when Image.open raises; the patch opens none.
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                for _ in range(call.get("repeat", 1)):
                    out = ENTRIES[call["entry"]](call["root"])
            except Exception as exc:
                err = [type(exc).__module__ + "." + type(exc).__qualname__, str(exc)]
        res = {
            "err": err,
            "out": None if err else digest(out),
            "warnings": [[w.category.__module__ + "." + w.category.__qualname__, str(w.message),
                          os.path.basename(w.filename), w.lineno] for w in caught],
            "rng": rng(),
            "rss_before_kb": before,
            "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }
        if call.get("hit") and cfg["patched"]:
            res["hit"] = call_hit
        results.append(res)
    print("RESULTS " + json.dumps(results))
''')


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(patched: bool, calls: list[dict], options: dict | None = None, dataloader: bool = False) -> list[dict]:
    cfg = {"patched": patched, "calls": calls, "options": options or {}, "dataloader": dataloader}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True,
                          env=_env(), cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):])


def _both(calls: list[dict], options: dict | None = None, dataloader: bool = False) -> tuple[list[dict], list[dict]]:
    """Stock's results and the patch's, the two processes side by side (2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        stock = pool.submit(_run, False, calls)
        patched = pool.submit(_run, True, calls, options, dataloader)
        return stock.result(), patched.result()


def _folder(base: Path, name: str, data: bytes) -> str:
    """An ImageFolder (and timm folder, and Caltech101 layout) holding one file."""
    root = base / name
    (root / "101_ObjectCategories" / "c").mkdir(parents=True)
    (root / "101_ObjectCategories" / "c" / "image_0001.jpg").write_bytes(data)
    return str(root)


def _jpeg(a: np.ndarray, **kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(a).save(out, "JPEG", **kwargs)
    return out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    import simplejpeg
    from sklearn.datasets import load_sample_image

    base = tmp_path_factory.mktemp("guards")
    out = {}
    # Valid grey JPEGs: cheap to encode (one byte a pixel), as big in pixels as the RGB ones.
    for n in (13400, 10000):
        flat = np.full((n, n, 1), 128, np.uint8)
        out[f"big{n}"] = _folder(base, f"big{n}", simplejpeg.encode_jpeg(flat, quality=50, colorspace="GRAY"))
        del flat
    # A real 640 x 427 photo.
    photo = load_sample_image("china.jpg")
    assert photo.shape == (427, 640, 3)
    out["photo"] = _folder(base, "photo", _jpeg(photo, quality=90))
    # A 16 x 16 JPEG whose frame header claims 30,000 x 30,000.
    small = bytearray(_jpeg(np.full((16, 16, 3), 100, np.uint8), quality=90))
    sof = small.find(b"\xff\xc0")
    small[sof + 5:sof + 9] = (30000).to_bytes(2, "big") * 2
    out["header30000"] = _folder(base, "header30000", bytes(small))
    # The photo with an EXIF block whose first directory is cut short: PIL warns "Corrupt EXIF data".
    bad_exif = b"Exif\x00\x00II*\x00" + (8).to_bytes(4, "little") + (5).to_bytes(2, "little") + b"\x00" * 7
    out["exif"] = _folder(base, "exif", _jpeg(photo, quality=90, exif=bad_exif))
    # An MPO (two frames; PIL opens it as MpoImageFile), and one whose MP header is damaged: PIL warns
    # "Image appears to be a malformed MPO file" and reads it as a JPEG.
    mpo = io.BytesIO()
    Image.fromarray(photo).save(mpo, "MPO", save_all=True, append_images=[Image.fromarray(photo[::-1].copy())])
    out["mpo"] = _folder(base, "mpo", mpo.getvalue())
    bad_mpo = bytearray(mpo.getvalue())
    mpf = bad_mpo.find(b"MPF\x00")
    bad_mpo[mpf + 4:mpf + 8] = b"XXXX"
    out["mpo_bad"] = _folder(base, "mpo_bad", bytes(bad_mpo))
    return out


def _assert_same(stock: list[dict], patched: list[dict], calls: list[dict]) -> None:
    for want, got, call in zip(stock, patched, calls):
        where = {k: v for k, v in call.items() if k != "root"}
        for key in ("err", "warnings", "out", "rng"):
            assert got[key] == want[key], (where, key, want[key], got[key])


ENTRIES = ("loader", "full", "crop", "pad", "timm", "native")


def test_bomb_errors_and_warnings_as_stock(files):
    """Every path, every case: stock's class, message and warnings, stock's outputs and draws."""
    cases = [
        ("big13400", "default", "always"),     # over twice the limit: DecompressionBombError
        ("header30000", "default", "always"),  # a header that claims 900 M pixels
        ("big10000", "default", "error"),      # over the limit, warnings as errors
        ("photo", 100_000, "always"),          # a lowered limit: an ordinary photo is a bomb
        ("photo", 200_000, "always"),          # ... or over the lowered limit: the warning, then the pixels
        ("photo", 200_000, "error"),
        ("photo", None, "always"),             # None: no guard at all
        ("exif", "default", "always"),         # stock's "Corrupt EXIF data" warning
        ("exif", "default", "error"),
        ("exif", 100_000, "always"),           # the EXIF warning, then the bomb error, in that order
        ("exif", 200_000, "always"),
        ("mpo", 200_000, "always"),
        ("mpo_bad", 200_000, "always"),
        ("mpo_bad", "default", "error"),
    ]
    calls = [{"root": files[name], "limit": limit, "filter": filt, "entry": entry}
             for name, limit, filt in cases for entry in ENTRIES]
    # The 10,000^2 warning where the patch decodes only a window (the full decodes: the memory test).
    calls += [{"root": files["big10000"], "limit": "default", "filter": "always", "entry": e} for e in ("crop", "timm")]
    # Python's default filter shows a warning once per location and message: the same count as stock.
    calls += [{"root": files[n], "limit": 200_000, "filter": "default", "entry": "loader", "repeat": 3}
              for n in ("photo", "exif")]
    stock, patched = _both(calls)
    _assert_same(stock, patched, calls)
    # The cases say what they claim (stock's own behaviour, so the comparison above means something).
    by = {(c["root"], c["limit"], c["filter"], c["entry"]): r for c, r in zip(calls, stock)}
    assert by[(files["big13400"], "default", "always", "crop")]["err"][0] == "PIL.Image.DecompressionBombError"
    assert by[(files["big10000"], "default", "error", "loader")]["err"][0] == "PIL.Image.DecompressionBombWarning"
    assert by[(files["photo"], 200_000, "always", "full")]["warnings"][0][0] == "PIL.Image.DecompressionBombWarning"
    assert by[(files["exif"], "default", "always", "crop")]["warnings"][0][1].startswith("Corrupt EXIF data")
    assert by[(files["exif"], "default", "error", "timm")]["err"][0] == "builtins.UserWarning"
    mpo_warning = by[(files["mpo_bad"], 200_000, "always", "pad")]["warnings"][0][1]
    assert mpo_warning.startswith("Image appears to be a malformed MPO")


def test_batch_parallel_loading_as_stock(files, tmp_path):
    """A num_workers=0 DataLoader with loader threads (``data/batches/batch_loader.py``: draws in the calling thread,
    decodes on a pool): stock's errors, warnings in stock's order, outputs and draws, cache on."""
    photo = next(Path(files["photo"]).rglob("*.jpg")).read_bytes()
    cases = [("big13400", "default", "always"), ("header30000", "default", "always"),
             ("exif", "default", "always"), ("exif", 100_000, "always"), ("photo", 200_000, "always"),
             ("photo", 200_000, "error")]
    calls = []
    for entry in ("batch_crop", "batch_full"):
        for k, (name, limit, filt) in enumerate(cases):
            # A fresh folder per call (the cache must miss): the case's file, then an ordinary photo.
            folder = Path(_folder(tmp_path, f"{entry}{k}", next(Path(files[name]).rglob("*.jpg")).read_bytes()))
            (folder / "101_ObjectCategories" / "c" / "image_0002.jpg").write_bytes(photo)
            calls.append({"root": str(folder), "limit": limit, "filter": filt, "entry": entry})
        # The photos stored by the first call of this entry, now hits under a lowered limit.
        calls.append({"root": calls[-len(cases) + 4]["root"], "limit": 100_000, "filter": "always", "entry": entry})
    options = {"loader_threads": 2, "cache_decoded": "on", "cache_dir": str(tmp_path / "cache")}
    stock, patched = _both(calls, options, dataloader=True)
    _assert_same(stock, patched, calls)


@pytest.mark.skipif(not hasattr(Image, "_decompression_bomb_check"), reason="this PIL has no rule of its own")
@pytest.mark.parametrize("limit", [None, 1, 100, 1000, 89478485])
def test_fallback_rule_equals_pils(limit, monkeypatch):
    """The re-implementation used where PIL has no ``_decompression_bomb_check`` gives PIL's outcomes."""
    import warnings

    from nano_patch.vision.images import decode

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)

    def outcome(check, size):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check(size)
            except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
                return type(exc), str(exc)
        return [(w.category, str(w.message)) for w in caught]

    sizes = [(0, 0), (1, 1), (10, 10), (10, 11), (20, 10), (20, 11), (9459, 9460), (13400, 13400), (30000, 30000)]
    for size in sizes:
        assert outcome(decode._own_bomb_check, size) == outcome(Image._decompression_bomb_check, size), size


def test_only_headers_without_exif_or_mpf_skip_pils_open(files):
    """``plain_open`` (the arithmetic check alone) only for headers whose PIL open cannot warn otherwise."""
    from nano_patch.vision.images import decode

    def data(name):
        return next(Path(files[name]).rglob("*.jpg")).read_bytes()

    assert decode.plain_open(data("photo")) and decode.plain_open(data("big10000"))
    for name in ("exif", "mpo", "mpo_bad"):
        assert not decode.plain_open(data(name)), name
    photo = data("photo")
    assert not decode.plain_open(photo[:2] + b"\x00junk" + photo[2:])  # anything odd: PIL decides
    assert not decode.plain_open(photo[:200])  # no scan reached


def test_decoded_cache_fill_and_hits_as_stock(files, tmp_path):
    """With the decoded-image cache on: a bomb is refused at the fill, and a limit lowered after an image
    was stored acts on the hit as stock's does on the file (class, message, warning, draws)."""
    calls = [
        {"root": files["big13400"], "limit": "default", "filter": "always", "entry": "full"},
        {"root": files["header30000"], "limit": "default", "filter": "always", "entry": "crop"},
        {"root": files["photo"], "limit": "default", "filter": "always", "entry": "full"},  # fills
    ]
    for entry in ("loader", "full", "crop", "timm"):
        for limit, filt in ((100_000, "always"), (200_000, "always"), (200_000, "error"), ("default", "always")):
            calls.append({"root": files["photo"], "limit": limit, "filter": filt, "entry": entry, "hit": True})
    stock, patched = _both(calls, {"cache_decoded": "on", "cache_dir": str(tmp_path / "cache")})
    _assert_same(stock, patched, calls)
    assert all(r["hit"] for r in patched if "hit" in r), "the photo was not served from the cache"
    assert stock[3]["err"][0] == "PIL.Image.DecompressionBombError"


def test_peak_memory_within_stock(files):
    """The guard acts before any pixel is allocated: peak RSS at most 10% over stock's, same outcomes.

    One process each, the calls in this order: ``ru_maxrss`` only grows, so the two errors (which
    allocate nothing in stock) are measured before the 10,000^2 image that both decode."""
    cases = {"13400^2 (error)": "big13400", "30000^2 header (error)": "header30000", "10000^2 (warning)": "big10000"}
    calls = [{"root": files[n], "limit": "default", "filter": "always", "entry": "loader"} for n in cases.values()]
    stock, patched = _both(calls)
    for case, want, got in zip(cases, stock, patched):
        mb = {k: {"peak": r["rss_peak_kb"] / 1024, "call": (r["rss_peak_kb"] - r["rss_before_kb"]) / 1024}
              for k, r in (("stock", want), ("patched", got))}
        print(f"{case}: peak RSS stock {mb['stock']['peak']:.0f} MB (+{mb['stock']['call']:.0f} in the call), "
              f"patched {mb['patched']['peak']:.0f} MB (+{mb['patched']['call']:.0f})")
        assert got["rss_peak_kb"] <= 1.10 * want["rss_peak_kb"], (case, want, got)
    _assert_same(stock, patched, calls)
