"""PIL's size check of every crop box, on every path of the plan, as stock makes it.

Pillow's ``Image.crop`` checks the area of the box it cuts against ``Image.MAX_IMAGE_PIXELS`` (a box that is
the whole image excepted): ``DecompressionBombWarning`` above the limit, ``DecompressionBombError`` above twice
it. torchvision's PIL transforms crop through it (``F.crop``, ``F.resized_crop``, ``F.center_crop`` after its pad,
``RandomCrop`` after its padding, ``FiveCrop``/``TenCrop``, a pad with negative sides in a non-constant mode).
Each case runs stock first (unpatched), then patched, in this process from the same seeds, with the limit lowered
so that the check acts, and compares the outputs, every warning (category, message, and the file and line it is
attributed to, in order), the error where stock raises one, and the three generators' states afterwards: on a
lone ``Compose`` call, on a ``num_workers=0`` DataLoader (the batch path: draws in the calling thread, renders on
the loader's threads, the draw program), on virtual workers, and under ``warnings.simplefilter("error")``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state, seed_all
from PIL import Image
from torch.utils.data import DataLoader

import nano_patch
from nano_patch.data.batches import batch_loader, drawn_batches
from nano_patch.vision.kernels import native, torch_draws
from nano_patch.vision.plans import compose_call, compose_plan, draw_program


@pytest.fixture
def limit(monkeypatch):
    """Sets ``Image.MAX_IMAGE_PIXELS`` for the test; the fixture puts it back after."""

    def set_limit(value: int | None) -> None:
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", value)

    return set_limit


def _warning(w: warnings.WarningMessage) -> tuple[str, str, str, int]:
    return (w.category.__name__, str(w.message), w.filename, w.lineno)


def _bomb_warnings(caught: list[warnings.WarningMessage]) -> list[tuple[str, str, str, int]]:
    return [_warning(w) for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]


def _as_bytes(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return (out.dtype, tuple(out.shape), out.contiguous().numpy().tobytes())
    if isinstance(out, Image.Image):
        return (out.mode, out.size, out.tobytes())
    if isinstance(out, (tuple, list)):
        return tuple(_as_bytes(o) for o in out)
    return out


def _calls(make: Any, img: Image.Image, n: int, seed: int = 0, action: str = "always") -> dict[str, Any]:
    """``n`` calls of the Compose ``make()`` on ``img`` from ``seed``, under the warnings filter ``action``: the
    outputs, the warnings, the error that stopped them (class and message) and the generators after."""
    compose = make()
    seed_all(seed)
    outputs: list[Any] = []
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for _ in range(n):
            try:
                outputs.append(_as_bytes(compose(img)))
            except Exception as exc:  # noqa: BLE001 - compared with stock's
                error = (type(exc).__name__, str(exc))
                break
    return {"outputs": outputs, "warnings": [_warning(w) for w in caught], "error": error, "rng": rng_state()}


def _same_calls(stock: dict[str, Any], patched: dict[str, Any]) -> None:
    assert patched["error"] == stock["error"]
    assert patched["warnings"] == stock["warnings"]
    assert len(patched["outputs"]) == len(stock["outputs"])
    for k, (want, got) in enumerate(zip(stock["outputs"], patched["outputs"])):
        assert got == want, f"call {k}"
    assert rng_differences(patched["rng"], stock["rng"]) == []


def _stock_then_patched(make: Any, img: Image.Image, n: int, seed: int = 0, action: str = "always"
                        ) -> dict[str, Any]:
    stock = _calls(make, img, n, seed, action)
    nano_patch.patch_torch(loader_threads=2)
    _same_calls(stock, _calls(make, img, n, seed, action))
    return stock


@pytest.fixture
def wide(photos) -> Image.Image:
    """A 424 x 176 photo."""
    return photos[0].resize((424, 176))


# --- a lone Compose call ---------------------------------------------------------------------------------------


def test_random_resized_crop_warns_as_stock(limit, wide):
    limit(30_000)
    stock = _stock_then_patched(lambda: T.Compose([T.RandomResizedCrop(64), T.ToTensor()]), wide, 20)
    assert len(stock["warnings"]) == 2 and stock["error"] is None
    assert all(w[0] == "DecompressionBombWarning" for w in stock["warnings"])


def _padded_center_crops() -> T.Compose:
    return T.Compose([T.Resize(300), T.RandomChoice([T.CenterCrop(520), T.CenterCrop(400), T.CenterCrop(280)]),
                      T.Resize(48), T.ToTensor()])


def test_a_padded_center_crop_raises_stocks_error_with_stocks_generators(limit, wide):
    """The padded 520 x 520 crop is over twice the limit: stock raises there; the 400 x 400 crop warns."""
    limit(131_072)
    stock = _stock_then_patched(_padded_center_crops, wide, 20)
    assert stock["error"] == ("DecompressionBombError", "Image size (270400 pixels) exceeds limit of 262144 pixels, "
                              "could be decompression bomb DOS attack.")
    assert len(stock["outputs"]) < 20


def test_a_planned_center_crop_checks_its_box(limit, photos):
    """A CenterCrop inside the image (the plan's own crop), and one the size of the image (PIL copies it
    unchecked, whatever the limit)."""
    img = photos[0]  # 500 x 334
    limit(20_000)
    stock = _stock_then_patched(lambda: T.Compose([T.CenterCrop(150), T.ToTensor()]), img, 3)
    assert len(stock["warnings"]) == 3
    nano_patch.unpatch_torch()
    limit(1_000)
    stock = _stock_then_patched(lambda: T.Compose([T.CenterCrop((334, 500)), T.Resize(20), T.ToTensor()]), img, 2)
    assert stock["warnings"] == [] and stock["error"] is None


RANDOM_CROPS = {
    "padding": lambda: T.Compose([T.RandomCrop(200, padding=30), T.ToTensor()]),
    "padding, reflect": lambda: T.Compose([T.RandomCrop((190, 210), padding=(12, 20), padding_mode="reflect"),
                                           T.RandomHorizontalFlip(), T.ToTensor()]),
    "pad_if_needed": lambda: T.Compose([T.RandomCrop(360, pad_if_needed=True), T.Resize(40), T.ToTensor()]),
    "pad_if_needed, edge": lambda: T.Compose([T.RandomCrop((200, 520), pad_if_needed=True, padding_mode="edge"),
                                              T.ToTensor()]),
    "no padding": lambda: T.Compose([T.RandomCrop(200), T.RandomHorizontalFlip(), T.ToTensor()]),
    "negative pad, reflect": lambda: T.Compose([T.Pad([-20, -10, -5, -30], padding_mode="reflect"), T.ToTensor()]),
}


@pytest.mark.parametrize("name", sorted(RANDOM_CROPS))
def test_random_crop_with_padding_checks_its_box(limit, photos, name):
    img = photos[0]  # 500 x 334
    limit(35_000)  # a 200 x 200 box warns; a 360 x 360 one (after the pad) raises
    stock = _stock_then_patched(RANDOM_CROPS[name], img, 6)
    assert stock["warnings"] or stock["error"]


def test_five_crop_and_ten_crop_check_every_box(limit, photos):
    def make(cls: Any, size: int) -> Any:
        return lambda: T.Compose([T.Resize(300), cls(size), T.Lambda(lambda crops: torch.stack(
            [T.functional.to_tensor(c) for c in crops]))])

    limit(30_000)
    for cls, size in ((T.FiveCrop, 200), (T.TenCrop, 180)):
        stock = _stock_then_patched(make(cls, size), photos[1], 2)
        assert len(stock["warnings"]) == 2 * (5 if cls is T.FiveCrop else 10)
        nano_patch.unpatch_torch()
    limit(18_000)  # over twice the limit: the first corner raises
    stock = _stock_then_patched(make(T.FiveCrop, 200), photos[1], 2)
    assert stock["error"] is not None and stock["error"][0] == "DecompressionBombError"


def test_timms_crop_checks_after_its_filters_draw(limit, wide):
    pytest.importorskip("timm")
    from timm.data.transforms import RandomResizedCropAndInterpolation

    def make() -> T.Compose:
        return T.Compose([RandomResizedCropAndInterpolation(64, interpolation="random"), T.ToTensor()])

    limit(30_000)
    stock = _stock_then_patched(make, wide, 20, seed=4)
    assert stock["warnings"]


@pytest.mark.parametrize("case", ["warning", "error"])
def test_a_warnings_filter_of_error_raises_the_same_exception(limit, wide, case):
    """Under ``simplefilter("error")`` the first warning is the exception, at stock's call, generators as stock's."""
    if case == "warning":
        limit(30_000)
        stock = _stock_then_patched(lambda: T.Compose([T.RandomResizedCrop(64), T.ToTensor()]), wide, 20,
                                    action="error")
        assert stock["error"] is not None and stock["error"][0] == "DecompressionBombWarning"
    else:
        limit(131_072)
        stock = _stock_then_patched(_padded_center_crops, wide, 20, action="error")
        assert stock["error"] is not None and stock["error"][0] == "DecompressionBombWarning"


def test_no_limit_and_the_default_limit_check_nothing(limit, wide):
    make = lambda: T.Compose([T.RandomResizedCrop(64), T.ToTensor()])  # noqa: E731
    for value in (None, Image.MAX_IMAGE_PIXELS):
        limit(value)
        stock = _stock_then_patched(make, wide, 5)
        assert stock["warnings"] == []
        nano_patch.unpatch_torch()


# --- a num_workers=0 DataLoader: the batch path ----------------------------------------------------------------


LOADER_PIPELINES = {
    # images scaled up past the limit, then cropped: some boxes warn, some (over twice it) raise; the open of the
    # files never acts
    "resize up, random resized crop": (200_000, lambda: T.Compose([
        T.Resize(700), T.RandomResizedCrop(48, scale=(0.08, 0.6)), T.RandomHorizontalFlip(), T.ToTensor()])),
    # the crop first (a JPEG decodes only its window): the open of the larger files warns too
    "random resized crop first": (85_000, lambda: T.Compose([T.RandomResizedCrop(48), T.ToTensor(),
                                                             T.Normalize([0.5] * 3, [0.25] * 3)])),
    # every box warns: every sample goes to stock's code
    "random crop, every box": (150_000, lambda: T.Compose([T.Resize(500), T.RandomCrop(400), T.Resize(32),
                                                           T.ToTensor()])),
    "center crop": (120_000, lambda: T.Compose([T.Resize(420), T.CenterCrop(360), T.Resize(40), T.ToTensor()])),
    # a stock step (RandomChoice): the batch is loaded one by one, its crops through the patched PIL backend
    "padded center crops": (131_072, _padded_center_crops),
}


def _loader_events(folder: Path, make: Any, seed: int, epochs: int = 3, action: str = "always",
                   workers: int = 0) -> tuple[list[Any], list[Any]]:
    """Per batch, the batch (copied) or the error (class, message), with the generators after it; the generators
    after each epoch; and every warning given in this thread."""
    from torchvision.datasets import ImageFolder

    seed_all(seed)
    loader = DataLoader(ImageFolder(str(folder), transform=make()), batch_size=4, shuffle=True, num_workers=workers)
    out: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for _ in range(epochs):
            it = iter(loader)
            out.append(("iterator", type(it).__name__))
            while True:
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                except Exception as exc:  # noqa: BLE001 - compared with stock's
                    text = str(exc)
                    out.append(("error", type(exc).__name__, text.split("\nOriginal Traceback")[0],
                                text.strip().splitlines()[-1], rng_state()))
                    continue
                out.append(("batch", x.clone(), y.clone(), rng_state()))
            out.append(("epoch", rng_state()))
    return out, [_warning(w) for w in caught]


def _same_events(stock: list[Any], patched: list[Any], iterator: bool = False) -> None:
    assert [e[0] for e in patched] == [e[0] for e in stock]
    for want, got in zip(stock, patched):
        if want[0] == "batch":
            assert want[1].dtype == got[1].dtype and torch.equal(want[1], got[1]) and torch.equal(want[2], got[2])
        elif want[0] == "error":
            assert got[:4] == want[:4]
        elif want[0] == "iterator":
            assert not iterator or got == want
            continue
        assert rng_differences(got[-1], want[-1]) == []


@pytest.fixture
def counted(monkeypatch):
    """Counts the runs of samples the batch path loaded, and the samples the draw program made or gave back."""
    seen = {"runs": 0, "made": 0, "given back": 0}
    real_run, real_draw = batch_loader._load_run, draw_program.Program.draw

    def load_run(*args: Any, **kwargs: Any) -> Any:
        seen["runs"] += 1
        return real_run(*args, **kwargs)

    def draw(self: Any, hw: Any) -> Any:
        got = real_draw(self, hw)
        seen["made" if got is not None else "given back"] += 1
        return got

    monkeypatch.setattr(batch_loader, "_load_run", load_run)
    monkeypatch.setattr(draw_program.Program, "draw", draw)
    return seen


@pytest.mark.parametrize("name", sorted(LOADER_PIPELINES))
def test_a_loader_gives_stocks_batches_warnings_errors_and_generators(image_folder, limit, counted, name):
    value, make = LOADER_PIPELINES[name]
    limit(value)
    stock, stock_warnings = _loader_events(image_folder, make, seed=5)
    assert _bomb_warnings_of(stock_warnings) or any(e[0] == "error" for e in stock)
    nano_patch.patch_torch(loader_threads=2)
    patched, patched_warnings = _loader_events(image_folder, make, seed=5)
    _same_events(stock, patched)
    assert patched_warnings == stock_warnings
    if name != "padded center crops":
        assert counted["runs"] > 0  # the batch path ran
        assert counted["given back"] > 0  # the draw program gave the samples whose box PIL checks to the plan
    if name == "resize up, random resized crop":
        assert counted["made"] > 0 and any(e[0] == "error" for e in stock)


def _bomb_warnings_of(caught: list[tuple[str, str, str, int]]) -> list[Any]:
    return [w for w in caught if w[0] == "DecompressionBombWarning"]


@pytest.mark.parametrize("name", ["resize up, random resized crop", "random crop, every box"])
def test_a_loader_under_a_warnings_filter_of_error(image_folder, limit, name):
    value, make = LOADER_PIPELINES[name]
    limit(value)
    stock, _ = _loader_events(image_folder, make, seed=7, epochs=2, action="error")
    assert any(e[0] == "error" and e[1] == "DecompressionBombWarning" for e in stock)
    nano_patch.patch_torch(loader_threads=2)
    patched, _ = _loader_events(image_folder, make, seed=7, epochs=2, action="error")
    _same_events(stock, patched)


# --- the draw program, and a quiet load (virtual workers) --------------------------------------------------


def _resize_up() -> T.Compose:
    return LOADER_PIPELINES["resize up, random resized crop"][1]()


def test_the_program_gives_back_a_sample_whose_box_pil_checks(limit):
    """The draw program leaves such a sample to the plan, its generator copy where it was before it; the plan's
    draw on a Recording gives it to stock's code (it must not warn there: the batch path may draw twice)."""
    nano_patch.patch_torch(loader_threads=2)
    compose = T.Compose([T.RandomResizedCrop(48), T.ToTensor()])
    hw = (176, 424)
    limit(30_000)
    torch.manual_seed(1)
    draws = torch_draws.start(native.kernel("torch_draws"))
    program = draw_program.bind(compose, draws, {})
    assert program is not None
    given_back = made = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            before = draws.torch_state()
            if program.draw(hw) is not None:
                made += 1
                continue
            given_back += 1
            assert torch.equal(draws.torch_state(), before)
            torch.set_rng_state(before)
            draws.from_torch()
            with pytest.raises(compose_plan.NotSplittable):
                compose_call.run_compose(compose, compose_plan.Recording(hw, draws=draws))
            torch.set_rng_state(before)  # past this sample by stock's own draw, as its one-by-one load goes
            T.RandomResizedCrop.get_params(torch.empty(1, *hw), [0.08, 1.0], [3 / 4, 4 / 3])
            draws.from_torch()
            program.resync()
    assert given_back > 0 and made > 0
    assert caught == []


def test_a_quiet_load_gives_the_batch_back_and_warns_nothing(image_folder, limit, counted):
    """``load_drawn`` (virtual workers): a box PIL would check makes the batch go back, with no warning given."""
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch(loader_threads=2)
    ds = ImageFolder(str(image_folder), transform=_resize_up())
    assert drawn_batches.why_not_drawn_apart(ds) is None
    state = torch.Generator().manual_seed(3).get_state()
    entries = ds.samples[:4]
    kernel = native.kernel("torch_draws")
    limit(200_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = drawn_batches.load_drawn(ds, ds, entries, torch_draws.TorchDraws.from_state(kernel, state), 2)
    assert isinstance(got, drawn_batches.GivenBack) and "draw program gives back" in got.why
    assert caught == [] and counted["given back"] == 1
    limit(2_000_000)  # the same draws under a limit no box reaches: the batch loads
    got = drawn_batches.load_drawn(ds, ds, entries, torch_draws.TorchDraws.from_state(kernel, state), 2)
    assert isinstance(got, list) and len(got) == 4


def test_virtual_workers_give_stocks_batches_and_errors(image_folder, limit):
    """Stock's workers warn (in their processes) and raise (wrapped) at their samples; the virtual workers give
    such a batch to a stand-in that loads it by stock's code: the same batches, errors and generators, and no
    warning in this process on either side."""
    value, make = LOADER_PIPELINES["resize up, random resized crop"]
    limit(value)
    stock, stock_warnings = _loader_events(image_folder, make, seed=2, epochs=2, workers=2)
    nano_patch.patch_torch()
    patched, patched_warnings = _loader_events(image_folder, make, seed=2, epochs=2, workers=2)
    _same_events(stock, patched)
    assert any(e[0] == "error" for e in stock)
    assert {e[1] for e in patched if e[0] == "iterator"} == {"VirtualWorkersIter"}
    assert _bomb_warnings_of(stock_warnings) == _bomb_warnings_of(patched_warnings) == []


# --- the kernels the patched PIL backend runs for stock's transforms ------------------------------------------


def test_the_backend_crop_and_pad_leave_checked_boxes_to_pil(limit, photos):
    """``F.crop`` and a reflect ``F.pad`` with negative sides on a patch-made image: PIL's check as stock's, and
    PIL's own error for an inverted box."""
    from torchvision.transforms import functional as F

    from nano_patch.vision.images.image import FastImage

    a = np.asarray(photos[0])
    calls = [lambda im: F.crop(im, 10, 20, 200, 300), lambda im: F.crop(im, 0, 0, 334, 500),
             lambda im: F.crop(im, -5, -5, 100, 100), lambda im: F.crop(im, 5, 5, 10, -3),
             lambda im: F.pad(im, [-10, -20, -30, -5], padding_mode="symmetric"),
             lambda im: F.pad(im, [-300, 0, -300, 0], padding_mode="edge")]

    def run(make_image: Any) -> list[Any]:
        out = []
        for value in (40_000, 70_000, None):
            limit(value)
            for call in calls:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        result: Any = _as_bytes(call(make_image()))
                    except Exception as exc:  # noqa: BLE001 - compared with stock's
                        result = (type(exc).__name__, str(exc))
                out.append((result, [_warning(w) for w in caught]))
        return out

    stock = run(lambda: Image.fromarray(a))
    nano_patch.patch_torch(loader_threads=2)
    assert run(lambda: FastImage.wrap(a)) == stock
    assert any(w for _, w in stock)
