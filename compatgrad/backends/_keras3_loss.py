"""A Keras 3 model's compiled loss, on every backend: called as the training step calls it, and built
from a batch's shapes before a step is traced. No framework is imported here."""

from typing import Any, Callable

from .. import _paths, versions
from .._types import Model, Tensor
from ..errors import InvalidArgumentError, NotCompiledError


def sample_weights(root: str, y: Any, sample_weight: Any, class_weight: Any) -> Any:
    """The sample weights train_on_batch trains with: ``sample_weight``, or ``class_weight`` per example
    (Keras 3 takes one or the other). ``root``: the model's Keras package root."""
    if not class_weight:
        return sample_weight
    if sample_weight is not None:
        raise InvalidArgumentError(
            "class_weight", "no sample_weight next to it (Keras 3 takes one or the other)", "both"
        )
    utils = _paths.load(root, "data_adapter_utils")
    return utils.class_weight_to_sample_weights(y, class_weight)


def compiled_loss(model: Model, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool) -> Tensor:
    if model._compile_loss is None and not model.losses:  # listed only now, after the forward pass
        raise NotCompiledError(
            "model: expected a model compiled with a loss (or with add_loss losses), got loss=None"
        )
    if versions.passes_training_to_loss(model):
        return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)


def build_compiled_loss(
    model: Model,
    backend: Any,
    batch: Any,
    map_structure: Callable[[Callable[[Any], Any], Any], Any],
    part: Callable[[Any], Any] = lambda value: value,
) -> None:
    """Build the compiled loss from the shapes of ``batch`` (x, y, sample_weight), as train_on_batch's
    ``_symbolic_build`` does, before a step is traced.

    A CompileLoss of several losses creates a ``Mean`` tracker per output when it builds (Keras 3.6,
    3.15; not 3.3). Created inside a traced step they go wrong: inside ``strategy.run`` on TensorFlow
    their initializers cannot be lifted out of the tf.function ("You must feed a value for placeholder
    tensor 'cond/else/...'"); inside ``jax.jit`` they are missing from the state the step was traced with.
    ``map_structure`` is the framework's; ``part`` picks what of a leaf has the batch's shape (one
    replica's part of a distributed value).
    """
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None or compile_loss.built:
        return

    def spec(value: Any) -> Any:
        if value is None:
            return None
        value = part(value)
        return backend.KerasTensor(tuple(value.shape), value.dtype)  # which standardizes the dtype

    def loss(x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        return compiled_loss(model, x, y, y_pred, sample_weight, training=False)  # as Keras builds it

    x, y, sample_weight = (map_structure(spec, p) for p in batch)
    y_pred = backend.compute_output_spec(model, x, training=False)
    backend.compute_output_spec(loss, x, y, y_pred, sample_weight)
