"""Gradients as numpy arrays: dense by default, or kept sparse for embedding-like variables."""
from typing import Any, NamedTuple, Tuple

import numpy as np


class SparseGradient(NamedTuple):
    """A ``tf.IndexedSlices`` gradient as numpy: rows ``indices`` of a ``dense_shape`` array hold ``values``.

    Indices may repeat; their rows add up (as the optimizer's sparse update and ``dense()`` do).
    """

    values: np.ndarray
    indices: np.ndarray
    dense_shape: Tuple[int, ...]

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.dense_shape

    def dense(self) -> np.ndarray:
        dense = np.zeros(self.dense_shape, dtype=self.values.dtype)
        np.add.at(dense, self.indices, self.values)
        return dense


def is_sparse(gradient: Any) -> bool:
    """A ``tf.IndexedSlices`` (or its graph-mode value), told by its parts, not by importing TensorFlow."""
    return all(hasattr(gradient, name) for name in ("values", "indices", "dense_shape")) and not isinstance(gradient, SparseGradient)


def to_numpy(gradient: Any) -> Any:
    """An eager tensor -> ndarray; an eager ``tf.IndexedSlices`` -> SparseGradient; None stays None."""
    if gradient is None:
        return None
    if is_sparse(gradient):
        return SparseGradient(np.asarray(gradient.values), np.asarray(gradient.indices), tuple(int(d) for d in np.asarray(gradient.dense_shape)))
    return np.asarray(gradient)
