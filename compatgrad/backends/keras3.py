"""Keras 3 backend (TensorFlow backend, eager), mirroring ``keras.src.backend.tensorflow.trainer``.

The loss is ``_compute_loss(..., training=)`` (3.4+) or ``compute_loss``, scaled by the optimizer's
``scale_loss``; gradients are unscaled, clipped and aggregated as ``BaseOptimizer.apply`` does.
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
from ..data import is_distributed
from ..detect import Flavour
from ..errors import UnsupportedModelError
from . import Request, Result, Step, StepOutput, custom_step
from . import _keras3_optimizer as keras3_optimizer
from ._distribute import distributed_step, strategy_of
from ._forward import Forward, loss_inputs
from ._keras3_loss import build_compiled_loss, compiled_loss, sample_weights
from ._state import PreservedState
from ._steps import Keras3Steps


def gradients(model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
    x, y, sample_weight = (_to_tensors(part) for part in (batch.x, batch.y, batch.sample_weight))
    if request.class_weight:
        sample_weight = tf.convert_to_tensor(
            sample_weights(flavour.root, y, sample_weight, request.class_weight)
        )

    if keras3_optimizer.accumulation_steps(model.optimizer) and strategy_of(model) is not None:
        raise UnsupportedModelError(
            "model.optimizer: accumulates gradients under a distribution strategy, which compatgrad "
            "does not support yet; use gradient_accumulation_steps=None"
        )
    if flavour.custom_step:
        utils = _paths.load(flavour.root, "data_adapter_utils")
        packed = utils.pack_x_y_sample_weight(x, y, sample_weight)  # as fit hands the step its batch
        result = custom_step.gradients(model, Keras3Steps, request, packed)
    else:
        strategy = strategy_of(model)
        if strategy is not None:
            with strategy.scope():  # as train_on_batch does under a strategy (_maybe_symbolic_build)
                build_compiled_loss(
                    model,
                    _paths.load(flavour.root, "backend"),
                    (batch.x, batch.y, batch.sample_weight),
                    tf.nest.map_structure,
                    lambda value: value.values[0] if is_distributed(value) else value,  # one replica's part
                )
        result = _compiled_step_gradients(model, flavour, request, x, y, sample_weight)
    return result._replace(applies_update=keras3_optimizer.applies_update(model.optimizer))


def _compiled_step_gradients(
    model: Model,
    flavour: Flavour,
    request: Request,
    x: Any,
    y: Any,
    sample_weight: Any,
) -> Result:
    data = (x, y) if sample_weight is None else (x, y, sample_weight)
    grads, loss, loss_scale = traced_step(model, flavour, request, len(data))(*data)
    return Result([to_numpy(g) for g in grads], loss, loss_scale)


def traced_step(model: Model, flavour: Flavour, request: Request, arity: int) -> Step:
    """The step as one cached ``tf.function`` of ``(x, y)`` or ``(x, y, sample_weight)`` (``arity``).

    Trainable variables are read when it is traced, as by Keras' train function (see keras2). An
    unbuilt LossScaleOptimizer scales by its initial scale, a built one by its dynamic scale
    variable: each gets a step of its own.
    """
    key = ("keras3", *request.key(), request.training, model.optimizer.built, arity)
    state = (model.optimizer, model._compile_loss)
    return cached(
        model,
        key,
        state,
        lambda: _build(
            weakref.ref(model),
            flavour,
            Forward(model, request.tensors),
            request,
            strategy_of(model),
            arity,
        ),
    )


def build(model: Model, flavour: Flavour, batch: Batch) -> None:
    """Build the model (its metrics, loss and optimizer too) from its first batch, as train_on_batch
    does under a strategy (without one it builds in its first trace, to the same weights)."""
    with model.distribute_strategy.scope():  # a strategy's model gets mirrored variables
        model._symbolic_build(data_batch=(batch.x, batch.y, batch.sample_weight))


def _to_tensors(part: Any) -> Any:
    """Arrays go into the step as they are: tf.convert_to_tensor would copy them, the step's own
    argument conversion does not (or once, where an array is not aligned). Only lists and dicts
    go through tf.nest, which costs more than the rest of the call."""
    if isinstance(part, (list, tuple, dict)):
        return tf.nest.map_structure(_to_tensors, part)
    return (
        part
        if part is None or isinstance(part, np.ndarray) or is_distributed(part)
        else tf.convert_to_tensor(part)
    )


def _build(
    model_ref: ModelRef,
    flavour: Flavour,
    forward: Forward,
    request: Request,
    strategy: Optional[Any],
    arity: int,
) -> Step:
    variables, training = request.variables, request.training
    losses_divided = versions.divides_loss_by_replicas(_paths.load(flavour.root, "losses"))

    def step(x: Any, y: Any, sample_weight: Any = None) -> StepOutput:
        model = model_ref()
        steps = Keras3Steps(model.optimizer)
        preserved = PreservedState(model, training)
        with forward.tape(variables, x) as tape:
            tape.watch([v.value for v in variables])  # non-trainable variables are not watched by default
            activations, y_pred = forward(model, tape, x, training)
            if request.output_grads:
                activations += loss_inputs(y_pred)
            loss = compiled_loss(model, x, y, y_pred, sample_weight, training)
            scaled_loss = steps.scale(loss)
        grads = steps.gradients(
            scaled_loss,
            variables,
            model.trainable_weights,
            tape.gradient,
            request.clip,
            activations,
            request.sparse,
        )
        preserved.restore()
        return grads, loss, steps.loss_scale()

    if strategy is not None:  # as train_on_batch: every replica gets the whole batch
        combine = "sum" if losses_divided else "first"  # each replica's share of the loss, or all of it
        return _paths.relaxed_function(distributed_step(strategy, step, len(request.tensors), combine), arity)
    return _paths.relaxed_function(step, arity)
