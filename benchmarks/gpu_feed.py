"""Feeding the GPU: an ordinary Lightning script, stock against patched, and what caps it.

The script: ImageFolder over real-photo JPEGs (``examples/make_photo_folder.py``), RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize; a torchvision ResNet in channels-last (the model converted, the batch
made channels-last in ``training_step``, as such scripts do); ``precision="bf16-mixed"``; batch 128;
``pin_memory=True``; ``shuffle=True``. Every configuration runs in a fresh process:

- ``stock`` and ``patched`` (``nano_patch.patch_torch()`` before anything else: under it the loader's workers
  send uint8 and the Trainer defers the tensor tail to the GPU), ``num_workers`` 0, 8 and 15 (capped at the
  usable cores);
- ``zeros``: stock, the most workers, a dataset that returns a float32 zero image per sample (the host's float
  path with no image work at all);
- ``bound``: no loader work at all, one batch resident on the GPU (the step alone: the data-free bound).

Samples/s is over the epochs after the first (the first starts workers and warms the page cache and cuDNN);
the share of time waiting is the time from the end of one training batch to the start of the next (the fetch, the
transfer and, patched, the tail) over the measured epochs' wall time. Without CUDA it runs the CPU part alone:
loader images/s and the bytes per batch through the worker queue and the pinned copy, tail deferred against not
(``--pipeline pets`` adds ColorJitter and crops to 128, the 2-core VM's target).

    python benchmarks/gpu_feed.py [--images 2400] [--epochs 3] [--models resnet18,resnet50] [--workers 0,8,15]
    python benchmarks/gpu_feed.py --cpu [--pipeline b|pets] [--workers 2]   # the CPU part (the default without CUDA)

Results: ``benchmarks/results/gpu_feed.{json,png}`` (GPU) or ``gpu_feed-cpu[-pets].{json,png}`` (CPU part).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"

GPU_CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
if cfg["mode"] == "patched":
    import nano_patch
    nano_patch.patch_torch()
import torch, torchvision
import lightning.pytorch as L
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader, Dataset

torch.backends.cudnn.benchmark = True
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
folder = ImageFolder(cfg["root"], transform=tf)


class Zeros(Dataset):
    def __len__(self):
        return len(folder)

    def __getitem__(self, i):
        return torch.zeros(3, 224, 224), 0


class Indices(Dataset):
    def __len__(self):
        return len(folder)

    def __getitem__(self, i):
        return i


deferred = [0]
if cfg["mode"] == "patched":
    from nano_patch.data.tail import finish_tail
    real_to = finish_tail.DeferredImages.to

    def counted_to(self, *a, **k):
        deferred[0] += 1
        return real_to(self, *a, **k)

    finish_tail.DeferredImages.to = counted_to


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = getattr(torchvision.models, cfg["model"])(num_classes=max(2, len(folder.classes)))
        self.net = self.net.to(memory_format=torch.channels_last)
        self.fixed = None

    def training_step(self, batch, batch_idx):
        if cfg["mode"] == "bound":
            if self.fixed is None:
                g = torch.Generator().manual_seed(0)
                self.fixed = (torch.randn(cfg["batch"], 3, 224, 224, generator=g).to(self.device),
                              torch.zeros(cfg["batch"], dtype=torch.long, device=self.device))
            x, y = self.fixed
        else:
            x, y = batch
        x = x.contiguous(memory_format=torch.channels_last)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class Clock(L.Callback):
    def __init__(self):
        self.wall = self.wait = self.stepping = 0.0
        self.samples = 0
        self.last_end = None

    def on_train_epoch_start(self, trainer, pl_module):
        torch.cuda.synchronize()
        self.epoch_start = self.last_end = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch_start = time.perf_counter()
        if trainer.current_epoch >= 1:
            self.wait += self.batch_start - self.last_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.last_end = time.perf_counter()
        if trainer.current_epoch >= 1:
            self.samples += cfg["batch"]
            self.stepping += self.last_end - self.batch_start  # (the step's own time, launches included)

    def on_train_epoch_end(self, trainer, pl_module):
        torch.cuda.synchronize()
        if trainer.current_epoch >= 1:
            self.wall += time.perf_counter() - self.epoch_start


dataset = {"zeros": Zeros(), "bound": Indices()}.get(cfg["mode"], folder)
workers = 0 if cfg["mode"] == "bound" else cfg["workers"]
loader = DataLoader(dataset, batch_size=cfg["batch"], shuffle=True, num_workers=workers, pin_memory=True,
                    drop_last=True)
clock = Clock()
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=cfg["epochs"], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[clock])
torch.manual_seed(0)
trainer.fit(Net(), loader)
print(json.dumps({"samples_per_s": clock.samples / clock.wall, "waiting": clock.wait / clock.wall,
                  "step_ms": 1000 * clock.stepping * cfg["batch"] / max(1, clock.samples),
                  "deferred_batches": deferred[0], "num_workers": workers}))
"""

CPU_CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
if cfg["mode"] != "stock":
    import nano_patch
    nano_patch.patch_torch()
    if cfg["mode"] == "patched, tail deferred":
        # what a patched Lightning loop on CUDA gets: the loader hands over uint8 batches (the rule is tested in
        # tests/test_device_tail.py); here nothing consumes them but the loop, as the GPU would finish them
        from nano_patch.train import tail_deferral
        tail_deferral.why_not = lambda loader: None
import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
if cfg["pipeline"] == "pets":
    tf = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
else:
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
loader = DataLoader(ImageFolder(cfg["root"], transform=tf), batch_size=cfg["batch"], shuffle=True,
                    num_workers=cfg["workers"], persistent_workers=cfg["workers"] > 0)
torch.manual_seed(0)


def one_pass():
    n = batches = queue = host = device = 0
    it = iter(loader)
    for x, y in it:
        n += len(y)
        batches += 1
        images = getattr(x, "images", x)  # a DeferredImages carries its uint8 images
        crossed = getattr(it, "last_image_bytes", 0) or images.nbytes  # what a worker put in shared memory
        queue += crossed
        # with pin_memory=True the pin thread copies the batch as it crossed; today's patched loader then writes
        # the float batch in the main process too; deferred, the float batch is made on the device instead
        host += crossed + (images.nbytes if images.nbytes != crossed else 0)
        device += images.nbytes
    return n, queue / batches, host / batches, device / batches


one_pass()
t = time.perf_counter()
n = 0
for _ in range(cfg["passes"]):
    k, queue, host, device = one_pass()
    n += k
print(json.dumps({"images_per_s": n / (time.perf_counter() - t), "queue_bytes_per_batch": queue,
                  "host_bytes_per_batch": host, "to_device_bytes_per_batch": device}))
"""


def _child(code: str, cfg: dict, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True, env=env,
                          check=False, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _machine() -> str:
    sys.path.insert(0, str(Path(__file__).parent))
    from train import _cpu_name  # benchmarks/train.py, beside this script

    name = f"{_cpu_name()}, {len(os.sched_getaffinity(0))} cores"
    try:
        import torch

        if torch.cuda.is_available():
            name += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return name


def _photos(tmp: str, images: int) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_photo_folder import build, sources

    return build(Path(tmp) / "photos", max(8, images // max(1, len(sources())))) / "train"


def gpu(args: argparse.Namespace) -> dict:
    cores = len(os.sched_getaffinity(0))
    workers = sorted({min(int(w), cores) for w in args.workers.split(",")})
    result: dict = {"machine": _machine(), "python": platform.python_version(), "batch": args.batch,
                    "epochs": args.epochs, "images": args.images, "workers": workers, "rows": {}}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = _photos(tmp, args.images)
        for model in args.models.split(","):
            configs = [("bound", 0), ("zeros", max(workers))]
            configs += [(mode, w) for w in workers for mode in ("stock", "patched")]
            for mode, w in configs:
                cfg = {"mode": mode, "workers": w, "model": model, "root": str(root), "batch": args.batch,
                       "epochs": args.epochs}
                row = _child(GPU_CHILD, cfg, timeout=600)
                result["rows"][f"{model} | {mode} | {w} workers"] = row
                print(f"{model:9s} {mode:8s} {w:2d} workers: {row['samples_per_s']:7.0f} samples/s, "
                      f"waiting {row['waiting']:.0%}, deferred batches {row['deferred_batches']} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    return result


def cpu(args: argparse.Namespace) -> dict:
    workers = [int(w) for w in args.workers.split(",")]
    modes = ["stock", "patched, tail on the CPU", "patched, tail deferred"]
    result: dict = {"machine": _machine(), "python": platform.python_version(), "pipeline": args.pipeline,
                    "batch": args.batch, "workers": workers, "modes": modes, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = _photos(tmp, args.images)
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeat):  # interleaved: drift and other load hit every configuration alike
            for w in workers:
                for mode in modes:
                    cfg = {"mode": mode, "workers": w, "root": str(root), "batch": args.batch,
                           "pipeline": args.pipeline, "passes": args.passes}
                    runs.setdefault(f"{mode} | {w} workers", []).append(_child(CPU_CHILD, cfg, timeout=900))
        for name, rs in runs.items():
            rates = sorted(r["images_per_s"] for r in rs)
            result["rows"][name] = {**rs[0], "images_per_s": rates[len(rates) // 2], "all": rates}
    return result


def chart_gpu(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({k.split(" | ")[0] for k in result["rows"]}, key=lambda m: list(result["rows"]).index(
        next(k for k in result["rows"] if k.startswith(m))))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = {k.split(" | ", 1)[1]: v for k, v in result["rows"].items() if k.startswith(f"{model} |")}
        names = list(rows)
        vals = [rows[n]["samples_per_s"] for n in names]
        bars = ax.bar(range(len(names)), vals, color=["0.3" if n.startswith(("bound", "zeros")) else
                                                      "tab:blue" if n.startswith("stock") else "tab:orange"
                                                      for n in names])
        for b, n in zip(bars, names):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{rows[n]['waiting']:.0%}\nwaiting",
                    ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(names)), [n.replace(" | ", "\n") for n in names], fontsize=7)
        ax.set_ylabel("samples / s (epochs after the first)")
        ax.set_title(f"{model}, bf16-mixed, channels-last, batch {result['batch']}", fontsize=9)
    fig.suptitle(f"Lightning fit on ImageFolder JPEGs: stock vs patched\n{result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def chart_cpu(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    modes, workers = result["modes"], result["workers"]
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [x + i * width for x in range(len(workers))]
        ax1.bar(xs, [result["rows"][f"{mode} | {w} workers"]["images_per_s"] for w in workers], width, label=mode)
        ax2.bar(xs, [result["rows"][f"{mode} | {w} workers"]["host_bytes_per_batch"] / 2**20 for w in workers],
                width, label=mode)
    for ax in (ax1, ax2):
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workers))], [f"{w} workers" for w in workers])
        ax.legend(fontsize=7)
    ax1.set_ylabel("loader images / s (median)")
    ax2.set_ylabel("MiB per batch written on the host")
    fig.suptitle(f"Pipeline {result['pipeline']}, batch {result['batch']}: the tensor tail on the CPU or deferred\n"
                 f"{result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU part only (the default without CUDA)")
    ap.add_argument("--images", type=int, default=2400, help="JPEGs in the folder (default 2400)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per GPU run; the first is not measured")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--workers", default=None, help="comma-separated num_workers (GPU: 0,8,15; CPU: 2)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (GPU: 128; CPU: 64)")
    ap.add_argument("--pipeline", choices=["b", "pets"], default="pets", help="CPU part: the pipeline")
    ap.add_argument("--passes", type=int, default=2, help="CPU part: measured passes per run")
    ap.add_argument("--repeat", type=int, default=3, help="CPU part: interleaved runs per configuration")
    args = ap.parse_args()
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    RESULTS.mkdir(exist_ok=True)
    if has_cuda and not args.cpu:
        args.workers = args.workers or "0,8,15"
        args.batch = args.batch or 128
        result = gpu(args)
        (RESULTS / "gpu_feed.json").write_text(json.dumps(result, indent=2))
        chart_gpu(result, RESULTS / "gpu_feed.png")
        print("| model | loader | workers | samples/s | waiting | x stock |")
        print("|---|---|---|---|---|---|")
        for key, row in result["rows"].items():
            model, mode, w = key.split(" | ")
            stock = result["rows"].get(f"{model} | stock | {w}")
            ratio = f"{row['samples_per_s'] / stock['samples_per_s']:.2f}x" if stock else ""
            print(f"| {model} | {mode} | {w.split()[0]} | {row['samples_per_s']:.0f} | {row['waiting']:.0%} | "
                  f"{ratio} |")
        return
    args.workers = args.workers or "2"
    args.batch = args.batch or 64
    args.images = args.images if args.images != 2400 else 288
    result = cpu(args)
    stem = "gpu_feed-cpu" + ("-pets" if args.pipeline == "pets" else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart_cpu(result, RESULTS / f"{stem}.png")
    print("| loader | workers | images/s | x today's patched | queue bytes/batch | host bytes/batch | "
          "bytes to the device/batch |")
    print("|---|---|---|---|---|---|---|")
    for key, row in result["rows"].items():
        mode, w = key.split(" | ")
        today = result["rows"][f"patched, tail on the CPU | {w}"]["images_per_s"]
        print(f"| {mode} | {w.split()[0]} | {row['images_per_s']:.0f} | {row['images_per_s'] / today:.2f}x | "
              f"{row['queue_bytes_per_batch']:,.0f} | {row['host_bytes_per_batch']:,.0f} | "
              f"{row['to_device_bytes_per_batch']:,.0f} |")


if __name__ == "__main__":
    main()
