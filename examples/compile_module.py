"""A plain ``nn.Module`` trained with Lightning through ``Trainer.compile``, on scikit-learn's digits.

    python examples/compile_module.py           # patched: Trainer.compile + bf16 + channels-last
    python examples/compile_module.py --stock   # stock Lightning, with a hand-written LightningModule

``Trainer.compile(model, loss, optimizer, metrics=...)`` builds the LightningModule the stock run
writes by hand below.
"""

import argparse
import time

import pytorch_lightning as pl
import torch
import torchmetrics
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def loaders():
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    train = DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=32, shuffle=True)
    return train, DataLoader(TensorDataset(x[1400:], y[1400:]), batch_size=128)


class HandWritten(pl.LightningModule):
    """What a stock user writes by hand."""

    def __init__(self, model, optimizer):
        super().__init__()
        self.model, self.optimizer = model, optimizer
        self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.acc(self.model(x), y)
        self.log("val/accuracy", self.acc)

    def configure_optimizers(self):
        return self.optimizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stock", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    kwargs = dict(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    if args.stock:
        module = HandWritten(model, optimizer)
        trainer = pl.Trainer(**kwargs)
    else:
        from nano_patch import patch_torch

        patch_torch()
        module = pl.Trainer.compile(model, torch.nn.CrossEntropyLoss(), optimizer,
                                    metrics=[torchmetrics.Accuracy(task="multiclass", num_classes=10)])
        trainer = pl.Trainer(precision="bf16", channels_last=True, **kwargs)
    train, val = loaders()
    start = time.perf_counter()
    trainer.fit(module, train, val)
    print(f"{'stock' if args.stock else 'Trainer.compile'}: {time.perf_counter() - start:.1f} s, "
          f"val accuracy {float(trainer.callback_metrics['val/accuracy']):.3f}")


if __name__ == "__main__":
    main()
