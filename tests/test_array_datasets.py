"""torchvision's array datasets (CIFAR10/100, SVHN, STL10, the MNIST family): stock against patched.

The matrix (``tests/scripts/array_matrix.py``): every dataset with its tutorial's transforms and with the variants
around them (pads of each mode, fills, centre crops, flips, a ``target_transform`` that draws, pipelines the path
does not take, parameters stock rejects), at ``num_workers=0`` and 2 (persistent or not, fork or forkserver in turn);
batches, targets, generators, errors and warnings as stock's. Then, in this process: the batch is made in one native
call; what stock reads per sample is read again when it changes between batches or within one; the maps are numpy's
pad.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _procs import first_difference, matrix_records

SCRIPT = Path(__file__).parent / "scripts" / "array_matrix.py"


def _matrix_module():
    spec = importlib.util.spec_from_file_location("array_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MATRIX = _matrix_module()
MODES = list(itertools.product((False, True), ("fork", "forkserver")))


def _cases() -> list[dict[str, Any]]:
    out = []
    for (p, name), (k, kind) in itertools.product(enumerate(MATRIX.PIPELINES), enumerate(MATRIX.KINDS)):
        if name != "tutorial" and (p + k) % 3:  # the tutorial everywhere; each variant on a third of the datasets
            continue
        base = {"pipeline": name, "kind": kind, "batch_size": 16, "seed": 5 + p + 11 * k}
        out.append({**base, "id": f"{kind}-{name}-w0", "workers": 0, "persistent": False, "start": "fork"})
        if name in MATRIX.ERRORS and (name, kind) != ("std_zero", "stl10"):
            continue  # (stock's workers take 10 s to stop after a batch raised: one such case at num_workers=2)
        persistent, start = MODES[(p + k) % len(MODES)]
        out.append({**base, "id": f"{kind}-{name}-w2-{'persistent' if persistent else 'fresh'}-{start}",
                    "workers": 2, "persistent": persistent, "start": start})
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arrays")
    MATRIX.make_files(root)
    return root


@pytest.fixture(scope="module")
def records(files, tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    """``{side: {case id: events}}``: each side and start method in a fresh process, two at a time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANO_PATCH_")}
    return matrix_records(SCRIPT, files, tmp_path_factory.mktemp("array_matrix"), CASES, env)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_combination_runs_as_on_stock(records, case):
    stock, patched = records["stock"][case["id"]], records["patched"][case["id"]]
    assert any(e.startswith("epoch") or e.startswith("case raised") for e in stock)
    difference = first_difference(stock, patched)
    assert difference is None, difference


def test_the_matrix_covers_every_dataset_and_pipeline():
    assert {c["kind"] for c in CASES} == set(MATRIX.KINDS)
    assert {c["pipeline"] for c in CASES} == set(MATRIX.PIPELINES)
    for kind in MATRIX.KINDS:
        assert {c["workers"] for c in CASES if c["kind"] == kind and c["pipeline"] == "tutorial"} == {0, 2}
    assert {(c["persistent"], c["start"]) for c in CASES if c["workers"]} == set(MODES)


# --- in this process: the path taken, and what it reads -----------------------------------------------------------

def _open(files: Path, kind: str, pipeline: str = "tutorial", **kw: Any) -> Any:
    transform, target_transform = MATRIX.pipeline(pipeline, kind)
    kw.setdefault("transform", transform)
    kw.setdefault("target_transform", target_transform)
    return MATRIX.open_dataset(kind, files, **kw)


def _epoch(ds: Any, between: Any = None, seed: int = 3, **kw: Any) -> list[Any]:
    """One epoch's batches (values, strides) and torch's generator at its end; ``between(batch_number, ds)`` runs
    after each batch."""
    torch.manual_seed(seed)
    out = []
    for b, (x, y) in enumerate(torch.utils.data.DataLoader(ds, batch_size=kw.pop("batch_size", 8), shuffle=True,
                                                           **kw)):
        out.append((x.clone(), x.stride(), x.dtype, y.clone() if isinstance(y, torch.Tensor) else y))
        if between is not None:
            between(b, ds)
    out.append(torch.get_rng_state())
    return out


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a[:-1], b[:-1]):
        assert u[1:3] == v[1:3]
        assert torch.equal(u[0], v[0])
        assert torch.equal(u[3], v[3]) if isinstance(u[3], torch.Tensor) else u[3] == v[3]
    assert torch.equal(a[-1], b[-1])


def _stock_then_patched(make: Any, between: Any = None, **kw: Any) -> tuple[list[Any], list[Any]]:
    import nano_patch

    stock = _epoch(make(), between, **kw)
    nano_patch.patch_torch()
    return stock, _epoch(make(), between, **kw)


@pytest.mark.parametrize("kind", ["cifar10", "fashionmnist", "svhn"])
def test_a_batch_is_made_in_one_native_call(files, kind, monkeypatch):
    """The batch is the array path's (one gather per batch, one draw call), and equals stock's."""
    import nano_patch
    from nano_patch.vision.kernels import native

    stock = _epoch(_open(files, kind))
    nano_patch.patch_torch()
    mod = native.kernel("array_gather")
    calls = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            fn = getattr(mod, name)
            return lambda *a: (calls.append(name), fn(*a))[1]

    monkeypatch.setattr(native, "kernel", lambda name: Spy() if name == "array_gather" else mod)
    patched = _epoch(_open(files, kind))
    _same(stock, patched)
    assert calls.count("gather_batch") == len(patched) - 1  # (one per batch)


def test_parameters_changed_between_batches_are_read_again(files):
    """The padding, the flip's p, Normalize's mean, the target_transform and the transform itself, each changed
    after a batch: the next batch is made with what stock would read then."""
    import torchvision.transforms as T

    def between(b: int, ds: Any) -> None:
        steps = ds.transform.transforms
        if b == 0:
            steps[0].padding = 1
        elif b == 1:
            steps[1].p = 0.9
        elif b == 2:
            steps[3].mean = [0.1, 0.2, 0.3]
        elif b == 3:
            ds.target_transform = lambda y: y + 100
        elif b == 4:
            ds.target_transform = None
            ds.transform = T.Compose([T.RandomCrop(28, padding_mode="symmetric", padding=2), T.ToTensor()])
        elif b == 5:
            ds.data[:] = 255 - ds.data
        elif b == 6:
            ds.targets = [3] * len(ds.targets)

    stock, patched = _stock_then_patched(lambda: _open(files, "cifar10"), between)
    _same(stock, patched)


def test_the_default_dtype_changed_between_batches(files):
    def between(b: int, ds: Any) -> None:
        torch.set_default_dtype(torch.float64 if b % 2 == 0 else torch.float32)

    try:
        stock, patched = _stock_then_patched(lambda: _open(files, "mnist"), between)
    finally:
        torch.set_default_dtype(torch.float32)
    _same(stock, patched)


def test_a_target_transform_that_changes_the_pipeline_mid_batch(files):
    """User code between samples: a target_transform that edits the crop's padding, the pixels of a later sample and
    the labels; each sample sees what stock's loop would."""
    seen = {"n": 0}

    def make() -> Any:
        ds = _open(files, "cifar100")
        seen["n"] = 0

        def target_transform(y: int) -> int:
            seen["n"] += 1
            if seen["n"] == 3:
                ds.transform.transforms[0].padding = 7
            if seen["n"] == 5:
                ds.data[:] = ds.data[::-1].copy()
            if seen["n"] == 9:
                ds.targets[:] = [t + 1 for t in ds.targets]
            return y * 2 + int(torch.rand(1) < 0.5)

        ds.target_transform = target_transform
        return ds

    stock, patched = _stock_then_patched(make)
    _same(stock, patched)


def test_attributes_read_through_code_are_read_as_often_as_stock(files):
    """A subclass whose ``data`` is a property (code of the user's): stock's loop reads it per sample; so must the
    patch (it loads such a dataset one by one)."""
    from torchvision import datasets

    reads = {"n": 0}

    class Counted(datasets.FashionMNIST):
        raw_folder = property(lambda self: os.path.join(self.root, "FashionMNIST", "raw"))

        @property
        def data(self) -> Any:
            reads["n"] += 1
            return self._data

        @data.setter
        def data(self, value: Any) -> None:
            self._data = value

    def make() -> Any:
        transform, _ = MATRIX.pipeline("tutorial", "fashionmnist")
        return Counted(str(files), transform=transform)

    make()
    reads["n"] = 0
    stock = _epoch(make())
    stock_reads, reads["n"] = reads["n"], 0
    import nano_patch

    nano_patch.patch_torch()
    patched = _epoch(make())
    _same(stock, patched)
    assert reads["n"] == stock_reads


def test_an_overriding_subclass_and_bad_indices_run_stocks_code(files):
    """A subclass's own ``__getitem__`` runs as on stock; an index out of range raises stock's error after the
    samples before it."""
    from torchvision import datasets

    calls = {"n": 0}

    class Own(datasets.MNIST):
        raw_folder = property(lambda self: os.path.join(self.root, "MNIST", "raw"))

        def __getitem__(self, i: int) -> Any:
            calls["n"] += 1
            return super().__getitem__(i)

    transform, _ = MATRIX.pipeline("tutorial", "mnist")
    import nano_patch

    nano_patch.patch_torch()
    ds = Own(str(files), transform=transform)
    _epoch(ds)
    assert calls["n"] == len(ds)
    plain = _open(files, "kmnist")
    errors = []
    for side in ("stock", "patched"):
        if side == "stock":
            nano_patch.unpatch_torch()
        else:
            nano_patch.patch_torch()
        loader = torch.utils.data.DataLoader(plain, batch_size=None, sampler=[[0, 1, len(plain) + 3]])
        torch.manual_seed(1)
        with pytest.raises(IndexError) as caught:
            next(iter(loader))
        errors.append((str(caught.value), torch.get_rng_state()))
    assert errors[0][0] == errors[1][0] and torch.equal(errors[0][1], errors[1][1])


def test_numpy_indices_from_a_sampler_take_the_path(files, monkeypatch):
    """A sampler over a NumPy array yields NumPy integers (a negative one too): the batch is the array path's, and
    stock's."""
    import nano_patch
    from nano_patch.data.datasets import array_datasets

    sampler = [np.array([3, -2, 7, 0, 11], dtype=np.int64)[k] for k in range(5)]
    def load(**kw: Any) -> list[Any]:
        torch.manual_seed(2)
        loader = torch.utils.data.DataLoader(_open(files, "cifar10"), batch_size=5, sampler=sampler)
        return [(x.clone(), y.clone()) for x, y in loader] + [torch.get_rng_state()]

    stock = load()
    nano_patch.patch_torch()
    made = []
    gather = array_datasets._gather
    monkeypatch.setattr(array_datasets, "_gather", lambda *a, **k: made.append(1) or gather(*a, **k))
    patched = load()
    assert made and torch.equal(stock[0][0], patched[0][0]) and torch.equal(stock[0][1], patched[0][1])
    assert torch.equal(stock[-1], patched[-1])


@pytest.mark.parametrize("form", ["batch_size=None", "drop_last", "random_split", "concat", "replacement",
                                  "inference_mode"])
def test_the_loaders_forms_around_an_array_dataset(files, form):
    """The DataLoader's other forms over an array dataset: samples one by one, a dropped last batch, a Subset from
    random_split (followed to its dataset), a ConcatDataset (stock's loop), a sampler with replacement, the loop under
    inference_mode (inference tensors, as stock's)."""
    import warnings

    import nano_patch

    def load() -> list[Any]:
        torch.manual_seed(4)
        ds: Any = _open(files, "cifar10")
        kw: dict[str, Any] = {"batch_size": 6, "shuffle": True}
        if form == "batch_size=None":
            kw = {"batch_size": None, "shuffle": True}
        elif form == "drop_last":
            kw["drop_last"] = True
        elif form == "random_split":
            ds = torch.utils.data.random_split(ds, [0.75, 0.25])[0]
        elif form == "concat":
            ds = torch.utils.data.ConcatDataset([ds, _open(files, "cifar100")])
        elif form == "replacement":
            kw = {"batch_size": 6, "sampler": torch.utils.data.RandomSampler(ds, replacement=True, num_samples=30)}
        out = []
        with warnings.catch_warnings(record=True) as caught, (
                torch.inference_mode() if form == "inference_mode" else torch.enable_grad()):
            warnings.simplefilter("always")
            for x, y in torch.utils.data.DataLoader(ds, **kw):
                out.append((x.clone(), torch.as_tensor(y).clone(), x.is_inference(), x.stride()))
        return out + [torch.get_rng_state(), [str(w.message) for w in caught]]

    stock = load()
    nano_patch.patch_torch()
    patched = load()
    assert len(stock) == len(patched)
    for a, b in zip(stock[:-2], patched[:-2]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2:] == b[2:]
    assert torch.equal(stock[-2], patched[-2]) and stock[-1] == patched[-1]


@pytest.mark.parametrize("mode", ["reflect", "symmetric", "edge", "constant"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_padded_map_is_numpys_pad(mode, n):
    """Padding the row (or column) map then gathering is padding the pixels: for every mode, any padding, even
    one more than the side (numpy's repeated reflections)."""
    from nano_patch.vision.plans.array_plan import pad_map

    rng = np.random.default_rng(n)
    pixels = rng.integers(0, 255, n)
    for before, after in ((0, 0), (1, 0), (0, 3), (n + 2, 2 * n + 1)):
        if mode == "reflect" and n == 1 and before + after:
            continue  # (numpy's reflect of one pixel: the plan leaves it to stock)
        index = pad_map(np.arange(n, dtype=np.int32), before, after, mode)
        want = np.pad(pixels, (before, after), mode) if mode != "constant" else np.pad(pixels, (before, after),
                                                                                      constant_values=-1)
        got = np.where(index < 0, -1, pixels[np.clip(index, 0, None)])
        assert np.array_equal(got, want), (before, after)
