"""The front door: validate the arguments, pick the backend from the model itself, run it."""
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import inputs
from .backends import Request
from .detect import Flavour, flavour_of, keras3_backend
from .errors import ModeError, UnconnectedGradientError, UnsupportedModelError


class GradientInfo(NamedTuple):
    loss: float  # the loss the step minimizes, unscaled, regularization included
    loss_scale: float  # the mixed-precision loss scale in force; 1.0 without loss scaling
    all_finite: bool  # False where a loss-scaled step would skip its update (overflow)


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
) -> Union[List[np.ndarray], Tuple[List[np.ndarray], GradientInfo]]:
    """The gradients the model's own training step would apply for this batch, as numpy arrays.

    ``params`` defaults to ``model.trainable_weights``; the result has one array per param, in order.
    ``learning_phase`` 1 runs Dropout / BatchNormalization as in training. The result is unscaled
    (mixed precision), aggregated across replicas and clipped by the optimizer's clipnorm /
    clipvalue / global_clipnorm as that version clips; ``clip=False`` returns it before clipping.
    ``unconnected='zero'`` returns zeros for params the loss does not depend on instead of raising.
    ``return_info=True`` returns ``(grads, GradientInfo)``: the loss, the loss scale in force and
    whether every gradient is finite (where it is not, the step would skip its update).
    """
    flavour = flavour_of(model)
    inputs.check_compiled(model)
    training = inputs.check_learning_phase(learning_phase)
    unconnected = inputs.check_unconnected(unconnected)
    params = inputs.check_params(model, params)
    batch = inputs.check_batch(model, x, y, sample_weight)
    backend = _backend(model, flavour)
    result = backend.gradients(model, flavour, Request(batch, params, training, bool(clip), class_weight))
    missing = [p for p, g in zip(params, result.grads) if g is None]
    if missing and unconnected == "raise":
        raise UnconnectedGradientError(
            "params",
            "params the loss depends on (or unconnected='zero')",
            "no gradient for {}".format(", ".join(inputs.name_of(p) for p in missing)),
        )
    grads = [_zeros_like(p) if g is None else g for p, g in zip(params, result.grads)]
    if not return_info:
        return grads
    finite = all(np.isfinite(g).all() for g in grads)
    return grads, GradientInfo(result.loss, result.loss_scale, bool(finite))


def _zeros_like(variable: Any) -> np.ndarray:
    dtype = getattr(variable.dtype, "as_numpy_dtype", variable.dtype)
    return np.zeros(tuple(variable.shape), dtype=dtype)


def _backend(model: Any, flavour: Flavour) -> Any:
    if flavour.name == "keras3":
        return _keras3_backend(flavour)
    tf = sys.modules["tensorflow"]
    eager = tf.executing_eagerly()
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
