"""docs/reference.md's Layout names every module of the package, under its own folder, and no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nano_patch"


def _layout_block() -> str:
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("## Layout\n", 1)[1]
    return section.split("```\n", 2)[1]


def _documented_modules() -> set[str]:
    """Module paths (relative to the package) the Layout block lists, from its indentation."""
    found: set[str] = set()
    folders: list[tuple[int, str]] = []
    for line in _layout_block().splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if name.endswith("/"):
            folders.append((indent, name.rstrip("/")))
        elif name.endswith(".py") and folders and folders[0][1] == "nano_patch":
            found.add("/".join([f for _, f in folders[1:]] + [name]))
    return found


@pytest.mark.skipif(not (PACKAGE / "__init__.py").exists() or not (ROOT / "docs").exists(),
                    reason="needs the source tree (the docs are not part of the wheel)")
def test_layout_lists_every_module() -> None:
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    documented = _documented_modules()
    assert modules - documented == set(), "modules missing from docs/reference.md's Layout"
    assert documented - modules == set(), "docs/reference.md's Layout names modules that do not exist"
