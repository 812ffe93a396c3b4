"""The Lightning part of ``nano-patch run --report``: time waiting for data against time in training steps.

Lightning's own ``SimpleProfiler`` already times both (``[_TrainingEpochLoop].train_dataloader_next``
and ``run_training_batch``); the report reads it. When the script chose no profiler, a quiet
``SimpleProfiler`` (no summary printed) is put in; a script's own ``SimpleProfiler`` is read as it is.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from . import LIGHTNING, find_class, name_class

DATA_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
STEP_ACTION = "run_training_batch"

_classes: dict[tuple[str, str], type] = {}


def quiet_profiler(pl: ModuleType) -> type:
    key = (pl.__name__, "QuietSimpleProfiler")
    if key not in _classes:

        class QuietSimpleProfiler(pl.profilers.SimpleProfiler):
            """Lightning's ``SimpleProfiler``, timing as always, without printing its summary at the end."""

            def summary(self) -> str:
                return ""

        _classes[key] = name_class(QuietSimpleProfiler, __name__, "QuietSimpleProfiler", pl.__name__)
    return _classes[key]


def report_callback(pl: ModuleType) -> type:
    key = (pl.__name__, "RunReport")
    if key not in _classes:

        class RunReport(pl.Callback):
            """Counts training samples and, on rank 0 at the end of fit, hands the profiler's figures to the report."""

            def __init__(self) -> None:
                self.samples = 0

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                   batch_idx: int) -> None:
                from .. import report

                self.samples += report.batch_size(batch)

            def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
                from .. import report

                if trainer.global_rank != 0:
                    return
                durations = getattr(trainer.profiler, "recorded_durations", None)
                loader = trainer.train_dataloader
                workers = getattr(loader, "num_workers", None)
                figures = {
                    "source": f"Lightning {type(trainer.profiler).__name__}, rank 0 of {trainer.world_size}",
                    "samples": self.samples * trainer.world_size,
                    "world_size": trainer.world_size,
                    "num_workers": workers if isinstance(workers, int) else 0,
                    "precision": str(trainer.precision),
                }
                if durations is None:
                    figures.update(data_wait_s=0.0, step_s=0.0, source=figures["source"] + " (no timings)")
                else:
                    figures.update(data_wait_s=float(sum(durations.get(DATA_ACTION, []))),
                                   step_s=float(sum(durations.get(STEP_ACTION, []))))
                report.write_training(figures)

        _classes[key] = name_class(RunReport, __name__, "RunReport", pl.__name__)
    return _classes[key]


def __getattr__(name: str) -> type:
    return find_class(name, {"QuietSimpleProfiler": (quiet_profiler, LIGHTNING),
                             "RunReport": (report_callback, LIGHTNING)})
