"""Undo what a gradient step writes besides gradients, inside the traced step itself."""

from typing import Any, List

import tensorflow as tf

from .. import versions
from .._types import Model

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
        for state in tf.nest.flatten(getattr(layer, "states", None) or []):
            if state is not None and hasattr(state, "assign") and id(state) not in seen:
                seen.add(id(state))
                states.append(state)
    return states


class PreservedState:
    """Moving statistics, Dropout seed-generator states, stateful layers' states and metric totals,
    read and written back.

    Create it at the start of the traced step and call ``restore()`` after the gradients:
    tf.function's automatic control dependencies order the reads before the forward pass's
    writes and the restores after them. Metrics first built during the trace (the Keras 2 loss
    container builds lazily) did not exist before it, so they are reset to their fresh state.
    """

    def __init__(self, model: Model, training: bool):
        self.model = model
        # Only a training-mode forward pass writes non-trainable variables (BatchNormalization, seeds);
        # any forward pass advances a stateful RNN's states.
        variables = list(model.non_trainable_variables) if training else []
        variables += layer_states(model)
        variables += [v for metric in model.metrics for v in metric.variables]
        self.metrics = {id(metric) for metric in model.metrics}
        seen = set()
        self.saved = []
        for variable in variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                self.saved.append((variable, tf.identity(variable)))

    def restore(self) -> None:
        for variable, value in self.saved:
            variable.assign(value)
        for metric in self.model.metrics:
            if id(metric) not in self.metrics:
                versions.metric_reset(metric)()
