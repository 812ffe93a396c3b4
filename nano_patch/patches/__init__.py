"""One module per patched target; each declares its group, target module and supported versions."""

from __future__ import annotations

from ..registry import Patch


def all_patches() -> list[Patch]:
    from .dataloader import DataLoaderPatch
    from .launch_command import TARGETS, LaunchCommandPatch
    from .lightning_trainer import LightningTrainerPatch
    from .pil_images import PilImagesPatch
    from .timm_datasets import TimmDatasetsPatch
    from .vision_datasets import VisionDatasetsPatch
    from .vision_transforms import VisionTransformsPatch
    from .vision_transforms_v2 import VisionTransformsV2Patch

    return [
        PilImagesPatch(),
        VisionTransformsPatch(),
        VisionTransformsV2Patch(),
        VisionDatasetsPatch(),
        TimmDatasetsPatch(),
        DataLoaderPatch(),
        LightningTrainerPatch("pytorch_lightning"),
        LightningTrainerPatch("lightning.pytorch"),
        *(LaunchCommandPatch(target) for target in TARGETS),
    ]
