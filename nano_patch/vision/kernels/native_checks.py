"""The compiled kernels checked against the installed PIL, before a kernel's first use in a process.

Each kernel reproduces a piece of PIL's arithmetic. Its check (:data:`CHECKS`, run by ``native.kernel``) compares it
with the installed PIL on a probe chosen where rounding differences show (extremes, ties, random colours, every
filter, up and down, both pass orders); where PIL itself computes one of several ways (Pillow 13's pass order,
pillow-simd's weights and grey), the check finds which, and the kernels then use that arithmetic (:data:`found`).
The crop decode is checked against simplejpeg's full decode, its reference; torch's reproduced draws against the
installed torch (``torch_draws.py``). A check returns None where the kernel is exact, else why not: the kernel is
then not used, and the caller runs PIL's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from ... import sysinfo
from .pil_filters import FILTERS, WARP_FILTERS

#: Resize arithmetic (native.h), tried in this order against the installed PIL: (pass order, weights).
#: Pillow 13 runs the vertical pass first when the height shrinks much more than the width; Pillow up
#: to 12, and pillow-simd, always run the horizontal pass first. pillow-simd rounds its weights to
#: 16 bits (weights 1) where Pillow keeps 22 (weights 0).
RESAMPLE_VARIANTS = ((1, 0), (0, 0), (0, 1), (1, 1))
#: Grey formulas (native.h): Pillow's, then pillow-simd's.
GREY_MODES = (0, 1)
VARIANT_NAMES = {0: "Pillow's arithmetic", 1: "pillow-simd's arithmetic"}


@dataclass
class Arithmetic:
    """Which of PIL's ways of computing the checks found the installed PIL to use: what the kernels then do."""

    #: the resize's (pass order rule, weights) (native.h)
    resample: tuple[int, int] = (1, 0)
    #: the grey formula, of the grey conversion and of the saturation blend (:data:`GREY_MODES`)
    grey: int = 0
    saturation: int = 0
    #: progressive (and other multi-scan) JPEGs region-decoded: the check may say no
    crop_multiscan: bool = True
    #: what the crop-decode check left out, for ``native.state()``
    crop_note: str = ""
    #: kernel -> which PIL's arithmetic it matched (:data:`VARIANT_NAMES`)
    variants: dict[str, int] = field(default_factory=dict)


#: What the checks run in this process found (set by the checks themselves, as they pass).
found = Arithmetic()


def forget() -> None:
    """Forget what the checks found, as in a new process (``native.reset``)."""
    global found
    found = Arithmetic()


def probe_image(h: int, w: int, seed: int) -> np.ndarray:
    """An RGB probe: smooth gradients (ties and mid-tones), hard edges, extremes and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 37) % 256], -1)
    a = a.astype(np.uint8)
    a[h // 3: h // 2] = rng.integers(0, 256, size=(h // 2 - h // 3, w, 3), dtype=np.uint8)
    a[:, w // 2: w // 2 + 2] = 255
    a[-2:, :3] = 0
    return a


def probe_colours() -> np.ndarray:
    """Colours where rounding differences show: extremes, greys, near-greys, colours whose grey value
    sits exactly on PIL's rounding boundary, and random ones; 64 x 64."""
    levels = np.array([0, 1, 2, 3, 127, 128, 129, 252, 253, 254, 255], dtype=np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    # 19595 R + 38470 G + 7471 B == 0x8000 (mod 65536): L's rounding term lands exactly on a boundary
    r, g = (x.ravel().astype(np.int64) for x in np.meshgrid(np.arange(256), np.arange(256), indexing="ij"))
    b = ((0x8000 - 19595 * r - 38470 * g) * pow(7471, -1, 65536)) % 65536
    ties = np.stack([r, g, b], -1)[b < 256][::3][:512].astype(np.uint8)
    rng = np.random.default_rng(20261122)
    rand = rng.integers(0, 256, size=(64 * 64 - len(grid) - len(ties), 3), dtype=np.uint8)
    return np.concatenate([grid, ties, rand]).reshape(64, 64, 3)


def _pil_version() -> str:
    return "{} {}".format(*sysinfo.pillow_distribution())


#: (source h, w), (output h, w), box or None: down, up, both, tall shrinks (the pass-order rule), boxes.
RESAMPLE_PROBES: list[tuple[tuple[int, int], tuple[int, int], tuple[float, float, float, float] | None]] = [
    ((47, 61), (19, 23), None),
    ((47, 61), (83, 71), None),
    ((47, 61), (30, 90), None),
    ((61, 29), (11, 25), None),
    ((64, 40), (9, 37), None),
    ((47, 61), (17, 29), (3.0, 2.5, 57.25, 40.0)),
    ((33, 35), (33, 20), None),
    ((33, 35), (12, 35), None),
    ((40, 300), (12, 31), None),
]


def check_resample(mod: ModuleType) -> str | None:
    """None if ``mod.resample`` equals the installed PIL on every probe, in one of
    :data:`RESAMPLE_VARIANTS` (which is then used)."""
    from PIL import Image

    cases = []
    for i, (src, dst, box) in enumerate(RESAMPLE_PROBES):
        a = probe_image(*src, seed=i)
        for grey in (False, True):
            img = Image.fromarray(a)
            arr = a
            if grey:
                img = img.convert("L")
                arr = np.asarray(img)
            for f in FILTERS:
                want = np.asarray(img.resize((dst[1], dst[0]), f, box=box))
                cases.append((arr, dst, f, box or (0.0, 0.0, float(src[1]), float(src[0])), want))
    for variant in RESAMPLE_VARIANTS:
        if all(_resample_matches(mod, variant, *case) for case in cases):
            found.resample = variant
            found.variants["resample"] = variant[1]
            return None
    return f"the compiled resize differs from {_pil_version()}'s, in Pillow's arithmetic and in pillow-simd's"


def _resample_matches(mod: ModuleType, variant: tuple[int, int], arr: np.ndarray, dst: tuple[int, int], f: int,
                      box: tuple[float, ...], want: np.ndarray) -> bool:
    for flip in (False, True):
        out = np.empty(dst + arr.shape[2:], np.uint8)
        mod.resample(arr, out, f, box, flip, variant, (dst[1], dst[0]), (0, 0))
        if not np.array_equal(out, want[:, ::-1] if flip else want):
            return False
    # a window of the output: the same pixels as the crop of the whole
    h, w = dst
    out = np.empty((max(1, h // 2), max(1, w // 2)) + arr.shape[2:], np.uint8)
    mod.resample(arr, out, f, box, False, variant, (w, h), (w // 3, h // 4))
    return np.array_equal(out, want[h // 4:h // 4 + out.shape[0], w // 3:w // 3 + out.shape[1]])


def rotate_data(w: int, h: int, angle: float, expand: Any = False, center: Any = None, translate: Any = None
                ) -> tuple[list[float], tuple[int, int]]:
    """The affine data and output (width, height) that ``Image.rotate`` hands to ``Image.transform``
    for a w x h image, in PIL's own float operations (its cos and sin rounded to 15 places, its
    centre, translation and expansion); ``angle`` in degrees counter-clockwise, already taken modulo
    360 as PIL does. PIL's quarter-turn shortcuts are the caller's."""
    import math

    post_trans = (0, 0) if translate is None else translate
    if center is None:
        center = (w / 2, h / 2)
    angle = -math.radians(angle)
    m = [round(math.cos(angle), 15), round(math.sin(angle), 15), 0.0,
         round(-math.sin(angle), 15), round(math.cos(angle), 15), 0.0]

    def apply(x: float, y: float) -> tuple[float, float]:
        return m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]

    m[2], m[5] = apply(-center[0] - post_trans[0], -center[1] - post_trans[1])
    m[2] += center[0]
    m[5] += center[1]
    if expand:
        xx, yy = [], []
        for x, y in ((0, 0), (w, 0), (w, h), (0, h)):
            tx, ty = apply(x, y)
            xx.append(tx)
            yy.append(ty)
        nw = math.ceil(max(xx)) - math.floor(min(xx))
        nh = math.ceil(max(yy)) - math.floor(min(yy))
        m[2], m[5] = apply(-(nw - w) / 2.0, -(nh - h) / 2.0)
        w, h = nw, nh
    return m, (w, h)


def warp_probes(w: int, h: int) -> list[tuple[list[float], tuple[int, int], bool]]:
    """(coefficients, output (w, h), perspective) for a w x h image, where PIL's transform has its
    special cases and its rounding shows: rotations (tiny, quarter turns by matrix, odd angles,
    expanded, off-centre), shears, scales up and down (nearest's scale-only path), mirrors,
    translations far out (nearest's double stepper) and off the image, perspectives mild and
    strong (one whose denominator changes sign), other output sizes."""
    out: list[tuple[list[float], tuple[int, int], bool]] = []
    for degrees, expand, centre in ((1e-3, False, None), (7.5, False, None), (33.0, True, None), (90.0, False, None),
                                    (180.0, True, None), (270.0, False, (2.0, 3.5)), (-45.0, True, None),
                                    (359.9, False, (w * 0.7, -1.0))):
        m, size = rotate_data(w, h, degrees % 360.0, expand, centre)
        out.append((m, size, False))
    out += [
        ([1.0, 0.3, -4.0, 0.2, 1.0, 3.0], (w, h), False),  # shear
        ([2.0, 0.0, 0.25, 0.0, 1.75, -0.5], (w // 2 + 1, h // 2 + 1), False),  # scale down, scale-only path
        ([0.4, 0.0, 1.3, 0.0, 0.6, -2.0], (w + 7, h + 5), False),  # scale up
        ([-1.0, 0.0, float(w), 0.0, 1.0, 0.0], (w, h), False),  # mirror
        ([1.0, 1e-9, 0.0, -1e-9, 1.0, 0.0], (w, h), False),  # next to the identity, fixed-point path
        ([0.9, 0.1, 40000.5, -0.1, 0.9, 2.0], (w, h), False),  # far out: nearest's double stepper
        ([0.9, 0.1, -40000.5, 0.1, 0.9, -3.0], (w, h), False),
        ([1.0, 0.05, -float(w) - 3, 0.0, 1.0, 0.0], (w, h), False),  # entirely off the image
        ([1.02, 0.05, -3.0, 0.01, 0.98, 2.0, 1e-3, 2e-3], (w, h), True),
        ([0.7, 0.3, 2.0, -0.2, 1.1, 1.0, 0.01, -0.008], (w + 3, h), True),
        ([1.1, -0.2, 1.0, 0.15, 0.9, -2.0, -0.06, 0.02], (w, h), True),  # the denominator crosses zero
    ]
    return out


def check_warp(mod: ModuleType, filters: tuple[int, ...] = tuple(WARP_FILTERS)) -> str | None:
    """None if ``mod.warp`` equals the installed PIL's ``Image.transform`` on every probe: RGB and L,
    every filter (or those of ``filters``), :func:`warp_probes` on a probe image and on tiny ones,
    black and coloured fills; and ``Image.rotate`` (expanded, off-centre, translated) equals the
    kernel run with :func:`rotate_data`'s matrix and size."""
    from PIL import Image

    big = probe_image(29, 37, seed=3)
    images = [big, np.ascontiguousarray(big[..., 1]), probe_image(1, 1, seed=1), probe_image(3, 2, seed=2),
              np.ascontiguousarray(probe_image(1, 5, seed=4)[..., 0])]
    for k, a in enumerate(images):
        img = Image.fromarray(a)
        h, w = a.shape[:2]
        fill = (10, 200, 255)[: 1 if a.ndim == 2 else 3] if k % 2 == 0 else (0,) * (1 if a.ndim == 2 else 3)
        colour = fill[0] if a.ndim == 2 else fill
        probes = warp_probes(w, h) if k < 2 else warp_probes(w, h)[::3]
        for coeffs, (ow, oh), persp in probes:
            method = Image.Transform.PERSPECTIVE if persp else Image.Transform.AFFINE
            for f in filters:
                want = np.asarray(img.transform((ow, oh), method, coeffs, f, fillcolor=colour))
                got = np.empty(want.shape, np.uint8)
                padded = tuple(float(c) for c in coeffs) + (0.0,) * (8 - len(coeffs))
                if not mod.warp(a, got, padded, persp, f, bytes(fill)) or not np.array_equal(got, want):
                    kind = "perspective" if persp else "affine"
                    return (f"the compiled transform differs from {_pil_version()}'s ({WARP_FILTERS[f]}, {kind} "
                            f"{coeffs}, {'L' if a.ndim == 2 else 'RGB'} {w}x{h})")
    # Image.rotate itself: its matrix and size as rotate_data rebuilds them (this PIL's conventions)
    img = Image.fromarray(big)
    for angle, expand, center, translate in ((15.0, False, None, None), (-100.5, True, None, None),
                                             (30.0, False, (5.0, 20.0), (3, -2)), (1e-3, True, (0.0, 0.0), None)):
        m, (ow, oh) = rotate_data(img.width, img.height, angle % 360.0, expand, center, translate)
        for f in filters:
            want = np.asarray(img.rotate(angle, f, expand, center, translate))
            got = np.empty(want.shape, np.uint8)
            if want.shape[:2] != (oh, ow) or not mod.warp(big, got, tuple(m) + (0.0, 0.0), False, f, bytes(3)) \
                    or not np.array_equal(got, want):
                return f"{_pil_version()}'s Image.rotate differs from its transform with rotate_data's matrix ({angle})"
    return None


def check_grayscale(mod: ModuleType) -> str | None:
    """None if RGB-to-L and the grey sum equal the installed PIL's in one of :data:`GREY_MODES`."""
    from PIL import Image

    probe = probe_colours()
    # widths of every remainder modulo 4: pillow-simd's formula depends on the pixel's place in the row
    parts = [probe, probe[:, :63], probe[:, :62], probe[:, :61], probe[3:40, 5:50], probe[:1, :1]]
    wants = [np.asarray(Image.fromarray(np.ascontiguousarray(a)).convert("L")) for a in parts]
    for mode in GREY_MODES:
        ok = True
        for a, want in zip(parts, wants):
            got = np.empty(a.shape[:2], np.uint8)
            mod.rgb_to_l(a, got, mode)
            if not np.array_equal(got, want) or mod.gray_sum(a, mode) != int(want.sum(dtype=np.int64)):
                ok = False
                break
        if ok:
            found.grey = mode
            found.variants["grayscale"] = mode
            return None
    return f"the compiled RGB-to-L conversion differs from {_pil_version()}'s"


SATURATION_PROBE_FACTORS = (0.0, 0.3, 0.5, 0.6, 1.0, 1.4, 2.0, -0.5, 7.5)


def check_saturation(mod: ModuleType) -> str | None:
    from PIL import Image, ImageEnhance

    probe = probe_colours()
    parts = [probe, probe[:, :61]]
    for mode in GREY_MODES:
        ok = True
        for a in parts:
            a = np.ascontiguousarray(a)
            for factor in SATURATION_PROBE_FACTORS:
                want = np.asarray(ImageEnhance.Color(Image.fromarray(a)).enhance(factor))
                got = np.empty_like(a)
                mod.blend_gray(a, got, factor, mode)
                if not np.array_equal(got, want):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            found.saturation = mode
            found.variants["saturation"] = mode
            return None
    return f"the compiled saturation blend differs from {_pil_version()}'s"


BLEND_PROBE = ((0, 0.0), (0, 0.3), (0, 0.6), (0, 1.0), (0, 1.4), (0, 2.7), (127, 0.6), (128, 1.3),
               (255, 0.3), (1, -0.5), (90, 7.5), (200, 0.999))


SHARPNESS_PROBE_FACTORS = (0.0, 0.1, 0.5, 1.0, 1.37, 1.9, 2.0, -0.5, 7.5)


def check_sharpness(mod: ModuleType) -> str | None:
    """The kernel against ``ImageEnhance.Sharpness`` on colours where rounding shows, RGB and L, and on
    the shapes PIL treats apart (under 3 x 3: copied whole; 3 wide or high: only borders)."""
    from PIL import Image, ImageEnhance

    probe = probe_colours()
    parts = [probe, probe[:, :61], probe[:3, :3], probe[:2, :9], probe[:7, :1], probe[5:9, 7:10]]
    for a in parts + [np.ascontiguousarray(p[..., 1]) for p in parts[:2]]:
        a = np.ascontiguousarray(a)
        img = Image.fromarray(a)
        for factor in SHARPNESS_PROBE_FACTORS:
            want = np.asarray(ImageEnhance.Sharpness(img).enhance(factor))
            got = np.empty_like(a)
            mod.sharpness(a, got, factor)
            if not np.array_equal(got, want):
                return f"the compiled sharpness differs from {_pil_version()}'s (factor {factor}, shape {a.shape})"
    return None


def check_blend(mod: ModuleType) -> str | None:
    from PIL import Image

    probe = probe_colours()
    img = Image.fromarray(probe)
    for value, factor in BLEND_PROBE:
        want = np.asarray(Image.blend(Image.new("RGB", img.size, (value,) * 3), img, factor))
        got = np.empty_like(probe)
        mod.blend_const(probe, got, value, factor)
        grey = np.ascontiguousarray(probe[..., 1])
        want_l = np.asarray(Image.blend(Image.new("L", img.size, value), Image.fromarray(grey), factor))
        got_l = np.empty_like(grey)
        mod.blend_const(grey, got_l, value, factor)
        if not (np.array_equal(got, want) and np.array_equal(got_l, want_l)):
            return f"the compiled blend differs from {_pil_version()}'s (value {value}, factor {factor})"
    return None


def pil_hue_shift(a: np.ndarray, shift: int) -> np.ndarray:
    """torchvision's PIL hue round trip on an RGB array, for reference: HSV, add to H, back to RGB."""
    from PIL import Image

    h, s, v = Image.fromarray(np.ascontiguousarray(a), "RGB").convert("HSV").split()
    hue = (np.asarray(h, dtype=np.uint8) + np.uint8(shift & 255)).astype(np.uint8)
    return np.asarray(Image.merge("HSV", (Image.fromarray(hue, "L"), s, v)).convert("RGB"))


def check_hue(mod: ModuleType) -> str | None:
    probe = probe_colours()
    for shift in (0, 1, 37, 128, 219, 255):
        got = np.empty_like(probe)
        mod.hue_shift(probe, got, shift)
        if not np.array_equal(got, pil_hue_shift(probe, shift)):
            return f"the compiled hue shift differs from {_pil_version()}'s"
    return None


def check_tables(mod: ModuleType) -> str | None:
    probe = probe_colours()[5:37, 3:50]
    tables = np.random.default_rng(7).integers(0, 256, size=(3, 256), dtype=np.uint8)
    got = np.empty_like(probe)
    mod.lut(probe, got, tables.tobytes())
    if not np.array_equal(got, np.stack([tables[c][probe[..., c]] for c in range(3)], -1)):
        return "the compiled table lookup is wrong"
    for dtype in (np.float32, np.float64):
        table = np.random.default_rng(3).standard_normal((3, 256)).astype(dtype)
        out = np.empty((3,) + probe.shape[:2], dtype)
        mod.planes_lut(probe, table, out)
        if not np.array_equal(out, np.stack([table[c][probe[..., c]] for c in range(3)])):
            return "the compiled tensor tail is wrong"
        out = np.empty(probe.shape, dtype)
        mod.pixels_lut(probe, table, out)
        if not np.array_equal(out, np.stack([table[c][probe[..., c]] for c in range(3)], -1)):
            return "the compiled tensor tail is wrong"
    return None


#: The crop-decode probes: (label, height, width, how encoded). Odd sizes, every chroma sampling
#: simplejpeg writes, grey, restart markers and progressive files (PIL's encoder).
CROP_PROBES = (
    ("4:2:0", 61, 47, "420"), ("4:2:2", 33, 131, "422"), ("4:4:0", 47, 61, "440"), ("4:4:4", 17, 16, "444"),
    ("4:1:1", 29, 70, "411"), ("grey", 23, 37, "gray"), ("4:2:0 1 x 1", 1, 1, "420"), ("4:2:0 2 x 3", 2, 3, "420"),
    ("4:2:2 1 x 19", 1, 19, "422"), ("4:2:0 with restart markers", 40, 53, "restart"),
    ("progressive 4:2:0", 45, 53, "progressive"), ("progressive grey", 19, 35, "progressive-grey"),
)
#: iMCU (height, width) by encoding: the unit libjpeg crops and skips in.
_IMCU = {"420": (16, 16), "422": (8, 16), "440": (16, 8), "444": (8, 8), "411": (8, 32), "gray": (8, 8),
         "restart": (16, 16), "progressive": (16, 16), "progressive-grey": (8, 8)}


def _crop_probe_jpeg(h: int, w: int, how: str, seed: int) -> bytes:
    import io

    import simplejpeg
    from PIL import Image

    # noise next to gradients: chroma changes from one sample to the next, so a wrong edge shows
    rng = np.random.default_rng(seed)
    a = probe_image(h, w, seed)
    a = np.where(rng.random((h, w, 1)) < 0.5, a, rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).astype(np.uint8)
    if how in ("420", "422", "440", "444", "411"):
        return simplejpeg.encode_jpeg(a, 90, colorsubsampling=how)
    if how == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(a[..., :1]), 90, colorspace="GRAY")
    img = Image.fromarray(a)
    out = io.BytesIO()
    if how == "restart":
        img.save(out, "JPEG", quality=90, subsampling=2, restart_marker_blocks=1)
    elif how == "progressive":
        img.save(out, "JPEG", quality=90, subsampling=2, progressive=True)
    else:
        img.convert("L").save(out, "JPEG", quality=90, progressive=True)
    return out.getvalue()


def crop_windows(h: int, w: int, imcu: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """Windows (top, left, height, width) of an h x w image where a crop decode goes wrong if it can: left
    and top edges at every offset of the first iMCU and on its far boundary, right and bottom edges at
    every offset of the second, narrow windows (1 to 5 pixels), windows touching every edge, the whole image."""
    mh, mw = imcu
    out = {(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (0, w - 1, 1, 1), (h - 1, 0, 1, 1),
           (0, 0, 1, w), (h - 1, 0, 1, w), (0, 0, h, 1), (0, w - 1, h, 1)}
    for r in range(mw + 1):
        left = min(r, w - 1)
        top = (3 * r) % h
        out.add((top, left, min((h, 1, 2, 5)[r % 4], h - top), min((1, 2, 3, w)[r % 4], w - left)))
        # wider than an iMCU, so that the decoded band ends at this right edge (narrower bands are widened)
        right = min(mw + r + 1, w)
        left = min(r % 5, right - 1)
        out.add(((5 * r) % h, left, h - (5 * r) % h, right - left))
    for r in range(mh + 1):
        top = min(r, h - 1)
        left = (5 * r) % w
        out.add((top, left, min((1, 2, 3, h)[r % 4], h - top), w - left))
        bottom = min(mh + r + 1, h)
        top = max(0, bottom - 1 - r % 3)
        out.add((top, (3 * r) % w, bottom - top, w - (3 * r) % w))
    return sorted(out)


def check_crop_decode(mod: ModuleType) -> str | None:
    """None if region decodes of every probe (:data:`CROP_PROBES`, :func:`crop_windows`) equal simplejpeg's
    full decode sliced. Progressive files that differ are left to the full decode, the rest still used."""
    try:
        import simplejpeg
    except ImportError:
        return "simplejpeg, the full decode it is checked against, is not installed"
    multiscan_why = ""
    for seed, (label, h, w, how) in enumerate(CROP_PROBES):
        data = _crop_probe_jpeg(h, w, how, seed)
        want = simplejpeg.decode_jpeg(data, colorspace="RGB")
        for top, left, wh, ww in crop_windows(h, w, _IMCU[how]):
            try:
                buf, stride, oy, ox = mod.decode_region(data, top, left, wh, ww)
            except mod.Error as exc:
                why = f"it failed on a {label} JPEG: {exc}"
            else:
                got = np.frombuffer(buf, np.uint8).reshape(len(buf) // stride, stride // 3, 3)[oy:oy + wh, ox:ox + ww]
                if np.array_equal(got, want[top:top + wh, left:left + ww]):
                    continue
                why = (f"it differs from the full decode on a {label} {h} x {w} JPEG "
                       f"(window top {top}, left {left}, {wh} x {ww})")
            if how.startswith("progressive"):
                multiscan_why = why
                break
            return f"{mod.LIBJPEG_VERSION}'s crop decode is not exact: {why}"
    found.crop_multiscan = not multiscan_why
    found.crop_note = f"progressive files decoded whole: {multiscan_why}" if multiscan_why else ""
    return None


def check_torch_draws(mod: ModuleType) -> str | None:
    """torch's draws reproduced (``torch_draws.py``): checked against the installed torch's own."""
    from . import torch_draws

    return torch_draws.check(mod)


def check_array_gather(mod: ModuleType) -> str | None:
    """An array dataset's batch gather (``csrc/array_gather.c``) against NumPy's indexing of the same maps, for one
    and three channels, a transposed (strided) source, float32 and float64 tables."""
    rng = np.random.default_rng(2026)
    for channels, transposed, dtype in ((3, False, np.float32), (1, False, np.float64), (3, True, np.float32)):
        shape = (5, 3, 7, 6) if transposed else (5, 7, 6, 3) if channels == 3 else (5, 7, 6)
        src = rng.integers(0, 256, shape, dtype=np.uint8)
        if transposed:
            src = src.transpose(0, 2, 3, 1)  # (SVHN's layout, read as H x W x C)
        th, tw, count = 4, 5, 6
        maps = rng.integers(-1, 6, 2 * count * (th + tw), dtype=np.int32)
        maps[maps >= 6] = 5
        samples = np.array([(k % 5, k * (th + tw), k * (th + tw) + th) for k in range(count)], np.int64)
        fill = bytes(rng.integers(0, 256, channels, dtype=np.uint8))
        table = rng.standard_normal((channels, 256)).astype(dtype)
        out = np.empty((count, channels, th, tw), dtype)
        mod.gather_batch(src, samples, maps, th, tw, fill, table, out)
        for k, (idx, ro, co) in enumerate(samples):
            rows, cols = maps[ro:ro + th], maps[co:co + tw]
            img = src[idx] if channels == 3 else src[idx][..., None]
            for c in range(channels):
                values = np.where((rows[:, None] < 0) | (cols[None, :] < 0), fill[c],
                                  img[np.clip(rows, 0, None)[:, None], np.clip(cols, 0, None)[None, :], c])
                if not np.array_equal(out[k, c], table[c][values]):
                    return "the array gather differs from NumPy's indexing"
    return None


CHECKS: dict[str, Callable[[Any], str | None]] = {
    "resample": check_resample,
    "warp": check_warp,
    "grayscale": check_grayscale,
    "saturation": check_saturation,
    "blend": check_blend,
    "sharpness": check_sharpness,
    "hue": check_hue,
    "tables": check_tables,
    "crop_decode": check_crop_decode,
    "torch_draws": check_torch_draws,
    "array_gather": check_array_gather,
}
