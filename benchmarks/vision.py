"""Vision benchmark: input pipelines end to end, stock against nano-patch and albumentations.

Each pipeline runs the way a training script runs it: ``ImageFolder`` over real photographs (JPEGs
of 300-500 px made from the photos that ship in scikit-learn and matplotlib, 3 classes of 40) and
``DataLoader(batch_size=16, num_workers=0, shuffle=True)``, for ``--epochs`` epochs; the figure is
the median images/s of the epochs after the first. Every (pipeline, side) runs in a fresh process
pinned to one core with one thread, and the sides of a pipeline are interleaved within each of
``--rounds`` rounds, so that drift on a shared machine hits them alike. Albumentations runs the
same operations on the same files (``cv2.imread``, its own transforms, ``ToTensorV2``).

Sides: ``stock`` and ``patched`` in this interpreter (its PIL), ``albumentations`` where it has the
ops, and with ``--simd-python`` the same two under an interpreter whose PIL is pillow-simd.
``--isa avx2`` narrows the native kernels (``NANO_PATCH_NATIVE_ISA``), to see an AVX2-only CPU's
path on an AVX-512 one. Results: ``benchmarks/results/vision[-STEM].json`` and ``.png``.

    python benchmarks/vision.py --simd-python /path/to/venv-with-pillow-simd/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: name -> what it runs (the README and docs quote these names)
PIPELINES = {
    "pets": "RandomResizedCrop(128), RandomHorizontalFlip(), ColorJitter(0.3, 0.3, 0.3), ToTensor(), Normalize()",
    "a": "Resize(256), ColorJitter(.4,.4,.4,.1), RandomCrop(224), RandomHorizontalFlip(), Resize(128), ToTensor()",
    "b": "RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize()",
    "c": "Resize(256), CenterCrop(224), ToTensor(), Normalize()",
    "d": "(b) with RandAugment() before ToTensor",
    "reference": "torchvision's reference recipe: RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor(), "
                 "ConvertImageDtype(float), Normalize()",
    "v2 b": "transforms.v2: RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor(), ToDtype(float32, "
            "scale=True), Normalize(), on PIL images",
    "v2 b, tensors first": "transforms.v2: PILToTensor(), RandomResizedCrop(224), RandomHorizontalFlip(), "
                           "ToDtype(float32, scale=True), Normalize()",
    "timm train": "timm.data.create_transform(224, is_training=True)",
    "timm train, RandAugment + RandomErasing": "timm.data.create_transform(224, is_training=True, "
                                               "auto_augment='rand-m9-mstd0.5', re_prob=0.25)",
    "timm eval": "timm.data.create_transform(224)",
    "reference TA": "torchvision's reference recipe behind its best weights: RandomResizedCrop(176), "
                    "RandomHorizontalFlip(), TrivialAugmentWide(BILINEAR), PILToTensor(), ConvertImageDtype(float), "
                    "Normalize(), RandomErasing(0.1)",
    "RA": "RandomResizedCrop(224), RandomHorizontalFlip(), RandAugment(BILINEAR), ToTensor(), Normalize()",
    "AA": "RandomResizedCrop(224), RandomHorizontalFlip(), AutoAugment(IMAGENET, BILINEAR), ToTensor(), Normalize()",
    "AugMix": "RandomResizedCrop(224), RandomHorizontalFlip(), AugMix(BILINEAR), ToTensor(), Normalize()",
    "warps": "RandomResizedCrop(224), RandomRotation(15, BILINEAR), "
             "RandomAffine(10, (.1, .1), (.9, 1.1), 5, BILINEAR), RandomPerspective(BILINEAR), ToTensor()",
}
ALBUMENTATIONS = ("pets", "a", "b", "c")


def torchvision_pipeline(name: str):
    import torch
    import torchvision.transforms as T

    norm = T.Normalize(MEAN, STD)
    if name == "pets":
        return T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                          T.ToTensor(), norm])
    if name == "a":
        return T.Compose([T.Resize(256), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomCrop(224),
                          T.RandomHorizontalFlip(), T.Resize(128), T.ToTensor()])
    if name == "b":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    if name == "c":
        return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    if name == "d":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.RandAugment(), T.ToTensor(), norm])
    if name == "reference":
        return T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(0.5), T.PILToTensor(),
                          T.ConvertImageDtype(torch.float), norm])
    bilinear = T.InterpolationMode.BILINEAR
    policy_tail = [T.ToTensor(), norm]
    if name == "reference TA":
        return T.Compose([T.RandomResizedCrop(176, antialias=True), T.RandomHorizontalFlip(0.5),
                          T.TrivialAugmentWide(interpolation=bilinear), T.PILToTensor(),
                          T.ConvertImageDtype(torch.float), norm, T.RandomErasing(p=0.1)])
    if name in ("RA", "AA", "AugMix"):
        policy = {"RA": lambda: T.RandAugment(interpolation=bilinear),
                  "AA": lambda: T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=bilinear),
                  "AugMix": lambda: T.AugMix(interpolation=bilinear)}[name]()
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), policy, *policy_tail])
    if name == "warps":
        return T.Compose([T.RandomResizedCrop(224), T.RandomRotation(15, interpolation=bilinear),
                          T.RandomAffine(10, (0.1, 0.1), (0.9, 1.1), 5, interpolation=bilinear),
                          T.RandomPerspective(interpolation=bilinear), T.ToTensor()])
    if name.startswith("v2"):
        import torchvision.transforms.v2 as v2

        tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        if name == "v2 b":
            return v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.PILToTensor(), *tail])
        return v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), *tail])
    if name.startswith("timm"):
        from timm.data import create_transform

        if name == "timm train":
            return create_transform(224, is_training=True)
        if name == "timm eval":
            return create_transform(224)
        return create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5", re_prob=0.25)
    raise KeyError(name)


def albumentations_pipeline(name: str):
    import albumentations as A
    from albumentations.pytorch import ToTensorV2

    if name == "pets":
        return A.Compose([A.RandomResizedCrop((128, 128)), A.HorizontalFlip(), A.ColorJitter(0.3, 0.3, 0.3, 0, p=1.0),
                          A.Normalize(MEAN, STD), ToTensorV2()])
    if name == "a":
        return A.Compose([A.SmallestMaxSize(256), A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), A.RandomCrop(224, 224),
                          A.HorizontalFlip(), A.SmallestMaxSize(128), A.ToFloat(max_value=255), ToTensorV2()])
    if name == "b":
        return A.Compose([A.RandomResizedCrop((224, 224)), A.HorizontalFlip(), A.Normalize(MEAN, STD), ToTensorV2()])
    if name == "c":
        return A.Compose([A.SmallestMaxSize(256), A.CenterCrop(224, 224), A.Normalize(MEAN, STD), ToTensorV2()])
    raise KeyError(name)


def worker(side: str, name: str, root: str, epochs: int) -> dict:
    """One (pipeline, side) in this fresh process: images/s of each epoch through the DataLoader."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    if side == "patched":
        import nano_patch

        nano_patch.patch_torch()
    from torch.utils.data import DataLoader, Dataset
    from torchvision.datasets import ImageFolder

    if side == "albumentations":
        tf = albumentations_pipeline(name)

        class Folder(Dataset):
            def __init__(self) -> None:
                self.samples = ImageFolder(root).samples

            def __len__(self) -> int:
                return len(self.samples)

            def __getitem__(self, i: int):
                path, target = self.samples[i]
                return tf(image=cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB))["image"], target

        dataset: Dataset = Folder()
    else:
        dataset = ImageFolder(root, transform=torchvision_pipeline(name))
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=0)
    torch.manual_seed(0)
    rates = []
    for _ in range(epochs):
        n, start = 0, time.perf_counter()
        for _, y in loader:
            n += len(y)
        rates.append(n / (time.perf_counter() - start))
    return {"rates": rates, "images_per_s": statistics.median(rates[1:] or rates)}


def run_side(python: str, side: str, name: str, root: str, epochs: int, isa: str | None) -> float:
    env = dict(os.environ)
    if isa:
        env["NANO_PATCH_NATIVE_ISA"] = isa
    out = subprocess.run([python, __file__, "--worker", side, name, root, str(epochs)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def measure(names: list[str], root: str, rounds: int, epochs: int, simd_python: str | None,
            isa: str | None) -> dict:
    """Every round runs every (pipeline, side) once, sides interleaved; medians over rounds."""
    sides: list[tuple[str, str, str]] = [("stock", sys.executable, "stock"), ("patched", sys.executable, "patched")]
    if simd_python:
        sides += [("stock+simd", simd_python, "stock"), ("patched+simd", simd_python, "patched")]
    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(rounds):
        got: dict[str, dict[str, float]] = {}
        for name in names:
            got[name] = {}
            todo = list(sides) + ([("albumentations", sys.executable, "albumentations")]
                                  if name in ALBUMENTATIONS else [])
            for label, python, side in (todo if r % 2 == 0 else todo[::-1]):
                got[name][label] = run_side(python, side, name, root, epochs, isa)
            print(f"round {r}: {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in got[name].items()), flush=True)
        per_round.append(got)
    medians = {name: {label: statistics.median(rd[name][label] for rd in per_round) for label in per_round[0][name]}
               for name in names}
    return {"medians": medians, "per_round": per_round}


def decode_only(root: str) -> float:
    """images/s of libjpeg-turbo (simplejpeg) alone on the same files, one core: the floor of every row."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import simplejpeg
    from torchvision.datasets import ImageFolder

    files = [p for p, _ in ImageFolder(root).samples]
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for f in files:
            simplejpeg.decode_jpeg(Path(f).read_bytes(), colorspace="RGB")
        rates.append(len(files) / (time.perf_counter() - start))
    return statistics.median(rates)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{cpu_name()} ({isa}), {os.cpu_count()} CPUs, Python {platform.python_version()}"


def table(result: dict) -> str:
    med = result["medians"]
    cols = ["stock", "patched", "stock+simd", "patched+simd", "albumentations"]
    cols = [c for c in cols if any(c in v for v in med.values())]
    lines = ["| pipeline | " + " | ".join(cols) + " | patched / stock | patched / albumentations |",
             "|---|" + "---|" * (len(cols) + 2)]
    for name, v in med.items():
        cells = [f"{v[c]:.0f}" if c in v else "-" for c in cols]
        vs_alb = f"{v['patched'] / v['albumentations']:.2f}x" if "albumentations" in v else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {v['patched'] / v['stock']:.2f}x | {vs_alb} |")
    lines.append(f"\ndecode only (simplejpeg): {result['decode_only']:.0f} images/s; {result['machine']}")
    return "\n".join(lines)


def grouped_bars(ax, groups: list, series: list, value) -> list[float]:
    """One bar per (group, series), the series side by side in each group; ``value(group, series)`` is a
    bar's height. Returns the x position of each group's centre, for its tick."""
    width = 0.8 / len(series)
    for i, c in enumerate(series):
        ax.bar([x + i * width for x in range(len(groups))], [value(g, c) for g in groups], width, label=c)
    return [x + 0.4 - width / 2 for x in range(len(groups))]


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["medians"]
    names = list(med)
    cols = [c for c in ("stock", "patched", "stock+simd", "patched+simd", "albumentations")
            if any(c in v for v in med.values())]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ticks = grouped_bars(ax, names, cols, lambda n, c: med[n].get(c, 0))
    ax.axhline(result["decode_only"], color="k", ls="--", lw=1, label="decode only")
    ax.set_xticks(ticks,
                  [n.replace(", ", ",\n").replace(" + ", "\n+ ") for n in names], fontsize=7)
    ax.set_ylabel("images / s, one core, through the DataLoader")
    ax.set_title(f"torchvision pipelines from JPEG file to batch\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simd-python", help="an interpreter whose PIL is pillow-simd (same torch/torchvision)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--only", nargs="*", choices=list(PIPELINES), help="pipelines to run (default: all)")
    ap.add_argument("--isa", choices=["generic", "avx2", "avx512"], help="narrow the native kernels")
    ap.add_argument("--stem", default="vision")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        side, name, root, epochs = args.worker
        print(json.dumps(worker(side, name, root, int(epochs))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from make_photo_folder import build

    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), per_class=40)
        root = str(Path(tmp) / "train")
        result = {"machine": machine(), "rounds": args.rounds, "epochs": args.epochs, "isa": args.isa,
                  "pipelines": {n: PIPELINES[n] for n in (args.only or PIPELINES)},
                  "decode_only": decode_only(root)}
        result.update(measure(list(args.only or PIPELINES), root, args.rounds, args.epochs, args.simd_python,
                              args.isa))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print(table(result))


if __name__ == "__main__":
    main()
