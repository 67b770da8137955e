"""The front door: validate the arguments, pick the backend from the model itself, run it."""
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import data, inputs, targets
from .arrays import SparseGradient, numpy_dtype, static_shape
from .backends import Request
from .detect import Flavour, flavour_of, keras3_backend
from .errors import InvalidArgumentError, ModeError, UnconnectedGradientError, UnsupportedModelError


class GradientInfo(NamedTuple):
    loss: float  # the loss the step minimizes, unscaled, regularization included
    loss_scale: float  # the mixed-precision loss scale in force; 1.0 without loss scaling
    all_finite: bool  # False where a loss-scaled step would skip its update (overflow)
    # False where the optimizer accumulates gradients (Keras 3 gradient_accumulation_steps) and this
    # step only adds them to its accumulators; True for whole datasets.
    applies_update: bool = True


def get_gradients(
    model: Any,
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
    ``unconnected='zero'`` returns zeros for params the loss does not depend on instead of raising.
    ``return_info=True`` returns ``(grads, GradientInfo)``: the loss, the loss scale in force and
    whether every gradient is finite (where it is not, the step would skip its update).

    ``x`` may also be a ``tf.data.Dataset`` (distributed or not), a generator or a Keras
    ``Sequence`` / ``PyDataset`` yielding ``(x, y)`` or ``(x, y, sample_weight)`` (then ``y`` is
    None): the gradient over all its batches (the first ``steps``), as on the concatenated data,
    with a progress bar unless ``verbose=0``. See ``compatgrad.data`` for how batches add up.
    """
    flavour = flavour_of(model)
    inputs.check_compiled(model, flavour.custom_step, losses_listed=flavour.name != "keras3")
    training = inputs.check_learning_phase(learning_phase)
    unconnected = inputs.check_unconnected(unconnected)
    backend = _backend(model, flavour)
    dataset = data.is_dataset(x)

    def make_batch(x: Any, y: Any, sample_weight: Any) -> inputs.Batch:
        distributed = data.distributed_batch(x, y, sample_weight)
        return distributed or inputs.check_batch(model, x, y, sample_weight, flavour.custom_step)

    batch = None if dataset else make_batch(x, y, sample_weight)
    # A custom train_step builds what it calls, which need not be model(x): its models come built.
    if not model.built and not flavour.custom_step:
        if batch is None:
            raise InvalidArgumentError(
                "model",
                "a built model for a whole dataset (build it, or pass one batch first)",
                "a model not built yet",
            )
        backend.build(model, flavour, batch)  # as train_on_batch builds it from its first batch
    wanted = targets.resolve(model, params)

    def batch_gradients(batch: inputs.Batch) -> Tuple[List[Any], Optional[GradientInfo]]:
        request = Request(batch, wanted.variables, wanted.tensors, training, bool(clip), class_weight, bool(sparse))
        result = backend.gradients(model, flavour, request)
        found = wanted.arrange(result.grads)
        missing = [name for name, g in zip(wanted.names, found) if g is None]
        if missing and unconnected == "raise":
            _raise_unconnected(model, flavour, wanted, found, missing)
        grads = [_zeros_like(p, batch.size) if g is None else g for p, g in zip(wanted.params, found)]
        if not (return_info or dataset):  # reading the loss and a pass over every gradient: only when used
            return grads, None
        finite = return_info and all(np.isfinite(g.values if isinstance(g, SparseGradient) else g).all() for g in grads)
        return grads, GradientInfo(
            float(result.loss),
            float(result.loss_scale),
            bool(finite),
            result.applies_update,
        )

    if dataset:
        if flavour.custom_step:
            raise InvalidArgumentError(
                "x",
                "one batch for a model that overrides train_step (its step has no loss compatgrad "
                "could add up over a dataset's batches)",
                type(x).__name__,
            )
        data.check_dataset_arguments(y, sample_weight, sparse, wanted.tensors)
        grads, loss, loss_scale, finite = data.over_dataset(model, flavour.root, x, steps, verbose, make_batch, batch_gradients)
        info = GradientInfo(loss, loss_scale, finite)
    else:
        data.check_not_dataset_arguments(steps)
        grads, info = batch_gradients(batch)
    output: Any = dict(zip(wanted.names, grads)) if as_dict else grads
    return (output, info) if return_info else output


def _raise_unconnected(
    model: Any,
    flavour: Flavour,
    wanted: targets.Targets,
    found: List[Any],
    missing: List[str],
) -> None:
    """Names what has no gradient; for a layer output, the likeliest cause: every Keras computes a
    crossentropy from the logits under a softmax / sigmoid output."""
    if flavour.custom_step:
        raise UnconnectedGradientError(
            "params",
            "variables the model's train_step applies a gradient to (or unconnected='zero')",
            "no gradient applied to {}".format(", ".join(missing)),
        )
    inputs_ = {id(t) for t in getattr(model, "inputs", None) or []}
    tensors = {id(t) for t in wanted.tensors if id(t) not in inputs_}
    hint = any(g is None and id(p) in tensors for p, g in zip(wanted.params, found))
    raise UnconnectedGradientError("params", "params the loss depends on (or unconnected='zero')", "no gradient for {}{}".format(
        ", ".join(missing), " (Keras computes a crossentropy from the logits under a softmax or sigmoid output, "
        "so that output has none; ask for the logits)" if hint else ""))


def _zeros_like(param: Any, batch_size: int) -> np.ndarray:
    """Zeros for an unconnected variable, or for an unconnected tensor of this batch."""
    shape = list(static_shape(param))
    if shape and shape[0] is None:  # a graph tensor: the batch comes first
        shape[0] = batch_size
    if any(d is None for d in shape):
        raise UnconnectedGradientError("params", "a tensor of known shape to fill with zeros", "{} of shape {}".format(inputs.name_of(param), tuple(param.shape)))
    return np.zeros(shape, dtype=numpy_dtype(param))


def _backend(model: Any, flavour: Flavour) -> Any:
    """The backend module for this flavour in the current mode; only a supported pair is remembered."""
    tf = sys.modules.get("tensorflow")  # absent only for a Keras 3 model on another backend
    key = (flavour, tf is not None and tf.executing_eagerly())
    backend = _BACKENDS.get(key)
    if backend is None:
        backend = _BACKENDS[key] = _choose_backend(model, flavour, key[1])
    return backend


_BACKENDS: Dict[Tuple[Flavour, bool], Any] = {}


def _choose_backend(model: Any, flavour: Flavour, eager: bool) -> Any:
    if flavour.name == "keras3":
        return _keras3_backend(flavour)
    tf = sys.modules["tensorflow"]
    if flavour.graph and not eager:
        from .backends import graph

        return graph
    if flavour.graph:
        if flavour.name == "keras":
            raise UnsupportedModelError("model: standalone Keras is supported in graph mode (TF 1.x) only")
        if hasattr(model, "train_step"):  # a training_v1 model: built while eager execution was disabled
            raise ModeError("model: built in graph mode, but eager execution is on now; build and use the model in one mode")
        raise UnsupportedModelError(
            "model: this Keras has no train_step (TF < 2.2), so only its graph mode can be matched; "
            "call tf.compat.v1.disable_eager_execution() before building the model"
        )
    if not eager:
        _raise_not_eager(tf, "model: built in eager mode, but eager execution is disabled now; call "
                         "tf.compat.v1.disable_eager_execution() before building the model to use graph mode")
    from .backends import keras2

    return keras2


def _keras3_backend(flavour: Flavour) -> Any:
    name = keras3_backend(flavour.root)
    if name != "tensorflow":
        raise UnsupportedModelError("model: expected a Keras 3 model on the TensorFlow backend, got the {!r} backend".format(name))
    import tensorflow as tf

    if not tf.executing_eagerly():
        _raise_not_eager(tf, "model: Keras 3 cannot train in graph mode (its train_on_batch returns an unevaluated tensor), "
                         "so no gradient could match its step; run eagerly, or use tf_keras (TF_USE_LEGACY_KERAS=1) for graph mode")
    from .backends import keras3

    return keras3


def _raise_not_eager(tf: Any, graph_mode_message: str) -> None:
    if getattr(tf.compat.v1, "executing_eagerly_outside_functions", lambda: False)():
        raise ModeError("get_gradients returns numpy arrays, so it cannot run inside a tf.function")
    raise ModeError(graph_mode_message)
