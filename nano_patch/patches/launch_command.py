"""Start Lightning's child ranks through nano-patch's rank entry (``python -m nano_patch._rank``).

Lightning's and Fabric's ``_SubprocessScriptLauncher`` build each child's command with the module functions
``_basic_subprocess_cmd`` and ``_hydra_subprocess_cmd`` (defined in ``lightning_fabric``'s launcher module and
imported by name into ``pytorch_lightning``'s). Both are wrapped where the launchers look them up, in each of the
four namespaces; the launchers themselves stay Lightning's. Wiring only: the wrappers are ``train/ranks.py``'s.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch

BUILDERS = ("_basic_subprocess_cmd", "_hydra_subprocess_cmd")

#: launcher module -> the distribution that ships it
TARGETS = {
    "lightning_fabric.strategies.launchers.subprocess_script": "pytorch-lightning",
    "pytorch_lightning.strategies.launchers.subprocess_script": "pytorch-lightning",
    "lightning.fabric.strategies.launchers.subprocess_script": "lightning",
    "lightning.pytorch.strategies.launchers.subprocess_script": "lightning",
}


class LaunchCommandPatch(Patch):
    #: Not an option group: whatever is patched passes the patch to the ranks it starts.
    group: ClassVar[str] = "ranks"
    requires: ClassVar[dict[str, str]]

    def __init__(self, target: str) -> None:
        super().__init__(target, f"launch-command[{target.rsplit('.strategies', 1)[0]}]",
                         {TARGETS[target]: ">=2.4,<2.7"})

    def check_internals(self, module: ModuleType) -> str | None:
        missing = [b for b in BUILDERS if not callable(vars(module).get(b))]
        return f"{self.target} lacks {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from ..train import ranks

        self.record.wrap(module, "_basic_subprocess_cmd", ranks.basic_command)
        self.record.wrap(module, "_hydra_subprocess_cmd", ranks.hydra_command)
