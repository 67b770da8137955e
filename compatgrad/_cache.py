"""Per-model caches of built gradient functions, dropped with the model and rebuilt on recompile."""

import operator
import weakref
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

from ._types import Model

_MODELS: "weakref.WeakKeyDictionary[Any, Dict[Hashable, Tuple[Tuple[Any, ...], Any]]]" = (
    weakref.WeakKeyDictionary()
)


def cached(model: Model, key: Hashable, state: Sequence[Any], build: Callable[[], Any]) -> Any:
    """``build()`` once per (model, key); again when any object in ``state`` is replaced (a recompile).

    Built functions must hold the model only weakly, or the model would never be freed.
    """
    entries = _MODELS.get(model)
    if entries is None:
        entries = _MODELS[model] = {}
    entry = entries.get(key)
    if entry is None or len(entry[0]) != len(state) or not all(map(operator.is_, entry[0], state)):
        entry = (tuple(state), build())
        entries[key] = entry
    return entry[1]


def built(model: Model) -> List[Any]:
    """What has been built for ``model`` (for the trace and op counts of tests and benchmarks)."""
    return [entry[1] for entry in _MODELS.get(model, {}).values()]
