"""The layers of a model, nested ones included, and the state variables of its stateful ones.

Plain attribute reads: no framework is imported, so every engine (TensorFlow's, JAX's) uses them.
"""

import contextlib
from typing import Any, Iterator, List

from .. import versions
from .._types import Model
from ..sources import flatten

# Where a layer keeps the layers it wraps where it does not list them itself (versions.flattens_layers):
# models, wrappers (TimeDistributed), Bidirectional's two directions.
_SUBLAYER_ATTRIBUTES = ("_layers", "layers", "layer", "forward_layer", "backward_layer")


def all_layers(model: Model) -> List[Any]:
    """The model and every layer inside it, nested models and wrapped layers included, each once."""
    if versions.flattens_layers(model):
        return list(model._flatten_layers(include_self=True, recursive=True))
    found, seen, pending = [], set(), [model]
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        for name in _SUBLAYER_ATTRIBUTES:
            children = getattr(layer, name, None)
            children = children if isinstance(children, (list, tuple)) else [children]
            pending.extend(child for child in children if hasattr(child, "trainable_weights"))
    return found


def layer_states(model: Model) -> List[Any]:
    """The state variables of every stateful layer of ``model`` (nested layers included), each once.

    Stateful RNNs (``stateful=True``: LSTM, GRU, SimpleRNN, ConvLSTM, RNN, Bidirectional over them)
    keep the state a forward pass leaves behind in ``layer.states``, variables that are in neither
    ``model.weights`` nor ``non_trainable_variables``; every forward pass, inference included,
    assigns them. Entries that are no variable yet (Keras 2: None before the layer is built; Keras 3:
    ``states`` None) are left out.
    """
    states, seen = [], set()
    for layer in all_layers(model):
        if not getattr(layer, "stateful", False):
            continue
        for state in flatten(getattr(layer, "states", None) or []):
            if state is not None and hasattr(state, "assign") and id(state) not in seen:
                seen.add(id(state))
                states.append(state)
    return states


@contextlib.contextmanager
def losses_kept(model: Model) -> Iterator[None]:
    """Every layer's ``add_loss`` losses of its last call, as they were: a call clears and refills
    them (eager Keras 3 keeps them, torch's step included; a stateless call leaves them empty)."""
    saved = [(layer, list(layer._losses)) for layer in all_layers(model) if hasattr(layer, "_losses")]
    try:
        yield
    finally:
        for layer, losses in saved:
            layer._losses.clear()
            layer._losses.extend(losses)
