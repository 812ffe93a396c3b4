"""Patch the Lightning ``Trainer`` in place, for ``pytorch_lightning`` and ``lightning.pytorch`` alike.

Wiring only: ``Trainer.__init__`` takes BigDL-Nano's arguments and turns them into stock Lightning objects
(``train/trainer_methods.py``, resolved by ``train/trainer_arguments.py``), ``Trainer.fit`` decides
``num_processes="auto"`` and notes what trains, ``Trainer.compile`` wraps a plain ``nn.Module`` into a LightningModule
(``train/compile.py``), and nano-patch's strategy names join Lightning's registry (``train/strategy.py``). Where
Lightning's own loops iterate a loader, its tensor tail may go to the device (``train/tail_deferral.py``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, ClassVar

from ..config import Options
from ..registry import Patch


class LightningTrainerPatch(Patch):
    group: ClassVar[str] = "trainer"
    requires: ClassVar[dict[str, str]]

    def __init__(self, namespace: str) -> None:
        dist = "pytorch-lightning" if namespace == "pytorch_lightning" else "lightning"
        super().__init__(namespace, f"trainer[{namespace}]", {dist: ">=2.4,<2.7"})
        self._registered: list[tuple[dict[str, Any], str]] = []

    def check_internals(self, module: ModuleType) -> str | None:
        trainer = getattr(module, "Trainer", None)
        strategies = getattr(module, "strategies", None)
        if trainer is None or strategies is None or not hasattr(strategies, "DDPStrategy"):
            return f"{self.target} lacks Trainer or strategies.DDPStrategy"
        if not hasattr(strategies.DDPStrategy, "_register_ddp_hooks"):
            return f"{self.target}.strategies.DDPStrategy lacks _register_ddp_hooks"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from ..train import strategy, tail_deferral, trainer_methods
        from ..train.compile import compile_for

        trainer = module.Trainer
        strategy.register_names(module, self._registered)
        init = trainer_methods.init_with_nano_arguments(module, vars(trainer)["__init__"])
        self.record.replace(trainer, "__init__", init)
        self.record.replace(trainer, "compile", staticmethod(compile_for(module)))
        self.record.wrap(trainer, "fit", trainer_methods.noting_fit)
        # a loader Lightning's own loop iterates may hand its tensor tail to the device
        fetchers = importlib.import_module(f"{self.target}.loops.fetchers")
        if "_run_stage" in vars(trainer) and hasattr(fetchers, "_DataFetcher"):  # else: the tail stays on the CPU
            self.record.wrap(trainer, "_run_stage", tail_deferral.running)
            self.record.wrap(fetchers._DataFetcher, "__iter__", tail_deferral.iterating)
            self.record.wrap(fetchers._DataFetcher, "__next__", tail_deferral.iterating)  # loaders started lazily

    def _revert(self) -> None:
        from ..train import strategy

        strategy.unregister_names(self._registered)
