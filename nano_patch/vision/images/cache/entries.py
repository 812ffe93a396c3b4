"""What a store holds: its name, format and cap records, and the entry format (header, key material, pixels).

An entry: a fixed header (magic, format, dtype, channels, height, width, pixel length, the length of the
key material), the key material itself, padding, then the raw pixels. Every read checks all of it,
including that the key material equals the one looked up; nothing in the store is ever executed or
unpickled.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

#: The store's folder inside the cache folder; a new entry format gets a new name.
STORE_NAME = "decoded-v1"
#: Written once into every store: a store without it (or with another value) is of another format.
FORMAT_KEY = b"\x00nano-patch:format"
FORMAT_VALUE = b"nano-patch decoded-image cache, entry format 1"
#: The largest cap (bytes, ASCII) any process opened the store with: LMDB keeps the largest map size.
CAP_KEY = b"\x00nano-patch:cap"
#: The cap that ``on`` means, at most; never more than half the free disk space when the store opens.
DEFAULT_CAP = 20 * 1000**3
#: Caps below this are refused: LMDB needs a few pages of its own.
MIN_CAP = 1024**2

_ENTRY = struct.Struct("<4sBBBxIIQI")  # magic, format, dtype code, channels, pad, height, width, length, key length
_MAGIC = b"NPDI"
_ENTRY_FORMAT = 1
_UINT8 = 1
#: LMDB puts a value into its own pages after a 16-byte page header: pixels start 64-byte aligned.
_PAGE_HEADER = 16
_ALIGN = 64


def digest(material: bytes) -> bytes:
    """The LMDB key of an entry: a digest of its key material."""
    return hashlib.blake2b(material, digest_size=20).digest()


def _pixel_offset(key_length: int) -> int:
    head = _ENTRY.size + key_length
    return head + (-(head + _PAGE_HEADER)) % _ALIGN


def encode_entry(material: bytes, a: np.ndarray) -> bytes:
    """An entry: header, key material, padding, then ``a``'s pixels (H x W or H x W x C uint8)."""
    a = np.ascontiguousarray(a)
    channels = 1 if a.ndim == 2 else int(a.shape[2])
    head = _ENTRY.pack(_MAGIC, _ENTRY_FORMAT, _UINT8, channels, a.shape[0], a.shape[1], a.nbytes, len(material))
    pad = bytes(_pixel_offset(len(material)) - len(head) - len(material))
    return b"".join((head, material, pad, a.data.cast("B")))


def parse_entry(value: Any, material: bytes) -> tuple[int, tuple[int, ...]] | None:
    """(offset of the pixels, their shape) in an entry read back for ``material``, or None if anything
    about it is wrong: magic, format, dtype, channels, sizes, total length, the key material."""
    if len(value) < _ENTRY.size:
        return None
    magic, fmt, dtype, channels, h, w, length, key_length = _ENTRY.unpack_from(value)
    if (magic != _MAGIC or fmt != _ENTRY_FORMAT or dtype != _UINT8 or channels not in (1, 3) or h <= 0 or w <= 0
            or length != h * w * channels or key_length != len(material)):
        return None
    offset = _pixel_offset(key_length)
    if len(value) != offset + length or value[_ENTRY.size:_ENTRY.size + key_length] != material:
        return None
    return offset, ((h, w) if channels == 1 else (h, w, channels))
