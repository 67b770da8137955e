"""Masking gradients, and freezing entries of a variable so that no optimizer moves them.

A zero gradient does not freeze an entry: momentum, Adam's moments and decoupled weight decay
(AdamW) still move it. ``freeze`` instead wraps the variable's constraint, which every Keras
optimizer applies after its update (OptimizerV2, optimizer.Optimizer, Keras 3, standalone
Keras 2.2-2.3): the frozen entries are put back to their saved values, bit for bit.
"""

import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import numpy as np

from . import versions
from ._types import Variable
from .arguments import name_of
from .arrays import SparseGradient, static_shape
from .errors import InvalidArgumentError, InvalidTypeError


def mask_gradients(grads: Sequence[Any], masks: Sequence[Any]) -> List[Any]:
    """``grads[i] * masks[i]`` for each i, as new arrays; a ``None`` mask leaves its gradient as it is.

    Each mask must broadcast to its gradient's shape without changing it (a (2,) mask on a (5, 2)
    kernel masks its columns). A SparseGradient is masked row by row, as its dense form would be.
    """
    grads = _sequence("grads", grads)
    masks = _sequence("masks", masks)
    if len(masks) != len(grads):
        raise InvalidArgumentError(
            "masks",
            f"{len(grads)} masks, one per gradient (None to leave one as it is)",
            f"{len(masks)} masks",
        )
    masked = []
    for index, (grad, mask) in enumerate(zip(grads, masks)):
        if mask is None or grad is None:
            masked.append(grad)
            continue
        shape = tuple(grad.dense_shape) if isinstance(grad, SparseGradient) else np.shape(grad)
        mask = broadcast_mask(f"masks[{index}]", mask, shape)
        if isinstance(grad, SparseGradient):
            masked.append(grad._replace(values=(grad.values * mask[grad.indices]).astype(grad.values.dtype)))
        else:
            grad = np.asarray(grad)
            masked.append((grad * mask).astype(grad.dtype))
    return masked


def freeze(variable: Variable, mask: Any) -> None:
    """Keep ``variable``'s entries where ``mask`` is True at their current values under any optimizer.

    ``mask`` is boolean and broadcasts to the variable's shape. The variable's own constraint, if
    any, still applies to the other entries; freezing again adds entries, ``unfreeze`` undoes it.
    In graph mode the constraint enters the update ops when they are built: freeze before the
    first training step (or ``compatgrad.apply_gradients``, which rebuilds its update op).
    """
    shape = cast(Tuple[int, ...], static_shape(variable))  # a variable's shape is fully known
    mask = broadcast_mask("mask", mask, shape)
    if mask.dtype != np.bool_:
        raise InvalidTypeError("mask", "a boolean mask (True: frozen)", f"dtype {mask.dtype}")
    current = getattr(variable, "constraint", None)
    if isinstance(current, _Frozen):
        mask = mask | current.mask
        current = current.previous
    _set_constraint(variable, _Frozen(mask, _read(variable), current))


def unfreeze(variable: Variable) -> None:
    """Give ``variable`` back the constraint it had before ``freeze``."""
    current = getattr(variable, "constraint", None)
    if not isinstance(current, _Frozen):
        raise InvalidArgumentError("variable", "a variable frozen by compatgrad.freeze", name_of(variable))
    _set_constraint(variable, current.previous)


class _Frozen:
    """The constraint ``freeze`` installs: the previous constraint, then the frozen entries put back."""

    def __init__(self, mask: np.ndarray, values: np.ndarray, previous: Optional[Callable[[Any], Any]]):
        self.mask = mask
        self.values = values
        self.previous = previous

    def __call__(self, value: Any) -> Any:
        import tensorflow as tf

        if self.previous is not None:
            value = self.previous(value)
        value = tf.convert_to_tensor(value)
        return tf.where(tf.constant(self.mask), tf.constant(self.values, dtype=value.dtype), value)


def broadcast_mask(argument: str, mask: Any, shape: Tuple[int, ...]) -> np.ndarray:
    """``mask`` as an array of ``shape``; it may broadcast, but not change the shape."""
    mask = np.asarray(mask)
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise InvalidArgumentError(
            argument, f"a mask that broadcasts to shape {tuple(shape)}", f"shape {mask.shape}"
        ) from None


def _sequence(argument: str, value: Any) -> List[Any]:
    if not isinstance(value, (list, tuple)):
        raise InvalidTypeError(argument, "a list with one entry per variable", type(value).__name__)
    return list(value)


def _set_constraint(variable: Variable, constraint: Any) -> None:
    target = versions.constraint_holder(variable)
    if hasattr(target, "_constraint"):
        target._constraint = constraint
    if getattr(variable, "constraint", None) is not constraint:
        raise InvalidTypeError(
            "variable", "a TensorFlow or Keras variable with a constraint", type(variable).__name__
        )


def _read(variable: Variable) -> np.ndarray:
    """The variable's value now: eagerly, or in the session that holds it (graph mode)."""
    import tensorflow as tf

    if tf.executing_eagerly():
        return np.array(variable.numpy() if hasattr(variable, "numpy") else variable)
    return np.array(graph_session(variable).run(variable))


def graph_session(variable: Variable) -> Any:
    """The session holding ``variable``: the default session, else that of the Keras that tracks it
    (tf.keras, tf_keras, keras-nightly: each keeps the variables it made per graph), else a Keras
    session already running its graph, else the first Keras imported whose graph it is.

    Several Keras copies can share one graph (TF 2.5's tf.keras beside the keras package), and a
    session of the wrong copy would not hold the variable's value.
    """
    import tensorflow as tf

    session = tf.compat.v1.get_default_session()
    if session is not None and session.graph is variable.graph:
        return session
    backends: List[Any] = []
    for root in versions.KERAS_ROOTS:
        backend = sys.modules.get(root + ".backend")
        if not versions.has_sessions(backend) or backend in backends:
            continue
        if versions.backend_graph(backend) is variable.graph:
            backends.append(backend)
    for backend in backends:
        if any(v is variable for v in versions.backend_variables(backend, variable.graph)):
            return backend.get_session()
    for backend in backends:
        live = versions.live_session(backend)
        if live is not None and live.graph is variable.graph:
            return live
    if backends:
        return backends[0].get_session()
    raise InvalidArgumentError(
        "variable", "a variable of the default session or of a Keras session (graph mode)", name_of(variable)
    )
