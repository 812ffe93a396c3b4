"""The decoded-image cache: bit-exact hits, stale files, processes sharing it, and everything that can
go wrong with a store on disk (kill -9, damage, refused folders, a full disk, a read-only disk, the cap).

Every pixel check compares with stock torchvision (no patch) or with a fresh decode of the file.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import nano_patch
from nano_patch import config
from nano_patch.vision.images import cache, decode

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
ROOT = Path(__file__).resolve().parents[1]


def pets():
    return T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                      T.ToTensor(), T.Normalize(MEAN, STD)])


def _items(ds, seed0: int = 0) -> list:
    out = []
    for i in range(len(ds)):
        torch.manual_seed(seed0 + i)
        out.append(ds[i])
    return out


def _stock(folder: Path, make=pets) -> list:
    from torchvision.datasets import ImageFolder

    return _items(ImageFolder(str(folder), transform=make()))


def _assert_equal_items(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (a, ta), (b, tb) in zip(got, want):
        assert ta == tb
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a, b)
        else:
            assert a.mode == b.mode and a.size == b.size
            assert np.array_equal(np.asarray(a), np.asarray(b))


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.jpg"))


def _read_back(cache_dir: Path, files: list[Path]) -> dict[str, int]:
    """Every stored entry of ``files`` equals a fresh decode; returns how many were found."""
    store = cache.open_store(cache_dir)  # the cap the store was made with
    found = 0
    for f in files:
        a = store.get(cache.key_material(f))
        if a is not None:
            found += 1
            assert np.array_equal(a, decode.decode_rgb(f)), f
    assert store.off is None, store.off
    return {"found": found}


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"


# --- hits, misses, keys -------------------------------------------------------------------------


def test_hits_and_misses_equal_stock(image_folder, cache_dir, monkeypatch):
    from torchvision.datasets import ImageFolder

    stock = _stock(image_folder)
    decodes = []
    real = decode.decode_rgb_reproducibly
    monkeypatch.setattr(decode, "decode_rgb_reproducibly", lambda p, *a, **k: decodes.append(p) or real(p, *a, **k))
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(cache_dir))
    ds = ImageFolder(str(image_folder), transform=pets())
    _assert_equal_items(_items(ds), stock)  # epoch 1: every image a miss, decoded and stored
    assert len(decodes) == len(ds)
    decodes.clear()
    _assert_equal_items(_items(ds), stock)  # epoch 2: every image a hit
    assert decodes == []
    row = cache.describe(cache_dir)
    assert row["entries"] == len(ds) and row["state"] == "ok"
    assert oct(cache_dir.stat().st_mode & 0o777) == oct(0o700)


def test_a_hit_is_a_read_only_view_into_the_store(image_folder, cache_dir):
    f = _files(image_folder)[0]
    store = cache.open_store(cache_dir, 16 * 1024**2)
    material = cache.key_material(f)
    assert store.get(material) is None
    want = decode.decode_rgb(f)
    assert store.put(material, want)
    a = store.get(material)
    assert np.array_equal(a, want)
    assert not a.flags.writeable and not a.flags.owndata
    import mmap

    owner = a
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert isinstance(getattr(owner, "obj", owner), mmap.mmap)  # the store's file, mapped: not a copy
    store.close_for_fork()  # the view outlives the environment (it maps the file, not LMDB's map)
    assert np.array_equal(a, want)
    # a crop of it is a view too: the resample kernel reads only the window it needs
    assert np.shares_memory(a[10:50, 20:80], a)


def test_a_changed_file_is_decoded_again(tmp_path, photos, cache_dir):
    """Rewritten in place with its modification time put back: the size and change time differ."""
    from torchvision.datasets import ImageFolder

    (tmp_path / "data" / "c").mkdir(parents=True)
    f = tmp_path / "data" / "c" / "x.jpg"
    photos[0].save(f, quality=90)
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(cache_dir))
    ds = ImageFolder(str(tmp_path / "data"), transform=T.Compose([T.Resize(64), T.PILToTensor()]))
    first = ds[0][0]
    before = f.stat()
    with open(f, "r+b") as out:  # same inode
        data = photos[1].resize(photos[0].size).tobytes()
        out.truncate(0)
        Image.frombytes("RGB", photos[0].size, data).save(out, format="JPEG", quality=85)
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert f.stat().st_mtime_ns == before.st_mtime_ns
    again = ds[0][0]
    nano_patch.unpatch_torch()
    stock = ImageFolder(str(tmp_path / "data"), transform=T.Compose([T.Resize(64), T.PILToTensor()]))[0][0]
    assert torch.equal(again, stock) and not torch.equal(first, stock)


def test_loader_functions_and_other_pipelines_use_the_cache(image_folder, cache_dir, monkeypatch):
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import default_loader, pil_loader

    makes = [lambda: T.Compose([T.Resize(80), T.CenterCrop(64), T.PILToTensor()]), lambda: None,
             lambda: T.Compose([T.Resize(64), T.Lambda(lambda im: im.rotate(90)), T.ToTensor()])]
    stocks = [_stock(image_folder, m) for m in makes]
    f = _files(image_folder)[0]
    want = np.asarray(Image.open(f).convert("RGB"))
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(cache_dir))
    for _ in range(2):  # misses, then hits
        for make, stock in zip(makes, stocks):
            _assert_equal_items(_items(ImageFolder(str(image_folder), transform=make())), stock)
        for load in (pil_loader, default_loader):
            im = load(str(f))
            assert type(im) is not np.ndarray and np.array_equal(np.asarray(im), want)


# --- processes sharing one store ----------------------------------------------------------------

_FILL = textwrap.dedent("""
    import json, sys, torch, nano_patch
    folder, cache_dir, workers, order = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    nano_patch.patch_torch(cache_decoded="on", cache_dir=cache_dir)
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    from torch.utils.data import DataLoader, Subset
    tf = T.Compose([T.RandomResizedCrop(64), T.ToTensor()])
    ds = ImageFolder(folder, transform=tf)
    idx = list(range(len(ds)))[::order]
    torch.manual_seed(0)
    loader = DataLoader(Subset(ds, idx), batch_size=2, num_workers=workers, persistent_workers=False)
    out = [x for _ in range(2) for x, _ in loader]
    torch.save(out, sys.argv[5])
""")


def test_two_workers_fill_one_store(image_folder, cache_dir, tmp_path):
    stock_out = tmp_path / "stock.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH", "_NANO_PATCH"))}
    code = _FILL.replace('nano_patch.patch_torch(cache_decoded="on", cache_dir=cache_dir)', "pass")
    subprocess.run([sys.executable, "-c", code, str(image_folder), str(cache_dir), "2", "1", str(stock_out)],
                   check=True, env=env, timeout=300)
    out = tmp_path / "patched.pt"
    subprocess.run([sys.executable, "-c", _FILL, str(image_folder), str(cache_dir), "2", "1", str(out)],
                   check=True, env=env, timeout=300)
    for a, b in zip(torch.load(out), torch.load(stock_out)):  # same worker seeds: stock's draws
        assert torch.equal(a, b)
    files = _files(image_folder)
    assert _read_back(cache_dir, files)["found"] == len(files)
    assert cache.describe(cache_dir)["entries"] == len(files)


def _note_inherited_handles(cache_dir: Path, out: Path, worker_id: int) -> None:
    store = cache.open_store(cache_dir)
    with open(out, "a") as f:
        f.write("open\n" if store.holds_handles() else "closed\n")


def test_workers_forked_after_the_main_process_read_the_cache_still_hit_it(image_folder, cache_dir, tmp_path,
                                                                          monkeypatch):
    """The main process holds views into the store when it forks its DataLoader workers: they must open
    the store themselves and read it (LMDB must not be used across a fork, and py-lmdb refuses to open a
    store a child inherited open), while the parent's views stay valid."""
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(cache_dir))
    make = lambda: T.Compose([T.CenterCrop(100), T.PILToTensor()])  # noqa: E731
    ds = ImageFolder(str(image_folder), transform=make())
    held = [ds[i][0] for i in range(len(ds))]  # fills the store, in this process
    views = [cache.open_store(cache_dir).get(cache.key_material(f)) for f in _files(image_folder)]
    decoded = tmp_path / "read-in-a-worker"
    real = decode.read_bytes

    def marked(path, *args, **kwargs):  # every decode path reads the file; a hit reads none
        with open(decoded, "a") as f:
            f.write(f"{os.getpid()} {path}\n")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(decode, "read_bytes", marked)
    inherited = tmp_path / "inherited-open"
    batches = list(DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=False,
                              worker_init_fn=functools.partial(_note_inherited_handles, cache_dir, inherited)))
    assert inherited.read_text().split() == ["closed", "closed"]  # no LMDB handle crossed the fork
    assert not decoded.exists(), decoded.read_text()  # every worker read the store
    assert torch.equal(torch.cat([b[0] for b in batches]), torch.stack(held))
    assert all(np.array_equal(v, decode.decode_rgb(f)) for v, f in zip(views, _files(image_folder)))


def test_two_ranks_fill_one_store_at_once(image_folder, cache_dir, tmp_path):
    """Two processes (two ranks of a multi-instance run on one machine) fill the store at the same time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH", "_NANO_PATCH"))}
    procs = [subprocess.Popen([sys.executable, "-c", _FILL, str(image_folder), str(cache_dir), "0", str(order),
                               str(tmp_path / f"r{order}.pt")], env=env) for order in (1, -1)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    files = _files(image_folder)
    assert _read_back(cache_dir, files)["found"] == len(files)
    assert cache.describe(cache_dir)["entries"] == len(files)


_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from pathlib import Path
    from nano_patch.vision.images import cache, decode
    cache_dir, files = sys.argv[1], sys.argv[2:]
    store = cache.open_store(Path(cache_dir), 512 * 1024**2)
    for f in files:
        a = decode.decode_rgb(f)
        print("writing", f, flush=True)
        store.put(cache.key_material(f), a)
        print("written", f, flush=True)
""")


def test_kill_9_mid_write_leaves_no_entry_that_reads_as_valid(tmp_path, photos, cache_dir):
    """Large images (slow puts): each writer is killed a moment after it starts a put. Everything the store
    then holds equals a fresh decode, the entry being written is absent, and writing goes on afterwards."""
    big = tmp_path / "big"
    big.mkdir()
    files = []
    for i in range(12):
        im = photos[i % len(photos)].resize((2600 + 8 * i, 1900), Image.BICUBIC)
        f = big / f"{i:02d}.jpg"
        im.save(f, quality=90)
        files.append(f)
    rng = random.Random(9)
    killed_mid_write = 0
    for trial in range(4):
        todo = [str(f) for f in files[trial * 3:trial * 3 + 3]]
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(cache_dir), *todo], stdout=subprocess.PIPE,
                                text=True)
        lines = []
        target = todo[1]  # let the first one finish, kill during the second
        for line in proc.stdout:
            lines.append(line.split())
            if lines[-1] == ["writing", target]:
                time.sleep(rng.uniform(0.0, 0.004))
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        store = cache.open_store(cache_dir, 512 * 1024**2)
        assert store.get(cache.key_material(todo[0])) is not None  # committed before the kill
        if store.get(cache.key_material(target)) is None:
            killed_mid_write += 1
    assert killed_mid_write >= 2  # the kills really landed inside puts
    # a fresh process finds a sound store and can still write (LMDB's lock was released with the killed writer)
    proc = subprocess.run([sys.executable, "-c", _WRITER, str(cache_dir), *map(str, files)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "nano-patch" not in proc.stderr, proc.stderr
    assert _read_back(cache_dir, files)["found"] == len(files)


# --- damage between runs -------------------------------------------------------------------------

_RUN = textwrap.dedent("""
    import json, sys, warnings, torch, nano_patch
    folder, cache_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    cap = sys.argv[4] if len(sys.argv) > 4 else "on"
    warnings.simplefilter("always")
    nano_patch.patch_torch(cache_decoded=cap, cache_dir=cache_dir)
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = ImageFolder(folder, transform=tf)
    items = []
    for epoch in range(2):
        for i in range(len(ds)):
            torch.manual_seed(i)
            items.append(ds[i][0])
    torch.save(items, out)
""")


def _run(folder: Path, cache_dir: Path, out: Path, *extra: str, prefix: list[str] | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH", "_NANO_PATCH"))}
    cmd = [*(prefix or []), sys.executable, "-c", _RUN, str(folder), str(cache_dir), str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def stock_run(image_folder, tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("stock") / "stock.pt"
    code = _RUN.replace("nano_patch.patch_torch(cache_decoded=cap, cache_dir=cache_dir)", "pass")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH", "_NANO_PATCH"))}
    subprocess.run([sys.executable, "-c", code, str(image_folder), "-", str(out)], check=True, env=env, timeout=300)
    return torch.load(out)


def _same(out: Path, stock: list) -> None:
    got = torch.load(out)
    assert len(got) == len(stock) and all(torch.equal(a, b) for a, b in zip(got, stock))


def _fill(cache_dir: Path, files: list[Path]) -> None:
    """Fill the store from this process, then close it (no views were taken), so that it can be damaged."""
    store = cache.open_store(cache_dir)
    for f in files:
        assert store.put(cache.key_material(f), decode.decode_rgb(f))
    store.close_for_fork()  # no environment left open in this process


def _cache_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "nano-patch" in line and "cache" in line]


def _damage(store: Path, kind: str) -> None:
    data = store / "data.mdb"
    if kind == "truncated":
        os.truncate(data, data.stat().st_size // 2)
    elif kind == "garbage":
        data.write_bytes(os.urandom(data.stat().st_size))
    elif kind == "older format":
        import lmdb

        env = lmdb.open(str(store), map_size=64 * 1024**2)
        with env.begin(write=True) as txn:
            txn.put(cache.FORMAT_KEY, b"nano-patch decoded-image cache, entry format 0")
        env.close()
    elif kind == "damaged entry":  # a byte of an entry's key material: its header check fails
        raw = bytearray(data.read_bytes())
        at = raw.index(b"NPDI")
        raw[at + 40] ^= 0xFF
        data.write_bytes(bytes(raw))


@pytest.mark.parametrize("kind", ["truncated", "garbage", "older format", "damaged entry"])
def test_a_damaged_store_is_rebuilt_with_one_warning(image_folder, cache_dir, tmp_path, stock_run, kind):
    _fill(cache_dir, _files(image_folder))
    _damage(cache_dir / cache.STORE_NAME, kind)
    proc = _run(image_folder, cache_dir, tmp_path / "after.pt")
    _same(tmp_path / "after.pt", stock_run)
    lines = _cache_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    if kind == "damaged entry":  # found on read: this run goes on uncached, the next rebuilds
        assert "failed its check" in lines[0]
        proc = _run(image_folder, cache_dir, tmp_path / "next.pt")
        _same(tmp_path / "next.pt", stock_run)
        assert len(_cache_lines(proc.stderr)) == 1 and "damaged" in proc.stderr
    else:
        assert "damaged" in lines[0] and "rebuilt" in lines[0] or "new one" in lines[0], lines
    files = _files(image_folder)
    assert _read_back(cache_dir, files)["found"] == len(files)


def test_a_garbage_lock_file_is_remade_by_lmdb_and_the_entries_kept(image_folder, cache_dir, tmp_path, stock_run):
    """LMDB re-initialises its lock file when the first process opens the store: nothing to rebuild."""
    _fill(cache_dir, _files(image_folder))
    (cache_dir / cache.STORE_NAME / "lock.mdb").write_bytes(os.urandom(8192))
    proc = _run(image_folder, cache_dir, tmp_path / "after.pt")
    _same(tmp_path / "after.pt", stock_run)
    assert _cache_lines(proc.stderr) == []
    files = _files(image_folder)
    assert _read_back(cache_dir, files)["found"] == len(files)


@pytest.mark.parametrize("kind", ["mode 0777", "another user's"])
def test_a_folder_open_to_others_is_refused(image_folder, tmp_path, stock_run, kind):
    folder = tmp_path / "shared-cache"
    folder.mkdir()
    if kind == "mode 0777":
        folder.chmod(0o777)
        want = "writable by group or others"
    elif os.getuid() == 0:
        os.chown(folder, 65534, 65534)
        folder.chmod(0o700)
        want = "owned by another user"
    else:
        folder = Path("/usr")  # owned by root, not by this user
        want = "owned by another user"
    proc = _run(image_folder, folder, tmp_path / "out.pt")
    _same(tmp_path / "out.pt", stock_run)
    lines = _cache_lines(proc.stderr)
    assert len(lines) == 1 and want in lines[0], proc.stderr
    assert not (folder / cache.STORE_NAME).exists()


def _in_small_filesystem(tmp_path: Path, size: str, read_only: bool = False) -> list[str]:
    """A command prefix that runs a program with ``tmp_path / 'fs'`` a small tmpfs (a private mount
    namespace), or, where that cannot be had, with the file-size limit standing in for a full disk."""
    (tmp_path / "fs").mkdir(exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o {opts} tmpfs {tmp_path / 'fs'}"],
                           capture_output=True) if shutil.which("unshare") else None
    if probe is not None and probe.returncode == 0:
        return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o {opts} tmpfs {tmp_path / "fs"} && exec "$0" "$@"']
    if read_only:
        (tmp_path / "fs").chmod(0o500)
        return []
    limit = int(size.rstrip("m")) * 1024**2
    return [sys.executable, "-c", "import resource, signal, os, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])"]


def test_a_full_disk_goes_on_uncached_with_one_warning(image_folder, tmp_path, stock_run):
    """A cap far above the disk's size: the disk fills before the cap is reached."""
    prefix = _in_small_filesystem(tmp_path, "2m")
    proc = _run(image_folder, tmp_path / "fs" / "cache", tmp_path / "out.pt", "64MB", prefix=prefix)
    _same(tmp_path / "out.pt", stock_run)
    lines = _cache_lines(proc.stderr)
    assert len(lines) == 1 and ("no space" in lines[0] or "writing failed" in lines[0]), proc.stderr


def test_a_read_only_location_goes_on_uncached_with_one_warning(image_folder, tmp_path, stock_run):
    prefix = _in_small_filesystem(tmp_path, "2m", read_only=True)
    proc = _run(image_folder, tmp_path / "fs" / "cache", tmp_path / "out.pt", prefix=prefix)
    _same(tmp_path / "out.pt", stock_run)
    lines = _cache_lines(proc.stderr)
    assert len(lines) == 1 and "read-only" in lines[0], proc.stderr


def test_the_cap_is_never_exceeded(image_folder, cache_dir, tmp_path, stock_run):
    cap = 2 * 1024**2  # a few of the test photos
    proc = _run(image_folder, cache_dir, tmp_path / "out.pt", str(cap))
    _same(tmp_path / "out.pt", stock_run)
    assert _cache_lines(proc.stderr) == []  # a full cache is not a problem: it just stops adding
    files = _files(image_folder)
    found = _read_back(cache_dir, files)["found"]
    assert 0 < found < len(files)
    assert (cache_dir / cache.STORE_NAME / "data.mdb").stat().st_size <= cap
    assert cache.describe(cache_dir)["cap"] == cap


# --- the command line, the options, --fast, the report ---------------------------------------------


def test_nano_patch_cache_lists_and_clears(image_folder, cache_dir, tmp_path):
    _run(image_folder, cache_dir, tmp_path / "out.pt")
    cli = [sys.executable, "-m", "nano_patch", "cache", "--cache-dir", str(cache_dir)]
    listing = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    n = len(_files(image_folder))
    assert f"{n} images" in listing and str(cache_dir / cache.STORE_NAME) in listing and "[ok]" in listing
    rows = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, check=True).stdout)
    row = next(r for r in rows if r["folder"] == str(cache_dir))
    assert row["entries"] == n and row["bytes_on_disk"] > 0
    cleared = subprocess.run([*cli, "clear"], capture_output=True, text=True, check=True).stdout
    assert f"removed {cache_dir / cache.STORE_NAME}" in cleared
    assert not (cache_dir / cache.STORE_NAME).exists()
    assert "no cache" in subprocess.run(cli, capture_output=True, text=True, check=True).stdout


def test_options_are_validated_with_the_accepted_values():
    assert config.validate("cache_decoded", "20GB") == 20 * 1000**3
    assert config.validate("cache_decoded", "2GiB") == 2 * 1024**3
    assert config.validate("cache_decoded", True) == "on"
    assert config.validate("cache_decoded", "off") == "off"
    for bad in ("lots", "10kB", -5, 3.5, [1]):
        with pytest.raises(config.ConfigError, match="cache_decoded.*accepted: on, off, auto"):
            config.validate("cache_decoded", bad)
    with pytest.raises(config.ConfigError, match="cache_dir"):
        nano_patch.patch_torch(cache_dir=42)
    assert not nano_patch.is_patched()


def test_flags_of_nano_patch_run(tmp_path):
    from nano_patch import cli

    script = tmp_path / "s.py"
    script.write_text("import nano_patch; o = nano_patch.options(); print(o.cache_decoded, o.cache_dir)\n")
    for flags, want in ((["--cache-decoded"], "on None"), (["--cache-decoded=512MB"], "512000000 None"),
                        (["--cache-decoded", "off", "--cache-dir", str(tmp_path)], f"off {tmp_path}")):
        run = subprocess.run([sys.executable, "-m", "nano_patch", "run", *flags, str(script)], capture_output=True,
                             text=True)
        assert run.returncode == 0 and run.stdout.strip() == want, (flags, run.stderr)
    bad = subprocess.run([sys.executable, "-m", "nano_patch", "run", "--cache-decoded=huge", str(script)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "accepted: on, off, auto" in bad.stderr
    assert "fits" in cli.config.ACCEPTED["cache_decoded"]


def test_fast_caches_a_dataset_that_fits_and_says_so(image_folder, cache_dir, capsys, monkeypatch):
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(cache_decoded="auto", cache_dir=str(cache_dir))
    ds = ImageFolder(str(image_folder), transform=pets())
    DataLoader(ds, batch_size=2)
    err = capsys.readouterr().err
    assert "decoded-image cache on for ImageFolder" in err and str(cache_dir) in err and err.count("\n") == 1
    assert cache.store_for(ds) is not None
    # the estimate from the headers is the decoded size
    files = _files(image_folder)
    real = sum(decode.decode_rgb(f).nbytes for f in files)
    assert abs(cache.estimate_decoded_bytes([str(f) for f in files]) - real) < 0.05 * real
    # too big for the budget: off, and one line says why
    monkeypatch.setattr(cache.choice, "AUTO_MEMORY_SHARE", 1e-9)
    other = ImageFolder(str(image_folder), transform=pets())
    DataLoader(other, batch_size=2)
    err = capsys.readouterr().err
    assert "decoded-image cache off for ImageFolder" in err and "budget" in err
    assert cache.store_for(other) is None


def test_fast_measures_the_budget_once_and_each_batch_asks_no_more_of_the_machine(image_folder, cache_dir,
                                                                                  monkeypatch):
    """``--fast``'s budget (the machine's memory, the disk's free space) is fixed when the first dataset is cached:
    it is measured then, not again for every batch; a store of another folder is the one asked for."""
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    measured = []
    real_budget = cache.choice._budget
    monkeypatch.setattr(cache.choice, "_budget", lambda folder: measured.append(folder) or real_budget(folder))
    nano_patch.patch_torch(cache_decoded="auto", cache_dir=str(cache_dir), loader_threads=2)
    ds = ImageFolder(str(image_folder), transform=pets())
    for _ in range(2):
        for _ in DataLoader(ds, batch_size=2):
            pass
    assert len(measured) == 2  # the dataset's decision, then the store's cap: once each, not per batch
    assert cache.store_for(ds) is cache.open_store(cache_dir)
    other_dir = cache_dir.parent / "other"
    nano_patch.unpatch_torch()
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(other_dir))
    assert cache.store_for(ds) is cache.open_store(other_dir) is not cache.open_store(cache_dir)


def test_fast_turns_the_cache_on():
    from nano_patch import preset

    options, line = preset.fast_options(native_bf16=False)
    assert options["cache_decoded"] == "auto" and "decoded-image cache" in line


def test_the_report_shows_hits_misses_bytes_and_time_saved(image_folder, cache_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torchvision.transforms as T
        from torch.utils.data import DataLoader
        from torchvision.datasets import ImageFolder
        ds = ImageFolder({str(image_folder)!r}, transform=T.Compose([T.RandomResizedCrop(64), T.ToTensor()]))
        for epoch in range(3):
            for x, y in DataLoader(ds, batch_size=4, num_workers=0):
                pass
    """))
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "nano_patch", "run", "--report", str(out), "--cache-decoded",
                          "--cache-dir", str(cache_dir), str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    n = len(_files(image_folder))
    c = json.loads(out.read_text())["decoded_cache"]
    assert (c["hits"], c["misses"], c["stored"]) == (2 * n, n, n)
    assert c["bytes_read"] == 2 * c["bytes_stored"] > 0 and c["decode_s_saved"] > 0
    assert f"decoded-image cache: {2 * n} hits, {n} misses" in run.stderr
