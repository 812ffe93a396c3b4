"""A LightningCLI script whose trainer_defaults pin one device, as Lightning's own imagenet example does.

It never imports nano_patch. Builds the Trainer only (``run=False``) and prints what it became as JSON.
"""

import json
import os
import sys

from pytorch_lightning.cli import LightningCLI

sys.path.insert(0, os.path.dirname(__file__))
from digits_lightning import DigitsCNN  # noqa: E402

if __name__ == "__main__":
    cli = LightningCLI(DigitsCNN, run=False, save_config_callback=None,
                       trainer_defaults={"accelerator": "cpu", "devices": 1, "logger": False})
    trainer = cli.trainer
    print(json.dumps({"strategy": type(trainer.strategy).__name__, "devices": trainer.num_devices,
                      "precision": str(trainer.precision)}))
