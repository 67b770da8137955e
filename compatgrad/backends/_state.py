"""Undo what a gradient step writes besides gradients, inside the traced step itself."""

import tensorflow as tf

from .. import versions
from .._types import Model
from ._layers import layer_states


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
