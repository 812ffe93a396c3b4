"""Fault injection for the decoded-image cache, in real processes: full disks, damaged B-tree pages, an
address-space limit, files the store cannot write, racy timestamps, a store folder that is a link, a data
file with two names.

Every run here is a child process, and every one must exit 0 (a child that dies of a signal fails the
test) with every image equal to stock's decode (``Image.open(p).convert("RGB")``, what torchvision's
``pil_loader`` gives), and with no healthy store deleted. Many of these faults end in SIGBUS inside the
process when a mapped file's page cannot be read or backed; a test that checks a child's exit status
catches that.

Full disks use a small tmpfs, or a loop-mounted ext4 image, in a private mount namespace (``unshare``)
where the machine allows it, and are skipped with the reason where it does not; a file-size limit
(RLIMIT_FSIZE) stands in for a disk that cannot take the store everywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nano_patch.data.batches import sample_loading as loading
from nano_patch.vision.images import cache, decode

PAGE = 4096

# --- the child process that reads through the cache ---------------------------------------------------

#: Two passes over the files through the cache (``loading.cached``, as the dataset patch does); prints
#: hits, images equal to stock's decode, and whether the store folder exists at the end.
_READ = textwrap.dedent("""
    import json, os, sys, warnings
    warnings.simplefilter("always")
    import numpy as np
    from pathlib import Path
    from PIL import Image
    from nano_patch.vision.images import cache, decode
    from nano_patch.data.batches import sample_loading as loading
    cache_dir, cap, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    store = cache.open_store(Path(cache_dir), None if cap == "on" else int(cap))
    hits = equal = 0
    for _ in range(2):
        for f in files:
            hits += store.get(cache.key_material(f)) is not None
            a = loading.cached(store, f)
            a = decode.decode_rgb(f) if a is None else a
            equal += bool(np.array_equal(a, np.asarray(Image.open(f).convert("RGB"))))
    data = Path(cache_dir) / cache.STORE_NAME / "data.mdb"
    digest = None
    if data.exists():  # in chunks: under an address-space limit the whole file may not fit in memory
        digest = __import__("hashlib").sha1()
        with open(data, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    print(json.dumps({"hits": hits, "equal": equal, "n": 2 * len(files), "store": data.parent.exists(),
                      "data": digest is not None and digest.hexdigest()}))
""")

#: Fill a store with the files (and ``extra`` small synthetic entries, for a B-tree with branch pages).
_FILL = textwrap.dedent("""
    import sys
    import numpy as np
    from pathlib import Path
    from nano_patch.vision.images import cache, decode
    cache_dir, cap, extra, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    store = cache.open_store(Path(cache_dir), None if cap == "on" else int(cap))
    for f in files:
        assert store.put(cache.key_material(f), decode.decode_rgb(f)), f
    rng = np.random.default_rng(0)
    for i in range(extra):
        a = rng.integers(0, 255, (8 + i % 5, 9, 3), dtype=np.uint8)  # in-page values, and some overflow
        assert store.put(b"synthetic %d" % i, a if i % 3 else np.repeat(a, 8, axis=1))
    store.close_for_fork()
""")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH", "_NANO_PATCH"))}
    env.update(extra)
    return env


def _died(proc: subprocess.CompletedProcess) -> str:
    if proc.returncode < 0:
        return f"the process died of {signal.Signals(-proc.returncode).name}\n{proc.stderr[-2000:]}"
    return f"exit status {proc.returncode}\n{proc.stderr[-3000:]}"


def _read(cache_dir: Path, files: list[Path], cap: str = "on", prefix: list[str] | None = None,
          env: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """Run the reader; assert it exited 0 with every image equal to stock's; return its figures and the
    cache's warning lines."""
    cmd = [*(prefix or []), sys.executable, "-c", _READ, str(cache_dir), cap, *map(str, files)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or _env(), timeout=300)
    assert proc.returncode == 0, _died(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["equal"] == out["n"], out
    return out, _warnings(proc.stderr)


def _fill(cache_dir: Path, files: list[Path], cap: str = "on", extra: int = 0) -> Path:
    proc = subprocess.run([sys.executable, "-c", _FILL, str(cache_dir), cap, str(extra), *map(str, files)],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, _died(proc)
    return cache_dir / cache.STORE_NAME


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "nano-patch" in line and "cache" in line]


def _digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(image_folder) -> list[Path]:
    return sorted(image_folder.rglob("*.jpg"))


# --- mount namespaces: a small tmpfs or ext4 image, where the machine allows ---------------------------


def _namespace() -> list[str]:
    """``unshare`` with a private mount namespace: as root a plain one (loop devices need real root), else
    inside a user namespace."""
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]


def _can_mount_tmpfs(where: Path) -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run([*_namespace(), "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {where}"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.strip()}"


def _ext4_image(tmp_path: Path, size_mb: int, extra: str = "-b 4096") -> Path:
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted ext4 image needs root")
    if shutil.which("mkfs.ext4") is None or shutil.which("unshare") is None:
        pytest.skip("mkfs.ext4 or unshare is not installed")
    img = tmp_path / "ext4.img"
    with open(img, "wb") as f:
        f.truncate(size_mb * 1024**2)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", *extra.split(), str(img)], check=True, capture_output=True)
    (tmp_path / "fs").mkdir(exist_ok=True)
    probe = subprocess.run([*_namespace(), "sh", "-c", f"mount -o loop {img} {tmp_path / 'fs'}"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {probe.stderr.strip()}")
    return img


def _in_fs(mount: str, then: str = "") -> list[str]:
    """A command prefix: mount, run the shell steps ``then``, then exec the command."""
    return [*_namespace(), "sh", "-c", f'set -e; {mount}; {then} exec "$0" "$@"']


_FILL_DISK = "head -c 1G /dev/zero > {fs}/filler 2>/dev/null || true;"


# --- 2. a full disk --------------------------------------------------------------------------------------


def test_full_tmpfs_at_creation(tmp_path, files):
    """A full tmpfs when the store would be created (LMDB writes its lock file through a map, so an unbacked
    page would be a SIGBUS inside ``lmdb.open``): the reader exits 0 with stock's pixels, no store is
    created, and one warning says "no space"."""
    fs = tmp_path / "fs"
    fs.mkdir()
    why = _can_mount_tmpfs(fs)
    if why:
        pytest.skip(why)
    prefix = _in_fs(f"mount -t tmpfs -o size=1m tmpfs {fs}", _FILL_DISK.format(fs=fs))
    out, lines = _read(fs / "cache", files, prefix=prefix)
    assert not out["store"] and out["hits"] == 0
    assert len(lines) == 1 and "no space" in lines[0], lines


def test_full_ext4_at_creation(tmp_path, files):
    """The same on ext4 (a loop-mounted image with 4 kB blocks, filled to its last two blocks: the cache and
    store folders take them, and the lock file's pages cannot be backed): exit 0, stock's pixels, no store,
    one "no space" warning."""
    img = _ext4_image(tmp_path, 16)
    fs = tmp_path / "fs"
    prefix = _in_fs(f"mount -o loop {img} {fs}",
                    f"head -c $(( ($(df -k --output=avail {fs} | tail -1) - 8) * 1024 )) /dev/zero > {fs}/filler;")
    out, lines = _read(fs / "cache", files, prefix=prefix)
    assert not out["store"] and out["hits"] == 0
    assert len(lines) == 1 and "no space" in lines[0], lines


def test_a_file_size_limit_at_creation(tmp_path, files):
    """Runs everywhere: a file-size limit below the lock file's size (RLIMIT_FSIZE, SIGXFSZ ignored) stands
    in for a disk that cannot take the store: exit 0, stock's pixels, no store created, one warning naming
    the file-size limit."""
    limit = 32 * 1024
    prefix = [sys.executable, "-c", "import resource, signal, os, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"]
    out, lines = _read(tmp_path / "cache", files, prefix=prefix)
    assert not out["store"] and out["hits"] == 0
    assert len(lines) == 1 and "file-size limit" in lines[0], lines


def test_full_tmpfs_after_creation_with_the_lock_file_gone(tmp_path, files):
    """A store exists, its lock file is gone (LMDB would make a new one) and the disk is full, so the new lock
    file's pages cannot be backed: exit 0, stock's pixels, one "no space" warning, and the data file kept
    byte for byte."""
    fs = tmp_path / "fs"
    fs.mkdir()
    why = _can_mount_tmpfs(fs)
    if why:
        pytest.skip(why)
    store = fs / "cache" / cache.STORE_NAME
    prefix = _in_fs(f"mount -t tmpfs -o size=40m tmpfs {fs}",
                    f"{sys.executable} -c \"$FILL\" {fs / 'cache'} on 0 {' '.join(map(str, files[:3]))}; "
                    f"sha1sum {store / 'data.mdb'} >&2; rm {store / 'lock.mdb'}; " + _FILL_DISK.format(fs=fs))
    proc = subprocess.run([*prefix, sys.executable, "-c", _READ, str(fs / "cache"), "on", *map(str, files)],
                          capture_output=True, text=True, env=_env(FILL=_FILL), timeout=300)
    assert proc.returncode == 0, _died(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["equal"] == out["n"]
    before = next(line.split()[0] for line in proc.stderr.splitlines() if line.endswith("data.mdb"))
    assert out["store"] and out["data"] == before  # kept, byte for byte
    lines = _warnings(proc.stderr)
    assert len(lines) == 1 and "no space" in lines[0], lines


# --- 2. damage between runs --------------------------------------------------------------------------


def _pages(raw: bytes | bytearray) -> list[tuple[int, int]]:
    """(page number, flags) of every page of an LMDB 0.9 data file, skipping the pages of overflow runs."""
    out, pg = [], 2
    while pg < len(raw) // PAGE:
        flags = struct.unpack_from("<H", raw, pg * PAGE + 10)[0]
        out.append((pg, flags))
        pg += max(1, struct.unpack_from("<I", raw, pg * PAGE + 12)[0]) if flags & 0x04 else 1
    return out


def _big_value_nodes(raw: bytes | bytearray) -> list[int]:
    """File offsets of the leaf nodes whose values live in overflow pages (F_BIGDATA)."""
    out = []
    for pg, flags in _pages(raw):
        if flags & 0x02 and not flags & 0x04:
            base = pg * PAGE
            lower = struct.unpack_from("<H", raw, base + 12)[0]
            for i in range((lower - 16) // 2):
                at = base + struct.unpack_from("<H", raw, base + 16 + 2 * i)[0]
                if struct.unpack_from("<H", raw, at + 4)[0] & 0x01:
                    out.append(at)
    return out


def _change_value_size(store: Path, how: str) -> None:
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = _big_value_nodes(raw)[0]
    new = {"past the end": len(raw), "huge": 0x0FFFFFFF}[how]
    struct.pack_into("<HH", raw, at, new & 0xFFFF, new >> 16)
    data.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["past the end", "huge"])
def test_a_changed_value_size_is_damage_found_before_the_first_read(tmp_path, files, how):
    """One value's recorded size in a leaf page changed (past the end of the file, or huge): the first run
    exits 0 with stock's pixels and one warning that the store was damaged and is rebuilt; the next run
    gives no warning and hits every image."""
    store = _fill(tmp_path / "cache", files)
    _change_value_size(store, how)
    out, lines = _read(tmp_path / "cache", files)
    assert len(lines) == 1 and "damaged" in lines[0] and "new one" in lines[0], lines
    out, lines = _read(tmp_path / "cache", files)
    assert lines == [] and out["hits"] == out["n"]


def test_nano_patch_cache_lists_a_damaged_store_as_damaged(tmp_path, files):
    """``nano-patch cache`` lists a store with a value running past the end of its file as damaged (not
    [ok]), from the same check a run makes, and leaves its data file byte for byte."""
    store = _fill(tmp_path / "cache", files)
    _change_value_size(store, "past the end")
    before = _digest(store / "data.mdb")
    proc = subprocess.run([sys.executable, "-m", "nano_patch", "cache", "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, _died(proc)
    line = next(line for line in proc.stdout.splitlines() if str(store) in line)
    assert "[damaged" in line and "[ok]" not in line, line
    assert _digest(store / "data.mdb") == before


def test_random_damage_to_b_tree_pages(tmp_path, files):
    """24 runs, each on a copy of one store with one random B-tree page (branch, leaf, free-list or meta; not
    pixels) overwritten with random bytes: every run exits 0 with stock's pixels, and most damage is found
    before the first read. (LMDB 0.9.36 itself rejects most such pages, by their page number and flags.)"""
    pristine = _fill(tmp_path / "pristine", files[:5], extra=400)  # the run adds the rest: it writes too
    raw = (pristine / "data.mdb").read_bytes()
    tree = [pg for pg, flags in _pages(raw) if not flags & 0x04] + [0, 1]
    rng = random.Random(26)
    damaged, failed = 0, []
    for trial in range(24):
        cache_dir = tmp_path / f"t{trial}"
        shutil.copytree(pristine.parent, cache_dir)
        pg = rng.choice(tree)
        with open(cache_dir / cache.STORE_NAME / "data.mdb", "r+b") as f:
            f.seek(pg * PAGE)
            f.write(rng.randbytes(PAGE))
        try:
            out, lines = _read(cache_dir, files)
        except AssertionError as exc:  # every trial runs: the message lists each one that failed, and how
            failed.append(f"page {pg}: {str(exc).splitlines()[0]}")
            continue
        damaged += any("damaged" in line for line in lines)
        shutil.rmtree(cache_dir)
    assert failed == []
    assert damaged >= 12  # most single-page damage is found before the first read


def test_random_damage_to_value_sizes_in_leaf_pages(tmp_path, files):
    """12 runs, each on a copy of one store where one random leaf node of an image has a random value size
    (which LMDB itself does not check): every run exits 0 with stock's pixels."""
    pristine = _fill(tmp_path / "pristine", files)
    raw = (pristine / "data.mdb").read_bytes()
    nodes = _big_value_nodes(raw)
    rng = random.Random(9)
    failed = []
    for trial in range(12):
        cache_dir = tmp_path / f"t{trial}"
        shutil.copytree(pristine.parent, cache_dir)
        at, size = rng.choice(nodes), rng.randrange(1, 1 << 32)
        with open(cache_dir / cache.STORE_NAME / "data.mdb", "r+b") as f:
            f.seek(at)
            f.write(struct.pack("<HH", size & 0xFFFF, size >> 16))
        try:
            _read(cache_dir, files)
        except AssertionError as exc:
            failed.append(f"size {size}: {str(exc).splitlines()[0]}")
            continue
        shutil.rmtree(cache_dir)
    assert failed == []


# --- 3. refusal is not damage ----------------------------------------------------------------------------


def test_an_address_space_limit_keeps_the_store_byte_for_byte(tmp_path, files):
    """Under RLIMIT_AS (12 GB, as batch schedulers set) a store with the 20 GB cap cannot be mapped at its cap
    (ENOMEM): it is mapped smaller, every image is a hit, the data file is kept byte for byte, and one
    warning names the address-space limit."""
    cap = str(20 * 1000**3)
    store = _fill(tmp_path / "cache", files, cap=cap)
    before = _digest(store / "data.mdb")
    limit = 12 * 1024**3
    prefix = [sys.executable, "-c", "import resource, os, sys; "
              f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"]
    out, lines = _read(tmp_path / "cache", files, cap=cap, prefix=prefix)
    assert out["store"] and out["data"] == before
    assert out["hits"] == out["n"]  # read from the store, at a smaller map
    assert len(lines) == 1 and "address-space limit" in lines[0], lines


def test_an_address_space_limit_too_tight_for_any_map_keeps_the_store(tmp_path, files):
    """With too little address space left for even a small map: uncached, one warning naming the cap and
    the limit, and the store left byte for byte."""
    cap = str(20 * 1000**3)
    store = _fill(tmp_path / "cache", files, cap=cap)
    # 48 MB more of entries: the store needs a map of at least that, so a margin of 48 MB over what the reader
    # maps before it opens the store is too little for any map (half the room would be needed to fit the file),
    # while it leaves the reader room for its decodes, whatever else the environment maps (a venv, BLAS threads).
    pad = ("import sys, numpy as np; from pathlib import Path; from nano_patch.vision.images import cache; "
           "s = cache.open_store(Path(sys.argv[1]), int(sys.argv[2])); "
           "[s.put(b'pad %d' % i, np.full((512, 1024, 3), i, np.uint8)) for i in range(32)]; s.close_for_fork()")
    subprocess.run([sys.executable, "-c", pad, str(tmp_path / "cache"), cap], env=_env(), check=True, timeout=300)
    before = _digest(store / "data.mdb")
    assert (store / "data.mdb").stat().st_size > 48 * 1024**2
    code = ("import numpy, PIL.Image, lmdb; from nano_patch.data.batches import sample_loading as loading; "
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize')))")
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    limit = int(probe.stdout) * 1024 + 48 * 1024**2
    prefix = [sys.executable, "-c", "import resource, os, sys; "
              f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"]
    out, lines = _read(tmp_path / "cache", files, cap=cap, prefix=prefix)
    assert out["store"] and out["data"] == before and out["hits"] == 0
    assert len(lines) == 1 and "address-space limit" in lines[0] and "20.0 GB" in lines[0], lines


def test_store_files_of_mode_0400_are_kept(tmp_path, files):
    """A store whose files are read-only to their owner (mode 0400): one warning (permission denied, left as
    it is), no hits, the data file and its mode kept. As root, CAP_DAC_OVERRIDE is dropped for the run."""
    store = _fill(tmp_path / "cache", files)
    before = _digest(store / "data.mdb")
    for name in ("data.mdb", "lock.mdb"):
        (store / name).chmod(0o400)
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, setpriv is needed to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    out, lines = _read(tmp_path / "cache", files, prefix=prefix)
    assert out["store"] and out["data"] == before and out["hits"] == 0
    assert oct((store / "data.mdb").stat().st_mode & 0o777) == oct(0o400)
    assert len(lines) == 1 and "permission denied" in lines[0] and "left as it is" in lines[0], lines


def test_a_store_on_a_read_only_mount_is_kept(tmp_path, files):
    """EROFS (a read-only bind mount of the cache folder): one "read-only" warning, no hits, the data file
    kept byte for byte."""
    store = _fill(tmp_path / "cache", files)
    before = _digest(store / "data.mdb")
    cache_dir = tmp_path / "cache"
    why = _can_mount_tmpfs(tmp_path)
    if why:
        pytest.skip(why)
    prefix = _in_fs(f"mount --bind {cache_dir} {cache_dir}; mount -o remount,ro,bind {cache_dir}")
    out, lines = _read(cache_dir, files, prefix=prefix)
    assert out["store"] and out["data"] == before and out["hits"] == 0
    assert len(lines) == 1 and "read-only" in lines[0], lines


# --- 4. racy timestamps ----------------------------------------------------------------------------------

_RACY = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from pathlib import Path
    from PIL import Image
    from nano_patch.vision.images import cache
    from nano_patch.data.batches import sample_loading as loading
    folder, cache_dir, tries = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    pair = [Path(sys.argv[4]).read_bytes(), Path(sys.argv[5]).read_bytes()]
    assert len(pair[0]) == len(pair[1])
    store = cache.open_store(cache_dir, 64 * 1024**2)
    stale = 0
    for i in range(tries):
        f = folder / f"x{i}.jpg"
        while time.time() % 1 > 0.3:  # all of it within one second
            time.sleep(0.01)
        f.write_bytes(pair[0])
        first = np.array(loading.cached(store, f))
        with open(f, "r+b") as out:  # in place: same inode, same size, same second
            out.write(pair[1])
        again = loading.cached(store, f)
        stale += not np.array_equal(again, np.asarray(Image.open(f).convert("RGB")))
    print(json.dumps({"stale": stale, "tries": tries}))
""")


def _same_size_pair(tmp_path: Path, files: list[Path]) -> tuple[Path, Path]:
    """Two different JPEGs of the same byte size (the shorter padded after its end marker)."""
    out = []
    for f, flip in ((files[0], False), (files[0], True)):
        im = Image.open(f).convert("RGB")
        buf = io.BytesIO()
        (im.transpose(Image.FLIP_LEFT_RIGHT) if flip else im).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    n = max(map(len, out))
    paths = []
    for i, data in enumerate(out):
        p = tmp_path / f"pair{i}.jpg"
        p.write_bytes(data + bytes(n - len(data)))
        paths.append(p)
    return paths[0], paths[1]


def test_a_racy_rewrite_on_one_second_timestamps_is_not_served_stale(tmp_path, files):
    """ext4 with 128-byte inodes keeps whole-second timestamps: a file rewritten in place with the same size
    in the same second as it was first read is served its new pixels, in 5 of 5 tries."""
    img = _ext4_image(tmp_path, 16, "-I 128")
    fs = tmp_path / "fs"
    a, b = _same_size_pair(tmp_path, files)
    prefix = _in_fs(f"mount -o loop {img} {fs}", f"mkdir -p {fs / 'data'};")
    proc = subprocess.run([*prefix, sys.executable, "-c", _RACY, str(fs / "data"), str(fs / "cache"), "5", str(a),
                           str(b)], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, _died(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"stale": 0, "tries": 5}


class _Coarse:
    """``os.stat`` as a file system with one-second timestamps gives it."""

    def __init__(self, st: os.stat_result) -> None:
        self._st = st

    def __getattr__(self, name: str) -> int:
        v = getattr(self._st, name)
        return v // 10**9 * 10**9 if name in ("st_mtime_ns", "st_ctime_ns") else v


def test_the_racy_rule_with_a_fake_clock(tmp_path, files, monkeypatch):
    """Runs everywhere: one-second timestamps and a fake clock. Within the window of the times, a miss is
    served (stock's pixels) and not added; once they are safely in the past, it is added; a rewrite in the
    same second is then never served stale."""
    a, b = _same_size_pair(tmp_path, files)
    f = tmp_path / "x.jpg"
    f.write_bytes(a.read_bytes())
    monkeypatch.setattr(cache.keys, "_stat", lambda p: _Coarse(os.stat(p)))
    second = os.stat(f).st_mtime_ns // 10**9 * 10**9
    now = [second + 400 * 10**6]
    monkeypatch.setattr(cache.keys, "_now_ns", lambda: now[0])
    store = cache.Store(tmp_path / "cache", 64 * 1024**2)
    want_a = np.asarray(Image.open(a).convert("RGB"))
    assert np.array_equal(loading.cached(store, f), want_a)
    assert store.get(cache.key_material(f)) is None  # served, not added: the time is racy
    with open(f, "r+b") as out:  # rewritten in place in the same second: the key could not tell
        out.write(b.read_bytes())
    assert np.array_equal(loading.cached(store, f), np.asarray(Image.open(b).convert("RGB")))
    st = os.stat(f)
    now[0] = max(st.st_mtime_ns, st.st_ctime_ns) // 10**9 * 10**9 + cache.COARSE_WINDOW_NS  # safely past now
    assert store.get(cache.key_material(f)) is None
    assert np.array_equal(loading.cached(store, f), np.asarray(Image.open(b).convert("RGB")))
    assert store.get(cache.key_material(f)) is not None  # added
    # fine timestamps: the window is two ticks of the kernel's coarse clock
    monkeypatch.setattr(cache.keys, "_stat", os.stat)
    st = os.stat(f)
    assert cache.racy(st, max(st.st_mtime_ns, st.st_ctime_ns) + cache.FINE_WINDOW_NS - 1)
    assert not cache.racy(st, max(st.st_mtime_ns, st.st_ctime_ns) + cache.FINE_WINDOW_NS)
    store.close_for_fork()


# --- 5. the store folder and its files -------------------------------------------------------------------


def test_a_store_folder_that_is_a_symlink_is_refused(tmp_path, files):
    """The cache folder is private, but its store folder links to a folder open to others: one warning
    naming the symbolic link, no hits, and nothing written in the linked folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    (cache_dir / cache.STORE_NAME).symlink_to(shared)
    out, lines = _read(cache_dir, files)
    assert list(shared.iterdir()) == [] and out["hits"] == 0
    assert len(lines) == 1 and "symbolic link" in lines[0], lines


def test_a_store_folder_open_to_others_is_refused(tmp_path, files):
    """A store folder of mode 0777 in a private cache folder: one warning ("writable by group or others"),
    no hits, the data file kept byte for byte."""
    store = _fill(tmp_path / "cache", files[:3])
    store.chmod(0o777)
    before = _digest(store / "data.mdb")
    out, lines = _read(tmp_path / "cache", files)
    assert out["data"] == before and out["hits"] == 0
    assert len(lines) == 1 and "writable by group or others" in lines[0], lines


def test_a_hard_linked_data_file_is_never_written_through(tmp_path, files):
    """data.mdb has a second name (another file of the same user): one warning naming the 2 links, no hits,
    and the other file unchanged byte for byte although the run had entries to add."""
    store = _fill(tmp_path / "cache", files[:3])
    other = tmp_path / "precious.bin"
    os.link(store / "data.mdb", other)
    before = _digest(other)
    out, lines = _read(tmp_path / "cache", files)  # the other files are misses: they would be added
    assert _digest(other) == before and out["hits"] == 0
    assert len(lines) == 1 and "2 links" in lines[0], lines


# --- the check: once per run, and its verdict ------------------------------------------------------------

_FORKS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from nano_patch.vision.images import cache
    log, cache_dir, files = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    real = cache.verify.check_store
    def logged(*a, **k):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        return real(*a, **k)
    cache.verify.check_store = logged
    store = cache.open_store(cache_dir)
    assert all(store.get(cache.key_material(f)) is not None for f in files)
    pids = []
    for _ in range(2):  # DataLoader workers: forked children that open the store themselves
        pid = os.fork()
        if pid == 0:
            ok = all(cache.open_store(cache_dir).get(cache.key_material(f)) is not None for f in files)
            os._exit(0 if ok else 1)
        pids.append(pid)
    assert all(os.waitpid(p, 0)[1] == 0 for p in pids)
""")


def test_the_check_runs_once_per_run_and_again_after_a_change(tmp_path, files):
    """The check runs once in a process whose forked children then read the store; not at all in the next
    process (the recorded verdict holds for the unchanged file); once again after any write to the file."""
    store = _fill(tmp_path / "cache", files)
    log = tmp_path / "checks"

    def run() -> int:
        log.write_text("")
        proc = subprocess.run([sys.executable, "-c", _FORKS, str(log), str(tmp_path / "cache"), *map(str, files)],
                              capture_output=True, text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, _died(proc)
        return len(log.read_text().split())

    assert run() == 1  # the main process checks; its forked children inherit the verdict
    assert run() == 0  # the file is unchanged since: the recorded verdict holds
    with open(store / "data.mdb", "r+b") as f:  # any write, even of the same bytes, changes its identity
        first = f.read(PAGE)
        f.seek(0)
        f.write(first)
    assert run() == 1


def test_a_check_killed_by_another_signal_keeps_the_store(tmp_path, files, monkeypatch):
    """Only a fault (SIGBUS, SIGSEGV, SIGABRT...) of the checking child means damage: one killed by SIGKILL
    (the OOM killer, say) proves nothing, and the store is kept."""
    store = _fill(tmp_path / "cache", files)
    for sig in ("SIGKILL", "SIGBUS"):
        (tmp_path / f"{sig}.py").write_text(f"import os, signal; os.kill(os.getpid(), signal.{sig})\n")
    monkeypatch.setattr(cache.verify, "CHILD_SCRIPT", str(tmp_path / "SIGKILL.py"))
    assert cache.check_store(store)[0] == "unchecked"
    monkeypatch.setattr(cache.verify, "CHILD_SCRIPT", str(tmp_path / "SIGBUS.py"))
    assert cache.check_store(store) == ("damaged", "reading it raised SIGBUS")
    monkeypatch.undo()
    assert cache.check_store(store) == ("sound", "")


def _child(store: Path) -> subprocess.CompletedProcess:
    """The check child as the check starts it: ``python -I`` on the script's path, nothing of the package."""
    import lmdb

    lmdb_parent = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    size = (store / "data.mdb").stat().st_size
    return subprocess.run([sys.executable, "-I", cache.verify.CHILD_SCRIPT, lmdb_parent, str(store),
                           str(size + 1024**2), str(cache.MAX_READERS)], capture_output=True, text=True,
                          env=_env(), timeout=120)


def test_the_check_child_on_a_sound_and_a_damaged_store(tmp_path, files):
    """The check child on its own: exit SOUND with nothing printed on a sound store; exit DAMAGED naming the
    value that runs past the end of the file on a damaged copy; the store's bytes unchanged by either."""
    from nano_patch.vision.images.cache import check_child

    store = _fill(tmp_path / "cache", files)
    before = _digest(store / "data.mdb")
    proc = _child(store)
    assert (proc.returncode, proc.stdout) == (check_child.SOUND, ""), _died(proc)
    assert _digest(store / "data.mdb") == before
    shutil.copytree(store, tmp_path / "damaged")
    _change_value_size(tmp_path / "damaged", "past the end")
    proc = _child(tmp_path / "damaged")
    assert proc.returncode == check_child.DAMAGED and "overflow" in proc.stdout.lower(), _died(proc)
    assert cache.check_store(tmp_path / "damaged") == ("damaged", proc.stdout.strip())


# --- threads ----------------------------------------------------------------------------------------------


def test_get_and_put_from_several_threads(tmp_path, files):
    """Threads reading and adding at once, while another closes the environment again and again (as before
    a fork): every image read equals its decode, and nothing raises."""
    store = cache.Store(tmp_path / "cache", 256 * 1024**2)
    want = {f: decode.decode_rgb(f) for f in files}
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                f = rng.choice(files)
                a = store.get(cache.key_material(f))
                if a is None:
                    store.put(cache.key_material(f), want[f])
                elif not np.array_equal(a, want[f]):
                    raise AssertionError(f"wrong pixels for {f}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def closer() -> None:
        while not stop.is_set():
            store.close_for_fork()
            time.sleep(0.002)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    churn = threading.Thread(target=closer)
    churn.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churn.join()
    assert errors == [] and store.off is None
    assert all(store.get(cache.key_material(f)) is not None for f in files)
    store.close_for_fork()
