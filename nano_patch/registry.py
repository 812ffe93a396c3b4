"""The patch machinery: one record of replaced attributes per patch, version guards and lazy hooks.

A patch replaces attributes *in place* (methods on the stock classes, functions in the stock
modules) and writes every replacement into its :class:`AttributeRecord`. ``revert`` restores from
that record and from nowhere else, so after ``unpatch_torch()`` every attribute is the very object it
was before.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import logging
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, MutableMapping
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

import wrapt
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .config import Options

log = logging.getLogger("nano_patch")

#: What an owner held where it held nothing.
MISSING = object()


class NanoPatchWarning(UserWarning):
    """A patch was skipped, or a feature will run slower than expected."""


class Replaced(NamedTuple):
    """One replacement a patch made: ``owner.name``, or ``owner[name]`` where ``item`` (a mapping's entry)."""

    owner: Any
    name: Any
    #: what ``owner`` held there before (:data:`MISSING`: nothing)
    old: Any
    item: bool = False

    def now(self) -> Any:
        """What ``owner`` holds there now (:data:`MISSING`: nothing)."""
        return self.owner.get(self.name, MISSING) if self.item else own_value(self.owner, self.name)


class AttributeRecord:
    """Every attribute (or registry entry) a patch replaced, with what was there before."""

    def __init__(self) -> None:
        self._entries: list[Replaced] = []

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """Set ``owner.name = new``, remembering what ``owner`` itself held under ``name``."""
        self._entries.append(Replaced(owner, name, own_value(owner, name)))
        setattr(owner, name, new)

    def replace_item(self, mapping: MutableMapping[Any, Any], key: Any, new: Any) -> None:
        """Set ``mapping[key] = new`` (a registry of torch's own, such as ``default_collate_fn_map``), remembering
        what it held under ``key``."""
        self._entries.append(Replaced(mapping, key, mapping.get(key, MISSING), True))
        mapping[key] = new

    def redirect(self, func: types.FunctionType, impl: Callable[..., Any]) -> None:
        """Make the function object ``func`` run ``impl`` while staying the very same object.

        Everything that holds ``func`` sees the change: ``from module import func`` done earlier,
        a dataset's default argument, a ``Lambda(func)``. Pickling by reference keeps working,
        because the module attribute is still ``func``. The code swapped in finds ``impl`` by its
        own (unique) code object, so it needs nothing from the function's module.
        """
        if func.__closure__:
            raise TypeError(f"{func.__module__}.{func.__qualname__} has a closure and cannot be redirected")
        code = _trampoline_code(func)
        _IMPLS[code] = impl
        self.replace(func, "__signature__", inspect.signature(func))
        self.replace(func, "__code__", code)

    def wrap(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """Wrap a method or function in place with a ``wrapt`` wrapper ``(wrapped, instance, args, kwargs)``."""
        original = vars(owner)[name]
        self.replace(owner, name, wrapt.FunctionWrapper(original, wrapper))

    def restore(self) -> None:
        """Put every replaced attribute back, newest first."""
        while self._entries:
            owner, name, old, item = self._entries.pop()
            if item:
                if old is MISSING:
                    owner.pop(name, None)
                else:
                    owner[name] = old
            elif old is MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)

    def entries(self) -> list[Replaced]:
        """What is replaced now, oldest first."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def own_value(owner: Any, name: str) -> Any:
    """What ``owner`` itself holds under ``name``: its ``__dict__`` entry, or a slot like ``__code__``."""
    if name in vars(owner):
        return vars(owner)[name]
    if isinstance(getattr(type(owner), name, None), (types.GetSetDescriptorType, types.MemberDescriptorType)):
        return getattr(owner, name)
    return MISSING


#: trampoline code object -> the implementation it runs. Code objects compare by value, so each trampoline carries
#: its function's name, file and first line (unique together).
_IMPLS: dict[types.CodeType, Callable[..., Any]] = {}


def _trampoline(*args: Any, **kwargs: Any) -> Any:
    import sys  # a local import: the code runs with the patched function's module globals

    return sys.modules["nano_patch.registry"]._IMPLS[sys._getframe().f_code](*args, **kwargs)


def _trampoline_code(func: types.FunctionType) -> types.CodeType:
    """The trampoline's code under ``func``'s name, file and first line: ``inspect.getsource`` of the redirected
    function is still stock's source, as ``torch.jit.script`` reads it to compile a scriptable function (the
    compiled function is stock's: TorchScript never runs the Python)."""
    code = func.__code__
    return _trampoline.__code__.replace(
        co_name=func.__name__,
        co_qualname=func.__qualname__,
        co_filename=code.co_filename,
        co_firstlineno=code.co_firstlineno,
    )


def stock_copy(func: types.FunctionType) -> types.FunctionType:
    """A new function object running ``func``'s current (stock) code, for falling back to stock."""
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    copy.__kwdefaults__ = func.__kwdefaults__
    copy.__qualname__ = func.__qualname__
    copy.__module__ = func.__module__
    return copy


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class Patch:
    """One patched target: a module, the distributions and version ranges it supports, apply/revert.

    Subclasses set the class attributes and implement :meth:`_apply` with ``self.record``; they
    override :meth:`check_internals` to name the internals they rely on.
    """

    name: ClassVar[str]
    #: The option switch that turns this patch on or off: "vision", "dataloader" or "trainer"; any other name
    #: (the launch command's "ranks") is on whenever patch_torch() is in force.
    group: ClassVar[str]
    #: The module whose import triggers :meth:`apply`.
    target: ClassVar[str]
    #: distribution name -> PEP 440 range this patch was tested with.
    requires: ClassVar[dict[str, str]]

    def __init__(self, target: str | None = None, name: str | None = None,
                 requires: dict[str, str] | None = None) -> None:
        """``target``, ``name``, ``requires``: this instance's own, for a patch class made once per target (each of
        Lightning's namespaces); else the class's."""
        if target is not None:
            self.target = target  # type: ignore[misc]
        if name is not None:
            self.name = name  # type: ignore[misc]
        if requires is not None:
            self.requires = requires  # type: ignore[misc]
        self.record = AttributeRecord()
        self.applied = False
        self.skipped: str | None = None

    def unsupported(self, module: ModuleType) -> str | None:
        """Why this patch cannot run here, or ``None``."""
        for dist, spec in self.requires.items():
            version = installed_version(dist)
            if version is None:
                return f"{dist} is not installed"
            try:
                ok = Version(version) in SpecifierSet(spec, prereleases=True)
            except (InvalidVersion, InvalidSpecifier):
                ok = False
            if not ok:
                return f"{dist} {version} is outside the supported range {spec}"
        return self.check_internals(module)

    def check_internals(self, module: ModuleType) -> str | None:
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        """Undo anything that is not an attribute in the record (registries, caches)."""

    def apply(self, module: ModuleType, options: Options) -> bool:
        """Patch ``module``; on any problem, restore what was done, warn once and return False."""
        if self.applied:
            return True
        reason = self.unpatchable_reason(module)
        if reason is None:
            try:
                self._apply(module, options)
            except Exception as exc:  # noqa: BLE001 - a patch must never crash the user's program
                self.record.restore()
                self._revert()
                reason = f"failed while patching: {type(exc).__name__}: {exc}"
        if reason is not None:
            self.skipped = reason
            warnings.warn(f"nano-patch: skipped patch {self.name!r}: {reason}", NanoPatchWarning, stacklevel=3)
            return False
        self.applied, self.skipped = True, None
        log.debug("nano-patch: applied %s", self.name)
        return True

    def unpatchable_reason(self, module: ModuleType) -> str | None:
        try:
            return self.unsupported(module)
        except Exception as exc:  # noqa: BLE001
            return f"version check failed: {exc}"

    def revert(self) -> None:
        self.record.restore()
        self._revert()
        self.applied = False

    def versions(self) -> dict[str, str | None]:
        return {dist: installed_version(dist) for dist in self.requires}


class PatchManager:
    """Applies patches now, or at their target's import through wrapt's post-import hooks."""

    def __init__(self, patches: Iterable[Patch]) -> None:
        self.patches = list(patches)
        self.options: Options | None = None
        self.enabled: set[str] = set()
        self._hooked: set[str] = set()
        self._lock = threading.RLock()

    @property
    def active(self) -> bool:
        return self.options is not None

    def patch(self, options: Options) -> None:
        with self._lock:
            self.options = options
            # A group that is no option (the launch command) is on whenever anything is patched.
            self.enabled = {p.name for p in self.patches if getattr(options, p.group, True)}
            for p in self.patches:
                if p.name not in self.enabled:
                    if p.applied:
                        p.revert()
                    continue
                module = sys.modules.get(p.target)
                if module is not None:
                    p.apply(module, options)
                elif p.name not in self._hooked:
                    # wrapt keeps its hooks forever; ours checks whether it is still wanted when it fires.
                    self._hooked.add(p.name)
                    wrapt.register_post_import_hook(self._hook_for(p), p.target)

    def _hook_for(self, p: Patch) -> Callable[[ModuleType], None]:
        def hook(module: ModuleType) -> None:
            with self._lock:
                if self.options is not None and p.name in self.enabled and not p.applied:
                    p.apply(module, self.options)

        return hook

    def unpatch(self) -> None:
        with self._lock:
            for p in reversed(self.patches):
                if p.applied:
                    p.revert()
            self.options = None
            self.enabled = set()

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for p in self.patches:
            if p.applied:
                state, reason = "applied", ""
            elif p.skipped:
                state, reason = "skipped", p.skipped
            elif self.active and p.name in self.enabled:
                state, reason = "pending", f"waits for `import {p.target}`"
            elif self.active:
                state, reason = "disabled", f"{p.group}=False"
            else:
                state, reason = "off", "patch_torch() has not been called"
            rows.append(
                {
                    "name": p.name,
                    "group": p.group,
                    "target": p.target,
                    "state": state,
                    "reason": reason,
                    "requires": dict(p.requires),
                    "versions": p.versions(),
                }
            )
        return rows

