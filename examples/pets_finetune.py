"""The pets-style fine-tune from the BigDL-Nano documentation, as a plain Lightning project.

A ResNet-18 LightningModule over an ImageFolder with the standard torchvision transforms. It never
imports nano_patch; run it stock, or under nano-patch:

    python examples/pets_finetune.py                       # stock
    nano-patch run --fast examples/pets_finetune.py        # patched, bf16 where the CPU has it, channels-last

Without a data folder it builds one of real photographs (``make_photo_folder.py``) in the user's
cache folder on first use, and says where. Give your own ImageFolder root (with ``train/`` and
``val/``) as the first argument.

With no internet, the ResNet starts from random weights (pass --pretrained where torchvision's
weights are cached).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class PetsClassifier(pl.LightningModule):
    def __init__(self, num_classes: int, pretrained: bool = False, lr: float = 1e-3):
        super().__init__()
        weights = torchvision.models.ResNet18_Weights.DEFAULT if pretrained else None
        self.model = torchvision.models.resnet18(weights=weights)
        self.model.fc = torch.nn.Linear(self.model.fc.in_features, num_classes)
        self.lr = lr
        self.samples = 0
        self.train_seconds = 0.0

    def forward(self, x):
        return self.model(x)

    # Throughput covers data loading and training steps, from the start of each epoch to its last
    # training batch; validation and the first (warm-up) epoch are left out.
    def on_train_epoch_start(self):
        self._t0 = self._last = time.perf_counter()
        self._epoch_samples = 0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._last = time.perf_counter()

    def on_train_epoch_end(self):
        if self.current_epoch > 0 or self.trainer.max_epochs == 1:
            self.train_seconds += self._last - self._t0
            self.samples += self._epoch_samples

    def training_step(self, batch, batch_idx):
        x, y = batch
        self._epoch_samples += len(y)
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        # Cosine decay to zero over the run: the last epochs settle, so the final accuracy is stable.
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)]


def loaders(root: str, size: int, batch: int, workers: int | None):
    train_tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                          T.ToTensor(), T.Normalize(MEAN, STD)])
    val_tf = T.Compose([T.Resize(int(size * 1.14)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    train = ImageFolder(f"{root}/train", transform=train_tf)
    val = ImageFolder(f"{root}/val", transform=val_tf)
    kw = {} if workers is None else {"num_workers": workers}
    return DataLoader(train, batch_size=batch, shuffle=True, **kw), DataLoader(val, batch_size=batch, **kw), train


def default_root() -> Path:
    """The real-photo folder in the user's cache folder, built on first use."""
    from make_photo_folder import build

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "nano-patch" / "pets-photos"
    done = root / ".complete"
    if not done.exists():
        print(f"building the real-photo folder in {root} (once)", flush=True)
        build(root)
        done.touch()
    print(f"data: {root}", flush=True)
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", help="ImageFolder root with train/ and val/; default: real photos, built "
                                            "in the cache folder on first use")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--pretrained", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    root = args.root or default_root()
    train_dl, val_dl, train = loaders(root, args.size, args.batch, args.workers)
    model = PetsClassifier(len(train.classes), args.pretrained)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    trainer.fit(model, train_dl, val_dl)
    if trainer.global_rank == 0:
        rate = model.samples * trainer.world_size / max(model.train_seconds, 1e-9)
        print(f"train samples/s (all ranks): {rate:.1f}  val_acc: {float(trainer.callback_metrics['val_acc']):.3f}")


if __name__ == "__main__":
    main()
