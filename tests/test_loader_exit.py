"""A script that ends while the loader's own threads are still at work exits as stock's does, with status 0.

At the interpreter's finalization a daemon thread that takes the GIL back inside torch's C++ code aborts the process
("terminate called without an active exception"). The loader's threads (batches made ahead at ``num_workers=0``,
virtual workers' producers at ``num_workers=2``) finish the work under way at exit and start none. To be sure the
threads are inside torch's C++ code at the exit, the child script makes each fast-path batch start with about a
second of matrix products (GIL released); stock's run of the same script never starts such a thread.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import sys, threading, time
import nano_patch
nano_patch.patch_torch(loader_threads=2)
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from nano_patch.data.batches import drawn_batches

real = drawn_batches.load_drawn
entered = threading.Event()

def slow(*args, **kwargs):
    if threading.current_thread() is not threading.main_thread():
        entered.set()
        x = torch.ones(1200, 1200)
        for _ in range(8):
            x = x @ x * 0  # torch's C++ code, the GIL released
    return real(*args, **kwargs)

drawn_batches.load_drawn = slow
ds = ImageFolder(sys.argv[1], transform=T.Compose([T.RandomResizedCrop(32), T.ToTensor()]))
loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=int(sys.argv[2]))
it = iter(loader)
next(it)
assert entered.wait(60), "no loader thread took the fast path"
print("exiting", flush=True)
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_script_ending_while_a_loader_thread_runs_torch_code_exits_cleanly(image_folder: Path, tmp_path: Path,
                                                                              num_workers: int):
    script = tmp_path / "ends_early.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(image_folder), str(num_workers)], capture_output=True,
                          text=True, timeout=300)
    assert "exiting" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
