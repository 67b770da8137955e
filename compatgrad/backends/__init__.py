"""One module per engine: ``graph`` (TF1-style sessions), ``keras2`` (tf.keras / tf_keras eager), ``keras3``."""
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from ..inputs import Batch


class Request(NamedTuple):
    """What every backend is asked for, validated by the front door."""

    batch: Batch
    params: Sequence[Any]  # variables
    tensors: Sequence[Any]  # graph tensors: layer outputs, model inputs
    training: bool  # learning phase 1
    clip: bool
    class_weight: Optional[Dict[Any, float]]
    sparse: bool  # keep tf.IndexedSlices gradients sparse


class Result(NamedTuple):
    """What every backend returns: gradients for params then tensors, as numpy arrays or SparseGradient
    (None where unconnected), the unscaled loss, the loss scale (scalars: floats, or eager tensors
    that the front door reads only when it needs them)."""

    grads: List[Optional[Any]]
    loss: Any
    loss_scale: Any
    applies_update: bool = True  # False where the optimizer only accumulates this step's gradients
