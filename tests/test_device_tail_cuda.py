"""The deferred tensor tail on a GPU: the tail runs on CUDA after Lightning's transfer, and every training batch
is stock's, bit for bit. Skipped only where CUDA is absent (the CPU side of the same code is
tests/test_device_tail.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import nano_patch
from nano_patch.data.tail import finish_tail
from nano_patch.vision.plans import tensor_tail

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def test_cuda_float32_tail_arithmetic_is_the_cpus_for_every_uint8_value():
    """Each of the 256 values through each channel's tail: CUDA's float32 div/mul/sub round as the CPU's (no
    fast-math); the divisor is a device tensor, since a CPU-scalar divisor makes CUDA multiply by a reciprocal."""
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(4, 3, 16, 16).contiguous()
    mean, std = torch.tensor(MEAN).view(-1, 1, 1), torch.tensor(STD).view(-1, 1, 1)
    cpu_v1 = torch.stack([(im.to(torch.float32).div(255) - mean) / std for im in x])
    cpu_v2 = torch.stack([im.to(torch.float32).mul_(1.0 / 255).sub(mean).div_(std) for im in x])
    for scale, want in ((tensor_tail.V1_DIV, cpu_v1), (tensor_tail.V2_MUL, cpu_v2)):
        spec = tensor_tail.TailSpec(scale, tuple(MEAN), tuple(STD))
        got = finish_tail.DeferredImages(x, spec).to(torch.device("cuda"))
        assert got.device.type == "cuda" and got.dtype == torch.float32
        assert torch.equal(got.cpu(), want)
        bare = finish_tail.apply_tail(x.cuda(), tensor_tail.TailSpec(scale))  # no Normalize
        assert torch.equal(bare.cpu(), torch.stack([im.to(torch.float32).div(255) for im in x])
                           if scale == tensor_tail.V1_DIV else x.to(torch.float32).mul_(1.0 / 255))


def _pipeline(kind: str):
    from torchvision import transforms as T
    from torchvision.transforms import v2

    if kind == "v1-plain":
        return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    if kind == "v2":
        return v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.ToImage(),
                           v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                           v2.RandomErasing(p=0.7, value="random")])
    return T.Compose([T.RandomCrop(96), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD),
                      T.RandomErasing(p=0.7, value="random")])


def _fit(image_folder, kind: str, workers: int) -> list:
    import lightning.pytorch as L
    from torchvision.datasets import ImageFolder

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.seen: list = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            assert x.device.type == "cuda"
            self.seen.append((x.detach().cpu(), x.stride(), x.dtype, y.cpu()))
            return torch.nn.functional.cross_entropy(self.conv(x).mean(dim=(2, 3))[:, :2], y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = ImageFolder(str(image_folder), transform=_pipeline(kind))
    loader = DataLoader(ds, batch_size=4, num_workers=workers, pin_memory=True)
    model = Recorder()
    trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=2, precision="bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(0)
    trainer.fit(model, loader)
    return model.seen


@pytest.mark.parametrize(("kind", "workers"), [("v1", 2), ("v2", 2), ("v1-plain", 0), ("v1", 0), ("v1-plain", 2)])
def test_patched_fit_on_the_gpu_sees_stocks_batches_bit_for_bit(image_folder, monkeypatch, kind, workers):
    """Every batch crosses as uint8 and is finished on the GPU: worker processes (RandomErasing, v2), virtual
    workers (v1-plain with 2 workers), and num_workers=0 (RandomErasing's draws ride with the uint8 samples)."""
    moved = []
    real_to = finish_tail.DeferredImages.to

    def to(self, device, *args, **kwargs):
        moved.append(torch.device(device).type)
        return real_to(self, device, *args, **kwargs)

    monkeypatch.setattr(finish_tail.DeferredImages, "to", to)
    stock = _fit(image_folder, kind, workers)
    nano_patch.patch_torch()
    patched = _fit(image_folder, kind, workers)
    assert len(patched) == len(stock) > 0
    for (a, sa, da, ya), (b, sb, db, yb) in zip(stock, patched):
        assert da == db == torch.float32 and a.shape == b.shape and sa == sb
        assert torch.equal(a, b) and torch.equal(ya, yb)
    assert moved == ["cuda"] * len(stock)  # every batch crossed as uint8 and was finished on the GPU
