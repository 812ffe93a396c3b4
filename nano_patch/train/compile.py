"""``Trainer.compile``: turn a plain ``nn.Module`` with a loss and an optimizer into a LightningModule.

Built per Lightning namespace, since ``pytorch_lightning`` and ``lightning.pytorch`` each have their
own ``LightningModule``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from . import LIGHTNING, find_class, name_class

_classes: dict[str, type] = {}


def _metric_name(metric: Any) -> str:
    # torchmetrics' Accuracy(task="multiclass") is a MulticlassAccuracy: log it as "accuracy".
    name = type(metric).__name__.lower()
    for task in ("multiclass", "multilabel", "binary"):
        if name.startswith(task) and len(name) > len(task):
            return name[len(task):]
    return name


def compiled_module_class(pl: ModuleType) -> type:
    """The LightningModule class ``Trainer.compile`` returns, for the namespace ``pl``."""
    if pl.__name__ in _classes:
        return _classes[pl.__name__]
    import torch

    class CompiledModule(pl.LightningModule):
        """A plain model with its loss, optimizer, scheduler and metrics, as a LightningModule.

        Batches are sequences: every item but the last is an input to the model, the last is the
        target. It logs ``train/loss``, ``val/loss``, ``test/loss`` and each metric as ``val/<name>``
        and ``test/<name>``.
        """

        def __init__(self, model: torch.nn.Module, loss: Callable[..., torch.Tensor], optimizer: Any,
                     scheduler: Any = None, metrics: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
            super().__init__()
            self.model = model
            self.loss = loss
            self._optimizer = optimizer
            self._scheduler = scheduler
            named = dict(metrics) if isinstance(metrics, Mapping) else {_metric_name(m): m for m in metrics or []}
            # Separate copies per stage, so validation never mixes into test; registered to follow .to().
            self.val_metrics = torch.nn.ModuleDict({k: m.clone() if hasattr(m, "clone") else m
                                                    for k, m in named.items()})
            self.test_metrics = torch.nn.ModuleDict({k: m.clone() if hasattr(m, "clone") else m
                                                     for k, m in named.items()})

        def forward(self, *inputs: Any) -> Any:
            return self.model(*inputs)

        def _split(self, batch: Any) -> tuple[tuple[Any, ...], Any]:
            if not isinstance(batch, (list, tuple)) or len(batch) < 2:
                raise TypeError(
                    "Trainer.compile expects each batch to be a sequence (inputs..., target); got "
                    f"{type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (list, tuple))
                                                 else "")
                )
            return tuple(batch[:-1]), batch[-1]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, target = self._split(batch)
            loss = self.loss(self(*inputs), target)
            self.log("train/loss", loss, prog_bar=True, batch_size=len(target))
            return loss

        def _evaluate(self, batch: Any, stage: str, metrics: torch.nn.ModuleDict) -> torch.Tensor:
            inputs, target = self._split(batch)
            output = self(*inputs)
            loss = self.loss(output, target)
            self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True, batch_size=len(target))
            for name, metric in metrics.items():
                metric(output, target)
                self.log(f"{stage}/{name}", metric, batch_size=len(target))
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self._evaluate(batch, "val", self.val_metrics)

        def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self._evaluate(batch, "test", self.test_metrics)

        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            inputs = self._split(batch)[0] if isinstance(batch, (list, tuple)) and len(batch) > 1 else (batch,)
            return self(*inputs)

        def configure_optimizers(self) -> Any:
            if self._scheduler is None:
                return self._optimizer
            return {"optimizer": self._optimizer, "lr_scheduler": self._scheduler}

    _classes[pl.__name__] = name_class(CompiledModule, __name__, "CompiledModule", pl.__name__)
    return CompiledModule


def compile_for(pl: ModuleType) -> Callable[..., Any]:
    """``Trainer.compile`` for the namespace ``pl``."""

    def compile(model: Any, loss: Callable[..., Any] | None = None, optimizer: Any = None, scheduler: Any = None,
                metrics: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        """Wrap a plain ``nn.Module`` into a LightningModule that trains, validates and logs.

        Args:
            model: an ``nn.Module``. A LightningModule is returned as it is.
            loss: ``loss(output, target) -> Tensor``, e.g. ``nn.CrossEntropyLoss()``.
            optimizer: an optimizer over ``model``'s parameters.
            scheduler: an optional lr scheduler of that optimizer, stepped every epoch.
            metrics: torchmetrics metrics (a list, or a dict name -> metric) for validation and test.

        Batch convention: each batch is a sequence; every item but the last is passed to the model
        (``model(*inputs)``), and the last is the target. Logged: ``train/loss``, ``val/loss`` and
        ``val/<metric>`` (``test/...`` under ``trainer.test``), where a metric's name is its class
        name in lower case unless given in a dict.
        """
        import torch

        if isinstance(model, pl.LightningModule):
            return model
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Trainer.compile: model must be an nn.Module, got {type(model).__name__}")
        if loss is None or not callable(loss):
            raise TypeError("Trainer.compile: loss must be a callable loss(output, target), "
                            f"got {type(loss).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"Trainer.compile: optimizer must be a torch.optim.Optimizer over the model's "
                            f"parameters, got {type(optimizer).__name__}")
        return compiled_module_class(pl)(model, loss, optimizer, scheduler, metrics)

    return compile


def __getattr__(name: str) -> type:
    return find_class(name, {"CompiledModule": (compiled_module_class, LIGHTNING)})
