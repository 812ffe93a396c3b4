"""Former name of ``train/tail_deferral.py``: the same module object, for code not yet moved to the new name."""

from __future__ import annotations

import sys

from . import tail_deferral

sys.modules[__name__] = tail_deferral
