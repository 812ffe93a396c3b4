"""Batch-parallel loading (``data/batches/batch_loader.py``): a num_workers=0 DataLoader's batches and every
generator's state
equal stock's, bit for bit, while the samples of each batch render on the loader's threads.

Each case runs stock first (unpatched), then patched, from the same seeds, over three epochs of a shuffled
loader, and checks that the patched run really took the parallel path where the plan can be split.
"""

from __future__ import annotations

import shutil
import threading

import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state, seed_all
from torch.utils.data import DataLoader, Subset

import nano_patch
from nano_patch import sysinfo
from nano_patch.data.threads import loader_threads, render_pool
from nano_patch.vision.plans import compose_plan, oprunner

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory, image_folder, photos):
    """The JPEGs of ``image_folder``, plus a grey JPEG, a PNG and a small JPEG: every source the draw meets."""
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(image_folder, root, dirs_exist_ok=True)
    photos[0].convert("L").save(root / "a" / "grey.jpg", quality=90)
    photos[1].save(root / "b" / "png.png")
    photos[2].resize((150, 110)).save(root / "b" / "small.jpg", quality=75)
    return root


def _timm_ra():
    from timm.data import create_transform

    return create_transform(96, is_training=True, auto_augment="rand-m9-mstd0.5")


PIPELINES = {
    "pets": lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.1),
                               T.ToTensor(), T.Normalize(MEAN, STD)]),
    "a": lambda: T.Compose([T.Resize(130), T.ColorJitter(.4, .4, .4, .1), T.RandomCrop(112), T.RandomHorizontalFlip(),
                            T.Resize(80), T.ToTensor()]),
    "c": lambda: T.Compose([T.Resize(120), T.CenterCrop(100), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "grey and flips": lambda: T.Compose([T.RandomResizedCrop(64), T.RandomVerticalFlip(), T.RandomGrayscale(0.5),
                                         T.RandomHorizontalFlip(), T.PILToTensor()]),
    "reference": lambda: T.Compose([T.RandomResizedCrop(80), T.RandomHorizontalFlip(), T.PILToTensor(),
                                    T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]),
    "RandAugment": lambda: T.Compose([T.RandomResizedCrop(96), T.RandAugment(), T.ToTensor()]),
    "AutoAugment": lambda: T.Compose([T.RandomResizedCrop(96), T.AutoAugment(), T.ToTensor()]),
    "TrivialAugmentWide": lambda: T.Compose([T.Resize(100), T.RandomCrop(90), T.TrivialAugmentWide(),
                                             T.RandomHorizontalFlip(), T.PILToTensor()]),
    "timm RandAugment": _timm_ra,
    "timm train": lambda: _timm_train(),
}
#: Pipelines the plan cannot split: still exact, one by one.
ONE_BY_ONE = {
    "AugMix": lambda: T.Compose([T.RandomResizedCrop(64), T.AugMix(), T.ToTensor()]),
    "a Lambda": lambda: T.Compose([T.RandomResizedCrop(64), T.Lambda(lambda im: im.rotate(5)), T.ToTensor()]),
    "v2": lambda: _v2(),
}


def _timm_train():
    from timm.data import create_transform

    return create_transform(96, is_training=True)  # ends in timm's MaybeToTensor + Normalize


def _v2():
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                       v2.ToDtype(torch.float32, scale=True)])


def _epochs(folder, make, subset=False, epochs=3):
    from torchvision.datasets import ImageFolder

    seed_all(3)
    ds = ImageFolder(str(folder), transform=make())
    data = Subset(ds, [8, 1, 0, 5, 3, 7, 2, 4]) if subset else ds
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=0)
    out = []
    for _ in range(epochs):
        out.append([(x.clone(), y.clone()) for x, y in loader])
        out.append(rng_state())
    return out


def _equal(stock, patched):
    assert len(stock) == len(patched)
    for want, got in zip(stock, patched):
        if isinstance(want, tuple) and len(want) == 3 and not isinstance(want[0], tuple):
            assert rng_differences(got, want) == []  # every generator, after every epoch
            continue
        assert len(want) == len(got)
        for (wx, wy), (gx, gy) in zip(want, got):
            assert wx.dtype == gx.dtype and wx.shape == gx.shape and wx.stride() == gx.stride() and torch.equal(wx, gx)
            assert torch.equal(wy, gy)


@pytest.fixture
def parallel_batches(monkeypatch):
    """Counts the batches that really rendered on more than one thread."""
    seen = []
    inside = threading.local()  # (map_outcomes runs its items through run_on_threads: counted once)
    real = render_pool.map_outcomes

    def counted(fn, items, n_threads, state=None):
        items = list(items)
        if n_threads > 1 and len(items) > 1:
            seen.append(len(items))
        inside.on = True
        try:
            return real(fn, items, n_threads, state)
        finally:
            inside.on = False

    real_on_threads = render_pool.run_on_threads

    def counted_on_threads(fn, n_threads):  # a batch rendered by one native call per thread
        if n_threads > 1 and not getattr(inside, "on", False):
            seen.append(n_threads)
        return real_on_threads(fn, n_threads)

    real_run_on = oprunner.NativeBatch.run_on

    def counted_run_on(self, n_threads):  # a batch rendered by the caller and native helper threads
        ran = real_run_on(self, n_threads)
        if ran > 1:
            seen.append(ran)
        return ran

    monkeypatch.setattr(render_pool, "map_outcomes", counted)
    monkeypatch.setattr(render_pool, "run_on_threads", counted_on_threads)
    monkeypatch.setattr(oprunner.NativeBatch, "run_on", counted_run_on)
    return seen


@pytest.mark.parametrize("cache", ["off", "on"])
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_batches_and_generators_equal_stock_over_three_epochs(mixed_folder, tmp_path, parallel_batches, name,
                                                              cache):
    if name.startswith("timm"):
        pytest.importorskip("timm")
    stock = _epochs(mixed_folder, PIPELINES[name])
    nano_patch.patch_torch(loader_threads=2, cache_decoded=cache, cache_dir=str(tmp_path / "cache"))
    patched = _epochs(mixed_folder, PIPELINES[name])
    _equal(stock, patched)
    assert len(parallel_batches) == 3 * 3  # 12 images in batches of 4: every batch of every epoch in parallel


def test_a_subset_of_a_folder_loads_its_batches_in_parallel(mixed_folder, parallel_batches):
    stock = _epochs(mixed_folder, PIPELINES["pets"], subset=True)
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _epochs(mixed_folder, PIPELINES["pets"], subset=True))
    assert len(parallel_batches) == 2 * 3


@pytest.mark.parametrize("name", sorted(ONE_BY_ONE))
def test_a_compose_that_cannot_be_split_loads_one_by_one_and_exactly(mixed_folder, parallel_batches, name):
    stock = _epochs(mixed_folder, ONE_BY_ONE[name])
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _epochs(mixed_folder, ONE_BY_ONE[name]))
    assert parallel_batches == []


def test_why_a_compose_is_not_split_is_recorded(mixed_folder):
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=2)
    tf = ONE_BY_ONE["a Lambda"]()
    list(DataLoader(ImageFolder(str(mixed_folder), transform=tf), batch_size=4))
    assert "`Lambda` at position 1" in compose_plan.plan_for(tf).unsplittable


def test_loader_threads_off_and_worker_processes_load_one_by_one(mixed_folder, parallel_batches):
    stock = _epochs(mixed_folder, PIPELINES["pets"], epochs=1)
    nano_patch.patch_torch(loader_threads="off")
    _equal(stock, _epochs(mixed_folder, PIPELINES["pets"], epochs=1))
    assert parallel_batches == []
    nano_patch.unpatch_torch()
    nano_patch.patch_torch(loader_threads=2)
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(mixed_folder), transform=PIPELINES["c"]())
    batches = list(DataLoader(ds, batch_size=4, num_workers=1))  # the worker's fetcher: one thread there
    assert len(batches) == 3 and parallel_batches == []


def test_a_file_that_fails_raises_stocks_error_with_stocks_generators(mixed_folder, tmp_path):
    """A truncated JPEG in the third batch: the same exception, after the same draws, as stock."""
    from torchvision.datasets import ImageFolder

    root = tmp_path / "broken"
    shutil.copytree(mixed_folder, root)
    data = (root / "a" / "grey.jpg").read_bytes()
    (root / "a" / "grey.jpg").write_bytes(data[: len(data) // 2])

    def run():
        seed_all(5)
        ds = ImageFolder(str(root), transform=PIPELINES["pets"]())
        got = []
        with pytest.raises(OSError) as exc:
            for x, _ in DataLoader(ds, batch_size=4, num_workers=0):
                got.append(x)
        return got, type(exc.value), rng_state()

    stock = run()
    nano_patch.patch_torch(loader_threads=2)
    patched = run()
    assert len(stock[0]) == len(patched[0]) and all(torch.equal(a, b) for a, b in zip(stock[0], patched[0]))
    assert patched[1] is stock[1]
    assert rng_differences(patched[2], stock[2]) == []


def test_a_subclass_that_overrides_getitem_is_called_per_item(mixed_folder, parallel_batches):
    from torchvision.datasets import ImageFolder

    class Tagged(ImageFolder):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return x, y + 100

    nano_patch.patch_torch(loader_threads=2)
    ys = torch.cat([y for _, y in DataLoader(Tagged(str(mixed_folder), transform=PIPELINES["c"]()), batch_size=4)])
    assert ys.min() >= 100 and parallel_batches == []


@pytest.mark.parametrize("value", [0, -1, "many", 2.5, True])
def test_a_bad_loader_threads_value_names_the_option_and_the_accepted_values(value):
    with pytest.raises(nano_patch.ConfigError, match=r"loader_threads.*accepted: a positive int, \"auto\""):
        nano_patch.patch_torch(loader_threads=value)
    assert not nano_patch.is_patched()


def _quota(monkeypatch, cpus: float | None) -> None:
    """The cgroup's CPU quota, as the core count reads it (``sysinfo``), read afresh (as after its refresh time)."""
    monkeypatch.setattr(sysinfo, "cgroup_quota", lambda: cpus)
    monkeypatch.setattr(sysinfo, "_quota_read", (float("-inf"), None))


def test_a_changed_quota_is_seen_within_its_refresh_time(monkeypatch):
    """The quota is read at most every ``QUOTA_REFRESH_S`` (the loader asks once per batch; a read costs ~50 us)."""
    now = [1000.0]
    monkeypatch.setattr(sysinfo.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(sysinfo.os, "sched_getaffinity", lambda pid: set(range(8)))
    _quota(monkeypatch, 2.0)
    assert sysinfo.usable_cores() == 2
    monkeypatch.setattr(sysinfo, "cgroup_quota", lambda: 6.0)  # the container resized
    assert sysinfo.usable_cores() == 2
    now[0] += sysinfo.QUOTA_REFRESH_S
    assert sysinfo.usable_cores() == 6


def test_usable_cores_are_the_affinity_capped_by_the_cgroup_quota(monkeypatch):
    monkeypatch.setattr(sysinfo.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    _quota(monkeypatch, None)
    assert sysinfo.usable_cores() == 8 and sysinfo.affinity_cpus() == list(range(8))
    _quota(monkeypatch, 2.5)  # a container given 2.5 CPUs
    assert sysinfo.usable_cores() == 3
    _quota(monkeypatch, 0.2)
    assert sysinfo.usable_cores() == 1


def test_the_pool_is_sized_to_the_usable_cores(monkeypatch, tmp_path):
    monkeypatch.setattr(loader_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    _quota(monkeypatch, None)
    assert sysinfo.usable_cores() == 8
    _quota(monkeypatch, 2.5)  # a container given 2.5 CPUs
    assert sysinfo.usable_cores() == 3
    nano_patch.patch_torch()
    assert loader_threads._auto_threads().ladder == [1, 2, 3]  # auto tries counts up to the usable cores


def _timm_epochs(folder, make, epochs=2):
    from timm.data import ImageDataset

    seed_all(4)
    loader = DataLoader(ImageDataset(str(folder), transform=make()), batch_size=4, shuffle=True, num_workers=0)
    out = []
    for _ in range(epochs):
        out.append([(x.clone(), y.clone()) for x, y in loader])
        out.append(rng_state())
    return out


@pytest.mark.parametrize("name", ["timm train", "timm RandAugment"])
def test_timms_image_dataset_loads_its_batches_in_parallel_as_stock(mixed_folder, parallel_batches, name):
    pytest.importorskip("timm")
    from timm.data import create_transform

    make = (lambda: create_transform(96, is_training=True)) if name == "timm train" else _timm_ra
    stock = _timm_epochs(mixed_folder, make)
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _timm_epochs(mixed_folder, make))
    assert len(parallel_batches) == 2 * 3


def test_timm_skips_a_broken_file_in_a_batch_as_stock(mixed_folder, tmp_path):
    """timm skips a file it cannot load and takes the next index: the batch goes one by one, as stock."""
    pytest.importorskip("timm")
    root = tmp_path / "broken"
    shutil.copytree(mixed_folder, root)
    data = (root / "a" / "grey.jpg").read_bytes()
    (root / "a" / "grey.jpg").write_bytes(data[: len(data) // 3])
    stock = _timm_epochs(root, PIPELINES["pets"])
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _timm_epochs(root, PIPELINES["pets"]))


@pytest.mark.parametrize("name", ["pets", "c", "reference", "grey and flips", "timm train"])
def test_every_sample_renders_in_one_native_call_and_tensor_batches_collate_without_a_copy(mixed_folder, monkeypatch,
                                                                                           name):
    """The op runner renders every sample of these pipelines (one call each); where the tail is ToTensor's, the
    batch tensor the samples were written into is the collated batch itself (and equal to stock's, checked above)."""
    if name.startswith("timm"):
        pytest.importorskip("timm")
    from nano_patch.data import collate
    from nano_patch.vision.plans import oprunner

    runs, collated, written = [], [], []
    real_run, real_collate_pairs, real_batch_tensor = oprunner.run, collate.collate_pairs, oprunner.batch_tensor
    monkeypatch.setattr(oprunner, "run", lambda job, a: runs.append(job) or real_run(job, a))
    monkeypatch.setattr(oprunner, "batch_tensor", lambda jobs: written.append(real_batch_tensor(jobs)) or written[-1])

    def collate_pairs(data, handed=None):
        got = real_collate_pairs(data, handed)
        collated.append(got is not None and got[0] is written[-1])
        return got

    monkeypatch.setattr(collate, "collate_pairs", collate_pairs)
    stock = _epochs(mixed_folder, PIPELINES[name], epochs=1)
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _epochs(mixed_folder, PIPELINES[name], epochs=1))
    assert len(runs) == 12  # every sample of the epoch
    tensor_tail = name in ("pets", "c", "timm train")  # ToTensor's layout is stack's; PILToTensor's is not
    assert collated == [tensor_tail] * 3  # the batch tensor the render wrote is the collated batch


def _normalised_epochs(folder, mean_between=None):
    """Two batches of pets' pipeline; ``mean_between``: Normalize's mean set to it between them (a user's
    change, which the second batch must see as stock sees it)."""
    from torchvision.datasets import ImageFolder

    seed_all(5)
    norm = T.Normalize(list(MEAN), list(STD))
    ds = ImageFolder(str(folder), transform=T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                                                       T.ToTensor(), norm]))
    out = []
    for k, (x, y) in enumerate(DataLoader(ds, batch_size=4, shuffle=True)):
        out.append((x.clone(), y.clone()))
        if k == 0 and mean_between is not None:
            norm.mean = mean_between
        if k == 1:
            break
    return out


def test_a_normalize_changed_between_batches_is_seen_by_the_next_batch(mixed_folder):
    """The draw step makes a run's tensor tail op once for all its samples (no user code runs between their
    draws); a Normalize the user changes between two batches gives the second one stock's new values."""
    stock = _normalised_epochs(mixed_folder, [0.1, 0.2, 0.3])
    nano_patch.patch_torch(loader_threads=2)
    patched = _normalised_epochs(mixed_folder, [0.1, 0.2, 0.3])
    unchanged = _normalised_epochs(mixed_folder)
    for (wx, wy), (gx, gy) in zip(stock, patched):
        assert torch.equal(wx, gx) and torch.equal(wy, gy)
    assert not torch.equal(stock[1][0], unchanged[1][0])  # (the change shows in stock's second batch)


def test_the_common_batch_is_collated_as_stocks_default_collate(mixed_folder, monkeypatch):
    """A batch of (image, int) pairs rendered into one batch tensor: the fetch collates it without stock's walk
    (``collate.collate_pairs``), to what stock's ``default_collate`` gives (values, dtypes, strides, types)."""
    from nano_patch.data import collate

    taken, handed_over = [], []
    real = collate.collate_pairs

    def collate_pairs(data, handed=None):
        taken.append(real(data, handed))
        handed_over.append(handed is not None and taken[-1][0] is handed[0])
        return taken[-1]

    monkeypatch.setattr(collate, "collate_pairs", collate_pairs)
    stock = _epochs(mixed_folder, PIPELINES["pets"], epochs=2)
    nano_patch.patch_torch(loader_threads=2)
    _equal(stock, _epochs(mixed_folder, PIPELINES["pets"], epochs=2))
    assert len(taken) == 6 and all(type(b) is list and len(b) == 2 for b in taken)
    # the first epoch reads each file in the draw (its samples checked slot by slot); the second renders each batch
    # in one call, the batch handed over whole to the fetch (``collate.hand_over``)
    assert handed_over == [False] * 3 + [True] * 3


def _slots_batch(n=3):
    """``n`` (image, target) pairs whose images are the marked slots of one batch tensor, as the render makes."""
    from nano_patch.vision.plans.batch_slots import mark_slot

    base = torch.arange(n * 2 * 3 * 4, dtype=torch.float32).reshape(n, 2, 3, 4)
    return base, [(mark_slot(slot, base, k), k + 10) for k, slot in enumerate(base.unbind(0))]


def test_collate_pairs_takes_only_what_stocks_walk_would_collate_the_same_way(monkeypatch):
    from torch.utils.data import default_collate
    from torch.utils.data._utils import collate as torch_collate

    from nano_patch.data import collate

    collate.install()
    try:
        base, batch = _slots_batch()
        got = collate.collate_pairs(batch)
        assert type(got) is list and got[0] is base and torch.equal(got[1], torch.tensor([10, 11, 12]))
        base, batch = _slots_batch()
        assert collate.collate_pairs([batch[1], batch[0], batch[2]]) is None  # not in the tensor's order
        want = default_collate([(x.clone(), y) for x, y in batch])
        got = default_collate(batch)  # (the marks stay where collate_pairs declined)
        assert torch.equal(got[0], want[0]) and got[0] is base
        others = [
            [(x, float(y)) for x, y in _slots_batch()[1]],  # float targets
            [(x, bool(y)) for x, y in _slots_batch()[1]],  # bool targets (stock: not collate_int_fn's type)
            [[x, y] for x, y in _slots_batch()[1]],  # lists, not tuples
            [(x, y, y) for x, y in _slots_batch()[1]],  # three columns
            [(x.clone(), y) for x, y in _slots_batch()[1]],  # not slots
            tuple(_slots_batch()[1]),  # not a list
            [],
        ]
        for data in others:
            assert collate.collate_pairs(data) is None
        base, batch = _slots_batch()
        monkeypatch.setitem(torch_collate.default_collate_fn_map, int, lambda b, **kw: "mine")
        assert collate.collate_pairs(batch) is None  # a user's collation of ints: stock's walk, which calls it
        assert default_collate(batch)[1] == "mine"
    finally:
        collate.uninstall()


def test_a_handed_over_batch_is_taken_once_and_only_for_its_own_slots():
    """``collate.hand_over`` notes a batch for its fetch: the note is taken once (never by a later fetch), and it
    collates only the very slots it names, in order; other samples get ``batch_of``'s checks, as before."""
    from nano_patch.data import collate

    collate.install()
    try:
        base, batch = _slots_batch()
        collate.hand_over(base, tuple(x for x, _ in batch))
        handed = collate.take_handed()
        assert handed is not None and collate.take_handed() is None  # taken once
        other_base, other = _slots_batch()
        got = collate.collate_pairs(other, handed)  # another batch's slots: checked one by one, and its own
        assert got[0] is other_base and got[0] is not base
        assert collate.collate_pairs([batch[1], batch[0], batch[2]], handed) is None  # not in the tensor's order
        got = collate.collate_pairs(batch, handed)
        assert got[0] is base and torch.equal(got[1], torch.tensor([10, 11, 12]))
    finally:
        collate.uninstall()
