"""``num_processes="auto"`` for the Lightning Trainer: built as one process, decided at ``fit``.

A Trainer asked for ``auto`` is built as one process (``train/trainer_arguments.py``) and keeps an
:class:`AutoRequest` (``train/trainer_methods.py``). Its ``fit``, before Lightning's launcher starts any rank, calls
:func:`decide_at_fit`: the decision (``train/instance_count.py``), and for more than one process Lightning's
accelerator connector built again with nano-patch's strategy for that count, from the arguments the Trainer was built
with, exactly as ``Trainer(num_processes=N)`` would have built it. Lightning's launcher then starts the ranks.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from . import instance_count

#: The Trainer arguments Lightning builds its accelerator connector (strategy, devices, precision) from.
CONNECTOR_ARGS = ("devices", "num_nodes", "accelerator", "strategy", "plugins", "precision", "sync_batchnorm",
                  "benchmark", "use_distributed_sampler", "deterministic")


@dataclasses.dataclass
class AutoRequest:
    """A Trainer built for ``num_processes="auto"``: what deciding the count at ``fit`` needs."""

    namespace: str  # pytorch_lightning or lightning.pytorch
    #: ``multi(kwargs, n, cores)``: the Trainer arguments for ``n`` nano-patch processes
    #: (``trainer_arguments.multi_instance_arguments``)
    multi: Callable[..., dict[str, Any]]
    skip: str | None  # why auto cannot be measured for this Trainer, as its arguments tell
    connector: dict[str, Any] = dataclasses.field(default_factory=dict)

    def with_connector(self, cls: type, original: Any, kwargs: dict[str, Any]) -> AutoRequest:
        """Keep the arguments Lightning built the Trainer's accelerator connector from (its ``PL_TRAINER_*``
        defaults included), to build it again for more processes."""
        defaults = {name: p.default for name, p in inspect.signature(original).parameters.items()}
        try:
            parse = importlib.import_module(f"{self.namespace}.utilities.argparse")._parse_env_variables
            given = {**vars(parse(cls)), **kwargs}
        except Exception:  # noqa: BLE001 - no PL_TRAINER_* defaults to read
            given = dict(kwargs)
        self.connector = {k: given.get(k, defaults.get(k)) for k in CONNECTOR_ARGS}
        return self


def skip_reason(kwargs: dict[str, Any], run_level: bool, start_method: str | None, cls: type) -> str | None:
    """Why this Trainer's arguments leave no room for ``auto`` to measure (then it runs as the script built it).
    ``cls``: nano-patch's strategy class."""
    from . import strategy as strategy_mod
    from .training_plan import default_start_method

    accelerator = kwargs.get("accelerator", "auto")
    if not strategy_mod.on_cpu(accelerator):
        return f"the Trainer trains on accelerator={accelerator!r}, and auto counts CPU processes"
    strategy = kwargs.get("strategy", "auto")
    named = isinstance(strategy, str) and strategy in (*strategy_mod.REPLACEABLE_STRATEGIES,
                                                       *strategy_mod.STRATEGY_NAMES)
    if not named and not isinstance(strategy, cls):
        return f"strategy={strategy!r} is not the plain data parallelism that nano-patch's processes replace"
    nodes = int(kwargs.get("num_nodes", 1) or 1)
    if nodes > 1:
        return f"num_nodes={nodes}: each node would measure on its own and could choose another count"
    devices = kwargs.get("devices", "auto")
    if not run_level and devices not in ("auto", None):
        return f"the Trainer argument devices={devices!r} sets the count"
    method = strategy_mod.STRATEGY_NAMES.get(strategy, None) if isinstance(strategy, str) else None
    if (method or start_method or default_start_method()) == "fork":
        return ("ranks forked from this process (as in an interactive session) could hang in OpenMP after the "
                "measurement's threads; give num_processes=N")
    return None


def decide_at_fit(trainer: Any, request: AutoRequest, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  channels_last: bool) -> None:
    """Measure and decide now, before Lightning's launcher runs; for more than one process, give the Trainer
    nano-patch's strategy for that count. Never raises: a count that cannot be set up is one process."""

    def arg(i: int, name: str) -> Any:
        return args[i] if len(args) > i else kwargs.get(name)

    n = instance_count.decided()
    if n is not None:
        decision = instance_count.Decision(n, "decided earlier in this run")
    else:
        accelerator = type(getattr(trainer, "accelerator", None)).__name__
        skip = request.skip or (None if accelerator == "CPUAccelerator" else
                                f"the Trainer trains on its {accelerator} (a GPU), and auto counts CPU processes")
        job = instance_count.TrainingJob(
            model=model, train_dataloaders=arg(1, "train_dataloaders"), datamodule=arg(3, "datamodule"),
            bf16=str(trainer.precision).startswith("bf16"), channels_last=channels_last,
            max_steps=trainer.max_steps, max_epochs=trainer.max_epochs,
            limit_train_batches=trainer.limit_train_batches, accumulate=trainer.accumulate_grad_batches, skip=skip)
        decision = instance_count.decide(job)
    if decision.processes > 1:
        try:
            built = request.multi(dict(request.connector), decision.processes, None)
            connectors = importlib.import_module(f"{request.namespace}.trainer.connectors.accelerator_connector")
            trainer._accelerator_connector = connectors._AcceleratorConnector(
                **{k: built[k] for k in CONNECTOR_ARGS if k in built})
        except Exception as exc:  # noqa: BLE001 - the Trainer stays as it was built: one process
            decision = instance_count.Decision(
                1, f"{decision.processes} processes could not be set up ({type(exc).__name__}: {exc})",
                decision.figures, decision.predicted, decision.measure_s)
    instance_count.publish(decision)
