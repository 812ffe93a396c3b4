"""The one contract every patch module meets: apply, revert, idempotency, version skip."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

from nano_patch.config import Options
from nano_patch.patches import all_patches
from nano_patch.registry import NanoPatchWarning

PATCHES = all_patches()


def _available(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _fresh(p):
    """A new, unapplied patch like ``p`` (those built per target take it as their argument)."""
    return type(p)(p.target) if p.group in ("trainer", "ranks") else type(p)()


@pytest.fixture(params=PATCHES, ids=lambda p: p.name)
def patch(request):
    p = _fresh(request.param)
    if not _available(p.target):
        pytest.skip(f"{p.target} is not installed")
    yield p
    p.revert()


def _snapshot(p):
    return [(e.owner, e.name, e.now()) for e in p.record.entries()]


def test_apply_replaces_and_revert_restores_identity(patch):
    module = importlib.import_module(patch.target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NanoPatchWarning)
        assert patch.apply(module, Options())
    assert patch.applied and len(patch.record) > 0
    replaced = patch.record.entries()
    for e in replaced:
        assert e.now() is not e.old, f"{e.owner}.{e.name} was recorded but not replaced"
    patch.revert()
    assert not patch.applied and len(patch.record) == 0
    for e in replaced:
        assert e.now() is e.old, f"{e.owner}.{e.name} not restored to the same object"


def test_apply_twice_is_idempotent(patch):
    module = importlib.import_module(patch.target)
    assert patch.apply(module, Options())
    first = _snapshot(patch)
    assert patch.apply(module, Options())
    assert _snapshot(patch) == first


def test_unsupported_version_skips_with_one_warning(patch):
    module = importlib.import_module(patch.target)
    dist = next(iter(patch.requires))
    patch.requires = {dist: "<0.0.1"}
    with pytest.warns(NanoPatchWarning, match=re.escape(f"skipped patch '{patch.name}'")) as rec:
        assert patch.apply(module, Options()) is False
    assert len([w for w in rec if issubclass(w.category, NanoPatchWarning)]) == 1
    assert not patch.applied and len(patch.record) == 0
    assert "outside the supported range" in patch.skipped


def test_failure_while_patching_leaves_nothing_half_patched(patch, monkeypatch):
    module = importlib.import_module(patch.target)
    original_apply = patch._apply

    def broken(mod, options):
        original_apply(mod, options)
        raise RuntimeError("boom")

    monkeypatch.setattr(patch, "_apply", broken)
    before = {id(o): _state(o) for o in _owners(patch, module)}
    with pytest.warns(NanoPatchWarning, match="failed while patching: RuntimeError: boom"):
        assert patch.apply(module, Options()) is False
    for o in _owners(patch, module):
        after = _state(o)
        assert after.keys() == before[id(o)].keys()
        assert all(after[k] is before[id(o)][k] for k in after)


def _state(o):
    if isinstance(o, dict):  # a registry of torch's own (default_collate_fn_map)
        return dict(o)
    state = dict(vars(o))
    if hasattr(o, "__code__"):
        state["__code__"] = o.__code__
    return state


def _owners(patch, module):
    p2 = _fresh(patch)
    p2.apply(module, Options())
    owners = {id(e.owner): e.owner for e in p2.record.entries()}
    p2.revert()
    return list(owners.values())


def test_registry_entries_go_through_the_patch_s_record_and_back(monkeypatch):
    """The DataLoader patch's entries in torch's own collate registry (the batch tensor's collation, the erasers'
    draws) are made through its record, and its revert takes them out again: every entry the very object it was."""
    import torch
    from torch.utils.data._utils import collate as torch_collate

    from nano_patch.data import collate
    from nano_patch.data.tail import finish_tail
    from nano_patch.registry import AttributeRecord
    from nano_patch.vision.plans.tensor_tail import ErasedImage

    fn_map = torch_collate.default_collate_fn_map
    monkeypatch.delitem(fn_map, ErasedImage, raising=False)  # (a worker's registration, made without a record)
    before = dict(fn_map)
    record = AttributeRecord()
    collate.install(record)
    finish_tail.register_collate(record)
    assert fn_map[torch.Tensor] is collate.collate_tensor and fn_map[ErasedImage] is finish_tail.collate_erased
    assert [e.item for e in record.entries()] == [True, True]
    record.restore()
    assert fn_map.keys() == before.keys() and all(fn_map[k] is v for k, v in before.items())
