"""After unpatch_torch(), every public attribute is the very object it was before patching."""

from __future__ import annotations

import importlib
import types

import nano_patch

MODULES = [
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms._functional_pil",
    "torchvision.datasets",
    "torchvision.datasets.folder",
    "torch.utils.data",
    "pytorch_lightning",
    "lightning.pytorch",
]


def _snapshot() -> dict[tuple[str, str, str], object]:
    snap = {}
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue  # lightning.pytorch only when installed
        for attr in dir(mod):
            if attr.startswith("__"):
                continue
            value = getattr(mod, attr)
            snap[(name, attr, "")] = value
            if isinstance(value, types.FunctionType):
                snap[(name, attr, "__code__")] = value.__code__
                snap[(name, attr, "__dict__")] = dict(vars(value))
            if isinstance(value, type):
                for k, v in vars(value).items():
                    snap[(name, attr, k)] = v
    return snap


def test_unpatch_restores_every_attribute_by_identity():
    before = _snapshot()
    nano_patch.patch_torch()
    nano_patch.patch_torch()  # twice: idempotent
    patched = _snapshot()
    changed = [k for k in before if patched.get(k) is not before[k]]
    assert changed, "patch_torch() changed nothing in the snapshot"
    nano_patch.unpatch_torch()
    after = _snapshot()
    assert after.keys() == before.keys()
    differing = [k for k in before if after[k] is not before[k] and not (k[2] == "__dict__" and after[k] == before[k])]
    assert differing == []
    assert not nano_patch.is_patched()


def test_early_imports_and_subclasses_see_the_patch(photos):
    from torchvision.transforms import ColorJitter, Compose, Resize  # imported before patching

    class MyResize(Resize):
        pass

    pipe = Compose([MyResize(64), ColorJitter(0.3)])
    nano_patch.patch_torch()
    from PIL import Image
    from torchvision.transforms import _functional_pil as F_pil

    seen = []
    patched_resize = F_pil.resize

    def spy(img, *args, **kwargs):
        seen.append(type(img))
        return patched_resize(img, *args, **kwargs)

    F_pil.resize = spy
    try:
        out = pipe(photos[0])
    finally:
        F_pil.resize = patched_resize
    from nano_patch.vision.images.image import FastImage

    assert seen == [FastImage], "the early-imported Compose/subclass did not carry a FastImage"
    assert isinstance(out, Image.Image) and min(out.size) == 64
    assert isinstance(pipe.transforms[0], Resize)


def test_lazy_patching_imports_nothing_and_patches_on_import():
    import subprocess
    import sys

    code = (
        "import sys, nano_patch; nano_patch.patch_torch();"
        "heavy=[m for m in ('torch','torchvision','pytorch_lightning','cv2') if m in sys.modules];"
        "assert heavy == [], heavy;"
        "import pytorch_lightning as pl; from nano_patch.train.trainer_arguments import NANO_ARGS;"
        "import inspect; ps=inspect.signature(pl.Trainer.__init__).parameters;"
        "assert all(a in ps for a in NANO_ARGS), list(ps);"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
