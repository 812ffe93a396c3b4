"""The decoded-image cache: full JPEG decodes kept in an LMDB store that every process on the machine shares.

Training reads the same files every epoch; only the first epoch needs to decode them. The dataset
patch asks :func:`store_for` for the store, looks a file up by its key (:func:`key_material`), and on a
miss decodes it in full and adds the array. A hit is a read-only NumPy view of the pixels where the
store's file holds them (mapped into memory): no copy, and a planned crop reads only the window it needs.

Why LMDB: an embedded store made for exactly this (memory-mapped, zero-copy reads, readers in many
processes without locks, one writer at a time, atomic transactions that a killed writer never leaves
half-done), and a well-kept Python binding. Entries are only ever added, never overwritten or deleted.

Safety: the store is untrusted until checked, as PIL treats a file, and a mapped store must never take
the process down (a SIGBUS has no Python exception). The modules, one job each:

- :mod:`.entries`: the store's name, format and cap records, and the entry format (header, key material,
  pixels), checked on every read;
- :mod:`.keys`: key material (the decoding stack, the file's identity and times) and the racy-timestamp
  rule;
- :mod:`.disk`: folder and file safety (private folders, single-link regular files, no links followed),
  allocation, free space, address space, and the damage and refusal classes;
- :mod:`.verify`: the check before a process first reads a store (run in :mod:`.check_child`, a process
  of its own), its verdict, and discarding a condemned store;
- :mod:`.opening`: creating or checking a store, then ``lmdb.open`` at a map that fits;
- :mod:`.mapped`: this process's own maps of the data file (views that outlive LMDB's map) and the gate
  that keeps LMDB's map in place while it is read;
- :mod:`.store`: :class:`Store`: get, put, switching off, and closing before a fork;
- :mod:`.process`: the setting the options ask for, one store per folder and process, the fork hooks;
- :mod:`.choice`: which store a dataset uses (``--fast``'s decision per dataset);
- :mod:`.admin`: ``nano-patch cache``: the folders, a store's description, clearing it;
- :mod:`.figures`: the figures for the run report;
- :mod:`.environ`: what a process tree shares through environment variables (warnings given, checks made).
"""

from __future__ import annotations

from .admin import clear, describe, known_folders
from .choice import (
    AUTO_DISK_SHARE,
    AUTO_MEMORY_SHARE,
    AUTO_SAMPLE,
    announce_own,
    dataset_files,
    decide,
    estimate_decoded_bytes,
    prepare,
    store_for,
    store_for_own,
)
from .disk import (
    CREATE_MIN_FREE,
    LOCK_BYTES,
    MAX_READERS,
    SPACE_RESERVE,
    StoreDamaged,
    StoreRefused,
    check_directory,
    human_bytes,
    refused_store_folder,
    store_bytes,
)
from .entries import CAP_KEY, DEFAULT_CAP, FORMAT_KEY, FORMAT_VALUE, MIN_CAP, STORE_NAME, encode_entry, parse_entry
from .environ import WARNED_ENV
from .figures import count_hit, count_miss
from .keys import COARSE_WINDOW_NS, FINE_WINDOW_NS, content_material, decoder_identity, key_material, racy, racy_times
from .process import Setting, default_dir, open_store, setting
from .store import Store
from .verify import RECORD_MAX_AGE_NS, RECORD_NAME, VERIFIED_ENV, check_store

__all__ = [
    "AUTO_DISK_SHARE", "AUTO_MEMORY_SHARE", "AUTO_SAMPLE", "CAP_KEY", "COARSE_WINDOW_NS", "CREATE_MIN_FREE",
    "DEFAULT_CAP", "FINE_WINDOW_NS", "FORMAT_KEY", "FORMAT_VALUE", "LOCK_BYTES", "MAX_READERS", "MIN_CAP",
    "RECORD_MAX_AGE_NS", "RECORD_NAME", "SPACE_RESERVE", "STORE_NAME", "VERIFIED_ENV", "WARNED_ENV", "Setting",
    "Store", "StoreDamaged", "StoreRefused", "announce_own", "check_directory", "check_store", "clear",
    "content_material", "count_hit", "count_miss", "dataset_files", "decide", "decoder_identity", "default_dir",
    "describe", "encode_entry", "estimate_decoded_bytes", "human_bytes", "key_material", "known_folders",
    "open_store", "parse_entry", "prepare", "racy", "racy_times", "refused_store_folder", "setting", "store_bytes",
    "store_for", "store_for_own",
]
