"""A plain LightningCLI script (it never imports nano_patch) over the digits model.

Without ``--help`` it builds the Trainer only (``run=False``) and prints what the CLI made of the
trainer arguments as one JSON line.
"""

import json
import os
import sys

from pytorch_lightning.cli import LightningCLI

sys.path.insert(0, os.path.dirname(__file__))
from digits_lightning import DigitsCNN  # noqa: E402

if __name__ == "__main__":
    cli = LightningCLI(DigitsCNN, run=False, save_config_callback=None)
    trainer = cli.trainer
    print(json.dumps({
        "strategy": type(trainer.strategy).__name__,
        "num_processes": trainer.num_devices,
        "callbacks": [type(c).__name__ for c in trainer.callbacks],
        "warmup_epochs": [getattr(c, "warmup_epochs", None) for c in trainer.callbacks
                          if type(c).__name__.startswith("AutoLR")],
    }))
