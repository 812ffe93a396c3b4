"""Run another test script with `nano-patch run`, but make the child ranks that Lightning's launcher starts from
it come up without nano-patch, as they did from a ``pip install --target`` + ``PYTHONPATH`` install.

argv: MODE TARGET [TARGET ARGS ...]. In the launching process, each child rank's command loses nano-patch's rank
entry (``-m nano_patch._rank``), and then, by MODE:

- ``no-site``: the child's interpreter gets ``-S`` (so it processes no .pth file), with site-packages on its
  PYTHONPATH so that it still finds torch and Lightning;
- ``no-env``: the child's environment loses ``_NANO_PATCH_STARTUP``.

Either way nothing patches the child: it runs TARGET as stock would. ``other-options`` keeps the child patched
(its rank entry stays) but adds ``NANO_PATCH_CHANNELS_LAST=1`` to its environment: other options than rank 0's.
"""

import os
import runpy
import site
import subprocess
import sys

MODE, TARGET = sys.argv[1], sys.argv[2]
RANK_ENTRY = "nano_patch._rank"

if "LOCAL_RANK" not in os.environ:
    stock_init = subprocess.Popen.__init__

    def _unpatched(self, args, *rest, env=None, **kwargs):
        if isinstance(args, list) and env is not None and "LOCAL_RANK" in env and MODE == "other-options":
            env = {**env, "NANO_PATCH_CHANNELS_LAST": "1"}
        elif isinstance(args, list) and env is not None and "LOCAL_RANK" in env:
            if RANK_ENTRY in args:
                at = args.index(RANK_ENTRY)
                args = args[:at - 1] + args[at + 1:]
            env = dict(env)
            if MODE == "no-env":
                env.pop("_NANO_PATCH_STARTUP", None)
            else:
                args = [args[0], "-S", *args[1:]]
                env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), *site.getsitepackages()] if p)
        stock_init(self, args, *rest, env=env, **kwargs)

    subprocess.Popen.__init__ = _unpatched

sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(TARGET))
runpy.run_path(TARGET, run_name="__main__")
