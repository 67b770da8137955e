"""Keras 2 eager backend: tf.keras 2.2-2.15 and tf_keras, mirroring that version's ``train_step``.

The batch goes through the version's own data adapter, the loss is ``compute_loss`` (2.8+) or
``compiled_loss`` with the regularization losses, and the gradients go through the optimizer's
own scale -> gradient -> unscale -> aggregate -> clip. The step is one cached ``tf.function``.
"""

import weakref
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from .. import _paths, versions
from .._cache import cached
from .._types import Model, ModelRef
from ..arguments import Batch
from ..arrays import to_numpy
from ..detect import Flavour
from ..errors import InvalidArgumentError
from . import Request, Result, Step, StepOutput, custom_step
from ._distribute import distributed_step, strategy_of
from ._forward import Forward, loss_inputs
from ._state import PreservedState
from ._steps import Keras2Steps


def gradients(model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
    class_weight = request.class_weight
    adapter = _paths.load(flavour.root, "data_adapter")
    floatx = _paths.load(flavour.root, "backend").floatx()

    def convert(part: Any) -> Any:
        """As single_batch_iterator converts the batch for train_on_batch, minus the tf.data round trip.

        A plain array takes the adapter's rule directly (floats to floatx) and goes into the step as
        it is: tf.convert_to_tensor would copy it, the step's own argument conversion does not (or
        once, where it is not aligned). Tensors pass; other leaves (pandas, scipy) take the adapter.
        """
        if isinstance(part, np.ndarray):
            return part.astype(floatx, copy=False) if part.dtype.kind == "f" else part
        return part if part is None or tf.is_tensor(part) else adapter._process_tensorlike(part)

    x, y, sample_weight = convert(batch.x), convert(batch.y), convert(batch.sample_weight)
    if class_weight:
        targets = (y,) if sample_weight is None else (y, sample_weight)
        try:  # the map function reads the targets' ranks: tensors
            x, y, sample_weight = adapter._make_class_weight_map_fn(class_weight)(
                x, *tf.nest.map_structure(tf.convert_to_tensor, targets)
            )
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
            raise InvalidArgumentError(
                "class_weight", "a dict {class index: weight} for a single-output model", str(error)
            ) from error

    if flavour.custom_step:
        packed = adapter.pack_x_y_sample_weight(x, y, sample_weight)  # as fit hands the step its batch
        return custom_step.gradients(model, Keras2Steps, request, packed)
    data = (x, y) if sample_weight is None else (x, y, sample_weight)
    grads, loss, loss_scale = traced_step(model, flavour, request, len(data))(*data)
    return Result([to_numpy(g) for g in grads], loss, loss_scale)


def traced_step(model: Model, flavour: Flavour, request: Request, arity: int) -> Step:
    """The step as one cached ``tf.function`` of ``(x, y)`` or ``(x, y, sample_weight)`` (``arity``).

    It reads the trainable variables when it is traced, as Keras' train function does: a change of
    ``trainable`` takes effect for both on recompile, which replaces the state.
    """
    key = ("keras2", *request.key(), request.training, arity)
    state = (model.optimizer, model.compiled_loss)
    return cached(
        model,
        key,
        state,
        lambda: _build(
            weakref.ref(model),
            _paths.load(flavour.root, "data_adapter"),
            Forward(model, request.tensors),
            request,
            strategy_of(model),
            arity,
        ),
    )


def build(model: Model, flavour: Flavour, batch: Batch) -> None:
    """Build the model as its train step does on the first batch: by calling it."""
    model(batch.x, training=False)


def _build(
    model_ref: ModelRef,
    adapter: Any,
    forward: Forward,
    request: Request,
    strategy: Optional[Any],
    arity: int,
) -> Step:
    variables, training = request.variables, request.training

    def step(*data: Any) -> StepOutput:  # (x, y) or (x, y, sample_weight), as train_step's data
        model = model_ref()
        if versions.expands_1d(adapter):
            data = adapter.expand_1d(data)
        x, y, sample_weight = adapter.unpack_x_y_sample_weight(data)
        steps = Keras2Steps(model.optimizer)

        preserved = PreservedState(model, training)
        with forward.tape(variables, x) as tape:
            tape.watch(variables)  # non-trainable variables are not watched by default
            activations, y_pred = forward(model, tape, x, training)
            if request.output_grads:
                activations += loss_inputs(y_pred)
            loss = _loss(model, x, y, y_pred, sample_weight)
            scaled_loss = steps.scale(loss)
        grads = steps.gradients(
            scaled_loss,
            variables,
            model.trainable_variables,
            tape.gradient,
            request.clip,
            activations,
            request.sparse,
        )
        preserved.restore()
        return grads, loss, steps.loss_scale()

    if strategy is not None:  # as single_batch_iterator: the batch split across the replicas
        return _paths.relaxed_function(
            distributed_step(strategy, step, len(request.tensors), "concat"), arity
        )
    return _paths.relaxed_function(step, arity)


def _loss(model: Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> tf.Tensor:
    if versions.has_compute_loss(model):  # possibly overridden by the user
        return model.compute_loss(x, y, y_pred, sample_weight)
    return model.compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)
