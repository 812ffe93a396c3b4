"""Training helpers built on Lightning: core topology, the multi-instance strategy, callbacks, Fabric APIs.

``pytorch_lightning`` and ``lightning.pytorch`` (and ``lightning_fabric`` / ``lightning.fabric``) are
separate copies of the same code, so classes that subclass theirs are built once per namespace. Each
gets a distinct name in its module, found again by that module's ``__getattr__``, so that pickle
(``spawn`` start method, checkpoints) can look it up by reference.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType

LIGHTNING = ("pytorch_lightning", "lightning.pytorch")
FABRIC = ("lightning_fabric", "lightning.fabric")


def class_name(base: str, namespace: str) -> str:
    """``base`` for the standalone packages, ``base_lightning_pytorch`` (and so on) for the ``lightning`` ones."""
    return base if namespace in ("pytorch_lightning", "lightning_fabric") else f"{base}_{namespace.replace('.', '_')}"


def name_class(cls: type, module: str, base: str, namespace: str) -> type:
    cls.__module__ = module
    cls.__name__ = cls.__qualname__ = class_name(base, namespace)
    return cls


def find_class(name: str, builders: Mapping[str, tuple[Callable[[ModuleType], type], tuple[str, ...]]]) -> type:
    """The module-level ``__getattr__`` of a module with per-namespace classes."""
    for base, (build, namespaces) in builders.items():
        for namespace in namespaces:
            if name == class_name(base, namespace):
                return build(importlib.import_module(namespace))
    raise AttributeError(name)
