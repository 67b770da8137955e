"""The one table of where Keras internals live.

Paths are relative to the package root that defines the model's class (see ``detect``; the roots of
each version: ``versions.KERAS_ROOTS``). Candidates are tried in order; the first that imports wins.
"""

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, Dict, Tuple

from . import versions

MODULES: Dict[str, Tuple[str, ...]] = {
    "backend": ("backend",),
    # Keras 2 eager: the data adapter train_on_batch feeds the train step through.
    "data_adapter": ("engine.data_adapter",),
    # Keras 3: class_weight_to_sample_weights, as train_on_batch uses it.
    "data_adapter_utils": ("trainers.data_adapters.data_adapter_utils",),
    # Keras 3: operation_fn, which hands each layer of a functional graph the call's training flag (JAX).
    "functional": ("models.functional",),
    # Keras 3: the keras.distribution layout in force (JAX).
    "distribution": ("distribution.distribution_lib",),
    # Keras 3: scale_loss_for_distribution (versions.divides_loss_by_replicas).
    "losses": ("losses.loss",),
    # Keras 3: map_structure over nested batches (the torch engine's; 3.0-3.3 kept it under utils).
    "tree": ("tree", "utils.tree"),
    # Progbar for whole-dataset gradients.
    "progbar": ("utils.progbar", "utils.generic_utils"),
}


@functools.lru_cache(maxsize=None)  # TF 1.x aliases tensorflow.* to tensorflow_core.*: each import searches
def load(root: str, name: str) -> ModuleType:
    errors = []
    for relative in MODULES[name]:
        try:
            return importlib.import_module(root + "." + relative)
        except ImportError as error:
            errors.append(str(error))
    raise ImportError("no {} module under {}: {}".format(name, root, "; ".join(errors)))


def relaxed_function(fn: Callable, arity: int) -> Callable:
    """``tf.function`` of ``fn`` called with ``arity`` positional arguments (``(x, y)``, ``(x, y,
    sample_weight)``, a custom step's ``(x,)``), that stops retracing when only the batch size
    changes, as Keras' train function.

    ``versions.relax_shapes_keyword``: TF 2.9+ generalizes on the first new batch size, before on
    the second, so one trace more there. One arity a function:
    binding a defaulted ``sample_weight=None`` costs tf.function 50-80 us a call (TF 2.15, 2.21),
    and calls of two arities break reduce_retracing (TF 2.15 fails to generalize across them).
    """
    import tensorflow as tf

    def one(x: Any) -> Any:
        return fn(x)

    def two(x: Any, y: Any) -> Any:
        return fn(x, y)

    def three(x: Any, y: Any, sample_weight: Any) -> Any:
        return fn(x, y, sample_weight)

    return tf.function((one, two, three)[arity - 1], **{versions.relax_shapes_keyword(): True})
