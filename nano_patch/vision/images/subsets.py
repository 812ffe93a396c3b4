"""The dataset under a chain of torch's ``Subset``s, with one meaning everywhere: only stock's own class is followed
(a subclass may change what an index means, or load its samples itself), and torch is not imported for it."""

from __future__ import annotations

import sys
from typing import Any


def under_subsets(dataset: Any) -> Any:
    """``dataset``, or the dataset under the chain of stock ``Subset``s it is."""
    data = sys.modules.get("torch.utils.data")
    subset = getattr(data, "Subset", None)
    while subset is not None and type(dataset) is subset:
        dataset = dataset.dataset
    return dataset
