"""compatgrad: the gradients a Keras model's own training step would apply, on every TF version.

    from compatgrad import get_gradients
    grads = get_gradients(model, x, y, model.trainable_weights, sample_weight=None, learning_phase=0)

Importing compatgrad imports no framework; TensorFlow / Keras are imported when a model is used.
"""

from . import errors
from .api import GradientInfo, get_gradients
from .apply import apply_gradients
from .arrays import SparseGradient
from .gradient_function import gradient_function
from .masks import freeze, mask_gradients, unfreeze
from .per_example import PerExampleInfo, per_example_gradients
from .sources import layer_outputs
from .symbolic import symbolic_gradients

__version__ = "0.1.0"
__all__ = [
    "get_gradients",
    "GradientInfo",
    "gradient_function",
    "symbolic_gradients",
    "per_example_gradients",
    "PerExampleInfo",
    "layer_outputs",
    "SparseGradient",
    "apply_gradients",
    "mask_gradients",
    "freeze",
    "unfreeze",
    "errors",
    "__version__",
]
