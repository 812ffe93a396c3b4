"""Stock's own DataLoader code, called from its own lines for the virtual workers' iterator: the checks and warnings
stock gives as its multi-process iterator starts name stock's file and line, and go through its module's warning
registry, as stock's do."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_get_iterators: dict[Any, Callable[[Any], Any]] = {}


def stock_get_iterator(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Stock's ``DataLoader._get_iterator`` (its own code: the worker-number check and its warning come from its
    line, in its module's warning registry), its multi-process iterator made by ``make`` instead."""
    import types

    import torch.utils.data.dataloader as module

    stock = vars(module.DataLoader)["_get_iterator"]
    stock = getattr(stock, "__wrapped__", stock)
    fn = _get_iterators.get(stock)
    if fn is None:
        made = threading.local()
        namespace = dict(vars(module))
        namespace["__warningregistry__"] = vars(module).setdefault("__warningregistry__", {})
        namespace["_MultiProcessingDataLoaderIter"] = lambda loader: made.make(loader)
        code = types.FunctionType(stock.__code__, namespace, stock.__name__, stock.__defaults__, stock.__closure__)

        def fn(loader: Any, made: Any = made, code: Any = code) -> Any:
            return code(loader)

        fn.made = made  # type: ignore[attr-defined]
        _get_iterators[stock] = fn
    fn.made.make = make  # type: ignore[attr-defined]
    return fn


_base_inits: list[Callable[[Any, Any], None]] = []


def base_init() -> Callable[[Any, Any], None]:
    """``_BaseDataLoaderIter.__init__`` called from the line where stock's ``_MultiProcessingDataLoaderIter.__init__``
    calls it: the warnings it gives (``pin_memory`` without an accelerator) name stock's file and line, and go
    through its module's warning registry, as stock's do."""
    if _base_inits:
        return _base_inits[0]
    import inspect

    import torch.utils.data.dataloader as module

    fn = None
    try:
        lines, first = inspect.getsourcelines(module._MultiProcessingDataLoaderIter.__init__)
        at = next(first + k for k, line in enumerate(lines) if line.strip() == "super().__init__(loader)")
        namespace = dict(vars(module))
        namespace["__warningregistry__"] = vars(module).setdefault("__warningregistry__", {})
        source = "\n" * (at - 1) + "def base_init(self, loader): _BaseDataLoaderIter.__init__(self, loader)\n"
        exec(compile(source, module.__file__, "exec"), namespace)  # noqa: S102 - a fixed line of our own
        fn = namespace["base_init"]
    except (OSError, TypeError, StopIteration, SyntaxError):  # no source to point at: called from here
        fn = module._BaseDataLoaderIter.__init__
    _base_inits.append(fn)
    return fn
