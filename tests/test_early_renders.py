"""A user's own dataset on two loader threads: each lazy sample's render starts on a helper thread while the user's
``__getitem__`` goes on (``lazy_samples._Batch``), and what the user's code sees is stock's: a sample read inside a
later ``__getitem__`` (its render under way, queued or done), an image the dataset keeps, an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


def _transform() -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize([0.5] * 3, [0.25] * 3)])


class Photos(Dataset):
    def __init__(self, files: list[Path], peek: bool = False, keep: bool = False) -> None:
        self.files, self.transform, self.peek, self.keep = files, _transform(), peek, keep
        self.last: Any = None
        self.kept: dict[int, Any] = {}
        self.sums: list[float] = []
        self.calls = 0

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        self.calls += 1
        img = self.kept.get(i) or Image.open(self.files[i]).convert("RGB")
        if self.keep:
            self.kept[i] = img
        x = self.transform(img)
        if self.peek and self.last is not None:
            self.sums.append(float(self.last.sum()))  # (the previous sample, read while the batch is fetched)
        self.last = x
        return x, i % 2


@pytest.fixture()
def files(tmp_path, photos) -> list[Path]:
    out = []
    for n in range(16):
        im = photos[n % len(photos)]
        w, h = im.size
        path = tmp_path / f"p{n}.jpg"
        im.crop((n * 5, n * 3, w - n * 4, h - n * 2)).save(path, quality=88)
        out.append(path)
    return out


def _run(ds: Any, epochs: int = 2) -> list[Any]:
    torch.manual_seed(3)
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    out = []
    for _ in range(epochs):
        out += [(x.clone(), y.clone()) for x, y in loader]
    return out + [torch.get_rng_state(), list(ds.sums)]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a[:-2], b[:-2]):
        assert torch.equal(u[0], v[0]) and torch.equal(u[1], v[1])
    assert torch.equal(a[-2], b[-2])
    assert a[-1] == b[-1]


@pytest.mark.parametrize("peek,keep", [(False, False), (True, False), (False, True)])
def test_early_renders_give_stocks_batches(files, monkeypatch, peek, keep):
    import nano_patch
    from nano_patch.data.datasets import lazy_samples

    stock = _run(Photos(files, peek, keep))
    nano_patch.patch_torch(loader_threads=2)
    early = []
    render = lazy_samples._render
    ds = Photos(files, peek, keep)

    def counted(job: Any, pending: Any, keep: bool = False, store: Any = None) -> Any:
        early.append(ds.calls % 8 != 0)  # (a render while the batch's __getitem__ calls are still going on)
        return render(job, pending, keep, store)

    monkeypatch.setattr(lazy_samples, "_render", counted)
    patched = _run(ds)
    _same(stock, patched)
    assert any(early)  # renders ran on the helper while the batch's __getitem__ calls went on
    if keep:  # the kept images hold their pixels, as stock's decoded at convert
        from nano_patch.vision.images import lazy_jpeg

        pending = [lazy_jpeg.pending_of(img) for img in ds.kept.values()]
        assert all(p is None or p.pixels is not None for p in pending)


def test_a_file_that_fails_in_the_render_raises_stocks_error(files):
    """A JPEG damaged below its markers (the strict decode refuses the scan): the early render's error is not
    raised on the helper; the sample goes to PIL's decode, as stock's convert does, and the batch is stock's."""
    import nano_patch

    data = bytearray(files[3].read_bytes())
    sos = data.index(b"\xff\xda")
    for k in range(sos + 40, len(data) - 10, 97):
        data[k] = data[k] ^ 0x55 if data[k] != 0xFF and data[k] ^ 0x55 != 0xFF else data[k]
    files[3].write_bytes(bytes(data))
    outcomes = []
    for side in ("stock", "patched"):
        if side == "patched":
            nano_patch.patch_torch(loader_threads=2)
        try:
            outcomes.append(_run(Photos(files), epochs=1))
        except Exception as exc:  # noqa: BLE001 - compared with stock's
            outcomes.append((type(exc), str(exc)))
    if isinstance(outcomes[0], tuple):
        assert outcomes[0] == outcomes[1]
    else:
        _same(outcomes[0], outcomes[1])
