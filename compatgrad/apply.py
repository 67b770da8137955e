"""``apply_gradients``: gradients validated against the variables, then applied by any flavour's optimizer."""

from typing import Any, List, Optional, Sequence

import numpy as np

from . import _paths, versions
from ._cache import cached
from ._types import Variable
from .arguments import name_of
from .arrays import SparseGradient, numpy_dtype, static_shape
from .backends import require_tensorflow
from .errors import InvalidArgumentError, InvalidTypeError
from .masks import _sequence, mask_gradients


def apply_gradients(
    optimizer: Any,
    grads: Sequence[Any],
    variables: Sequence[Any],
    masks: Optional[Sequence[Any]] = None,
    missing: str = "raise",
) -> None:
    """One optimizer update of ``variables`` by ``grads`` (as ``get_gradients`` returns them), after
    checking they pair up.

    Raises before touching anything if the counts differ, a shape does not match its variable, or a
    gradient is None (``missing="zero"`` applies zeros instead). ``masks`` are applied first, as
    ``mask_gradients`` does. Eager: ``optimizer.apply_gradients`` (Keras 2) or ``optimizer.apply``
    (Keras 3, given back the loss scale it divides by). Graph mode: the update op is built once per
    optimizer and variables (again when a variable's constraint changes) and run in their session.
    The optimizer clips as it always does; clipping gradients that ``get_gradients`` clipped changes nothing.
    """
    grads = _sequence("grads", grads)
    variables = _sequence("variables", variables)
    if missing not in ("raise", "zero"):
        raise InvalidArgumentError("missing", "'raise' or 'zero'", repr(missing))
    if len(grads) != len(variables):
        raise InvalidArgumentError(
            "grads",
            f"{len(variables)} gradients, one per variable",
            f"{len(grads)} gradients",
        )
    checked = [
        _check(index, grad, variable, missing) for index, (grad, variable) in enumerate(zip(grads, variables))
    ]
    if masks is not None:
        checked = mask_gradients(checked, masks)

    require_tensorflow(type(optimizer).__module__, "apply_gradients", "optimizer")
    import tensorflow as tf

    if not tf.executing_eagerly():
        _apply_in_session(
            optimizer, [g.dense() if isinstance(g, SparseGradient) else g for g in checked], variables
        )
    elif versions.has_keras3_apply(optimizer):
        from .backends import _keras3_optimizer

        if not optimizer.built:
            optimizer.build(variables)
        tensors = [_tensor(tf, g, v) for g, v in zip(checked, variables)]
        for scale in _keras3_optimizer.loss_scales(optimizer):
            tensors = [g * tf.cast(scale, g.dtype) for g in tensors]
        optimizer.apply(tensors, variables)
    else:
        optimizer.apply_gradients(
            list(zip([_tensor(tf, g, v) for g, v in zip(checked, variables)], variables))
        )


def _check(index: int, grad: Any, variable: Variable, missing: str) -> Any:
    expected = static_shape(variable)
    argument = f"grads[{index}] (for {name_of(variable)})"
    if grad is None:
        if missing == "raise":
            raise InvalidArgumentError(
                argument, f"a gradient of shape {expected} (or missing='zero')", "None"
            )
        return np.zeros(expected, dtype=numpy_dtype(variable))
    if isinstance(grad, SparseGradient):
        shape = tuple(grad.dense_shape)
    elif hasattr(grad, "shape"):
        shape = tuple(np.shape(grad))
    else:
        raise InvalidTypeError(argument, f"an array of shape {expected}", type(grad).__name__)
    if shape != expected:
        raise InvalidArgumentError(argument, f"shape {expected}", f"shape {shape}")
    return grad


def _tensor(tf: Any, grad: Any, variable: Variable) -> Any:
    dtype = numpy_dtype(variable)
    if isinstance(grad, SparseGradient):
        return tf.IndexedSlices(
            tf.constant(grad.values, dtype=dtype),
            tf.constant(grad.indices),
            tf.constant(grad.dense_shape, dtype="int64"),
        )
    return tf.convert_to_tensor(np.asarray(grad, dtype=dtype))


def _apply_in_session(optimizer: Any, grads: List[np.ndarray], variables: List[Variable]) -> None:
    key = ("apply", tuple(id(v) for v in variables))
    state = tuple(getattr(v, "constraint", None) for v in variables)
    update = cached(optimizer, key, state, lambda: _build_update(optimizer, variables))
    update([np.asarray(g, dtype=numpy_dtype(v)) for g, v in zip(grads, variables)])


def _build_update(optimizer: Any, variables: List[Variable]) -> Any:
    """A K.function running ``optimizer.get_updates`` on a loss whose gradient is exactly the fed gradients.

    ``get_updates(loss, params)`` is the one update method every graph-mode optimizer has (standalone
    Keras, OptimizerV2): the gradient of sum(g * v) with respect to v is g, bit for bit.
    """
    import tensorflow as tf

    K = _paths.load(_optimizer_root(optimizer), "backend")
    with variables[0].graph.as_default():
        feeds = [tf.compat.v1.placeholder(v.dtype.base_dtype, shape=v.shape) for v in variables]
        loss = tf.add_n([tf.reduce_sum(g * v) for g, v in zip(feeds, variables)])
        updates = optimizer.get_updates(loss=loss, params=variables)
        return K.function(feeds, [loss], updates=updates)  # K.function needs an output


def _optimizer_root(optimizer: Any) -> str:
    """The Keras package root of the optimizer's class, or of the first of its bases that has one."""
    for cls in type(optimizer).__mro__:
        root = versions.keras_root(getattr(cls, "__module__", "") or "")
        if root is not None:
            return root
    raise InvalidTypeError("optimizer", "a Keras optimizer", type(optimizer).__name__)
