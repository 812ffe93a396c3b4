"""A batch's files stat'ed in one native call (``csrc/stat.c``): each identity is ``os.stat``'s, a file that cannot
be stat'ed has none, and the fallback without the extension answers the same."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nano_patch.vision.images import file_index


def _files(tmp_path: Path) -> list[object]:
    a = tmp_path / "a.jpg"
    a.write_bytes(b"\xff\xd8 not much")
    odd = os.fsencode(str(tmp_path)) + b"/\xe9t\xe9.jpg"  # a name that is not UTF-8
    with open(odd, "wb") as f:
        f.write(b"12345")
    link = tmp_path / "link.jpg"
    link.symlink_to(a)
    return [str(a), a, odd, os.fsdecode(odd), str(link), str(tmp_path / "missing.jpg"), str(tmp_path), "a\0b", 7]


def _expected(path: object) -> tuple[int, ...] | None:
    try:
        st = os.stat(os.fspath(path))  # type: ignore[arg-type]
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def test_each_identity_is_os_stats(tmp_path):
    paths = _files(tmp_path)
    assert file_index.identities(paths) == [_expected(p) for p in paths]
    assert file_index.identities([]) == []


def test_without_the_extension_the_same(tmp_path, monkeypatch):
    paths = _files(tmp_path)
    native = file_index.identities(paths)
    monkeypatch.setattr(file_index, "_stat_extension", False)
    assert file_index.identities(paths) == native


@pytest.mark.parametrize("age_s, settled", [(0.0, False), (10.0, True)])
def test_a_file_too_new_proves_nothing(tmp_path, age_s, settled):
    path = tmp_path / "f.jpg"
    path.write_bytes(b"x")
    ident = file_index.identities([str(path)])[0]
    now = max(ident[3], ident[4]) + int(age_s * 1e9)
    assert file_index.settled(ident, now) is settled
    assert file_index.settled(None, now) is False
