"""One module per engine: ``graph`` (TF1-style sessions), ``keras2`` (tf.keras / tf_keras eager), ``keras3``."""
from typing import Any, List, NamedTuple, Optional


class Result(NamedTuple):
    """What every backend returns: gradients (None where unconnected), the unscaled loss, the loss scale."""

    grads: List[Optional[Any]]
    loss: float
    loss_scale: float
