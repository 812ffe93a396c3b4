"""The package's imports run one way: each module imports only from its own layer or a lower one.

Layers, lowest first (docs/reference.md, "Layers"):

- base: options, the patch registry, the run report and notices, what the machine offers;
- kernels: the compiled kernels' loading, checks and wrappers, and the PIL-exact functions on arrays;
- images: decoding, the patch's PIL image, the file index, the decoded-image cache;
- plans: a Compose's plan, its steps, draws, typed ops and tensor tail;
- batches: the DataLoader's batch path (``data/``), and a sample's loading;
- training: Lightning and Fabric (``train/``);
- patches: one module per patched target (``patches/``);
- the face: the package itself (``nano_patch/__init__.py``), the command line and the entry points.

Every import counts, those inside functions included, relative and absolute. Nothing below the face imports the
package ``nano_patch`` itself (it reads the options in force from ``config.current()``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nano_patch"

BASE, KERNELS, IMAGES, PLANS, BATCHES, TRAINING, PATCHES, FACE = range(8)
NAMES = ("base", "kernels", "images", "plans", "batches", "training", "patches", "the face")

#: Modules placed one by one (the packages data/, train/, patches/ and vision/cache/ are placed whole below).
LAYERS: dict[str, int] = {
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
    "nano_patch.vision": KERNELS,
    "nano_patch.vision.native": KERNELS,
    "nano_patch.vision.native_checks": KERNELS,
    "nano_patch.vision.native_kernels": KERNELS,
    # torch's generator reproduced natively: a kernel's wrapper and its check, which native_checks runs
    "nano_patch.vision.torch_draws": KERNELS,
    "nano_patch.vision.functional": KERNELS,
    "nano_patch.vision.decode": IMAGES,
    "nano_patch.vision.image": IMAGES,
    "nano_patch.vision.file_index": IMAGES,
    "nano_patch.vision.source": IMAGES,
    "nano_patch.vision.stock": PLANS,
    "nano_patch.vision.pixels": PLANS,
    "nano_patch.vision.pixel_ops": PLANS,
    "nano_patch.vision.recording": PLANS,
    "nano_patch.vision.tensor_tail": PLANS,
    "nano_patch.vision.steps": PLANS,
    "nano_patch.vision.policies": PLANS,
    "nano_patch.vision.augmix": PLANS,
    "nano_patch.vision.compose_plan": PLANS,
    "nano_patch.vision.compose_call": PLANS,
    "nano_patch.vision.draw_program": PLANS,
    "nano_patch.vision.oprunner": PLANS,
    "nano_patch.vision.batch_slots": PLANS,
    "nano_patch.vision.loading": BATCHES,
}
PACKAGES = {"nano_patch.vision.cache": IMAGES, "nano_patch.data": BATCHES, "nano_patch.train": TRAINING,
            "nano_patch.patches": PATCHES}

#: (module, what it imports) allowed across the rule for now, each with why; to be emptied, never grown.
KNOWN: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def layer_of(module: str) -> int | None:
    if module in LAYERS:
        return LAYERS[module]
    for package, layer in PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return layer
    return None


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
    assert sorted(m for m in LAYERS if m not in known) == []


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
    for folder in ("vision", "data", "train"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "config.py").write_text("")
    (tree / "data" / "collate.py").write_text("")
    (tree / "train" / "ranks.py").write_text("")
    (tree / "vision" / "compose_call.py").write_text(
        "def f():\n    from ..data import collate\n\n\ndef g():\n    import nano_patch.train.ranks\n")
    (tree / "vision" / "functional.py").write_text("import nano_patch\nfrom nano_patch import config\n")
    found = violations(tree)
    assert found == ["nano_patch.vision.compose_call (plans) imports nano_patch.data.collate (batches)",
                     "nano_patch.vision.compose_call (plans) imports nano_patch.train.ranks (training)",
                     "nano_patch.vision.functional (kernels) imports the package nano_patch itself"], found
