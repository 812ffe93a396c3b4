"""Lazy JPEG images: ``Image.open(...).convert("RGB")`` whose pixels are decoded only when something reads them.

Under the patch, ``convert("RGB")`` of a plain JPEG that ``Image.open`` has just opened (by path or over a file
object) reads the file's bytes, as stock's ``load`` would, and returns an ordinary ``PIL.Image.Image`` whose core
(``Image._im``) is a :class:`PendingDecode` holding those bytes. Every PIL route to the pixels goes through the
``Image.im`` property (``load``, ``tobytes``, ``copy``, ``np.asarray``, pickling, every operation), which the patch
extends (:func:`image_core`): the first such access decodes the bytes with PIL's own JPEG decoder, exactly as
stock's ``load`` would have, and from then on the image holds that core. Only code that can prove equal pixels
without PIL (a patched ``Compose`` whose first step is a crop: ``data/datasets/lazy_samples.py``) reads the bytes
instead,
decoding only the crop's window.

What user code can see is stock's: the class is exactly ``PIL.Image.Image``, there is no ``filename``, ``format``
is None, ``readonly`` is 0, ``info`` is the file's, copied as stock's ``convert`` copies it; the opened image is
left loaded (its file closed where PIL opened it); the pixels are those of the bytes read at ``convert``, whatever
happens to the file later. Anything that is not a plain, whole baseline or progressive 8-bit JPEG in RGB or grey
(CMYK, 12-bit, arithmetic coding, lossless, a truncated or damaged stream, a draft, a stream with markers PIL's
decoder could refuse) keeps stock's ``convert``, and so stock's image, warnings and errors, at stock's line.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any

from PIL import Image, ImageFile

from ... import report
from . import call_sites, decode

#: The run report's section (the patch's name).
REPORT_KEY = "pil_images"
#: PIL's read size when it loads a file: where stock's ``load`` leaves a file object's position.
_MAX_BLOCK = ImageFile.MAXBLOCK


class PendingDecode:
    """Stands in ``Image._im`` for a lazy image until PIL reads its pixels: the JPEG's bytes, read at ``convert``;
    or, once the image has shown it is kept (:meth:`kept_pixels`), its decoded pixels in place of the bytes."""

    __slots__ = ("data", "size", "source_mode", "mode", "path", "args", "truncated_ok", "pixels", "renders",
                 "serial", "_core", "_lock")

    #: PIL reads ``_im.readonly`` (``Image.readonly``): a decoded image is writable
    readonly = 0

    def __init__(self, data: bytes, size: tuple[int, int], source_mode: str, mode: str, path: Any,
                 args: tuple[Any, ...], truncated_ok: bool) -> None:
        self.data: bytes | None = data  # (None once the pixels are held instead)
        self.size = size  # PIL's (width, height)
        self.source_mode, self.mode, self.path, self.args = source_mode, mode, path, args
        self.truncated_ok = truncated_ok
        #: the decoded pixels (H x W x 3, read-only), for an image rendered more than once: stock decodes once
        self.pixels: Any = None
        #: renders of this image outside a batch (a second one keeps its pixels)
        self.renders = 0
        #: the order it was made in (:func:`made_so_far`): a batch tells its own images from ones made before it
        self.serial = _take_serial()
        self._core: Any = None
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return True

    @property
    def hw(self) -> tuple[int, int]:
        return self.size[1], self.size[0]

    def core(self) -> Any:
        """The decoded core, made once (PIL's JPEG decoder on the bytes, as stock's ``load``, then its ``convert``;
        or a copy of the pixels kept): from then on PIL holds the pixels, and the bytes are let go."""
        core = self._core
        if core is None:
            with self._lock:
                core = self._core
                if core is None:
                    pixels = self.pixels
                    core = Image.fromarray(pixels).im if pixels is not None else _decode(self)
                    self._core, self.data = core, None
        return core

    def kept_pixels(self) -> Any:
        """The pixels as a read-only H x W x 3 array, decoded once and held from now on in place of the bytes (an
        image kept across epochs renders from them, as stock's holds its decoded pixels): libjpeg-turbo's strict
        decode, which is PIL's for the streams a lazy image takes, else PIL's own."""
        pixels = self.pixels
        if pixels is None:
            with self._lock:
                pixels = self.pixels
                if pixels is None:
                    pixels = self.pixels = _pixels_of(self)
                    self.data = None
        return pixels


#: the last serial number a lazy image got, and its lock
_last_serial = 0
_serial_lock = threading.Lock()


def _take_serial() -> int:
    global _last_serial
    with _serial_lock:
        _last_serial += 1
        return _last_serial


def made_so_far() -> int:
    """The serial number the next lazy image gets: images with one at least this high were made after this call."""
    return _last_serial + 1


def _fresh_serial_lock() -> None:
    global _serial_lock
    _serial_lock = threading.Lock()  # (a lock another thread held at a fork stays held in the child)


os.register_at_fork(after_in_child=_fresh_serial_lock)


def _pixels_of(p: PendingDecode) -> Any:
    import numpy as np

    a = None
    if p._core is None and p.data is not None:
        try:
            a = decode.decode_rgb(p.path, data=p.data, checked=True)  # (its markers were checked at convert)
        except Exception:  # noqa: BLE001 - a stream the strict decode refuses: PIL's decode decides
            a = None
    if a is None or a.shape[:2] != p.hw:
        core = p._core if p._core is not None else _decode(p)
        a = np.asarray(Image.Image()._new(core))
    a.flags.writeable = False
    return a


def _decode(p: PendingDecode) -> Any:
    """What stock's ``load`` then ``convert`` make of the bytes: ``ImageFile.load``'s decode, fed at once."""
    core = Image.core.new(p.source_mode, p.size)
    decoder = Image._getdecoder(p.source_mode, "jpeg", p.args, ())
    try:
        decoder.setimage(core, (0, 0, *p.size))
        n, err_code = decoder.decode(p.data)
        if n >= 0:  # the stream ended before the image: as stock's load at the end of the file
            if not p.truncated_ok:
                raise OSError(f"image file is truncated ({len(p.data)} bytes not processed)")
            n, err_code = decoder.decode(b"\xff\xd9")
    finally:
        decoder.cleanup()
    if not p.truncated_ok and err_code < 0:
        raise ImageFile._get_oserror(err_code, encoder=False)
    if p.mode != p.source_mode:
        core = core.convert(p.mode, Image.Dither.FLOYDSTEINBERG)
    return core


#: The lazy images alive, so that the patch's revert can decode them: PIL's own ``Image.im`` reads no pending decode.
#: (PIL images are unhashable: by id, each entry dropped with its image.)
_live: dict[int, weakref.ref[Image.Image]] = {}
_live_lock = threading.Lock()


def _keep_track(img: Image.Image) -> None:
    key = id(img)
    with _live_lock:
        _live[key] = weakref.ref(img, lambda _ref: _live.pop(key, None))


def decode_all() -> None:
    """Decode every lazy image still alive (the patch is being reverted: PIL's own code takes over their pixels)."""
    with _live_lock:
        images = [ref() for ref in _live.values()]
        _live.clear()
    for img in images:
        if img is not None and type(img.__dict__.get("_im")) is PendingDecode:
            with contextlib.suppress(Exception):  # (stock's error, raised where its pixels are read)
                image_core(img)


def undecoded_alive() -> list[PendingDecode]:
    """The pending decodes of the lazy images alive now whose pixels neither they nor PIL hold yet."""
    with _live_lock:
        images = [ref() for ref in _live.values()]
    found = []
    for img in images:
        p = img.__dict__.get("_im") if img is not None else None
        if type(p) is PendingDecode and p.pixels is None and p._core is None and p.data is not None:
            found.append(p)
    return found


def pending_of(img: Any) -> PendingDecode | None:
    """The pending decode of a lazy RGB image whose pixels nothing has read yet (a converted one, or an opened JPEG
    :func:`load_lazily` loaded), else None."""
    if type(img) is not Image.Image and type(img).__name__ != "JpegImageFile":
        return None
    p = img.__dict__.get("_im")
    if type(p) is not PendingDecode or p._core is not None or img.__dict__.get("_mode") != "RGB":
        return None
    return p


def image_core(img: Image.Image) -> Any:
    """``Image.im`` under the patch: stock's, a pending decode made first."""
    im = img._im
    if type(im) is PendingDecode:
        im = img._im = im.core()
    elif isinstance(im, Image.DeferredError):
        raise im.ex
    assert im is not None
    return im


def _takes(img: Any) -> bool:
    """A plain JPEG ``Image.open`` has just opened, nothing of it loaded or changed yet."""
    from PIL import JpegImagePlugin

    if type(img) is not JpegImagePlugin.JpegImageFile:
        return False
    d = img.__dict__
    if d.get("_im") is not None or img.mode not in ("RGB", "L") or img.palette or img.fp is None:
        return False
    if d.get("decoderconfig") or "_ended" in d or d.get("map") is not None or "transparency" in img.info:
        return False
    tile = img.tile
    if len(tile) != 1:
        return False
    name, extents, offset, args = tile[0]
    return name == "jpeg" and tuple(extents) == (0, 0, *img.size) and offset == 0 and tuple(args) == (img.mode, "")


def plain_stream(data: bytes, size: tuple[int, int], mode: str) -> int:
    """Where the end-of-image marker ends, in a whole, 8-bit, Huffman-coded baseline or progressive JPEG of this
    (width, height) and colour, every marker segment of which passes each check libjpeg-turbo makes before and
    while it decodes rows (``csrc/markers.c``: PIL's decoder then cannot fail on the stream's markers, now or
    later, and libjpeg-turbo's strict decode of it is PIL's); else 0, also where the extension is not here (the
    decode then runs at stock's moment)."""
    header = decode.jpeg_header(data)
    if header is None or (header[1], header[0]) != size or header[2] != ("Gray" if mode == "L" else "YCbCr"):
        return 0
    check = _stream_check()
    if check is None:
        return 0
    # (libjpeg refuses a progressive image whose coefficients exceed a memory bound set in JPEGMEM: not modelled)
    return check(data, size[0], size[1], 1 if mode == "L" else 3, "JPEGMEM" not in os.environ)


_stream_end: Any = None


def _stream_check() -> Any:
    """The native whole-stream check, or None where the extension is missing or switched off."""
    global _stream_end
    if _stream_end is None:
        try:
            from ..kernels import native

            _stream_end = native.extension().stream_end
        except Exception:  # noqa: BLE001 - no native module here (or switched off): no lazy decode
            _stream_end = False
    return _stream_end or None


def _position_after_load(data: bytes, end: int) -> int:
    """Where stock's ``load`` leaves the file: it reads in PIL's blocks until the decoder has the image's ``end``."""
    blocks = -(-end // _MAX_BLOCK)
    return min(len(data), blocks * _MAX_BLOCK)


def convert_lazily(img: Any, mode: Any, matrix: Any) -> Image.Image | None:
    """Stock's ``img.convert(mode, matrix)`` as a lazy image where :func:`_takes` and :func:`plain_stream` allow,
    with the opened image left as stock's ``load`` leaves it, or of a JPEG :func:`lazy_load` left pending; None
    (nothing read, or the file object put back where it was) where stock's own ``convert`` must run."""
    if mode != "RGB" or matrix:
        return None
    source = _pending_load(img)
    if source is None:
        if not _takes(img):
            return None
        source = _load_lazily(img)
        if source is None:
            return None
    # stock's result: a new image over the decode (copied, or converted from grey), the file's info copied
    pending = PendingDecode(source.data, source.size, source.source_mode, "RGB", source.path, source.args,
                            source.truncated_ok)  # type: ignore[arg-type]
    if source.data is None:  # (its pixels are held: shared, read-only, as a copy is)
        pending.pixels = source.pixels
        if pending.pixels is None or source.source_mode != "RGB":
            return None
    out = Image.Image()
    out._im = pending
    out._mode = "RGB"
    out._size = img.size
    out.info = img._copy_info()
    _keep_track(out)
    return out


def _pending_load(img: Any) -> PendingDecode | None:
    """The pending decode of an opened JPEG that :func:`lazy_load` loaded and nothing has read or changed since
    (stock's ``convert`` of it copies the decoded image, or converts it from grey)."""
    from PIL import JpegImagePlugin

    if type(img) is not JpegImagePlugin.JpegImageFile:
        return None
    p = img.__dict__.get("_im")
    if type(p) is not PendingDecode or p._core is not None or img.mode != p.mode or img.size != p.size:
        return None
    if img.palette or "transparency" in img.info or img.__dict__.get("decoderconfig"):
        return None
    return p


def lazy_load(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ImageFile.load``'s wrapper: ``img.load()`` written as a statement (its pixel-access object dropped unused)
    on a plain JPEG just opened reads the file as stock's ``load`` does and leaves the pixels pending; everywhere
    else (the result kept, PIL's own calls, any other image) stock's ``load``."""
    if instance is None or args or kwargs or not _takes(instance):
        return wrapped(*args, **kwargs)
    frame = call_sites.caller(1)
    if frame is None or str(frame.f_globals.get("__name__", "")).startswith("PIL.") \
            or not call_sites.result_dropped(frame):
        return wrapped(*args, **kwargs)
    del frame
    if _load_lazily(instance) is None:
        return wrapped(*args, **kwargs)
    if report.stats is not None:
        report.count(REPORT_KEY, True, "JPEG loaded lazily (load()'s result unused; decoded where its pixels are "
                                       "read)")
    return None  # (dropped by the caller: nothing reads it)


def load_lazily(img: Any) -> PendingDecode | None:
    """For an RGB JPEG ``Image.open`` has just opened, handed as it is to a transform: the image loaded as stock's
    ``load`` leaves it, its pixels pending (:func:`pending_of` then finds them); else None (nothing done)."""
    if not _takes(img) or img.mode != "RGB":
        return None
    return _load_lazily(img)


def _load_lazily(img: Any) -> PendingDecode | None:
    """The opened image ``img`` loaded as stock's ``load`` leaves it (its file read and done with, ``tile`` empty),
    its core a pending decode of the bytes read; None where they are not a plain stream (nothing changed)."""
    fp = img.fp
    try:
        where = fp.tell()
        fp.seek(0)
        data = fp.read()
    except Exception:  # noqa: BLE001 - stock's load reads the file and meets its error itself
        with contextlib.suppress(Exception):
            fp.seek(where)
        return None
    end = plain_stream(data, img.size, img.mode) if type(data) is bytes else 0
    if not end:
        fp.seek(where)
        return None
    pending = PendingDecode(data, img.size, img.mode, img.mode, getattr(img, "filename", None) or None,
                            tuple(img.tile[0][3]), bool(ImageFile.LOAD_TRUNCATED_IMAGES))
    fp.seek(_position_after_load(data, end))
    img.map = None
    img._im = pending
    img.tile = []
    img.readonly = 0
    if img._exclusive_fp and img._close_exclusive_fp_after_loading:
        fp.close()
    img.fp = None
    _keep_track(img)
    return pending


def lazy_convert(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Image.convert``'s wrapper: :func:`convert_lazily` where it takes the call, else stock's ``convert``."""
    if instance is not None and (args or kwargs) and len(args) <= 2 and kwargs.keys() <= {"mode", "matrix"}:
        out = convert_lazily(instance, args[0] if args else kwargs.get("mode"),
                             args[1] if len(args) > 1 else kwargs.get("matrix"))
        if out is not None:
            if report.stats is not None:
                report.count(REPORT_KEY, True, "JPEG converted lazily (decoded where its pixels are read)")
            return out
        if report.stats is not None and type(instance).__name__ == "JpegImageFile":
            report.count(REPORT_KEY, False, "convert of a JPEG that is not a plain, whole RGB/grey one (or was "
                                            "loaded): PIL's own")
    return wrapped(*args, **kwargs)
