"""Keras 2 eager backend: tf.keras 2.2-2.15 and tf_keras, mirroring that version's ``train_step``.

The batch goes through the version's own data adapter, the loss is ``compute_loss`` (2.8+) or
``compiled_loss`` with the regularization losses, and the gradients go through the optimizer's
own scale -> gradient -> unscale -> aggregate -> clip. The step is one cached ``tf.function``.
"""
import weakref
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from .. import _paths
from .._cache import cached
from ..arrays import to_numpy
from ..detect import Flavour
from ..errors import InvalidArgumentError
from . import Request, Result
from ._distribute import distributed_step, strategy_of
from ._forward import Forward
from ._state import PreservedState
from ._steps import Keras2Steps


def gradients(model: Any, flavour: Flavour, request: Request) -> Result:
    batch, class_weight = request.batch, request.class_weight
    adapter = _paths.load(flavour.root, "data_adapter")
    floatx = _paths.load(flavour.root, "backend").floatx()

    def convert(part: Any) -> Any:
        """As single_batch_iterator converts the batch for train_on_batch, minus the tf.data round trip.

        A plain array takes the adapter's rule directly (floats to floatx): its per-leaf checks
        (pandas, scipy, which a None costs a failed import) cost more than the conversion.
        """
        if isinstance(part, np.ndarray):
            return tf.convert_to_tensor(part, dtype=floatx if np.issubdtype(part.dtype, np.floating) else None)
        return None if part is None else adapter._process_tensorlike(part)

    x, y, sample_weight = convert(batch.x), convert(batch.y), convert(batch.sample_weight)
    if class_weight:
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        try:
            x, y, sample_weight = adapter._make_class_weight_map_fn(class_weight)(*data)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
            raise InvalidArgumentError("class_weight", "a dict {class index: weight} for a single-output model", str(error)) from error

    trainable = model.trainable_variables
    key = ("keras2", tuple(id(p) for p in request.params), tuple(id(t) for t in request.tensors),
           tuple(id(v) for v in trainable), request.training, request.clip, request.sparse)
    state = (model.optimizer, model.compiled_loss)
    step = cached(model, key, state, lambda: _build(weakref.ref(model), adapter, Forward(model, request.tensors), request, strategy_of(model)))
    grads, loss, loss_scale = step(x, y) if sample_weight is None else step(x, y, sample_weight)
    return Result([to_numpy(g) for g in grads], float(loss), float(loss_scale))


def _build(model_ref: "weakref.ref", adapter: Any, forward: Forward, request: Request, strategy: Optional[Any]) -> Any:
    params, training = request.params, request.training

    def step(x: Any, y: Any, sample_weight: Any = None) -> tuple:
        model = model_ref()
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        if hasattr(adapter, "expand_1d"):  # train_step of TF 2.2-2.6 expands 1-D arrays
            data = adapter.expand_1d(data)
        x, y, sample_weight = adapter.unpack_x_y_sample_weight(data)
        steps = Keras2Steps(model.optimizer)

        preserved = PreservedState(model, training)
        with forward.tape(params, x) as tape:
            tape.watch(params)  # non-trainable params are not watched by default
            activations, y_pred = forward(model, tape, x, training)
            loss = _loss(model, x, y, y_pred, sample_weight)
            scaled_loss = steps.scale(loss)
        grads = steps.gradients(scaled_loss, params, model.trainable_variables, tape.gradient, request.clip, activations, request.sparse)
        preserved.restore()
        return grads, loss, steps.scale(tf.ones_like(loss))

    if strategy is not None:  # as single_batch_iterator: the batch split across the replicas
        return _paths.relaxed_function(distributed_step(strategy, step, len(request.tensors), "concat"))
    return _paths.relaxed_function(step)


def _loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    if hasattr(model, "compute_loss"):  # Keras >= 2.8, possibly overridden by the user
        return model.compute_loss(x, y, y_pred, sample_weight)
    return model.compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)
