"""No private name (``_x``) of one nano_patch module is used by another: neither imported (``from .m import
_x``) nor reached through an imported module or object (``m._x``). What one module needs from another is
that module's public interface.

``KNOWN`` lists the uses that remain in modules being reworked elsewhere; it is to be emptied, not grown:
the test fails on a use not listed, and on a listed one that is gone (so the list never goes stale).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nano_patch

PACKAGE = Path(nano_patch.__file__).resolve().parent

#: (the module that uses it, the private name with the module it belongs to)
KNOWN: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def private_uses(text: str, module: str, is_package: bool = False) -> set[tuple[str, str]]:
    """(``module``, the other module's private name) for every private name of another nano_patch module
    that the source ``text`` of ``module`` imports, or reads as an attribute of a name it imported from
    nano_patch."""
    tree = ast.parse(text)
    found: set[tuple[str, str]] = set()
    imported: dict[str, str] = {}  # local name -> what it is, fully qualified
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            if not source.startswith("nano_patch"):
                continue
            for alias in node.names:
                if _private(alias.name) and source != module:
                    found.add((module, f"{source}.{alias.name}"))
                imported[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nano_patch"):
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                and _private(node.attr)):
            found.add((module, f"{imported[node.value.id]}.{node.attr}"))
    return found


def test_the_checker_finds_both_kinds_of_use():
    """The checker itself: an import of another module's private name and a read of one through an imported
    module are found; the module's own private names and other packages' are not."""
    text = ("from .disk import _refused_file, check_directory\nfrom .. import decode\nimport os\n"
            "decode._x\nos._exit\n_own = 1\nprint(_own, check_directory)\n")
    assert private_uses(text, "nano_patch.vision.images.cache.store") == {
        ("nano_patch.vision.images.cache.store", "nano_patch.vision.images.cache.disk._refused_file"),
        ("nano_patch.vision.images.cache.store", "nano_patch.vision.images.decode._x")}
    # a package importing its own private submodule is not a use of another module's private name
    assert private_uses("from . import _version\nfrom .x import _y\n", "nano_patch", is_package=True) == {
        ("nano_patch", "nano_patch.x._y")}


def test_no_private_names_across_modules():
    uses: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = _module_name(path)
        uses |= private_uses(path.read_text(encoding="utf-8"), module, is_package)
    new = sorted(uses - KNOWN)
    gone = sorted(KNOWN - uses)
    assert not new, "private names of other modules (make them public, or move the code):\n" + "\n".join(
        f"  {m} uses {n}" for m, n in new)
    assert not gone, "no longer used: remove from KNOWN:\n" + "\n".join(f"  {m} uses {n}" for m, n in gone)
