"""The engines, one module each behind one interface (``Engine``), and the choice of one for a model.

- ``graph``: TF1-style sessions (TF 1.x, standalone Keras 2.2/2.3, tf.keras / tf_keras models built
  after ``tf.compat.v1.disable_eager_execution()``).
- ``keras2``: tf.keras 2.2-2.15 and tf_keras, eager. ``keras3``: Keras 3 on TensorFlow, eager.
- ``keras3_jax``: Keras 3 on JAX (imports JAX, never TensorFlow); ``keras3_torch``: on PyTorch.
- A model whose class overrides ``train_step`` runs its own step (``custom_step``), reached
  through ``keras2`` / ``keras3``, which convert its batch as their Keras does.

The TensorFlow engines import TensorFlow, keras3_jax JAX, keras3_torch torch; this module imports
none of them, and imports an engine only once a model needs it.
"""

import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import versions
from .._types import Model, Tensor
from ..arguments import Batch
from ..detect import Flavour, keras3_backend
from ..errors import ModeError, UnsupportedModelError

try:
    from typing import Protocol
except ImportError:  # Python 3.7: the interface is documentation only there
    Protocol = object  # type: ignore[assignment]


class Request(NamedTuple):
    """What every engine is asked for, the same for every batch, validated by the front door."""

    variables: Sequence[Any]  # the variables among the wanted params
    tensors: Sequence[Any]  # the graph tensors among them: layer outputs, model inputs
    training: bool  # learning phase 1
    clip: bool
    class_weight: Optional[Dict[Any, float]]
    sparse: bool  # keep tf.IndexedSlices gradients sparse
    # Also the gradients of the loss with respect to what it reads of the model's outputs, after the
    # tensors': per flat output, the output and its logits (``_forward.loss_inputs``).
    output_grads: bool = False

    def key(self) -> Tuple[Any, ...]:
        """What every built step depends on, for the engines' cache keys (each adds its own): the
        params by identity, clipping, sparseness, the output gradients."""
        return (
            tuple(map(id, self.variables)),
            tuple(map(id, self.tensors)),
            self.clip,
            self.sparse,
            self.output_grads,
        )


class Result(NamedTuple):
    """What every engine returns: gradients for variables then tensors, as numpy arrays or
    SparseGradient (None where unconnected), the unscaled loss, the loss scale (scalars: floats, or
    eager tensors that the front door reads only when it needs them)."""

    grads: List[Optional[Any]]
    loss: Tensor
    loss_scale: Any
    applies_update: bool = True  # False where the optimizer only accumulates this step's gradients


# An eager step's (gradients for variables then tensors, None where unconnected; loss; loss scale), tensors.
StepOutput = Tuple[List[Optional[Any]], Any, Any]
# An eager engine's compiled step: (x, y) or (x, y, sample_weight) -> StepOutput.
Step = Callable[..., StepOutput]


class Engine(Protocol):
    """What an engine module provides."""

    def gradients(self, model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
        """The gradients of one batch, as the model's training step would apply them."""

    def build(self, model: Model, flavour: Flavour, batch: Batch) -> None:
        """Build an unbuilt model from its first batch, as its training step would."""


class EagerEngine(Engine, Protocol):
    def traced_step(self, model: Model, flavour: Flavour, request: Request, arity: int) -> Step:
        """The compiled step (not for custom train steps), for loops that stay in the graph."""


def engine_for(model: Model, flavour: Flavour, eager: Optional[bool] = None) -> Engine:
    """The engine for this flavour in this mode; raises where no engine can match the step.

    ``eager``: whether the eager engines run (default: whether TensorFlow executes eagerly now;
    ``symbolic_gradients`` asks for the mode outside the ``tf.function`` it may be called in).
    Only a supported (flavour, mode) pair is remembered, so a refusal is explained every time.
    """
    if eager is None:
        tf = sys.modules.get("tensorflow")  # absent only for a Keras 3 model on another backend
        eager = tf is not None and tf.executing_eagerly()
    key = (flavour, eager)
    engine = _ENGINES.get(key)
    if engine is None:
        engine = _ENGINES[key] = _choose(model, flavour, eager)
    return engine


_ENGINES: Dict[Tuple[Flavour, bool], Engine] = {}


def _choose(model: Model, flavour: Flavour, eager: bool) -> Engine:
    if flavour.name == "keras3":
        return _keras3(flavour, eager)
    if flavour.graph and not eager:
        from . import graph

        return graph
    if flavour.graph:
        if flavour.name == "keras":
            raise UnsupportedModelError("model: standalone Keras is supported in graph mode (TF 1.x) only")
        if versions.has_train_step(model):  # a training_v1 model: built while eager execution was disabled
            raise ModeError(
                "model: built in graph mode, but eager execution is on now; "
                "build and use the model in one mode"
            )
        raise UnsupportedModelError(
            "model: this Keras has no train_step (TF < 2.2), so only its graph mode can be matched; "
            "call tf.compat.v1.disable_eager_execution() before building the model"
        )
    if not eager:
        _raise_not_eager(
            "model: built in eager mode, but eager execution is disabled now; call "
            "tf.compat.v1.disable_eager_execution() before building the model to use graph mode"
        )
    from . import keras2

    return keras2


def _keras3(flavour: Flavour, eager: bool) -> Engine:
    name = keras3_backend(flavour.root)
    if name == "jax":
        from . import keras3_jax

        return keras3_jax
    if name == "torch":
        from . import keras3_torch

        return keras3_torch
    if name != "tensorflow":
        raise UnsupportedModelError(
            "model: expected a Keras 3 model on the TensorFlow, JAX or PyTorch backend, "
            f"got the {name!r} backend"
        )
    if not eager:
        _raise_not_eager(
            "model: Keras 3 cannot train in graph mode (its train_on_batch returns an unevaluated "
            "tensor), so no gradient could match its step; run eagerly, or use tf_keras "
            "(TF_USE_LEGACY_KERAS=1) for graph mode"
        )
    from . import keras3

    return keras3


def per_example_engine(root: str) -> Any:
    """The per-example engine for a model whose Keras lives under ``root``: ``_per_example``
    (TensorFlow), ``_per_example_keras3`` (Keras 3 on JAX and PyTorch)."""
    if keras3_backend(root) in ("jax", "torch"):
        from . import _per_example_keras3

        return _per_example_keras3
    require_tensorflow(root, "per_example_gradients")
    from . import _per_example

    return _per_example


def require_tensorflow(root: str, feature: str, argument: str = "model") -> None:
    """Raise where ``feature``, built on TensorFlow's engines, meets Keras 3 on another backend.

    ``root``: the module (or package root) of the class of ``argument`` (the model, an optimizer).
    """
    name = keras3_backend(root)
    if name not in (None, "tensorflow"):
        raise UnsupportedModelError(
            f"{argument}: {feature} runs on Keras 3's TensorFlow backend (and on Keras 2), got the "
            f"{name!r} backend; get_gradients runs there"
        )


def _raise_not_eager(graph_mode_message: str) -> None:
    if versions.executing_eagerly_outside_functions():
        raise ModeError(
            "get_gradients returns numpy arrays, so it cannot run inside a tf.function; "
            "compatgrad.symbolic_gradients returns tensors there"
        )
    raise ModeError(graph_mode_message)
