"""The front door: validate the arguments, let ``backends`` pick the engine from the model itself, run it."""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from . import arguments, data, sources
from ._types import Model
from .arrays import SparseGradient, numpy_dtype, static_shape
from .backends import Request, engine_for
from .detect import Flavour, flavour_of
from .errors import InvalidArgumentError, UnconnectedGradientError


class GradientInfo(NamedTuple):
    loss: float  # the loss the step minimizes, unscaled, regularization included
    loss_scale: float  # the mixed-precision loss scale in force; 1.0 without loss scaling
    all_finite: bool  # False where a loss-scaled step would skip its update (overflow)
    # False where the optimizer accumulates gradients (Keras 3 gradient_accumulation_steps) and this
    # step only adds them to its accumulators; True for whole datasets.
    applies_update: bool = True


def get_gradients(
    model: Model,
    x: Any,
    y: Any = None,
    params: Optional[Sequence[Any]] = None,
    sample_weight: Any = None,
    learning_phase: int = 0,
    *,
    class_weight: Optional[Dict[Any, float]] = None,
    clip: bool = True,
    unconnected: str = "raise",
    return_info: bool = False,
    as_dict: bool = False,
    sparse: bool = False,
    steps: Optional[int] = None,
    verbose: int = 1,
) -> Any:
    """The gradients the model's own training step would apply for this batch, as numpy arrays.

    ``params`` defaults to ``model.trainable_weights``; the result has one array per param, in order.
    Params may also be tensors of the model's graph: ``model.inputs`` and layer outputs
    (``layer.output``, or ``layer_outputs(model, names)``); their gradients have the tensor's shape
    with the batch first, unscaled and never clipped. ``as_dict=True`` returns ``{name: array}`` in
    params order (variable names; ``"<layer>/output"`` for tensors; repeats get " (2)", ...).
    Embedding gradients (``tf.IndexedSlices``) come dense, as large as the embedding matrix;
    ``sparse=True`` returns them as ``SparseGradient(values, indices, dense_shape)``.
    ``learning_phase`` 1 runs Dropout / BatchNormalization as in training. The result is unscaled
    (mixed precision), aggregated across replicas and clipped by the optimizer's clipnorm /
    clipvalue / global_clipnorm as that version clips; ``clip=False`` returns it before clipping.
    Params the loss does not depend on raise ``UnconnectedGradientError`` (its ``missing`` names
    them); ``unconnected='zero'`` returns zeros for them instead, ``unconnected='skip'`` None (with
    ``as_dict=True``, leaves them out).
    ``return_info=True`` returns ``(grads, GradientInfo)``: the loss, the loss scale in force and
    whether every gradient is finite (where it is not, the step would skip its update).

    ``x`` may also be a ``tf.data.Dataset`` (distributed or not), a generator or a Keras
    ``Sequence`` / ``PyDataset`` yielding ``(x, y)`` or ``(x, y, sample_weight)`` (then ``y`` is
    None): the gradient over all its batches (the first ``steps``), as on the concatenated data,
    with a progress bar unless ``verbose=0``. See ``compatgrad.data`` for how batches add up.
    """
    flavour = flavour_of(model)
    arguments.check_compiled(model, flavour.custom_step, losses_listed=flavour.name != "keras3")
    training = arguments.check_learning_phase(learning_phase)
    unconnected = arguments.check_unconnected(unconnected)
    engine = engine_for(model, flavour)
    dataset = data.is_dataset(x)
    batch = None
    if not dataset:
        data.check_not_dataset_arguments(steps)
        batch = data.distributed_batch(x, y, sample_weight) or arguments.check_batch(
            model,
            x,
            y,
            sample_weight,
            flavour.custom_step,
        )
    # A custom train_step builds what it calls, which need not be model(x): its models come built.
    if not model.built and not flavour.custom_step:
        if batch is None:
            raise InvalidArgumentError(
                "model",
                "a built model for a whole dataset (build it, or pass one batch first)",
                "a model not built yet",
            )
        engine.build(model, flavour, batch)  # as train_on_batch builds it from its first batch
    wanted = sources.resolve(model, params)
    request = Request(
        wanted.variables,
        wanted.tensors,
        training,
        bool(clip),
        class_weight,
        bool(sparse),
    )

    if batch is None:
        if flavour.custom_step:
            raise InvalidArgumentError(
                "x",
                "one batch for a model that overrides train_step (its step has no loss compatgrad "
                "could add up over a dataset's batches)",
                type(x).__name__,
            )
        data.check_dataset_arguments(y, sample_weight, sparse, wanted.tensors)
        result = data.over_dataset(model, flavour, engine, request, x, steps, verbose)
    else:
        result = engine.gradients(model, flavour, request, batch)

    size = 0 if batch is None else batch.size  # datasets take variables only: no batch-sized zeros
    grads = handle_unconnected(
        model,
        flavour,
        wanted,
        wanted.arrange(result.grads),
        unconnected,
        lambda name, param: _zeros_like(name, param, size),
    )
    output = as_output(wanted, grads, as_dict)
    if not return_info:  # reading the loss and a pass over every gradient: only when asked for
        return output
    info = GradientInfo(
        float(result.loss),
        float(result.loss_scale),
        all(_finite(g) for g in grads if g is not None),
        result.applies_update,
    )
    return output, info


def handle_unconnected(
    model: Model,
    flavour: Flavour,
    wanted: sources.Sources,
    grads: List[Any],
    unconnected: str,
    zeros: Callable[[str, Any], Any],
) -> List[Any]:
    """``grads`` (in params order) after ``unconnected``: "raise" naming the params without a gradient,
    "zero" filling theirs with ``zeros(name, param)``, "skip" leaving them None."""
    missing = {name: p for name, p, g in zip(wanted.names, wanted.params, grads) if g is None}
    if missing and unconnected == "raise":
        _raise_unconnected(model, flavour, wanted, grads, missing)
    if unconnected == "zero":
        return [zeros(name, p) if g is None else g for name, p, g in zip(wanted.names, wanted.params, grads)]
    return grads


def as_output(wanted: sources.Sources, grads: List[Any], as_dict: bool) -> Any:
    """The list, or ``{name: gradient}`` without the ones "skip" left None."""
    if as_dict:
        return {name: g for name, g in zip(wanted.names, grads) if g is not None}
    return grads


def _raise_unconnected(
    model: Model,
    flavour: Flavour,
    wanted: sources.Sources,
    found: List[Any],
    missing: Dict[str, Any],
) -> None:
    """Names what has no gradient; for a layer output, the likeliest cause: every Keras computes a
    crossentropy from the logits under a softmax / sigmoid output."""
    if flavour.custom_step:
        raise UnconnectedGradientError(
            "params",
            "variables the model's train_step applies a gradient to (or unconnected='zero')",
            "no gradient applied to {}".format(", ".join(missing)),
            missing,
        )
    model_inputs = {id(t) for t in getattr(model, "inputs", None) or []}
    tensors = {id(t) for t in wanted.tensors if id(t) not in model_inputs}
    hint = any(g is None and id(p) in tensors for p, g in zip(wanted.params, found))
    raise UnconnectedGradientError(
        "params",
        "params the loss depends on (or unconnected='zero')",
        "no gradient for {}{}".format(
            ", ".join(missing),
            " (Keras computes a crossentropy from the logits under a softmax or sigmoid output, "
            "so that output has none; ask for the logits)"
            if hint
            else "",
        ),
        missing,
    )


def _finite(grad: Any) -> bool:
    return bool(np.isfinite(grad.values if isinstance(grad, SparseGradient) else grad).all())


def _zeros_like(name: str, param: Any, batch_size: Optional[int]) -> np.ndarray:
    """Zeros for an unconnected variable, or for an unconnected tensor of this batch."""
    return np.zeros(zeros_shape(name, param, batch_size), dtype=numpy_dtype(param))


def zeros_shape(name: str, param: Any, batch_size: Any) -> List[Any]:
    """The shape of an unconnected param's zeros: a variable's, or a graph tensor's with
    ``batch_size`` (an int, or a tensor inside a step) first; raises where a size is unknown."""
    shape = list(static_shape(param))
    if shape and shape[0] is None:  # a graph tensor: the batch comes first
        shape[0] = batch_size
    if any(d is None for d in shape):
        raise UnconnectedGradientError(
            "params",
            "a tensor of known shape to fill with zeros",
            f"{arguments.name_of(param)} of shape {tuple(param.shape)}",
            {name: param},
        )
    return shape
