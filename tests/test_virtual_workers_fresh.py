"""Virtual workers under forkserver (Python 3.14's default start method on Linux, stood in for here) and spawn: a
stock worker is then a fresh interpreter (the dataset a pickle round trip, the modules at their defaults), and the
patch's batches, generators and errors must equal stock's started the same way.

Each test sets the interpreter's start method, as a script on 3.14 has it without saying so.
"""

from __future__ import annotations

import functools
import multiprocessing
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from test_virtual_workers import _iterators, _pets, _stock_and_patched, folder  # noqa: F401 - (a fixture)
from torch.utils.data import DataLoader

import nano_patch


@pytest.fixture(params=["forkserver", "spawn"])
def start_method(request):
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(request.param, force=True)
    yield request.param
    multiprocessing.set_start_method(before, force=True)


#: (workers, persistent) per start method: every case under forkserver (Python 3.14's default); spawn starts its
#: workers the same way (a fresh interpreter), so it takes two of them.
FRESH_CASES = [("forkserver", w, p) for p in (False, True) for w in (1, 2, 3)] + [("spawn", 3, False),
                                                                                  ("spawn", 2, True)]


@pytest.mark.parametrize(("method", "workers", "persistent"), FRESH_CASES)
def test_fresh_workers_give_stocks_batches_and_generators(folder, method, workers, persistent):  # noqa: F811
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True,
                          num_workers=workers, persistent_workers=persistent)

    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        _, patched = _stock_and_patched(make, seed=workers)
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_fresh_workers_under_lightnings_seeding(folder, start_method):  # noqa: F811
    from lightning_fabric.utilities.seed import pl_worker_init_function
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True, num_workers=2,
                          worker_init_fn=functools.partial(pl_worker_init_function, rank=1),
                          persistent_workers=True)

    _, patched = _stock_and_patched(make, seed=8)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


def test_a_named_context_runs_virtual_workers_too(folder):  # noqa: F811
    from torchvision.datasets import ImageFolder

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, num_workers=2,
                          multiprocessing_context=multiprocessing.get_context("forkserver"),
                          persistent_workers=True)

    _, patched = _stock_and_patched(make, seed=9)
    assert set(_iterators(patched)) == {"VirtualWorkersIter"}


class _LocalFolder:
    """Makes an ImageFolder subclass defined inside a function: it does not pickle."""

    @staticmethod
    def make(root: str) -> Any:
        from torchvision.datasets import ImageFolder

        class Local(ImageFolder):
            pass

        return Local(root, transform=_pets())


@pytest.mark.parametrize("case", ["lambda transform", "local class"])
def test_a_dataset_that_does_not_pickle_raises_stocks_error(folder, start_method, case):  # noqa: F811
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    def make() -> DataLoader:
        if case == "lambda transform":
            ds = ImageFolder(str(folder), transform=T.Compose([T.Lambda(lambda im: im), T.ToTensor()]))
        else:
            ds = _LocalFolder.make(str(folder))
        return DataLoader(ds, batch_size=4, num_workers=2)

    def raised() -> tuple[str, str]:
        with pytest.raises(Exception) as got:  # noqa: PT011 - stock's own, compared below
            next(iter(make()))
        return type(got.value).__name__, str(got.value)

    stock = raised()
    nano_patch.patch_torch()
    assert raised() == stock


def test_a_state_a_fresh_worker_would_not_see_keeps_processes(folder, start_method):  # noqa: F811
    from torchvision.datasets import ImageFolder

    from nano_patch.data.workers import virtual_eligibility

    nano_patch.patch_torch()
    loader = DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, num_workers=2)
    assert virtual_eligibility.why_not(loader, "auto") is None
    torch.set_default_dtype(torch.float64)
    try:
        why = virtual_eligibility.why_not(loader, "auto")
    finally:
        torch.set_default_dtype(torch.float32)
    assert why is not None and "default_dtype (torch.float64)" in why and start_method in why


def test_the_fresh_state_is_a_fresh_interpreters():
    from nano_patch.data.workers import worker_state

    out = subprocess.run([sys.executable, "-c", "import torch; from PIL import Image, ImageFile; "
                          "print(torch.get_default_dtype(), ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS)"],
                         capture_output=True, text=True, check=True)
    fresh = worker_state.fresh()
    assert out.stdout.split() == [str(fresh.default_dtype), str(fresh.load_truncated_images),
                                  str(fresh.max_image_pixels)]


_SCRIPT = """
import sys, multiprocessing, torch
if sys.argv[3] == "patched":
    import nano_patch
    nano_patch.patch_torch()
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
if sys.argv[2] == "top":
    torch.set_default_dtype(torch.float64)  # a fresh worker imports this module: it sets it too

if __name__ == "__main__":
    multiprocessing.set_start_method("forkserver")
    if sys.argv[2] == "main":
        torch.set_default_dtype(torch.float64)  # a fresh worker does not run this block: its default is float32
    torch.manual_seed(0)
    loader = DataLoader(ImageFolder(sys.argv[1], transform=T.Compose([T.RandomResizedCrop(32), T.ToTensor()])),
                        batch_size=4, shuffle=True, num_workers=2)
    for x, y in loader:
        print(x.dtype, round(float(x.double().sum()), 6), y.tolist())
    print(type(iter(loader)).__name__)
"""


@pytest.mark.parametrize("where", ["top", "main"])
def test_state_set_at_the_top_level_or_in_main_as_a_fresh_worker_sees_it(folder, tmp_path, where):  # noqa: F811
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))

    def run(side: str) -> list[str]:
        out = subprocess.run([sys.executable, str(script), str(folder), where, side], capture_output=True,
                             text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.splitlines()

    stock, patched = run("stock"), run("patched")
    assert patched[:-1] == stock[:-1]
    assert stock[0].startswith("torch.float64" if where == "top" else "torch.float32")


def test_one_batch_given_back_goes_to_a_stand_in_and_the_rest_stay_fast(folder, monkeypatch):  # noqa: F811
    """Under forkserver, persistent: one batch the fast path gives back (forced here) is loaded by a stand-in (a
    fresh interpreter), the report names why, and every later batch of the run takes the fast path again; the
    batches and generators stay stock's."""
    from torchvision.datasets import ImageFolder

    from nano_patch.data.batches import drawn_batches

    original = drawn_batches._load_drawn
    calls = []

    def second_given_back(*args):
        calls.append(1)
        return drawn_batches.GivenBack("forced by the test") if len(calls) == 2 else original(*args)

    def make():
        return DataLoader(ImageFolder(str(folder), transform=_pets()), batch_size=4, shuffle=True, num_workers=2,
                          persistent_workers=True)

    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    monkeypatch.setattr(drawn_batches, "_load_drawn", second_given_back)
    try:
        _stock_and_patched(make, seed=4)
        calls.clear()
        torch.manual_seed(4)
        loader = make()
        for _ in range(4):
            for _ in loader:
                pass
        described = loader._iterator.describe()
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert described["stand_in_batches"] == 1 and described["stand_in_reasons"] == {"forced by the test": 1}
    assert len(calls) == 4 * 3  # every batch of the four epochs went to the fast path first
