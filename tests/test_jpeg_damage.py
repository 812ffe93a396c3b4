"""Damaged JPEGs through every step a script takes, against stock: a lazy ``load()`` or ``convert`` rejects what
libjpeg-turbo rejects, where stock rejects it.

The corpus is made from real photographs encoded five ways (baseline 4:2:0, 4:4:4, grey, progressive, with
restart markers), then damaged: each marker segment kind (DQT, DHT, SOF, SOS, DRI, and the tables and scans between
a progressive file's scans) corrupted in each way libjpeg-turbo checks (``jdmarker.c`` as it reads a segment,
``jdhuff.c``, ``jdphuff.c`` and ``jdinput.c`` at a scan's start), truncated at each segment boundary, and with
bytes flipped at random in its headers. Each stream runs through ``Image.open``, ``load()`` in a ``try`` (the way
datasets filter bad files) and then a read of what the image holds, ``convert("RGB")``, a transform and a
DataLoader over a user's dataset, from a path, a file object and ``BytesIO``: the patched outcome (pixels, or the
exception's class and message, and torch's generator) must be stock's, step by step.
"""

from __future__ import annotations

import io
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import nano_patch

# -- the corpus ----------------------------------------------------------------------------------------------------


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker offset, marker code, segment end) of every marker segment, scans' entropy data skipped."""
    out, i, n = [], 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        code = data[i + 1]
        if code == 0xD9:
            break
        end = i + 2 + ((data[i + 2] << 8) | data[i + 3])
        out.append((i, code, end))
        i = end
        if code == 0xDA:  # to the next marker after the entropy-coded data
            while i + 1 < n and not (data[i] == 0xFF and data[i + 1] not in (0x00, 0xFF, *range(0xD0, 0xD8))):
                i += 1
    return out


def _at(data: bytes, code: int, nth: int = 0) -> tuple[int, int] | None:
    found = [(i, end) for i, c, end in _segments(data) if c == code]
    return found[nth] if nth < len(found) else None


def _patched(data: bytes, at: int, values: bytes) -> bytes:
    return data[:at] + values + data[at + len(values):]


def _damages(data: bytes, progressive: bool) -> dict[str, bytes]:
    """Each way a segment can be damaged that libjpeg-turbo checks (and a few it only warns of)."""
    out: dict[str, bytes] = {}
    dht = _at(data, 0xC4)
    if dht is not None:
        i, end = dht
        body = i + 4  # the first table's class/id byte
        counts = data[body + 1:body + 17]
        n = sum(counts)
        out["dht count past the segment"] = _patched(data, body + 16, bytes([counts[15] + 40]))
        out["dht code space overflows"] = _patched(data, body + 1, bytes([2, 2]))  # all-ones codes
        out["dht table id 4"] = _patched(data, body, bytes([data[body] & 0x10 | 4]))
        out["dht class 2"] = _patched(data, body, bytes([0x20 | data[body] & 0x0F]))
        if not data[body] & 0x10 and n:  # a DC table: a symbol out of range
            out["dht dc symbol 16"] = _patched(data, body + 17 + n - 1, bytes([16]))
            out["dht dc symbol 200"] = _patched(data, body + 17, bytes([200]))
        out["dht length 3 short"] = _patched(data, i + 2, (end - i - 2 - 3).to_bytes(2, "big"))
        out["dht empty table"] = _patched(data, body + 1, bytes(16))
    for k in range(4):  # every DHT table class and id the file has, its counts inflated
        found = _at(data, 0xC4, k)
        if found is None:
            break
        out[f"dht {k} counts over 256"] = _patched(data, found[0] + 5, bytes([255, 255]))
    dqt = _at(data, 0xDB)
    if dqt is not None:
        i, end = dqt
        out["dqt table id 4"] = _patched(data, i + 4, bytes([data[i + 4] & 0xF0 | 4]))
        out["dqt precision 16-bit"] = _patched(data, i + 4, bytes([0x10 | data[i + 4] & 0x0F]))
        out["dqt length 1 long"] = _patched(data, i + 2, (end - i - 2 + 1).to_bytes(2, "big"))
    sof = next(((i, c, end) for i, c, end in _segments(data) if c in (0xC0, 0xC1, 0xC2)), None)
    if sof is not None:
        i, code, end = sof
        nc = data[i + 9]
        out["sof precision 12"] = _patched(data, i + 4, bytes([12]))
        out["sof sampling 0"] = _patched(data, i + 11, bytes([0x01]))
        out["sof sampling 5"] = _patched(data, i + 11, bytes([0x51]))
        out["sof quant table 5"] = _patched(data, i + 12, bytes([5]))
        out["sof quant table 3 undefined"] = _patched(data, i + 12, bytes([3]))
        out["sof width 0"] = _patched(data, i + 7, bytes([0, 0]))
        if nc == 3:
            out["sof fractional sampling"] = _patched(data, i + 11, bytes([0x31]))
            out["sof duplicate component id"] = _patched(data, i + 13, bytes([data[i + 10]]))
            out["sof 4x4 luma"] = _patched(data, i + 11, bytes([0x44]))
        out["sof arithmetic"] = _patched(data, i + 1, bytes([0xC9]))
        out["sof lossless"] = _patched(data, i + 1, bytes([0xC3]))
    sos = _at(data, 0xDA)
    if sos is not None:
        i, end = sos
        ns = data[i + 4]
        out["sos unknown component"] = _patched(data, i + 5, bytes([0x7F]))
        out["sos dc table 5"] = _patched(data, i + 6, bytes([0x50 | data[i + 6] & 0x0F]))
        out["sos dc table 3 undefined"] = _patched(data, i + 6, bytes([0x30 | data[i + 6] & 0x0F]))
        out["sos ac table 3 undefined"] = _patched(data, i + 6, bytes([data[i + 6] & 0xF0 | 3]))
        out["sos 5 components"] = _patched(data, i + 4, bytes([5]))
        out["sos not sequential (a warning)"] = _patched(data, i + 6 + 2 * ns - 1, bytes([0, 0]))
        if ns > 1:
            out["sos components out of order"] = _patched(data, i + 5, data[i + 7:i + 9] + data[i + 5:i + 7])
            out["sos component twice"] = _patched(data, i + 7, data[i + 5:i + 6])
        out["sos al 14"] = _patched(data, end - 1, bytes([0x0E]))
        out["second sof"] = data[:i] + data[sof[0]:sof[2]] + data[i:] if sof is not None else data
        out["a second scan where the first held everything"] = data[:-2] + data[i:end] + b"\x00" * 8 + b"\xff\xd9"
        out["an unknown marker before the scan"] = data[:i] + b"\xff\x02\x00\x04ab" + data[i:]
        out["a restart marker before the scan"] = data[:i] + b"\xff\xd3" + data[i:]
        out["a second soi"] = data[:i] + b"\xff\xd8" + data[i:]
        out["garbage before the scan"] = data[:i] + b"\x00\x12" + data[i:]
    dri = _at(data, 0xDD)
    if dri is not None:
        out["dri length 5"] = _patched(data, dri[0] + 2, bytes([0, 5]))
    if progressive:  # the tables and scans between a progressive file's scans
        for k in (2, 4):
            later = _at(data, 0xDA, k)
            if later is not None:
                i, end = later
                out[f"scan {k}: bad band"] = _patched(data, end - 3, bytes([0x05, 0x02]))
                out[f"scan {k}: two components in an ac band"] = _patched(data, i + 4, bytes([2]))
                out[f"scan {k}: refinement al not ah-1"] = _patched(data, end - 1, bytes([0x31]))
                out[f"scan {k}: ac table 3 undefined"] = _patched(data, i + 6, bytes([data[i + 6] & 0xF0 | 3]))
        for i in [i for i, c, _ in _segments(data) if c == 0xC4][2:4]:
            out[f"dht at {i}: code space overflows"] = _patched(data, i + 5, bytes([2, 2]))
            out[f"dht at {i}: count past the segment"] = _patched(data, i + 20, bytes([200]))
    for i, code, _ in _segments(data):  # truncated at each segment boundary
        out[f"cut at the {code:02X} marker at {i}"] = data[:i]
    out["no end of image"] = data[:-2]
    out["cut in the first scan"] = data[:(sos[1] + len(data)) // 2] if sos is not None else data[:-40]
    return out


def _flips(data: bytes, seed: int, count: int) -> dict[str, bytes]:
    """Bytes flipped at random in the headers (before the first scan's data)."""
    rng = random.Random(seed)
    sos = _at(data, 0xDA)
    limit = sos[1] if sos is not None else len(data)
    out = {}
    for k in range(count):
        b = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 3))):
            b[rng.randrange(2, limit)] = rng.randrange(256)
        out[f"flips {seed}.{k}"] = bytes(b)
    return out


@pytest.fixture(scope="module")
def corpus(photos) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for p, photo in enumerate(photos[:2]):
        im = photo.copy()
        im.thumbnail((72, 72))
        kinds = {"baseline": {"quality": 90}, "444": {"quality": 90, "subsampling": 0},
                 "progressive": {"quality": 85, "progressive": True},
                 "restarts": {"quality": 90, "restart_marker_blocks": 3}}
        encoded = {}
        for name, kw in kinds.items():
            buf = io.BytesIO()
            im.save(buf, "JPEG", **kw)
            encoded[name] = buf.getvalue()
        buf = io.BytesIO()
        im.convert("L").save(buf, "JPEG", quality=90)
        encoded["grey"] = buf.getvalue()
        for name, data in encoded.items():
            out[f"{p} {name} whole"] = data
            for what, damaged in _damages(data, name == "progressive").items():
                out[f"{p} {name} {what}"] = damaged
            for what, damaged in _flips(data, seed=p * 10 + len(name), count=6).items():
                out[f"{p} {name} {what}"] = damaged
    return out


# -- the steps a script takes ----------------------------------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - compared with stock's
        return ("raised", type(exc).__name__, _ADDRESS.sub("0x?", str(exc)))


#: an object's address in a message (a ``BytesIO`` named in "cannot identify image file"): not the image's
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def _pixels(img: Image.Image) -> Any:
    a = np.asarray(img)
    return (img.mode, img.size, a.tobytes())


def _source(how: str, data: bytes, path: Path) -> Any:
    if how == "path":
        return path
    if how == "file":
        return open(path, "rb")  # noqa: SIM115 - closed by the step (or left open, as a script would)
    return io.BytesIO(data)


def _load_filtered(src: Any) -> list[Any]:
    """A dataset's filter: ``load()`` in a ``try``; then what the image holds, as a script that keeps it reads it."""
    steps: list[Any] = []
    img = Image.open(src)
    try:
        img.load()
        steps.append("loaded")
    except OSError as exc:
        steps.append(("load raised", type(exc).__name__, _ADDRESS.sub("0x?", str(exc))))
    steps.append(_outcome(lambda: _pixels(img)))
    steps.append(_outcome(lambda: _pixels(img.convert("RGB"))))
    return steps


def _converted(src: Any) -> list[Any]:
    return [_outcome(lambda: _pixels(Image.open(src).convert("RGB")))]


def _transformed(src: Any) -> list[Any]:
    torch.manual_seed(3)
    tf = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
    got = _outcome(lambda: tf(Image.open(src).convert("RGB")).numpy().tobytes())
    return [got, torch.random.get_rng_state().sum().item()]


STEPS = {"load in a try": _load_filtered, "convert": _converted, "a transform": _transformed}


def _run(corpus: dict[str, bytes], folder: Path) -> dict[tuple[str, str, str], Any]:
    out = {}
    for k, (name, data) in enumerate(sorted(corpus.items())):
        path = folder / f"{k}.jpg"
        for how in ("path", "file", "bytes"):
            for step, fn in STEPS.items():
                out[(name, how, step)] = _outcome(lambda fn=fn, how=how, data=data, path=path: fn(_source(how, data,
                                                                                                          path)))
    return out


@pytest.fixture(scope="module")
def corpus_files(corpus, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("damaged")
    for k, (_, data) in enumerate(sorted(corpus.items())):
        (folder / f"{k}.jpg").write_bytes(data)
    return folder


def test_every_damaged_stream_through_every_step_as_stock(corpus, corpus_files):
    stock = _run(corpus, corpus_files)
    nano_patch.patch_torch()
    patched = _run(corpus, corpus_files)
    differ = [key for key in stock if stock[key] != patched[key]]
    assert not differ, (len(differ), differ[:12])


def test_the_corpus_means_something(corpus, corpus_files):
    """The damages reach libjpeg's errors at load (so the test above can fail), and the whole streams decode."""
    stock = _run(corpus, corpus_files)
    raised_at_load = {name for (name, how, step), got in stock.items()
                      if how == "path" and step == "load in a try" and got[0] == "ok"
                      and isinstance(got[1][0], tuple)}
    for kind in ("dht count past the segment", "dht code space overflows", "dht dc symbol 16", "dqt table id 4",
                 "sof sampling 5", "sos dc table 5", "sos unknown component", "dri length 5"):
        assert any(kind in name for name in raised_at_load), kind
    assert all(stock[(name, "path", "convert")][1][0][0] == "ok" for name in corpus if name.endswith("whole"))
    nano_patch.patch_torch()
    lazy = 0
    for name in corpus:
        if name.endswith("whole"):
            img = Image.open(corpus_files / f"{sorted(corpus).index(name)}.jpg")
            img.load()
            lazy += type(vars(img)["_im"]).__name__ == "PendingDecode"
    assert lazy >= 8  # (the whole streams stay lazy: the check refuses only what it must)


class _Filtered(torch.utils.data.Dataset):
    """A user's dataset that filters bad files at ``load()``, as real datasets do."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.tf = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        try:
            with open(self.paths[i], "rb") as f:
                img = Image.open(f)
                img.load()
        except OSError:
            return torch.zeros(3, 24, 24), -1
        return self.tf(img.convert("RGB")), i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_that_filters_its_bad_files_keeps_stocks_files(corpus, corpus_files, num_workers):
    paths = sorted(corpus_files.glob("*.jpg"), key=lambda p: int(p.stem))[:160]

    def run() -> list[Any]:
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(_Filtered(paths), batch_size=16, num_workers=num_workers)
        return [(x.numpy().tobytes(), y.tolist()) for x, y in loader] + [torch.random.get_rng_state().sum().item()]

    stock = run()
    nano_patch.patch_torch()
    patched = run()
    kept = [y for _, ys in stock[:-1] for y in ys if y >= 0]
    assert len(kept) < len(paths)  # (some are filtered out)
    assert patched == stock
