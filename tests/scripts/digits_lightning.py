"""A plain Lightning script (it never imports nano_patch): a small CNN on scikit-learn's digits.

argv: OUT_DIR [key=value ...]. Every rank writes OUT_DIR/rank{N}.json (its cores, threads and the
final weights' file). Keys: strategy, devices, epochs, max_steps, batch, precision, crash_rank, lr, seed, order.
"""

import json
import os
import sys

import pytorch_lightning as pl
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

ARGS = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
# Imported by a test: write nothing. "__mp_main__" is this script re-imported in a spawned rank.
OUT_DIR = sys.argv[1] if __name__ in ("__main__", "__mp_main__") else None


class DigitsCNN(pl.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 10),
        )

        # Digits have one channel, for which both memory formats look alike: watch the 8-channel activation.
        self.net[2].register_forward_pre_hook(self._watch_conv_input)

    def _watch_conv_input(self, module, args):
        self.conv_input_channels_last = args[0].is_contiguous(memory_format=torch.channels_last)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if int(ARGS.get("crash_rank", -1)) == self.global_rank and batch_idx == 2:
            raise RuntimeError("rank crashed on purpose")
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def on_train_end(self):
        out = OUT_DIR
        if out is None:
            return
        weights = os.path.join(out, f"weights{self.global_rank}.pt")
        torch.save({k: v.detach().float().contiguous() for k, v in self.state_dict().items()}, weights)
        with open(os.path.join(out, f"rank{self.global_rank}.json"), "w") as f:
            json.dump({
                "rank": self.global_rank, "world": self.trainer.world_size, "pid": os.getpid(), "ppid": os.getppid(),
                "local_rank": self.local_rank, "node_rank": self.trainer.node_rank,
                "affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                "omp": os.environ.get("OMP_NUM_THREADS"), "weights": weights,
                "channels_last_weight": self.net[2].weight.is_contiguous(memory_format=torch.channels_last),
                "conv_input_channels_last": getattr(self, "conv_input_channels_last", None),
                "precision": str(self.trainer.precision), "strategy": type(self.trainer.strategy).__name__,
                # Read without importing nano_patch: whether this rank runs patched, and what patched it.
                "patched": bool(getattr(sys.modules.get("nano_patch"), "is_patched", lambda: False)()),
                "patched_by": getattr(sys.modules.get("nano_patch.train.ranks"), "patched_by", None),
                "nano_patch_file": getattr(sys.modules.get("nano_patch"), "__file__", None),
                "task_affinity": [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")],
            }, f)


def data():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


if __name__ == "__main__":
    torch.manual_seed(int(ARGS.get("seed", 0)))
    train, val = data()
    batch = int(ARGS.get("batch", 32))
    trainer_kwargs = dict(max_epochs=int(ARGS.get("epochs", 1)), logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    if "max_steps" in ARGS:
        trainer_kwargs["max_steps"] = int(ARGS["max_steps"])
    for key in ("strategy", "precision"):
        if key in ARGS:
            trainer_kwargs[key] = ARGS[key]
    for key in ("devices", "num_nodes"):
        if key in ARGS:
            trainer_kwargs[key] = int(ARGS[key])
    trainer = pl.Trainer(**trainer_kwargs)
    model = DigitsCNN(lr=float(ARGS.get("lr", 0.01)))
    sampler = None
    if ARGS.get("order") == "ddp":
        # The global order Lightning's DistributedSampler (shuffled, seed 0, epoch 0) gives the ranks.
        sampler = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(train, batch_size=batch, shuffle=False, sampler=sampler)
    trainer.fit(model, loader, DataLoader(val, batch_size=200))
    if trainer.global_rank == 0:
        with open(os.path.join(sys.argv[1], "metrics.json"), "w") as f:
            json.dump({k: float(v) for k, v in trainer.callback_metrics.items()}, f)
