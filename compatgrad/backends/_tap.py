"""The gradients ``fit`` applies, kept as it trains: the optimizer's apply method, wrapped while ``fit``
traces its step, writes what the optimizer applies (``_steps``: unscaled, aggregated, clipped as that
Keras does) into variables of its own, and how far each weight moved, then applies as before.

Nothing runs twice: the wrapper sees the gradients the step computed once. The update itself is the
optimizer's own call on the step's own gradients, so training is bit for bit what it is without a tap.
"""

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import numpy as np
import tensorflow as tf

from .._types import Model
from ..arguments import name_of
from ..detect import Flavour
from ..errors import InvalidArgumentError, ModeError, UnsupportedModelError
from ._distribute import strategy_of
from ._state import all_layers
from ._steps import Keras2Steps, Keras3Steps, Steps
from .custom_step import optimizers_of


class Applied:
    """One step's record, as numpy: per trainable weight (``model.trainable_weights``' order) the
    gradient applied (None where the step applied none) and its update's norm over its norm before."""

    def __init__(self, grads: List[Optional[np.ndarray]], update_ratios: List[Optional[float]]):
        self.grads, self.update_ratios = grads, update_ratios


class Tap:
    """Installed on a model for one ``fit``: ``install`` before ``fit`` makes its train function,
    ``read`` after a step, ``remove`` when ``fit`` ends."""

    def __init__(self, model: Model, flavour: Flavour, clip: bool):
        _check(model, flavour)
        self.model_ref = weakref.ref(model)
        self.clip = clip
        self.steps_class: Type[Steps] = Keras3Steps if flavour.name == "keras3" else Keras2Steps
        # id(weight) -> (its gradient, its update ratio, whether a step wrote them since the last read)
        self.slots: Dict[int, Tuple[tf.Variable, tf.Variable, tf.Variable]] = {}
        self.patched: List[Any] = []

    def install(self) -> None:
        model = self.model_ref()
        assert model is not None  # the logger holds it
        _check_train_function(model)
        every = [self.steps_class(optimizer) for optimizer in optimizers_of(model)]
        if not self.clip and any(steps.clips and not steps.clips_in_apply for steps in every):
            raise InvalidArgumentError(
                "clip",
                "True for this optimizer: its Keras (TF < 2.4) clips in the train step, before "
                "apply_gradients, so the unclipped gradients never reach it",
                "False",
            )
        for steps in every:
            optimizer = steps.optimizer
            setattr(optimizer, steps.apply_method, steps.intercepted(self._recorder(steps)))
            self.patched.append(optimizer)
        # Keras makes its train function again, now traced with the wrapper; ``remove`` drops it again.
        model.train_function = None

    def remove(self) -> None:
        for optimizer in self.patched:
            delattr(optimizer, self.steps_class.apply_method)
        self.patched = []
        model = self.model_ref()
        if model is not None:
            model.train_function = None  # the tapped one: the next call traces Keras' own again

    def read(self, weights: List[Any]) -> Applied:
        grads: List[Optional[np.ndarray]] = []
        ratios: List[Optional[float]] = []
        for weight in weights:
            slot = self.slots.get(id(weight))
            if slot is None or not slot[2].numpy():  # no step applied a gradient to it since the last read
                grads.append(None)
                ratios.append(None)
                continue
            grads.append(slot[0].numpy())
            ratios.append(float(slot[1].numpy()))
            slot[2].assign(False)
        return Applied(grads, ratios)

    def _recorder(self, steps: Steps) -> Callable[[List[Tuple[Any, Any]], bool], Callable[[], None]]:
        def record(pairs: List[Tuple[Any, Any]], aggregate: bool) -> Callable[[], None]:
            steps.build([v for _, v in pairs])  # as its apply would, before reading its loss scale
            applied = steps.applied(pairs, self.clip, aggregate)
            slots = [self._slot(v) for _, v in pairs]
            before = [tf.identity(v) for _, v in pairs]
            for (grad_slot, _, fresh), g in zip(slots, applied):
                grad_slot.assign(tf.cast(tf.convert_to_tensor(g), grad_slot.dtype))
                fresh.assign(True)

            def after() -> None:  # the weights as the optimizer left them: how far it moved each
                for (_, v), (_, ratio_slot, _), old in zip(pairs, slots, before):
                    moved = tf.norm(tf.cast(tf.identity(v) - old, tf.float32))
                    # 0 for a weight that was all zeros (a bias at its first step)
                    ratio_slot.assign(tf.math.divide_no_nan(moved, tf.norm(tf.cast(old, tf.float32))))

            return after

        return record

    def _slot(self, variable: Any) -> Tuple[tf.Variable, tf.Variable, tf.Variable]:
        """The variables a weight's record goes to, made outside the step the first time it is traced."""
        if id(variable) not in self.slots:
            with tf.init_scope():
                dtype = tf.as_dtype(variable.dtype).base_dtype
                self.slots[id(variable)] = (
                    tf.Variable(tf.zeros(variable.shape, dtype), trainable=False),
                    tf.Variable(0.0, trainable=False),
                    tf.Variable(False, trainable=False),
                )
        return self.slots[id(variable)]


def layer_of(model: Model) -> Dict[int, str]:
    """id(weight) -> the name of the innermost layer holding it (a nested model's layers, not the model)."""
    owner: Dict[int, Tuple[int, str]] = {}
    for layer in all_layers(model):
        weights = layer.trainable_weights
        for weight in weights:
            known = owner.get(id(weight))
            if known is None or len(weights) < known[0]:
                owner[id(weight)] = (len(weights), layer.name)
    return {key: name for key, (_, name) in owner.items()}


def weight_names(weights: List[Any]) -> List[str]:
    return [name_of(w) for w in weights]


def _check(model: Model, flavour: Flavour) -> None:
    if flavour.graph:
        raise ModeError(
            "model: GradientLogger taps eager training steps (tf.keras 2.2+, tf_keras, Keras 3); "
            "graph mode and standalone Keras are not supported yet. Use get_gradients in a callback"
        )
    if strategy_of(model) is not None:
        raise UnsupportedModelError(
            "model: built under a distribution strategy; GradientLogger does not tap replicated steps yet"
        )


def _check_train_function(model: Model) -> None:
    """Keras makes and caches the train function; one set from outside would be dropped: refuse it."""
    function = getattr(model, "train_function", None)
    made_by = getattr(getattr(function, "python_function", function), "__qualname__", "")
    if function is not None and ".make_train_function.<locals>." not in made_by:
        raise UnsupportedModelError(
            "model.train_function: expected the one Keras' make_train_function makes, got "
            f"{made_by or type(function).__name__}; GradientLogger taps the step Keras traces. Set "
            "model.train_function = None to train with Keras' own, or log from your function"
        )
