"""``torch.jit.script`` of every v1 transform (torchvision documents scripting them), patched against stock.

TorchScript compiles a function from its source; the patch redirects some of torchvision's functions in place
(``registry.AttributeRecord.redirect``), and a function whose source TorchScript cannot read fails to script. Each
side runs in a fresh process (TorchScript keeps what it compiled for a class: a second side in the same process
would reuse the first's), scripts each transform on its own and an ``nn.Sequential`` of several, and runs the
scripted module on a tensor from a fixed seed: whether it scripts, the error where it does not, and the outputs,
must be stock's.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")  # (torch 2.14 deprecates jit.script: the same warning on both sides)
if sys.argv[1] == "patched":
    import nano_patch
    nano_patch.patch_torch()
import torch
import torchvision.transforms as T

MAKE = {
    "AugMix": lambda: T.AugMix(), "AutoAugment": lambda: T.AutoAugment(), "CenterCrop": lambda: T.CenterCrop(20),
    "ColorJitter": lambda: T.ColorJitter(0.3, 0.3, 0.3, 0.1), "ConvertImageDtype": lambda: T.ConvertImageDtype(
        torch.float64), "ElasticTransform": lambda: T.ElasticTransform(), "FiveCrop": lambda: T.FiveCrop(12),
    "GaussianBlur": lambda: T.GaussianBlur(5, 2.0), "Grayscale": lambda: T.Grayscale(3),
    "LinearTransformation": lambda: T.LinearTransformation(torch.eye(3 * 24 * 24), torch.zeros(3 * 24 * 24)),
    "Normalize": lambda: T.Normalize([0.5, 0.4, 0.3], [0.2, 0.2, 0.2]), "Pad": lambda: T.Pad(3),
    "RandAugment": lambda: T.RandAugment(), "RandomAdjustSharpness": lambda: T.RandomAdjustSharpness(2.0),
    "RandomAffine": lambda: T.RandomAffine(20, (0.1, 0.1)), "RandomApply": lambda: T.RandomApply(
        torch.nn.ModuleList([T.ColorJitter(0.2)])), "RandomAutocontrast": lambda: T.RandomAutocontrast(),
    "RandomCrop": lambda: T.RandomCrop(16, padding=2), "RandomEqualize": lambda: T.RandomEqualize(),
    "RandomErasing": lambda: T.RandomErasing(), "RandomGrayscale": lambda: T.RandomGrayscale(),
    "RandomHorizontalFlip": lambda: T.RandomHorizontalFlip(), "RandomInvert": lambda: T.RandomInvert(),
    "RandomPerspective": lambda: T.RandomPerspective(), "RandomPosterize": lambda: T.RandomPosterize(4),
    "RandomResizedCrop": lambda: T.RandomResizedCrop(18), "RandomRotation": lambda: T.RandomRotation(30),
    "RandomSolarize": lambda: T.RandomSolarize(0.5), "RandomVerticalFlip": lambda: T.RandomVerticalFlip(),
    "Resize": lambda: T.Resize(20), "TenCrop": lambda: T.TenCrop(12),
    "TrivialAugmentWide": lambda: T.TrivialAugmentWide(),
    "Sequential": lambda: torch.nn.Sequential(T.RandomResizedCrop(20), T.RandomHorizontalFlip(), T.GaussianBlur(3),
                                              T.ColorJitter(0.2, 0.2), T.Normalize([0.5] * 3, [0.2] * 3)),
}
out = {}
for name, make in MAKE.items():
    try:
        scripted = torch.jit.script(make())
    except Exception as exc:
        out[name] = ["raised", type(exc).__name__, str(exc).splitlines()[0][:200]]
        continue
    torch.manual_seed(0)
    x = torch.rand(3, 24, 24) if name not in ("RandomPosterize", "RandomEqualize", "AugMix", "AutoAugment",
                                               "RandAugment", "TrivialAugmentWide") else \
        (torch.rand(3, 24, 24) * 255).to(torch.uint8)
    try:
        y = scripted(x)
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        out[name] = ["ok", [t.double().sum().item() for t in ys], torch.get_rng_state().sum().item()]
    except Exception as exc:
        out[name] = ["ran, raised", type(exc).__name__]
print(json.dumps(out))
"""


def _side(side: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, side], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_v1_transform_scripts_as_stock():
    stock, patched = _side("stock"), _side("patched")
    assert stock.keys() == patched.keys()
    assert sum(v[0] == "ok" for v in stock.values()) >= 20  # (most of them script on stock: the test means something)
    differ = {name: (stock[name], patched[name]) for name in stock if stock[name] != patched[name]}
    assert not differ, differ
