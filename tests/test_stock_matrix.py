"""Stock against patched over the axes users combine (``tests/scripts/stock_matrix.py`` runs the cases).

Every transform shape x every dataset kind, at ``num_workers=0`` (on 2, 4 and 16 usable cores, in turn) and at
``num_workers=2``; there the loading modes (persistent or not, virtual workers or worker processes, fork or
forkserver) take turns so that each dataset kind meets every mode and each shape six of the eight. Four fresh
processes run them all (stock and patched, under each start method), two at a time; each case's record (its
batches' values, dtypes, shapes and strides; the three global generators after each epoch; its error; its
warnings) must equal stock's, event by event.

``MATRIX_CASES`` (comma-separated case ids, or substrings of them) runs a selection.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from _procs import first_difference, matrix_records

SCRIPT = Path(__file__).parent / "scripts" / "stock_matrix.py"


def _matrix_module():
    spec = importlib.util.spec_from_file_location("stock_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    spec.loader.exec_module(module)
    return module


MATRIX = _matrix_module()
#: (persistent, virtual workers, start method) at num_workers=2
MODES = list(itertools.product((False, True), (True, False), ("fork", "forkserver")))
CORES = (2, 4, 16)


def _cases() -> list[dict[str, Any]]:
    out = []
    for (s, shape), (d, (dataset, joint)) in itertools.product(enumerate(MATRIX.SHAPES),
                                                               enumerate(MATRIX.DATASETS.items())):
        if shape == "joint" and not joint:
            continue  # (only a dataset that takes v2's transforms= can be given them)
        base = {"shape": shape, "dataset": dataset, "batch_size": 4, "epochs": 2, "seed": 11 + s + 7 * d}
        out.append({**base, "id": f"{shape}-{dataset}-w0", "workers": 0, "persistent": False, "virtual": True,
                    "start": "fork", "cores": CORES[(s + d) % 3]})
        persistent, virtual, start = MODES[(s + 3 * d) % len(MODES)]
        mode = f"{'persistent' if persistent else 'fresh'}-{'virtual' if virtual else 'processes'}-{start}"
        out.append({**base, "id": f"{shape}-{dataset}-w2-{mode}", "workers": 2, "persistent": persistent,
                    "virtual": virtual, "start": start, "cores": CORES[(s + 2 * d) % 3]})
    return out


CASES = _cases()
_WANTED = [c for c in os.environ.get("MATRIX_CASES", "").split(",") if c]
SELECTED = [c for c in CASES if not _WANTED or any(w in c["id"] for w in _WANTED)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANO_PATCH_") and k != "_NANO_PATCH_STARTUP"}
    env["PYTHONWARNINGS"] = "default"
    return env


@pytest.fixture(scope="module")
def records(tmp_path_factory, photos) -> dict[str, dict[str, list[str]]]:
    """``{side: {case id: events}}``: each side and start method in a fresh process, two at a time."""
    root = tmp_path_factory.mktemp("matrix")
    MATRIX.make_folder(root, photos)
    return matrix_records(SCRIPT, root, root, SELECTED, _env())


@pytest.mark.parametrize("case", SELECTED, ids=[c["id"] for c in SELECTED])
def test_the_combination_runs_as_on_stock(records, case):
    stock, patched = records["stock"][case["id"]], records["patched"][case["id"]]
    assert any(e.startswith("epoch") or e.startswith("case raised") for e in stock)  # it recorded what it ran
    difference = first_difference(stock, patched)
    assert difference is None, difference


def test_the_matrix_covers_every_axis():
    """Each shape and dataset kind at num_workers=0 and 2; each dataset kind with every loading mode; each start
    method, persistence, worker kind and core count somewhere."""
    assert {c["shape"] for c in CASES} == set(MATRIX.SHAPES)
    assert {c["dataset"] for c in CASES} == set(MATRIX.DATASETS)
    for dataset in MATRIX.DATASETS:
        modes = {(c["persistent"], c["virtual"], c["start"]) for c in CASES
                 if c["dataset"] == dataset and c["workers"]}
        assert modes == set(MODES), dataset
    for shape in MATRIX.SHAPES:
        assert {c["workers"] for c in CASES if c["shape"] == shape} == {0, 2}
    assert {c["cores"] for c in CASES if not c["workers"]} == set(CORES)
    assert len({c["id"] for c in CASES}) == len(CASES)


def test_the_record_sees_a_changed_batch_and_a_moved_generator(tmp_path, photos):
    """The recorder is not blind: the same case gives the same events twice; one more draw from torch's generator
    between epochs, or a batch of another dtype, shows."""
    import torch

    MATRIX.make_folder(tmp_path, photos)
    case = {"id": "x", "shape": "v1_compose", "dataset": "imagefolder", "batch_size": 4, "epochs": 2, "seed": 3,
            "workers": 0, "persistent": False, "virtual": True, "start": "fork", "cores": 2}
    first = MATRIX.run_case(case, tmp_path, patched=False)
    assert MATRIX.run_case(case, tmp_path, patched=False) == first
    assert MATRIX.run_case({**case, "seed": 4}, tmp_path, patched=False) != first
    rec = MATRIX.Recorder()
    rec.generators("a")
    torch.rand(1)
    rec.generators("a")
    assert rec.events[0] != rec.events[1]
    assert rec.value(torch.zeros(2)) != rec.value(torch.zeros(2, dtype=torch.float64))
    assert rec.value(torch.zeros(2, 2)) != rec.value(torch.zeros(2, 2).t().contiguous().t())
