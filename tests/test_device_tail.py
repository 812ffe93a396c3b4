"""The deferred tensor tail: uint8 batches whose tensor tail runs after the transfer, and the rule of when that happens.

Every comparison is against stock run in the same test (the patch reverted): values, dtype, shape and strides.
Lightning's runs here are on the CPU with ``train.tail_deferral.DEVICE_TYPES`` widened to "cpu", so that the
deferral (only ever made for an accelerator) happens and the transfer is simulated by Lightning's own one.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import nano_patch
from nano_patch import report
from nano_patch.data.tail import finish_tail
from nano_patch.train import tail_deferral as trainer_tail
from nano_patch.vision.plans import tensor_tail

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
ERASE = {"zero": 0, "sequence": (0.5, -1.0, 2.0), "random": "random"}
TAILS = ["v1", "v1-no-normalize", "timm", "v2-image", "v2-piltotensor", "v2-no-normalize"]


def _pipeline(kind: str, erase: str | None = None, p: float = 0.7):
    from torchvision import transforms as T
    from torchvision.transforms import v2

    if kind.startswith("v2"):
        head = [v2.RandomCrop(96), v2.RandomHorizontalFlip()]
        first = v2.PILToTensor() if kind == "v2-piltotensor" else v2.ToImage()
        tail = [first, v2.ToDtype(torch.float32, scale=True)]
        if kind != "v2-no-normalize":
            tail.append(v2.Normalize(MEAN, STD))
        erasers = [v2.RandomErasing(p=p, value=ERASE[erase])] if erase else []
        return v2.Compose(head + tail + erasers)
    head = [T.RandomCrop(96), T.RandomHorizontalFlip()]
    if kind == "timm":
        timm_transforms = pytest.importorskip("timm.data.transforms")
        tail = [timm_transforms.MaybeToTensor(), T.Normalize(MEAN, STD)]
    else:
        tail = [T.ToTensor()] + ([T.Normalize(MEAN, STD)] if kind == "v1" else [])
    erasers = [T.RandomErasing(p=p, value=ERASE[erase])] if erase else []
    return T.Compose(head + tail + erasers)


def _dataset(image_folder, tf):
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(image_folder), transform=tf)


def _load(ds, workers: int, seed: int = 0) -> list:
    torch.manual_seed(seed)
    return list(DataLoader(ds, batch_size=4, num_workers=workers))


def _assert_same(stock: list, got: list) -> None:
    assert len(stock) == len(got)
    for (a, ya), (b, yb) in zip(stock, got):
        assert type(b) is torch.Tensor and b.dtype == a.dtype == torch.float32
        assert b.shape == a.shape and b.stride() == a.stride()
        assert torch.equal(a, b)  # every bit
        assert torch.equal(ya, yb)


def _deferred_then_moved(ds, workers: int, monkeypatch) -> list:
    """The patched loader as Lightning's loop would get it, each batch then 'transferred' to the CPU."""
    monkeypatch.setattr(trainer_tail, "why_not", lambda loader: None)
    out = []
    for images, labels in _load(ds, workers):
        assert isinstance(images, finish_tail.DeferredImages) and images.images.dtype == torch.uint8
        out.append([images.to(torch.device("cpu")), labels])
    return out


@pytest.mark.parametrize("erase", [None, "zero", "sequence", "random"])
@pytest.mark.parametrize("kind", TAILS)
def test_every_tail_after_a_simulated_transfer_is_stock(image_folder, monkeypatch, kind, erase):
    ds = _dataset(image_folder, _pipeline(kind, erase))
    stock = _load(ds, 2)
    nano_patch.patch_torch()
    _assert_same(stock, _deferred_then_moved(ds, 2, monkeypatch))


@pytest.mark.parametrize("virtual", [False, True])
@pytest.mark.parametrize(("kind", "erase"), [("v1", "random"), ("timm", None), ("v2-image", None),
                                            ("v2-image", "random"), ("v1", None)])
def test_not_deferred_the_workers_finish_the_tail_and_the_batch_is_stock(image_folder, kind, erase, virtual):
    """Outside a Trainer (no device finishes the tail) the workers finish it, processes or virtual workers: the
    main process gets stock's float batch and does no per-batch pixel work."""
    from nano_patch.data.tail.uint8_batches import Uint8Batches

    ds = _dataset(image_folder, _pipeline(kind, erase, p=1.0))
    stock = _load(ds, 2)
    nano_patch.patch_torch(virtual_workers=virtual)
    torch.manual_seed(0)
    it = iter(DataLoader(ds, batch_size=4, num_workers=2))
    got = list(it)
    _assert_same(stock, got)
    assert not isinstance(it, Uint8Batches)


@pytest.mark.parametrize("kind", ["v1", "v2-image", "v2-piltotensor"])
def test_num_workers_0_defers_too(image_folder, monkeypatch, kind):
    ds = _dataset(image_folder, _pipeline(kind))
    stock = _load(ds, 0)
    nano_patch.patch_torch()
    _assert_same(stock, _deferred_then_moved(ds, 0, monkeypatch))
    assert ds[0][0].dtype == torch.float32  # dataset[i] outside the loader's next() stays stock


@pytest.mark.parametrize(("kind", "erase"), [("v1", "random"), ("v1", "zero"), ("v2-image", "random"),
                                            ("v2-piltotensor", "sequence")])
def test_num_workers_0_defers_an_erasing_tail_with_its_draws_in_the_batch_path(image_folder, monkeypatch, kind,
                                                                                erase):
    """num_workers=0: the batch's draw step makes each sample's erasers' draws after its other draws, as stock
    does; the samples render on the loader's threads (v1); the batches after the transfer, and the generator
    after the run, are stock's."""
    from nano_patch.data.threads import render_pool

    ds = _dataset(image_folder, _pipeline(kind, erase, p=0.6))
    stock = _load(ds, 0)
    stock_state = torch.get_rng_state()
    nano_patch.patch_torch(loader_threads=2)
    threaded = []
    real = render_pool.map_outcomes

    def counted(fn, items, n_threads, state=None):
        items = list(items)
        threaded.append(len(items))
        return real(fn, items, n_threads, state)

    monkeypatch.setattr(render_pool, "map_outcomes", counted)
    _assert_same(stock, _deferred_then_moved(ds, 0, monkeypatch))
    assert torch.equal(torch.get_rng_state(), stock_state)
    if kind.startswith("v1"):  # every batch on the batch path, every sample in it
        assert threaded == [len(b[1]) for b in stock]
    else:  # v2's Compose loads one by one (it is not on the batch path): still deferred, still stock's
        assert threaded == []


def test_erasing_values_and_rectangles_drawn_from_stocks_generators(image_folder, monkeypatch):
    """The erasers' draws are made in the worker, in stock's order: rectangles and normal values are stock's, and
    each next sample's crop (drawn after them from the same generator) is stock's too."""
    ds = _dataset(image_folder, _pipeline("v1", "random", p=1.0))
    stock = _load(ds, 1)
    nano_patch.patch_torch()
    monkeypatch.setattr(trainer_tail, "why_not", lambda loader: None)
    torch.manual_seed(0)
    batches = list(DataLoader(ds, batch_size=4, num_workers=1))
    erased = [e for b in batches for sample in b[0].erasures for e in sample]
    assert len(erased) == len(ds) and all(e.shape == (3, e.h, e.w) for e in erased)
    for (a, _), b in zip(stock, batches):
        assert b[0].values.dtype == torch.float32  # one flat tensor of values per batch crossed the queue
        for n, (e,) in enumerate(b[0].erasures):  # the erased rectangle holds exactly the drawn values
            v = b[0].values[e.at:e.at + 3 * e.h * e.w].view(e.shape)
            assert torch.equal(a[n, :, e.i:e.i + e.h, e.j:e.j + e.w], v)
    _assert_same(stock, [[b[0].to("cpu"), b[1]] for b in batches])


def test_channels_last_and_pinned_as_given(image_folder, monkeypatch):
    """Item 3: with --channels-last the finished batch is channels-last, as the float path makes it."""
    ds = _dataset(image_folder, _pipeline("v1", "zero"))
    stock = _load(ds, 2)
    nano_patch.patch_torch(channels_last=True)
    got = _deferred_then_moved(ds, 2, monkeypatch)
    for (a, _), (b, _) in zip(stock, got):
        assert b.is_contiguous(memory_format=torch.channels_last) and torch.equal(a, b)


def test_the_device_arithmetic_has_no_reciprocal_shortcut():
    """x / 255 by a tensor on the batch's device (CUDA divides a CPU scalar by multiplying by its reciprocal)."""
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16).contiguous()
    spec = tensor_tail.TailSpec(tensor_tail.V1_DIV, tuple(MEAN), tuple(STD))
    out = finish_tail.apply_tail(x, spec)
    want = torch.stack([(im.to(torch.float32).div(255) - torch.tensor(MEAN).view(-1, 1, 1))
                        / torch.tensor(STD).view(-1, 1, 1) for im in x])
    assert torch.equal(out, want)


# --- the rule (item 2), through Lightning's own loop ---------------------------------------------


def _lightning():
    return pytest.importorskip("lightning.pytorch")


def _module(L, **overrides):
    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)
            self.seen: list = []
            self.before: list = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append([x.detach().clone(memory_format=torch.preserve_format), y.clone()])
            return torch.nn.functional.cross_entropy(self.layer(x.mean(dim=(2, 3))), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    for name, fn in overrides.items():
        setattr(Recorder, name, fn)
    return Recorder()


def _fit(L, model, loader, datamodule=None):
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(0)
    if datamodule is not None:
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, loader)
    return model.seen


@pytest.fixture
def counting(monkeypatch, tmp_path):
    """Lightning's transfers of deferred batches, counted; the run report's reasons, recorded; "cpu" an accelerator."""
    moved = []
    real_to = finish_tail.DeferredImages.to

    def to(self, device, *args, **kwargs):
        moved.append(device)
        return real_to(self, device, *args, **kwargs)

    monkeypatch.setattr(finish_tail.DeferredImages, "to", to)
    monkeypatch.setattr(trainer_tail, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(report, "stats", report.Stats(str(tmp_path)))
    return moved


def _reasons(deferred: bool) -> list[str]:
    return [r for (p, fast, r) in report.stats.counts
            if p == "dataloader" and fast == deferred and r.startswith("device tail, ")]


def _stock_fit(L, ds, workers=2, **overrides):
    return _fit(L, _module(L, **overrides), DataLoader(ds, batch_size=4, num_workers=workers))


def test_lightning_fit_defers_and_the_step_sees_stocks_tensors(image_folder, counting):
    L = _lightning()
    ds = _dataset(image_folder, _pipeline("v1", "random"))
    stock = _stock_fit(L, ds)
    nano_patch.patch_torch()
    _assert_same(stock, _stock_fit(L, ds))
    assert len(counting) == len(stock)  # every batch went through Lightning's transfer as uint8
    assert any("runs on the device" in r for r in _reasons(True))


def test_lightning_fit_on_cpu_keeps_the_tail(image_folder, counting, monkeypatch):
    L = _lightning()
    monkeypatch.setattr(trainer_tail, "DEVICE_TYPES", ("cuda",))
    ds = _dataset(image_folder, _pipeline("v2-image"))
    stock = _stock_fit(L, ds)
    nano_patch.patch_torch()
    _assert_same(stock, _stock_fit(L, ds))
    assert not counting and any("goes to cpu" in r for r in _reasons(False))


@pytest.mark.parametrize("hook", ["on_before_batch_transfer", "transfer_batch_to_device"])
def test_a_module_hook_before_the_transfer_sees_stocks_float_batch(image_folder, counting, hook):
    L = _lightning()
    ds = _dataset(image_folder, _pipeline("v1"))

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.before.append(batch[0].clone())
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.before.append(batch[0].clone())
        return L.LightningModule.transfer_batch_to_device(self, batch, device, dataloader_idx)

    fn = on_before_batch_transfer if hook == "on_before_batch_transfer" else transfer_batch_to_device
    stock_model = _module(L, **{hook: fn})
    stock = _fit(L, stock_model, DataLoader(ds, batch_size=4, num_workers=2))
    nano_patch.patch_torch()
    model = _module(L, **{hook: fn})
    _assert_same(stock, _fit(L, model, DataLoader(ds, batch_size=4, num_workers=2)))
    assert len(model.before) == len(stock_model.before) == len(stock)
    for a, b in zip(stock_model.before, model.before):
        assert type(b) is torch.Tensor and b.dtype == torch.float32 and torch.equal(a, b)
    assert not counting and any(f"overrides {hook}" in r for r in _reasons(False))


def test_a_datamodule_hook_before_the_transfer_keeps_the_tail(image_folder, counting):
    L = _lightning()
    ds = _dataset(image_folder, _pipeline("v1"))
    seen_before = []

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(ds, batch_size=4, num_workers=2)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen_before.append(batch[0].dtype)
            return batch

    stock = _fit(L, _module(L), None, datamodule=Data())
    nano_patch.patch_torch()
    _assert_same(stock, _fit(L, _module(L), None, datamodule=Data()))
    assert seen_before == [torch.float32] * (2 * len(stock))
    assert not counting and any("Data overrides on_before_batch_transfer" in r for r in _reasons(False))


def test_a_collate_fn_of_the_users_keeps_the_tail(image_folder, counting):
    L = _lightning()
    from torch.utils.data import default_collate

    ds = _dataset(image_folder, _pipeline("v1"))

    def collate(batch):
        return default_collate(batch)

    stock = _fit(L, _module(L), DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate))
    nano_patch.patch_torch()
    _assert_same(stock, _fit(L, _module(L), DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)))
    assert not counting and any("not the patch's uint8 batches" in r for r in _reasons(False))


def test_a_dataloader_iter_step_keeps_the_tail(image_folder, counting):
    L = _lightning()
    ds = _dataset(image_folder, _pipeline("v1"))

    def training_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        x, y = batch
        self.seen.append([x.clone(), y.clone()])
        return torch.nn.functional.cross_entropy(self.layer(x.mean(dim=(2, 3))), y)

    stock = _fit(L, _module(L, training_step=training_step), DataLoader(ds, batch_size=4, num_workers=2))
    nano_patch.patch_torch()
    got = _fit(L, _module(L, training_step=training_step), DataLoader(ds, batch_size=4, num_workers=2))
    _assert_same(stock, got)
    assert not counting and any("not iterated by a Lightning loop" in r for r in _reasons(False))


def test_the_user_iterating_the_same_loader_gets_stocks_floats(image_folder, counting):
    L = _lightning()
    ds = _dataset(image_folder, _pipeline("v2-image", "zero"))
    stock_loader = DataLoader(ds, batch_size=4, num_workers=2)
    stock_fit = _fit(L, _module(L), stock_loader)
    stock_own = _load(ds, 2, seed=1)
    nano_patch.patch_torch()
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    _assert_same(stock_fit, _fit(L, _module(L), loader))
    assert len(counting) == len(stock_fit)  # Lightning's iteration: deferred
    torch.manual_seed(1)
    own = list(loader)  # the user's own iteration of the very loader: float batches
    _assert_same(stock_own, own)
    assert len(counting) == len(stock_fit)
    assert any("not iterated by a Lightning loop" in r for r in _reasons(False))
