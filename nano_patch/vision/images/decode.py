"""Decode image files to uint8 RGB arrays: libjpeg-turbo through simplejpeg for real JPEGs, PIL otherwise.

The result always equals stock ``PIL.Image.open(path).convert("RGB")``: the file's bytes, not its
extension, decide the decoder; CMYK/YCCK JPEGs and every other format go through PIL; a corrupt or
truncated file raises PIL's exception, its message PIL's.

PIL's guards stay: before libjpeg-turbo allocates a pixel, :func:`check_open` applies what stock's
``Image.open`` does to the header (the installed PIL's decompression-bomb rule, read at call time,
and PIL's own open of the bytes where the header carries EXIF or MPF data, whose parsing warns).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from PIL import Image

from ... import report

_JPEG_SOI = b"\xff\xd8\xff"


def _own_bomb_check(size: tuple[int, int]) -> None:
    """PIL's rule, for a PIL without ``_decompression_bomb_check``: same classes, same messages."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None:
        return
    pixels = max(1, size[0]) * max(1, size[1])
    if pixels > 2 * limit:
        raise Image.DecompressionBombError(
            f"Image size ({pixels} pixels) exceeds limit of {2 * limit} pixels, "
            "could be decompression bomb DOS attack."
        )
    if pixels > limit:
        warnings.warn(
            f"Image size ({pixels} pixels) exceeds limit of {limit} pixels, could be decompression bomb DOS attack.",
            Image.DecompressionBombWarning,
            stacklevel=1,  # PIL's own: the warning is attributed to the line that issues it
        )


#: The installed PIL's own rule (Pillow and pillow-simd both have it and take the (width, height) size
#: positionally). It reads ``Image.MAX_IMAGE_PIXELS`` at each call, so a limit the user lowers, or None,
#: acts at once; its warning is issued from PIL's own line, so warnings filters and the once-per-
#: location registry treat it exactly as stock's.
_bomb_check: Callable[[tuple[int, int]], None] = getattr(Image, "_decompression_bomb_check", _own_bomb_check)


def check_size(height: int, width: int) -> None:
    """Stock's decompression-bomb rule on an image of this size: DecompressionBombError above twice
    ``Image.MAX_IMAGE_PIXELS``, DecompressionBombWarning above it, nothing when it is None."""
    _bomb_check((width, height))


def below_size_limit(height: int, width: int) -> bool:
    """True where :func:`check_size` can do nothing for this size (PIL's rule acts only above
    ``Image.MAX_IMAGE_PIXELS``): the draw of a batch skips the call then. False where it may act, or where the
    limit is not a plain int (None, or anything a user set: PIL's own rule then decides)."""
    limit = Image.MAX_IMAGE_PIXELS
    return type(limit) is int and max(1, height) * max(1, width) <= limit


# Markers PIL's JPEG open reads with a 2-byte length and no warning of its own: the SOFs (not 0xC8),
# DHT, DAC, DQT, DRI, APP0-APP15 and COM. Anything else makes PIL's own open run (see plain_open).
_LENGTH_MARKERS = frozenset([*range(0xC0, 0xC8), *range(0xC9, 0xD0), 0xDB, 0xDD, *range(0xE0, 0xF0), 0xFE])


def plain_open(data: bytes) -> bool:
    """True when stock's ``Image.open`` of this JPEG can warn of nothing but its size.

    PIL's JPEG open warns from two places besides the bomb check: its parse of an APP1 "Exif" segment
    (to find the DPI, e.g. "Corrupt EXIF data") and of an APP2 "MPF" one (MPO detection). Walks the
    segments up to the first scan, as PIL does; any oddity answers False, so that PIL itself decides.
    """
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False
        m = data[i + 1]
        if m == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if m == 0xDA:
            return True
        if m not in _LENGTH_MARKERS:
            return False
        if m == 0xE1 and data.startswith(b"Exif\x00\x00", i + 4):
            return False
        if m == 0xE2 and data.startswith(b"MPF\x00", i + 4):
            return False
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return False


#: Per thread: the file whose open stage already ran for the sample being loaded (see :func:`reusing_open`).
_reused = threading.local()


@contextlib.contextmanager
def reusing_open(path: Any, data: bytes | None, array: np.ndarray | None = None,
                 info: dict[Any, Any] | None = None) -> Iterator[None]:
    """While a sample is loaded again one by one in this thread: ``path``'s open stage (PIL's warnings and guards)
    already ran, on ``data``, and ``array`` is its decode where one was made, so none of it is run again."""
    previous = getattr(_reused, "entry", None)
    _reused.entry = (os.fspath(path), data, array)
    if info is not None:
        _stash_info(path, info)
    try:
        yield
    finally:
        _reused.entry = previous


def _reuse(path: Any) -> tuple[str, bytes | None, np.ndarray | None] | None:
    entry = getattr(_reused, "entry", None)
    if entry is None:
        return None
    try:
        return entry if entry[0] == os.fspath(path) else None
    except TypeError:
        return None


def open_stage_ran(path: Any) -> bool:
    """Whether ``path``'s open stage already ran for the sample this thread is loading (:func:`reusing_open`)."""
    return _reuse(path) is not None


def looks_truncated(data: bytes) -> bool:
    """A JPEG whose bytes end before its image does: no end-of-image marker after the first scan's start.

    Stock's open of it succeeds and its decode raises (``image file is truncated``), before the transform draws;
    the loader's threads leave such a file to stock's own code, so that nothing of it is run ahead.
    """
    sos = data.find(b"\xff\xda", 2)
    return sos < 0 or data.rfind(b"\xff\xd9") < sos


#: Per thread: the ``info`` of the last image PIL opened here, by path (see :func:`image_info`).
_opened = threading.local()


def _stash_info(path: Any, info: dict[Any, Any]) -> None:
    if path is not None:
        _opened.entry = (os.fspath(path), dict(info))


def image_info(path: Any, data: bytes | None = None) -> dict[Any, Any]:
    """The ``info`` of stock's ``Image.open(path).convert("RGB")``: PIL's own parse of the file's header.

    Taken from PIL's open of the file in this thread where one just ran (:func:`check_open`, a PIL decode);
    otherwise a JPEG whose header can warn of nothing is parsed by PIL's JPEG plugin from its first bytes, and any
    other file is opened by PIL (its warnings are those of stock's open of the file). Called only where the
    sample is an image (a tensor's pixels do not depend on it).
    """
    entry = getattr(_opened, "entry", None)
    if entry is not None and entry[0] == os.fspath(path):
        _opened.entry = None
        return dict(entry[1])
    if data is None:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
        if not (data.startswith(_JPEG_SOI) and plain_open(data)):
            data = read_bytes(path)
    try:
        if data.startswith(_JPEG_SOI) and plain_open(data):
            from PIL import JpegImagePlugin

            return dict(JpegImagePlugin.JpegImageFile(io.BytesIO(data)).info)
        with Image.open(io.BytesIO(data)) as im:
            return dict(im.convert("RGB").info) if im.mode == "P" else dict(im.info)
    except Exception:  # noqa: BLE001 - the decode raises stock's error for such a file
        return {}


def check_open(data: bytes, height: int, width: int, path: Any = None) -> bool:
    """Stock ``Image.open``'s checks on a JPEG about to be decoded by libjpeg-turbo, in this thread,
    before any pixel is allocated: its warnings and errors, same classes, same messages, same order.

    The decompression-bomb rule on the header's size; where the header holds EXIF or MPF data, PIL's
    own open of the bytes instead (it parses them, warns as stock does, and applies the same rule).
    False when that open fails otherwise: PIL then decodes the file and raises stock's error.
    A later decode of the same bytes is told ``checked=True``, so that nothing warns twice.
    """
    entry = getattr(_reused, "entry", None)
    if entry is not None and entry[1] is data:
        return True  # its open stage ran for this sample already (reusing_open)
    if plain_open(data):
        _bomb_check((width, height))
    else:
        try:
            with Image.open(io.BytesIO(data)) as im:
                _stash_info(path, im.info)
        except Exception as exc:
            if isinstance(exc, (Warning, Image.DecompressionBombError)):
                raise  # stock's own: a warning made an error by the user's filters, or the bomb error
            return False
    return True


def _simplejpeg():
    try:
        import simplejpeg
    except ImportError:  # pragma: no cover - a declared dependency, but never crash for it
        return None
    return simplejpeg


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    reused = _reuse(path)
    if reused is not None and reused[1] is not None:
        return reused[1]
    with open(path, "rb") as f:
        return f.read()


def jpeg_header(data: bytes) -> tuple[int, int, str] | None:
    """(height, width, colorspace) of a JPEG that libjpeg-turbo decodes like PIL ("YCbCr" or "Gray")."""
    sj = _simplejpeg()
    if sj is None or not data.startswith(_JPEG_SOI):
        return None
    try:
        h, w, colorspace, _ = sj.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray"):
        return None  # CMYK and YCCK: PIL's conversion is the reference
    return h, w, colorspace


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) of a JPEG that simplejpeg can decode to RGB, else None."""
    header = jpeg_header(data)
    return None if header is None else header[:2]


def decode_rgb(
    path: str | os.PathLike[str], min_size: tuple[int, int] | None = None, data: bytes | None = None,
    *, checked: bool = False,
) -> np.ndarray:
    """Decode ``path`` to an HxWx3 uint8 RGB array equal to ``PIL.Image.open(path).convert("RGB")``.

    ``min_size`` = (height, width) lets libjpeg-turbo scale a JPEG down in the DCT domain (by 1/2,
    1/4 or 1/8) while keeping both sides at least that large. It is only a permission: the caller
    must resize the result to its final size. ``data``: the file's bytes, when already read.
    ``checked``: the caller already ran :func:`check_open` on them (its warnings are not repeated).
    """
    return decode_rgb_reproducibly(path, min_size, data, checked=checked)[0]


def decode_rgb_reproducibly(
    path: str | os.PathLike[str], min_size: tuple[int, int] | None = None, data: bytes | None = None,
    *, checked: bool = False,
) -> tuple[np.ndarray, bool]:
    """:func:`decode_rgb`, and whether the same file always decodes to these pixels with this software.

    True for libjpeg-turbo's strict decodes, and for PIL's unless ``ImageFile.LOAD_TRUNCATED_IMAGES``
    is set (a damaged file then decodes to PIL's fill, where stock with the flag off raises). Only
    such decodes may go into the decoded-image cache.
    """
    reused = _reuse(path)
    if reused is not None and reused[2] is not None and min_size is None:
        return reused[2], False  # decoded when its open stage ran (not stored again)
    data = read_bytes(path) if data is None else data
    size = jpeg_size(data)
    if size is not None and (checked or check_open(data, *size, path=path)):
        sj = _simplejpeg()
        kwargs: dict[str, Any] = {"colorspace": "RGB"}
        if min_size is not None:
            kwargs.update(min_height=int(min_size[0]), min_width=int(min_size[1]))
        try:
            arr = sj.decode_jpeg(data, strict=True, **kwargs)
        except ValueError:
            pass  # truncated or corrupt: PIL decides, so the error (or LOAD_TRUNCATED_IMAGES) is stock
        else:
            if report.stats is not None:
                report.stats.count("vision_datasets", True, "JPEG decoded by libjpeg-turbo")
            return arr, True
    if report.stats is not None:
        report.stats.count("vision_datasets", False, why_pil(data))
    from PIL import ImageFile

    return np.asarray(pil_open_rgb(path)), not ImageFile.LOAD_TRUNCATED_IMAGES


_MAGIC = ((b"\x89PNG", "PNG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def why_pil(data: bytes) -> str:
    """Why a file went to PIL rather than libjpeg-turbo, for the run report."""
    if data.startswith(_JPEG_SOI):
        sj = _simplejpeg()
        try:
            colorspace = sj.decode_jpeg_header(data)[2] if sj is not None else None
        except ValueError:
            colorspace = None
        if colorspace in ("CMYK", "YCCK"):
            return f"{colorspace} JPEG: decoded by PIL"
        return "damaged or unusual JPEG: decoded by PIL"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP files: decoded by PIL"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return f"{name} files: decoded by PIL"
    return "other image formats: decoded by PIL"


def decode_jpeg_native(path: str | os.PathLike[str], *, checked: bool = False) -> np.ndarray | None:
    """A baseline/progressive JPEG in its own mode, as ``Image.open(path)`` would hold it: HxW for
    grayscale ("L"), HxWx3 for colour ("RGB"). None for anything else (CMYK, other formats, damage):
    the caller then opens the file with PIL as stock does. ``checked``: as :func:`decode_rgb`."""
    data = read_bytes(path)
    header = jpeg_header(data)
    arr = None
    if header is not None and (checked or check_open(data, header[0], header[1], path=path)):
        gray = header[2] == "Gray"
        try:
            arr = _simplejpeg().decode_jpeg(data, colorspace="GRAY" if gray else "RGB", strict=True)
        except ValueError:
            pass  # truncated or corrupt: PIL decides
        else:
            arr = arr[:, :, 0] if gray else arr
    if report.stats is not None:
        report.stats.count("vision_datasets", arr is not None,
                           "JPEG decoded by libjpeg-turbo" if arr is not None else why_pil(data))
    return arr


def pil_open_rgb(path: str | os.PathLike[str]) -> Image.Image:
    """Stock ``Image.open(path).convert("RGB")``: stock's error, its message and notes unchanged."""
    with open(path, "rb") as f:
        img = Image.open(f)
        rgb = img.convert("RGB")
        _stash_info(path, rgb.info)
        return rgb
