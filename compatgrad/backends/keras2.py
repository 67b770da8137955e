"""Keras 2 eager backend: tf.keras 2.2-2.15 and tf_keras, mirroring that version's ``train_step``.

The batch goes through the version's own data adapter, the loss is ``compute_loss`` (2.8+) or
``compiled_loss`` with the regularization losses, and the gradients go through the optimizer's
own scale -> gradient -> unscale -> aggregate -> clip. The step is one cached ``tf.function``.
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
from ._steps import Keras2Steps


def gradients(model: Any, flavour: Flavour, request: Request) -> Result:
    batch, params, training, clip, class_weight = request
    adapter = _paths.load(flavour.root, "data_adapter")
    # As single_batch_iterator prepares the batch for train_on_batch, minus the tf.data round trip.
    x, y, sample_weight = adapter._process_tensorlike((batch.x, batch.y, batch.sample_weight))
    if class_weight:
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        try:
            x, y, sample_weight = adapter._make_class_weight_map_fn(class_weight)(*data)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
            raise InvalidArgumentError("class_weight", "a dict {class index: weight} for a single-output model", str(error)) from error

    trainable = model.trainable_variables
    key = ("keras2", tuple(id(p) for p in params), tuple(id(v) for v in trainable), training, clip)
    state = (model.optimizer, model.compiled_loss)
    step = cached(model, key, state, lambda: _build(weakref.ref(model), adapter, params, training, clip))
    grads, loss, loss_scale = step(x, y, sample_weight)
    return Result([None if g is None else g.numpy() for g in grads], float(loss), float(loss_scale))


def _build(model_ref: "weakref.ref", adapter: Any, params: Sequence[Any], training: bool, clip: bool) -> Any:
    def step(x: Any, y: Any, sample_weight: Any) -> tuple:
        model = model_ref()
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        if hasattr(adapter, "expand_1d"):  # train_step of TF 2.2-2.6 expands 1-D arrays
            data = adapter.expand_1d(data)
        x, y, sample_weight = adapter.unpack_x_y_sample_weight(data)
        steps = Keras2Steps(model.optimizer)

        preserved = PreservedState(model, training)
        with tf.GradientTape() as tape:
            tape.watch(params)  # non-trainable params are not watched by default
            y_pred = model(x, training=training)
            loss = _loss(model, x, y, y_pred, sample_weight)
            scaled_loss = steps.scale(loss)
        grads = steps.gradients(scaled_loss, params, model.trainable_variables, tape.gradient, clip)
        preserved.restore()
        return grads, loss, steps.scale(tf.ones_like(loss))

    return _paths.relaxed_function(step)


def _loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    if hasattr(model, "compute_loss"):  # Keras >= 2.8, possibly overridden by the user
        return model.compute_loss(x, y, y_pred, sample_weight)
    return model.compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)
