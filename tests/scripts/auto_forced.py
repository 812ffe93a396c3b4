"""Runs digits_lightning.py with ``num_processes="auto"``'s measurement replaced by one that chooses the count in
the environment variable FORCED_PROCESSES (a test of what follows the decision: the Trainer rebuilt at fit, Lightning's
launcher, the ranks taking the count). argv: as digits_lightning.py."""

import os
import runpy
import sys

from nano_patch.train import instance_count


def fake_decide(job, cpus=None):
    n = int(os.environ["FORCED_PROCESSES"])
    return instance_count.Decision(n, f"forced to {n} by the test")


instance_count.decide = fake_decide
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits_lightning.py")
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
