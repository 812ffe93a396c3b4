"""The draw program (``vision/plans/draw_program.py``): a known plan's native runs made straight from the native draws.

Each sample's program run must equal what the plan's own path makes for it (its Recording's ops, prepared by
``oprunner.prepare``), from the same generator state, and leave the generator where that path leaves it; a
sample the program gives back leaves the generator as it was before the sample. Anything the program does not
know gives no program. And the loader, using it for every sample, still gives stock's batches and generators.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
from _epochs import assert_same_epochs, loader_epochs

import nano_patch
from nano_patch import report
from nano_patch.vision.kernels import native, torch_draws
from nano_patch.vision.plans import compose_call, compose_plan, draw_program, oprunner

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

PIPELINES = {
    "pets": lambda: T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                               T.ToTensor(), T.Normalize(MEAN, STD)]),
    "b": lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "c": lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "hue, odd ratio, bicubic": lambda: T.Compose([
        T.RandomResizedCrop((96, 80), scale=(0.3, 0.9), ratio=(0.2, 5.0), interpolation=T.InterpolationMode.BICUBIC),
        T.ColorJitter(brightness=0.5, hue=0.5), T.RandomVerticalFlip(0.3), T.ToTensor()]),
    "resize max_size, random crop": lambda: T.Compose([
        T.Resize(100, max_size=180), T.RandomCrop((90, 96)), T.RandomHorizontalFlip(0.7), T.ColorJitter(0, 0.4),
        T.ToTensor(), T.Normalize(MEAN, STD)]),
    "center crop beyond small images": lambda: T.Compose([
        T.RandomHorizontalFlip(), T.CenterCrop(150), T.ToTensor()]),
    "pad if needed": lambda: T.Compose([T.RandomCrop(150, pad_if_needed=True), T.ToTensor()]),
}
SIZES = [(375, 500), (500, 333), (64, 64), (1200, 90), (31, 415), (140, 149), (151, 160), (256, 256)]


@pytest.fixture(autouse=True)
def patched():
    if not native.available("torch_draws"):
        pytest.fail(f"the native draws are not used here: {native.state()['torch_draws']}")
    nano_patch.patch_torch(loader_threads=2)


def _draws():
    return torch_draws.start(native.kernel("torch_draws"))


def _by_plan(compose, hw, draws, shared):
    """The plan's own path for one sample: its recording, prepared (or why it keeps the Python path). Torch's
    generator is put where ``draws`` stands first: a draw the native copy declines is lent to torch's own code,
    which the copy allows only from where it was taken (the tests keep two copies of one state)."""
    torch.set_rng_state(draws.torch_state())
    draws.from_torch()
    try:
        recording = compose_call.run_compose(compose, compose_plan.Recording(hw, draws=draws, shared=shared))
    except compose_plan.NotSplittable as exc:
        return f"not splittable: {exc}"
    except ValueError as exc:  # stock's own error (a crop larger than the image): the draw step raises it
        return f"raises {exc}"
    got = oprunner.prepare(recording)
    return got if isinstance(got, str) else (got.records, got.kind, got.table.tobytes(), got.shape)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_sample_s_run_and_generator_equal_the_plan_s(name):
    compose = PIPELINES[name]()
    torch.manual_seed(5)
    mine, theirs = _draws(), _draws()  # two copies of the same state
    program = draw_program.bind(compose, mine, {})
    assert program is not None
    shared: dict = {}
    given_back = 0
    for k in range(400):
        hw = SIZES[k % len(SIZES)]
        want = _by_plan(compose, hw, theirs, shared)
        before = mine.torch_state()
        run = program.draw(hw)
        if run is None:  # given back: nothing drawn; the caller draws it by the plan, as the batch loader does
            given_back += 1
            assert torch.equal(mine.torch_state(), before)
            assert _by_plan(compose, hw, mine, {}) == want
            program.resync()
        else:
            assert not isinstance(want, str), want
            assert (run.records, run.kind, run.table.tobytes(), run.shape) == want
        assert torch.equal(mine.torch_state(), theirs.torch_state())
    if name in ("center crop beyond small images", "pad if needed", "resize max_size, random crop"):
        assert given_back > 0  # (the sizes below the crop)
    else:
        assert given_back < 10  # (a crop whose float32 exp the native draws cannot be sure of)


def test_a_sample_given_back_after_some_of_its_draws_leaves_the_generator_before_it(monkeypatch):
    """The jitter declines after the crop and the flip drew: the state goes back to before the sample, with the
    samples drawn since the checkpoint drawn again."""
    compose = PIPELINES["pets"]()
    torch.manual_seed(9)
    draws = _draws()
    program = draw_program.bind(compose, draws, {})
    kept = [program.draw((375, 500)) for _ in range(3)]
    assert all(r is not None for r in kept)
    before = draws.torch_state()
    mod = native.kernel("torch_draws")
    monkeypatch.setattr(mod, "draws_jitter", lambda *args: None)
    draw_program._kept.clear()  # (the steps bound for the Compose hold the kernel's functions: bound again)
    program = draw_program.bind(compose, draws, {})
    assert program.draw((375, 500)) is None
    assert torch.equal(draws.torch_state(), before)


def _refused(compose, draws=None) -> bool:
    return draw_program.bind(compose, draws or _draws(), {}) is None


def test_what_the_program_does_not_know_gives_no_program(monkeypatch, tmp_path):
    tail = [T.ToTensor(), T.Normalize(MEAN, STD)]
    assert _refused(T.Compose([T.RandomResizedCrop(64), T.Lambda(lambda x: x), *tail]))  # user code
    assert _refused(T.Compose([T.RandomResizedCrop(64), T.RandomGrayscale(), *tail]))  # a step it does not make
    assert _refused(T.Compose([T.RandomResizedCrop(64)]))  # ends in an image
    assert _refused(T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Lambda(lambda x: x)]))  # after the tail
    nearest = T.InterpolationMode.NEAREST
    assert _refused(T.Compose([T.RandomResizedCrop(64, interpolation=nearest), *tail]))  # OpenCV's nearest
    assert _refused(T.Compose([T.RandomResizedCrop(64, antialias=False), *tail]))  # stock warns
    assert _refused(T.Compose([T.Resize(64, max_size=32), *tail]))  # stock raises
    assert _refused(T.Compose([T.RandomCrop(64, padding=4), *tail]))  # a padded crop
    assert not _refused(T.Compose([T.RandomResizedCrop(64), *tail]))  # (the same steps, known)
    assert draw_program.bind(T.Compose([T.RandomResizedCrop(64), *tail]), None, {}) is None  # torch's own draws


def test_pillow_simd_s_grey_keeps_contrast_and_saturation_on_the_plan(monkeypatch):
    from nano_patch import sysinfo

    monkeypatch.setattr(sysinfo, "pillow_is_simd", lambda: True)
    tail = [T.ToTensor()]
    assert _refused(T.Compose([T.ColorJitter(contrast=0.3), *tail]))
    assert _refused(T.Compose([T.ColorJitter(saturation=0.3), *tail]))
    assert not _refused(T.Compose([T.ColorJitter(brightness=0.3, hue=0.1), *tail]))


@pytest.mark.parametrize("name", ["pets", "c", "hue, odd ratio, bicubic"])
def test_the_loader_draws_every_sample_by_the_program_with_stock_s_batches(image_folder, monkeypatch, name):
    nano_patch.unpatch_torch()
    stock = loader_epochs(image_folder, PIPELINES[name], 21)
    nano_patch.patch_torch(loader_threads=2)
    made = {"runs": 0, "given back": 0}
    real = draw_program.Program.draw

    def counted(self, hw):
        got = real(self, hw)
        made["runs" if got is not None else "given back"] += 1
        return got

    monkeypatch.setattr(draw_program.Program, "draw", counted)
    assert_same_epochs(stock, loader_epochs(image_folder, PIPELINES[name], 21))
    from torchvision.datasets import ImageFolder

    n = len(ImageFolder(str(image_folder)))
    assert made["runs"] + made["given back"] == 2 * n and made["runs"] >= 2 * n - 2


@pytest.mark.parametrize("name", ["pets", "c"])
def test_under_the_report_the_program_runs_and_counts_what_the_plan_s_path_counts(image_folder, monkeypatch, tmp_path,
                                                                                 name):
    """``--report`` no longer sends the batches down the plan's path: the program draws them (and the batch is taken
    at once), and the report counts, per sample, each step, the tensor tail and the op runner's one call, as the
    plan's path counts them; the batches stay stock's."""
    nano_patch.unpatch_torch()
    stock = loader_epochs(image_folder, PIPELINES[name], 8)
    nano_patch.patch_torch(loader_threads=2, batches_ahead=False)  # (every batch through the draw step here)
    runs, got = [], {}
    real = draw_program.Program.draw
    for side in ("program", "plan"):
        with monkeypatch.context() as m:
            m.setattr(report, "stats", report.Stats(str(tmp_path / side)))
            m.setattr(draw_program.Program, "draw", lambda self, hw, side=side: runs.append(side) or real(self, hw))
            if side == "plan":
                m.setattr(draw_program, "bind", lambda *args: None)
            assert_same_epochs(stock, loader_epochs(image_folder, PIPELINES[name], 8))
            got[side] = (dict(report.stats.counts), report.stats.loader["parallel_samples"])
    from torchvision.datasets import ImageFolder

    n = len(ImageFolder(str(image_folder)))
    assert runs.count("program") == 2 * n and "plan" not in runs
    assert got["program"] == got["plan"] and got["program"][1] == 2 * n
    assert got["program"][0][("vision_transforms", True, "sample rendered by the native op runner (one call)")] == 2 * n
