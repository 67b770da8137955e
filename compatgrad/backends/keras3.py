"""Keras 3 backend (TensorFlow backend, eager), mirroring ``keras.src.backend.tensorflow.trainer``.

The loss is ``_compute_loss(..., training=)`` (3.4+) or ``compute_loss``, scaled by the optimizer's
``scale_loss``; gradients are unscaled, clipped and aggregated as ``BaseOptimizer.apply`` does.
"""
import weakref
from typing import Any, Sequence

import tensorflow as tf

from .. import _paths
from .._cache import cached
from ..detect import Flavour
from ..errors import InvalidArgumentError
from . import Request, Result
from ._state import PreservedState
from ._steps import Keras3Steps


def gradients(model: Any, flavour: Flavour, request: Request) -> Result:
    batch, params, training, clip, class_weight = request
    x, y, sample_weight = tf.nest.map_structure(_to_tensor, (batch.x, batch.y, batch.sample_weight))
    if class_weight:
        if sample_weight is not None:
            raise InvalidArgumentError("class_weight", "no sample_weight next to it (Keras 3 takes one or the other)", "both")
        utils = _paths.load(flavour.root, "data_adapter_utils")
        sample_weight = tf.convert_to_tensor(utils.class_weight_to_sample_weights(y, class_weight))

    # An unbuilt LossScaleOptimizer scales by its initial scale, a built one by its dynamic scale variable.
    built = model.optimizer.built
    key = ("keras3", tuple(id(p) for p in params), tuple(id(v) for v in model.trainable_weights), training, clip, built)
    state = (model.optimizer, model._compile_loss)
    step = cached(model, key, state, lambda: _build(weakref.ref(model), params, training, clip))
    grads, loss, loss_scale = step(x, y, sample_weight)
    return Result([None if g is None else g.numpy() for g in grads], float(loss), float(loss_scale))


def _to_tensor(value: Any) -> Any:
    return value if value is None else tf.convert_to_tensor(value)


def _build(model_ref: "weakref.ref", params: Sequence[Any], training: bool, clip: bool) -> Any:
    def step(x: Any, y: Any, sample_weight: Any) -> tuple:
        model = model_ref()
        steps = Keras3Steps(model.optimizer)
        preserved = PreservedState(model, training)
        with tf.GradientTape() as tape:
            tape.watch([p.value for p in params])  # non-trainable params are not watched by default
            y_pred = model(x, training=training) if model._call_has_training_arg else model(x)
            loss = _loss(model, x, y, y_pred, sample_weight, training)
            scaled_loss = steps.scale(loss)
        grads = steps.gradients(scaled_loss, params, model.trainable_weights, tape.gradient, clip)
        preserved.restore()
        return grads, loss, steps.scale(tf.ones_like(loss))

    return _paths.relaxed_function(step)


def _loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool) -> tf.Tensor:
    if hasattr(model, "_compute_loss"):  # Keras >= 3.4: calls compute_loss with training where it takes it
        return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
