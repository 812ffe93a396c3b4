"""Shared fixtures: real photographs from installed packages, re-encoded as JPEG; clean patch state."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from PIL import Image

# Under pytest-xdist the tests run in execnet's worker, whose ``__main__`` has no file: the patch would take the
# process for an interactive session (whose ranks fork). To the tests it is ``python -m pytest``, as without xdist.
_main = sys.modules.get("__main__")
if os.environ.get("PYTEST_XDIST_WORKER") and _main is not None and not hasattr(_main, "__file__"):
    _main.__file__ = str(Path(pytest.__file__).with_name("__main__.py"))

# The forkserver (Python 3.14's default start method) imports what every worker of the suite imports, once: stock's
# worker processes then start as fast as the patch's (which preloads the same when it starts the server first); a
# setting of the user's own, which changes no batch, seed or error.
import multiprocessing  # noqa: E402

multiprocessing.set_forkserver_preload(["torch", "torchvision.datasets", "torchvision.transforms", "PIL.Image"])


def photo_sources() -> list[Path]:
    """Real photos that ship inside scikit-learn and matplotlib wheels."""
    import matplotlib
    import sklearn

    sk = Path(sklearn.__file__).parent / "datasets" / "images"
    mpl = Path(matplotlib.get_data_path()) / "sample_data"
    paths = [sk / "china.jpg", sk / "flower.jpg", mpl / "grace_hopper.jpg"]
    return [p for p in paths if p.exists()]


@pytest.fixture(scope="session")
def photos() -> list[Image.Image]:
    """The photos as RGB PIL images at pet-dataset sizes (longer side 300-500 px)."""
    out = []
    for i, p in enumerate(photo_sources()):
        im = Image.open(p).convert("RGB")
        im.thumbnail((500 - 90 * i, 500 - 90 * i))
        out.append(im)
    assert len(out) >= 2, "scikit-learn/matplotlib sample photos are missing"
    return out


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory, photos) -> Path:
    """An ImageFolder tree of JPEGs made from the photos (two classes, several crops each)."""
    root = tmp_path_factory.mktemp("imagefolder")
    for cls in ("a", "b"):
        (root / cls).mkdir()
    for i, im in enumerate(photos):
        for j in range(3):
            w, h = im.size
            crop = im.crop((j * 10, j * 7, w - j * 5, h - j * 3))
            crop.save(root / ("a" if (i + j) % 2 else "b") / f"p{i}_{j}.jpg", quality=88)
    return root


@pytest.fixture(autouse=True)
def _unpatched():
    """Every test starts and ends unpatched, with no NANO_PATCH_* variables leaking in."""
    import nano_patch

    saved = {k: v for k, v in os.environ.items() if k.startswith("NANO_PATCH_") or k == "_NANO_PATCH_STARTUP"}
    for k in saved:
        del os.environ[k]
    nano_patch.unpatch_torch()
    yield
    nano_patch.unpatch_torch()
    os.environ.update(saved)


#: The modules that take longest on 2 cores, longest first (``--durations``, summed per module). Run with
#: ``-n 2 --dist loadfile`` (pyproject's addopts), each module goes whole to one worker in this order, so that no
#: long module starts last while the other worker idles.
SLOW_MODULES = ("test_lightning", "test_virtual_workers_fresh", "test_ranks", "test_run", "test_decoded_cache",
                "test_stock_matrix", "test_fabric", "test_native_kernels", "test_switch_on", "test_dataloader",
                "test_dropin_probe", "test_own_dataset", "test_virtual_worker_contract", "test_warm_start")


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))  # (a stable sort)


#: per module, the seconds its tests took (setup, call and teardown), summed where the reports arrive (the xdist
#: controller, or the one process): the suite's own account of where its time goes, at the end of every run
_module_seconds: dict[str, float] = {}
#: the xdist workers whose reports arrived ("main" without xdist)
_workers: set[str] = set()


def pytest_runtest_logreport(report) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration
    _workers.add(getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main"))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _module_seconds:
        return
    total = sum(_module_seconds.values())
    write = terminalreporter.write_line
    terminalreporter.section("slowest modules (seconds of their tests, summed)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{seconds:8.1f} s  {100 * seconds / total:4.1f}%  {module}")
    write(f"{total:8.1f} s  in all, over {len(_workers)} worker(s)")
