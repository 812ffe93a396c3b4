"""A plain Lightning script whose DataLoader Lightning must re-create with a DistributedSampler.

argv: OUT_DIR. Each rank writes OUT_DIR/rank{N}.json: the sample indices it trained on and what its
re-created training DataLoader looks like; its worker writes worker_of_{rank pid}.json: its cores and threads.
"""

import json
import os
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset


class Indexed(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        mark = os.path.join(sys.argv[1], f"worker_of_{os.getppid()}.json")
        if info is not None and not os.path.exists(mark):
            with open(mark, "w") as f:  # what a worker really runs on, read while it loads
                json.dump({"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                           "omp": os.environ.get("OMP_NUM_THREADS"),
                           "user_init": os.environ.get("SAMPLER_TEST_WORKER")}, f)
        return torch.full((4,), float(i)), i


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, i = batch
        self.seen += i.tolist()
        return self.layer(x).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self):
        dl = self.trainer.train_dataloader
        with open(os.path.join(sys.argv[1], f"rank{self.global_rank}.json"), "w") as f:
            json.dump({"seen": self.seen, "sampler": type(dl.sampler).__name__,
                       "worker_init": type(dl.worker_init_fn).__name__, "persistent": dl.persistent_workers,
                       "user_init_kept": dl.worker_init_fn is mark_worker,
                       "num_workers": dl.num_workers, "pid": os.getpid(),
                       "affinity": sorted(os.sched_getaffinity(0))}, f)


def mark_worker(worker_id):
    os.environ["SAMPLER_TEST_WORKER"] = str(worker_id)


if __name__ == "__main__":
    loader = DataLoader(Indexed(), batch_size=5, shuffle=True, num_workers=1, worker_init_fn=mark_worker,
                        persistent_workers=True)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), loader)
