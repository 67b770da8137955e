"""Gradients as numpy arrays: dense by default, or kept sparse for embedding-like variables."""

from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from . import versions


class SparseGradient(NamedTuple):
    """A ``tf.IndexedSlices`` gradient as numpy: rows ``indices`` of a ``dense_shape`` array hold ``values``.

    Indices may repeat; their rows add up (as the optimizer's sparse update and ``dense()`` do).
    Per-example gradients (``per_example_gradients(sparse=True)``) index two leading axes: ``indices``
    then holds (example, row) pairs, one per row of ``values``.
    """

    values: np.ndarray
    indices: np.ndarray
    dense_shape: Tuple[int, ...]

    @classmethod
    def from_parts(cls, values: Any, indices: Any, dense_shape: Any) -> "SparseGradient":
        return cls(np.array(values), np.array(indices), tuple(int(d) for d in np.asarray(dense_shape)))

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.dense_shape

    def dense(self) -> np.ndarray:
        dense = np.zeros(self.dense_shape, dtype=self.values.dtype)
        np.add.at(dense, tuple(self.indices.T) if self.indices.ndim == 2 else self.indices, self.values)
        return dense


def is_sparse(gradient: Any) -> bool:
    """A ``tf.IndexedSlices`` (or its graph-mode value), told by its parts, not by importing TensorFlow."""
    kind = type(gradient)  # not the instance: a missing attribute of an eager tensor costs an exception
    return (
        hasattr(kind, "indices")
        and hasattr(kind, "dense_shape")
        and hasattr(kind, "values")
        and kind is not SparseGradient
    )


def to_numpy(gradient: Any) -> Any:
    """An eager tensor -> ndarray; an eager ``tf.IndexedSlices`` -> SparseGradient; None stays None.

    The arrays are copies, writable as graph mode's are: ``np.asarray`` of an eager tensor is a
    read-only view of its buffer.
    """
    if gradient is None:
        return None
    if is_sparse(gradient):
        return SparseGradient.from_parts(gradient.values, gradient.indices, gradient.dense_shape)
    return np.array(gradient)


def static_shape(value: Any) -> Tuple[Optional[int], ...]:
    """A variable's or tensor's shape as ints, None where unknown."""
    return versions.shape_tuple(value.shape)


def numpy_dtype(value: Any) -> np.dtype:
    """The numpy dtype of a variable or tensor."""
    return np.dtype(versions.numpy_dtype_of(value.dtype))
