"""The forward pass of an eager step (the model itself, or its extraction view when tensors are wanted),
and what a loss reads of its outputs."""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from .. import versions
from .._types import Model
from ..detect import model_class
from ..sources import extraction_view, output_structure


class Forward:
    """``forward(model, tape, x, training) -> (activations, y_pred)``; activations follow ``tensors``.

    The view shares the model's layers and variables, so its forward pass is the model's. The
    inputs are watched, so a tensor that depends on no trainable variable still gets a gradient.
    """

    def __init__(self, model: Model, tensors: Sequence[Any]):
        self.count = len(tensors)
        self.outputs = output_structure(model) if tensors else None
        self.view = (
            extraction_view(model, model_class(model), tuple(tensors), tf.nest.flatten(self.outputs))
            if tensors
            else None
        )

    def tape(self, params: Sequence[Any], x: Any) -> tf.GradientTape:
        """The step's tape: Keras' own, which watches every variable read, unless only tensors are wanted.

        Then it watches just the inputs (in ``__call__``), so the backward pass stops there instead
        of also reaching every variable. Integer inputs (an Embedding's) cannot be watched: with
        one of those, the variables are.
        """
        leaves = tf.nest.flatten(x)
        watch_variables = bool(params) or self.view is None or not all(t.dtype.is_floating for t in leaves)
        return tf.GradientTape(watch_accessed_variables=watch_variables)

    def __call__(self, model: Model, tape: tf.GradientTape, x: Any, training: bool) -> Tuple[List[Any], Any]:
        if self.view is None:
            return [], model(x, training=training) if versions.call_takes_training(model) else model(x)
        tape.watch([t for t in tf.nest.flatten(x) if t.dtype.is_floating])
        flat = list(self.view(x, training=training))
        return flat[: self.count], tf.nest.pack_sequence_as(self.outputs, flat[self.count :])


def loss_inputs(outputs: Any) -> List[Any]:
    """Per output of the model (flat), the two tensors its loss may read: the output, then its logits.

    Every Keras computes a crossentropy from the logits under a softmax or sigmoid output, which
    then has no gradient of its own. The logits are the output's ``_keras_logits`` (TF 2.5+, Keras
    3) or the Softmax / Sigmoid op's input; an output without them is given twice.
    """
    found = []
    for output in tf.nest.flatten(outputs):
        found += [output, logits_of(output)]
    return found


def logits_of(output: Any) -> Any:
    """An output's logits, as a Keras crossentropy finds them (see ``loss_inputs``); else the output."""
    logits = getattr(output, "_keras_logits", None)
    if logits is not None:
        return logits
    op = getattr(output, "op", None)  # eager tensors have no op
    return op.inputs[0] if op is not None and op.type in ("Softmax", "Sigmoid") else output
