"""A small plain Lightning script over an ImageFolder of JPEGs (it never imports nano_patch).

argv: DATA_DIR [workers]. The transform holds a Lambda that runs PIL code, so the report has a fallback to name.
"""

import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.datasets import ImageFolder


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.Lambda(lambda im: im.transpose(0)),
                    T.ToTensor()])
    data = ImageFolder(sys.argv[1], transform=tf)
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=workers)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
