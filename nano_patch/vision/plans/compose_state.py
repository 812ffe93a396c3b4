"""What a Compose's draws read, kept to tell later whether it is still the same: its list of transforms, each
transform's attributes (frozen: :func:`freeze`), and torch's default dtype.

Draws made ahead of the moment stock makes them (a batch's draw program bound once for its samples, a batch made
ahead while the training step runs) are stock's only where user code run in between changed none of this: a
parameter set between two samples or two batches (a curriculum's crop size, a flip's probability), a transform
added, or the default dtype that ``ToTensor`` converts to.

A transform's attributes are frozen rather than deep-copied: scalars and enums are kept as they are (they cannot
change), lists, tuples, dicts and sets are copied level by level, tensors are cloned, functions and classes are
kept by identity (as a deep copy keeps them), an object with attributes of its own (a transform inside
``RandomApply``) is frozen the same way, and anything else is deep-copied and compared with ``==`` (an object with no
``==`` of its own then reads as changed, and the draws are made again). A v1 transform is an ``nn.Module``, whose
dozen hook tables a deep copy rebuilt at every batch; freezing them is a tuple each.
"""

from __future__ import annotations

import collections
import copy
import enum
import types
from typing import Any

#: values that cannot change in place: kept as they are
_ATOMS = frozenset((int, float, bool, str, bytes, complex, type(None), range, slice))
#: kept by identity (a deep copy keeps them too)
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
                types.MethodWrapperType, types.WrapperDescriptorType)
#: nesting beyond which a value is deep-copied instead (a recursive structure)
_DEPTH = 12


class _Copied:
    """A value frozen as a deep copy: the same where it compares equal."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = copy.deepcopy(value)


class _Kept:
    """A value frozen by identity, and, for an object with attributes, by its attributes frozen."""

    __slots__ = ("obj", "attributes")

    def __init__(self, obj: Any, attributes: Any) -> None:
        self.obj, self.attributes = obj, attributes


def freeze(value: Any, depth: int = 0) -> Any:
    """``value`` as it stands now, in a form :func:`unchanged` compares a later value with."""
    t = type(value)
    if t in _ATOMS or isinstance(value, enum.Enum):
        return value
    if depth > _DEPTH:
        return _Copied(value)
    if t is list or t is tuple:
        return (t, tuple(freeze(x, depth + 1) for x in value))
    if t is dict or t is collections.OrderedDict:
        return (t, tuple((k, freeze(x, depth + 1)) for k, x in value.items()))
    if t is set or t is frozenset:
        return (t, frozenset(value)) if all(type(x) in _ATOMS for x in value) else _Copied(value)
    if isinstance(value, _BY_IDENTITY):
        return _Kept(value, None)
    if t.__module__ == "torch" and t.__name__ in ("Tensor", "Parameter"):
        return _Kept(value, (value.dtype, value.shape, value.detach().clone()))
    attributes = getattr(value, "__dict__", None)
    if type(attributes) is dict and not hasattr(t, "__slots__"):
        return _Kept(value, freeze(attributes, depth + 1))
    return _Copied(value)


def unchanged(value: Any, frozen: Any) -> bool:
    """Whether ``value`` is what :func:`freeze` froze as ``frozen``."""
    t = type(value)
    if type(frozen) is _Kept:
        if value is not frozen.obj:
            return False
        if frozen.attributes is None:
            return True
        if t.__module__ == "torch" and t.__name__ in ("Tensor", "Parameter"):
            import torch

            dtype, shape, data = frozen.attributes
            return value.dtype == dtype and value.shape == shape and torch.equal(value.detach(), data)
        return unchanged(value.__dict__, frozen.attributes)
    if type(frozen) is _Copied:
        try:
            return bool(value == frozen.value)
        except Exception:  # noqa: BLE001 - a value that does not compare (a tensor): taken as changed
            return False
    if t in _ATOMS or isinstance(value, enum.Enum):
        return value is frozen or (type(frozen) is t and value == frozen)
    if type(frozen) is not tuple or len(frozen) != 2 or frozen[0] is not t:
        return False
    kind, items = frozen
    if kind is list or kind is tuple:
        return len(value) == len(items) and all(unchanged(x, f) for x, f in zip(value, items))
    if kind is set or kind is frozenset:
        return value == items
    return len(value) == len(items) and all(
        k == fk and unchanged(x, f) for (k, x), (fk, f) in zip(value.items(), items))


_NOT_PLAIN = object()


def _plain_copy(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that ``==`` compares with the value later, at C speed: atoms, enums, functions and
    classes as they are, containers of such copied level by level; :data:`_NOT_PLAIN` for anything else."""
    t = type(value)
    if t in _ATOMS or isinstance(value, _AS_THEY_ARE):
        return value
    if t in _CONTAINERS:
        if not value:
            return t()
        if depth > _DEPTH:
            return _NOT_PLAIN
        if t is dict or t is _OrderedDict:
            pairs = [(k, _plain_copy(x, depth + 1)) for k, x in value.items()]
            return _NOT_PLAIN if any(x is _NOT_PLAIN for _, x in pairs) else t(pairs)
        items = [_plain_copy(x, depth + 1) for x in value]
        return _NOT_PLAIN if any(x is _NOT_PLAIN for x in items) else t(items)
    return _NOT_PLAIN


_AS_THEY_ARE = (enum.Enum, *_BY_IDENTITY)
_OrderedDict = collections.OrderedDict
_CONTAINERS = frozenset((list, tuple, set, frozenset, dict, _OrderedDict))


def _snapshot(attributes: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
    """A transform's attributes as (a plain copy that ``==`` compares, with each value that cannot be copied so
    kept as itself; those values, each frozen for :func:`unchanged`)."""
    plain: dict[str, Any] = {}
    deep: list[tuple[Any, Any]] = []
    for k, v in attributes.items():
        c = _plain_copy(v)
        if c is _NOT_PLAIN:
            plain[k] = v  # (the dict's == takes it as equal only while it is the same object)
            deep.append((v, freeze(v)))
        else:
            plain[k] = c
    return plain, deep


class ComposeState:
    """A Compose as its draws read it, at one moment (:meth:`still`: nothing of it has changed since)."""

    __slots__ = ("compose", "items", "snapshot", "dtype")

    def __init__(self, compose: Any) -> None:
        import torch

        self.compose = compose
        self.items = list(compose.transforms)
        self.snapshot = [_snapshot(vars(t)) for t in self.items]
        self.dtype = torch.get_default_dtype()

    def still(self, compose: Any) -> bool:
        """Whether ``compose`` is the same object, with the same transforms, each with the same attributes, under the
        same default dtype."""
        import torch

        if compose is not self.compose:
            return False
        items = compose.transforms
        if len(items) != len(self.items) or torch.get_default_dtype() != self.dtype:
            return False
        try:
            for t, u, (plain, deep) in zip(items, self.items, self.snapshot):
                if t is not u or vars(t) != plain or not all(unchanged(v, f) for v, f in deep):
                    return False
        except Exception:  # noqa: BLE001 - a value that does not compare (a new tensor in its place): changed
            return False
        return True
