"""Vision benchmark: torchvision input pipelines, stock against nano-patch, on one core.

Real photographs that ship in scikit-learn and matplotlib are re-encoded as JPEG at pet-dataset
sizes (longer side 300-500 px) and at 12 MP. Each pipeline runs from the JPEG file to the final
tensor, as a dataset's ``__getitem__`` does, on one pinned core with one thread.

Columns: stock torchvision, patched (this interpreter's PIL), and the same two under a second
interpreter with pillow-simd (``--simd-python``), albumentations 2.0.8 on the same ops, and a
decode-only bound (simplejpeg). ``--repeats`` rounds, each timing every column once (stock and
patched interleaved); medians over the rounds. Results go to ``benchmarks/results/vision.json``
and ``vision.png``.

    python benchmarks/vision.py --simd-python /path/to/venv-with-pillow-simd/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
PIPELINES = {
    "a": "Resize(256), ColorJitter(.4,.4,.4,.1), RandomCrop(224), RandomHorizontalFlip(), Resize(128), ToTensor()",
    "b": "RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize()",
    "c": "Resize(256), CenterCrop(224), ToTensor(), Normalize()",
    "d": "RandomResizedCrop(224), RandomHorizontalFlip(), RandAugment(), ToTensor(), Normalize()",
    "v2 b": "transforms.v2: RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor(), ToDtype(float32, "
            "scale=True), Normalize(), on PIL images",
    "v2 b, tensors first": "transforms.v2: PILToTensor(), RandomResizedCrop(224), RandomHorizontalFlip(), "
                           "ToDtype(float32, scale=True), Normalize()",
}


def make_photos(folder: Path) -> dict[str, list[str]]:
    """Pet-size JPEGs (300-500 px) and 12 MP JPEGs from the bundled photos."""
    import matplotlib
    import sklearn
    from PIL import Image

    sources = [
        Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg",
        Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg",
        Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
    ]
    pets, big = [], []
    for src in sources:
        im = Image.open(src).convert("RGB")
        for side in (500, 440, 380, 320):
            small = im.copy()
            small.thumbnail((side, side), Image.LANCZOS)
            p = folder / f"{src.stem}_{side}.jpg"
            small.save(p, quality=90)
            pets.append(str(p))
        # 12 MP: 4000x3000 (or 3000x4000), upsampled; real content, though softer than a camera's.
        size = (4000, 3000) if im.width >= im.height else (3000, 4000)
        p = folder / f"{src.stem}_12mp.jpg"
        im.resize(size, Image.BICUBIC).save(p, quality=92)
        big.append(str(p))
    return {"pet": pets, "12mp": big}


def torchvision_pipelines():
    import torchvision.transforms as T

    norm = T.Normalize(MEAN, STD)
    return {
        "a": T.Compose([T.Resize(256), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomCrop(224),
                        T.RandomHorizontalFlip(), T.Resize(128), T.ToTensor()]),
        "b": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm]),
        "c": T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm]),
        "d": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.RandAugment(), T.ToTensor(), norm]),
        **v2_pipelines(),
    }


def v2_pipelines():
    import torch
    import torchvision.transforms.v2 as v2

    to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return {
        "v2 b": v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.PILToTensor(), *to_float]),
        "v2 b, tensors first": v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
                                           *to_float]),
    }


def albumentations_pipelines():
    import albumentations as A
    from albumentations.pytorch import ToTensorV2

    return {
        "a": A.Compose([A.SmallestMaxSize(256), A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), A.RandomCrop(224, 224),
                        A.HorizontalFlip(), A.SmallestMaxSize(128), A.ToFloat(max_value=255), ToTensorV2()]),
        "b": A.Compose([A.RandomResizedCrop((224, 224)), A.HorizontalFlip(), A.Normalize(MEAN, STD), ToTensorV2()]),
        "c": A.Compose([A.SmallestMaxSize(256), A.CenterCrop(224, 224), A.Normalize(MEAN, STD), ToTensorV2()]),
    }


def rate(fn, files: list[str], seconds: float, repeats: int) -> float:
    """Median images/s over ``repeats`` passes of at least ``seconds`` each."""
    for f in files[:4]:
        fn(f)  # warm up: imports, thread pools, caches
    rates = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for f in files:
                fn(f)
            n += len(files)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def measure(files: dict[str, list[str]], seconds: float, repeats: int, with_albumentations: bool) -> dict:
    """Everything that runs in one interpreter: stock, patched, (albumentations), decode bound.

    ``repeats`` rounds, each timing every column once, so that drift on a shared machine hits stock
    and patched alike; each figure is the median over the rounds, and every round is kept.
    """
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import cv2
    import simplejpeg
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    from torchvision.datasets.folder import default_loader

    import nano_patch
    from nano_patch import sysinfo
    from nano_patch.vision import loading

    pipes = torchvision_pipelines()
    album = albumentations_pipelines() if with_albumentations else {}

    def album_call(f, p):
        img = cv2.cvtColor(cv2.imread(f), cv2.COLOR_BGR2RGB)
        return p(image=img)["image"]

    rounds: list[dict[tuple[str, str, str], float]] = []
    for _ in range(repeats):
        got: dict[tuple[str, str, str], float] = {}
        for name, pipe in pipes.items():
            torch.manual_seed(0)
            got["pet", name, "stock"] = rate(lambda f, p=pipe: p(default_loader(f)), files["pet"], seconds, 1)
        got["12mp", "c", "stock"] = rate(lambda f: pipes["c"](default_loader(f)), files["12mp"], seconds, 1)
        nano_patch.patch_torch()
        for name, pipe in pipes.items():
            got["pet", name, "patched"] = rate(lambda f, p=pipe: loading.load_transformed(f, p), files["pet"],
                                               seconds, 1)
        got["12mp", "c", "patched"] = rate(lambda f: loading.load_transformed(f, pipes["c"]), files["12mp"],
                                           seconds, 1)
        nano_patch.patch_torch(scaled_decode=True)
        got["12mp", "c", "patched_scaled_decode"] = rate(lambda f: loading.load_transformed(f, pipes["c"]),
                                                         files["12mp"], seconds, 1)
        nano_patch.unpatch_torch()
        for name, pipe in album.items():
            got["pet", name, "albumentations"] = rate(lambda f, p=pipe: album_call(f, p), files["pet"], seconds, 1)
        got["decode", "", ""] = rate(lambda f: simplejpeg.decode_jpeg(Path(f).read_bytes(), colorspace="RGB"),
                                     files["pet"], seconds, 1)
        rounds.append(got)

    out = summarise([{"/".join(k).strip("/"): v for k, v in r.items()} for r in rounds])
    out["pil"] = "{} {}".format(*sysinfo.pillow_distribution())
    if with_albumentations:
        import albumentations

        out["albumentations"] = albumentations.__version__
    return out


def summarise(rounds: list[dict[str, float]]) -> dict:
    """Medians over rounds of ``{"pet/a/stock": images_per_s, ..., "decode": ...}``, every round kept."""
    out: dict = {"pet": {}, "12mp": {}, "rounds": rounds}
    for key in rounds[0]:
        value = statistics.median(r[key] for r in rounds)
        if key == "decode":
            out["pet_decode_only"] = value
        else:
            size, name, column = key.split("/")
            out[size].setdefault(name, {})[column] = value
    return out


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plain, simd = result["plain"], result.get("simd")
    cols = [("stock, Pillow", plain, "stock"), ("patched, Pillow", plain, "patched")]
    if simd:
        cols += [("stock, pillow-simd", simd, "stock"), ("patched, pillow-simd", simd, "patched")]
    cols.append(("albumentations", plain, "albumentations"))
    names = list(PIPELINES)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(cols)
    for i, (label, res, key) in enumerate(cols):
        vals = [res["pet"][n].get(key, 0) for n in names]
        ax.bar([x + i * width for x in range(len(names))], vals, width, label=label)
    ax.axhline(plain["pet_decode_only"], color="k", ls="--", lw=1, label="decode only (simplejpeg)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))],
                  [n.replace(", ", "\n") if n.startswith("v2") else f"({n})" for n in names])
    ax.set_ylabel("images / s, one core")
    ax.set_title(f"torchvision pipelines from JPEG, 300-500 px photos\n{result['machine']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simd-python", help="an interpreter whose PIL is pillow-simd (same torch/torchvision)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        files = json.loads(Path(args.worker).read_text())
        print(json.dumps(measure(files, args.seconds, args.repeats, with_albumentations=False)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        files = make_photos(Path(tmp))
        result = {"machine": f"{platform.processor() or platform.machine()}, {_cpu_name()}, {os.cpu_count()} CPUs",
                  "python": platform.python_version(), "seconds": args.seconds, "repeats": args.repeats}
        spec = Path(tmp) / "files.json"
        spec.write_text(json.dumps(files))
        plain: list[dict] = []
        simd: list[dict] = []
        for _ in range(args.repeats):  # plain Pillow and pillow-simd rounds alternate, so drift hits both
            plain.append(measure(files, args.seconds, 1, with_albumentations=True))
            if args.simd_python:
                proc = subprocess.run([args.simd_python, __file__, "--worker", str(spec), "--seconds",
                                       str(args.seconds), "--repeats", "1"], capture_output=True, text=True, check=True)
                simd.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        result["plain"] = {**plain[0], **summarise([r for p in plain for r in p["rounds"]])}
        if simd:
            result["simd"] = {**simd[0], **summarise([r for p in simd for r in p["rounds"]])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vision.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / "vision.png")
    print(table(result))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def table(result: dict) -> str:
    plain, simd = result["plain"], result.get("simd") or {}
    lines = [
        "| pipeline | stock, Pillow | patched, Pillow | stock, pillow-simd | patched, pillow-simd | albumentations "
        "| patched+simd / stock+Pillow | patched+simd / stock+simd |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in PIPELINES:
        p = plain["pet"][n]
        s = simd.get("pet", {}).get(n, {})
        best = s.get("patched", p["patched"])
        label = n if n.startswith("v2") else f"({n})"
        lines.append(
            f"| {label} | {p['stock']:.0f} | {p['patched']:.0f} ({p['patched'] / p['stock']:.2f}x) | "
            f"{s.get('stock', float('nan')):.0f} | {s.get('patched', float('nan')):.0f} | "
            f"{p.get('albumentations', float('nan')):.0f} | {best / p['stock']:.2f}x | "
            f"{best / s.get('stock', float('nan')):.2f}x |"
        )
    big = plain["12mp"]["c"]
    scaled = big["patched_scaled_decode"]
    lines.append(f"\n12 MP, pipeline (c): stock {big['stock']:.1f}/s, patched {big['patched']:.1f}/s "
                 f"({big['patched'] / big['stock']:.2f}x), patched + scaled_decode {scaled:.1f}/s "
                 f"({scaled / big['stock']:.2f}x)")
    if simd:
        b = simd["12mp"]["c"]
        lines.append(f"12 MP with pillow-simd: stock {b['stock']:.1f}/s, patched {b['patched']:.1f}/s "
                     f"({b['patched'] / big['stock']:.2f}x over stock+Pillow), scaled_decode "
                     f"{b['patched_scaled_decode']:.1f}/s ({b['patched_scaled_decode'] / big['stock']:.2f}x)")
    lines.append(f"decode only (simplejpeg): {plain['pet_decode_only']:.0f} images/s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
