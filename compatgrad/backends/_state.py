"""Undo what a gradient step writes besides gradients, inside the traced step itself."""
from typing import Any

import tensorflow as tf


class PreservedState:
    """Moving statistics, Dropout seed-generator states and metric totals, read and written back.

    Create it at the start of the traced step and call ``restore()`` after the gradients:
    tf.function's automatic control dependencies order the reads before the forward pass's
    writes and the restores after them. Metrics first built during the trace (the Keras 2 loss
    container builds lazily) did not exist before it, so they are reset to their fresh state.
    """

    def __init__(self, model: Any, training: bool):
        self.model = model
        # Only a training-mode forward pass writes non-trainable variables (BatchNormalization, seeds).
        variables = list(model.non_trainable_variables) if training else []
        variables += [v for metric in model.metrics for v in metric.variables]
        self.metrics = {id(metric) for metric in model.metrics}
        self.saved = [(v, tf.identity(v)) for v in variables]

    def restore(self) -> None:
        for variable, value in self.saved:
            variable.assign(value)
        for metric in self.model.metrics:
            if id(metric) not in self.metrics:
                reset = getattr(metric, "reset_state", None) or metric.reset_states  # reset_states before TF 2.5
                reset()
