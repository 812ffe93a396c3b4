"""The package's imports run one way: each module imports only from its own layer or a lower one.

Layers, lowest first (docs/reference.md, "Layers"):

- base: options, the patch registry, the run report and notices, what the machine offers;
- kernels (``vision/kernels/``): the compiled kernels' loading, checks and wrappers, the PIL-exact functions on arrays;
- images (``vision/images/``): decoding, the patch's PIL image, the file index, the decoded-image cache;
- plans (``vision/plans/``): a Compose's plan, its steps, draws, typed ops and tensor tail;
- batches: the DataLoader's batch path (``data/``), and a sample's loading;
- training: Lightning and Fabric (``train/``);
- patches: one module per patched target (``patches/``);
- the face: the package itself (``nano_patch/__init__.py``), the command line and the entry points.

Each layer below the base is a folder, placed whole. Every import counts, those inside functions included, relative
and absolute. Nothing below the face imports the package ``nano_patch`` itself (it reads the options in force from
``config.current()``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nano_patch"

BASE, KERNELS, IMAGES, PLANS, BATCHES, TRAINING, PATCHES, FACE = range(8)
NAMES = ("base", "kernels", "images", "plans", "batches", "training", "patches", "the face")

#: The package's own top-level modules, placed one by one: the face and the base.
MODULES: dict[str, int] = {
    "nano_patch": FACE,
    "nano_patch.__main__": FACE,
    "nano_patch.cli": FACE,
    "nano_patch.auto": FACE,
    "nano_patch._startup": FACE,
    "nano_patch._rank": FACE,
    "nano_patch._version": BASE,
    "nano_patch.config": BASE,
    "nano_patch.registry": BASE,
    "nano_patch.report": BASE,
    "nano_patch.exit_notices": BASE,
    "nano_patch.sysinfo": BASE,
    "nano_patch.forks": BASE,
    "nano_patch.envtune": BASE,
    "nano_patch.preset": BASE,
    "nano_patch.simd": BASE,
}
#: Every subpackage is placed whole: a module belongs to the innermost package listed here that holds it.
PACKAGES: dict[str, int] = {
    "nano_patch.vision": KERNELS,  # its __init__ only; the compiled extensions sit beside it
    "nano_patch.vision.kernels": KERNELS,
    "nano_patch.vision.images": IMAGES,
    "nano_patch.vision.plans": PLANS,
    "nano_patch.data": BATCHES,
    "nano_patch.train": TRAINING,
    "nano_patch.patches": PATCHES,
}

#: (module, what it imports) allowed across the rule for now, each with why; to be emptied, never grown.
KNOWN: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(module: str) -> int | None:
    if module in MODULES:
        return MODULES[module]
    holders = [p for p in PACKAGES if module == p or module.startswith(p + ".")]
    return PACKAGES[max(holders, key=len)] if holders else None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules (the package itself included) that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = node.module if not node.level else ".".join(filter(None, (base, node.module)))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            # `import nano_patch.x.y` binds and runs the package too; what it uses is the module it names
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                found.add(target)
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    """Every import of a higher layer, and every import of the package itself below the face (KNOWN left out)."""
    known = modules() if package == PACKAGE else _modules_under(package)
    out = []
    for name, path in sorted(known.items()):
        own = layer_of(name)
        if own is None:
            continue  # (test_every_module_has_a_layer names it)
        for target in sorted(imports(name, path, known)):
            theirs = layer_of(target)
            if (name, target) in KNOWN or theirs is None:
                continue
            if target == "nano_patch" and own != FACE:
                out.append(f"{name} ({NAMES[own]}) imports the package nano_patch itself")
            elif theirs > own:
                out.append(f"{name} ({NAMES[own]}) imports {target} ({NAMES[theirs]})")
    return out


def _modules_under(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_every_module_has_a_layer():
    assert sorted(m for m in modules() if layer_of(m) is None) == []


def test_every_placed_module_exists():
    known = modules()
    assert sorted(m for m in [*MODULES, *PACKAGES] if m not in known) == []


def test_no_module_is_placed_on_its_own_below_the_top():
    """Layers are folders: only the package's top-level modules are placed by name."""
    assert [m for m in MODULES if m.count(".") > 1 or m.startswith(tuple(p + "." for p in PACKAGES))] == []


def test_imports_run_one_way():
    assert violations() == []


def test_the_known_exceptions_are_still_there():
    """A listed exception that is gone is taken off the list, so that it never goes stale."""
    known = modules()
    gone = [pair for pair in KNOWN if pair[0] not in known or pair[1] not in imports(pair[0], known[pair[0]], known)]
    assert gone == []


def test_the_scan_sees_function_level_relative_and_absolute_imports(tmp_path):
    """The rule holds against imports in every form: a higher layer imported inside a function, relatively or
    absolutely, and the package imported below the face, are each found."""
    tree = tmp_path / "nano_patch"
    for folder in ("vision", "vision/kernels", "vision/plans", "data", "train"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "config.py").write_text("")
    (tree / "data" / "collate.py").write_text("")
    (tree / "train" / "ranks.py").write_text("")
    (tree / "vision" / "plans" / "compose_call.py").write_text(
        "def f():\n    from ...data import collate\n\n\ndef g():\n    import nano_patch.train.ranks\n")
    (tree / "vision" / "kernels" / "functional.py").write_text("import nano_patch\nfrom nano_patch import config\n")
    found = violations(tree)
    assert found == ["nano_patch.vision.kernels.functional (kernels) imports the package nano_patch itself",
                     "nano_patch.vision.plans.compose_call (plans) imports nano_patch.data.collate (batches)",
                     "nano_patch.vision.plans.compose_call (plans) imports nano_patch.train.ranks (training)"], found
