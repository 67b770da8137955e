"""The gradients ``fit`` applies, kept as it trains: the optimizer's apply method, wrapped while ``fit``'s
train function is made, writes what the optimizer applies (``_steps``: unscaled, aggregated, clipped as
that Keras does) into variables of its own, then applies as before.

Nothing runs twice: the wrapper sees the gradients the step computed once. The update itself is the
optimizer's own call on the step's own gradients, so training is bit for bit what it is without a tap.

Eager (tf.keras 2.2+, tf_keras, Keras 3): the train function is made again, traced with the wrapper, and
dropped after ``fit``. Graph mode (TF 1.x, TF 2 graph mode, standalone Keras): ``fit`` has made its
``K.function`` before any callback hears of it, and holds it; the tapped function is built next to it and
takes its place in that same object for the run, which gets its own back after.
"""

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import numpy as np
import tensorflow as tf

from .. import _paths
from .._types import Model
from ..arguments import name_of
from ..detect import Flavour
from ..errors import InvalidArgumentError, UnsupportedModelError
from ._distribute import strategy_of
from ._state import all_layers
from ._steps import Keras2Steps, Keras3Steps, Steps
from .custom_step import optimizers_of

Pairs = List[Tuple[Any, Any]]
Slot = Tuple[Any, Any]  # a weight's applied gradient, whether a step wrote it since the last read


class Tap:
    """Installed on a model for one ``fit``: ``install`` as ``fit`` starts, ``read`` after a step,
    ``remove`` when ``fit`` ends."""

    def __init__(self, model: Model, flavour: Flavour, clip: bool):
        if strategy_of(model) is not None:
            raise UnsupportedModelError(
                "model: built under a distribution strategy; GradientLogger does not tap replicated steps yet"
            )
        self.model_ref = weakref.ref(model)
        self.clip, self.graph = clip, flavour.graph
        self.backend = _paths.load(flavour.root, "backend")
        self.steps_class: Type[Steps] = Keras3Steps if flavour.name == "keras3" else Keras2Steps
        self.slots: Dict[int, Slot] = {}  # by id(weight)
        self.patched: List[Tuple[Any, str]] = []  # (optimizer, the method wrapped)
        self.replaced: Optional[Tuple[Any, Dict[str, Any]]] = None  # graph: (fit's K.function, its state)
        self.mark_read: Any = None  # graph: the op that clears every slot's flag

    def install(self) -> None:
        model = self.model_ref()
        assert model is not None  # the logger holds it
        every = [self.steps_class(optimizer) for optimizer in optimizers_of(model)]
        _check(model, every, self.clip, self.graph)
        for steps in every:
            self._patch(steps)
        fits = model.train_function
        model.train_function = None
        if not self.graph:  # Keras makes it again as fit starts, traced with the wrappers
            return
        model._make_train_function()
        tapped = model.train_function
        session = self.backend.get_session()
        session.run(tf.compat.v1.variables_initializer([v for slot in self.slots.values() for v in slot]))
        with session.graph.as_default():
            self.mark_read = tf.group(*[wrote.assign(False) for _, wrote in self.slots.values()])
        if fits is not None:  # fit holds this one: it runs the tapped graph until remove
            self.replaced = (fits, dict(vars(fits)))
            vars(fits).update(vars(tapped))
            model.train_function = fits

    def remove(self) -> None:
        for optimizer, method in self.patched:
            delattr(optimizer, method)
        self.patched = []
        model = self.model_ref()
        if model is not None:
            model.train_function = None  # the tapped one: the next call makes Keras' own again
        if self.replaced is not None:
            fits, state = self.replaced
            vars(fits).clear()
            vars(fits).update(state)
            if model is not None:
                model.train_function = fits
            self.replaced = None

    def read(self, weights: List[Any]) -> List[Optional[np.ndarray]]:
        """Per weight, the gradient the steps since the last read applied last; None where none did."""
        slots = [self.slots.get(id(w)) for w in weights]
        written = [slot for slot in slots if slot is not None]
        values = iter(self.values([v for slot in written for v in slot]))
        fresh = {}
        for slot in written:
            grad, wrote = next(values), next(values)
            if wrote:
                fresh[id(slot)] = grad
        self._mark_read([slot[1] for slot in written])
        return [None if slot is None else fresh.get(id(slot)) for slot in slots]

    def values(self, variables: List[Any]) -> List[Any]:
        if not variables:
            return []
        if self.graph:
            return list(self.backend.get_session().run(variables))
        return [np.asarray(v.numpy()) for v in variables]

    # --- The wrappers ----------------------------------------------------------------------------

    def _patch(self, steps: Steps) -> None:
        optimizer = steps.optimizer
        if hasattr(optimizer, steps.apply_method):
            setattr(optimizer, steps.apply_method, steps.intercepted(self._recorder(steps)))
            self.patched.append((optimizer, steps.apply_method))
        else:  # standalone Keras: get_updates takes get_gradients' gradients to ops of its own
            optimizer.get_updates = self._get_updates(steps)
            self.patched.append((optimizer, "get_updates"))

    def _recorder(self, steps: Steps) -> Callable[[Pairs, bool], Callable[[Any], Any]]:
        def record(pairs: Pairs, aggregate: bool) -> Callable[[Any], Any]:
            steps.build([v for _, v in pairs])  # as its apply would, before its loss scale is read
            writes = self._write(pairs, steps.applied(pairs, self.clip, aggregate))
            # Graph mode runs what the train function's updates hold: the writes go with the update.
            return lambda result: tf.group(result, *writes) if self.graph else result

        return record

    def _get_updates(self, steps: Steps) -> Callable[[Any, List[Any]], List[Any]]:
        optimizer = steps.optimizer
        get_updates, gradients = optimizer.get_updates, self.backend.gradients

        def tapped(loss: Any, params: List[Any]) -> List[Any]:
            raw: List[Any] = []

            def kept(loss: Any, variables: List[Any]) -> List[Any]:
                raw[:] = gradients(loss, variables)
                return raw

            self.backend.gradients = kept  # type: ignore[attr-defined]  # get_gradients' call, before it clips
            try:
                updates = get_updates(loss, params)
            finally:
                self.backend.gradients = gradients  # type: ignore[attr-defined]
            pairs = [(g, v) for g, v in zip(raw, params) if g is not None]
            # Clipped again as get_gradients does (clip=False: not at all), from its raw gradients.
            clipped = steps.clip(pairs) if self.clip and steps.clips else [g for g, _ in pairs]
            return list(updates) + self._write(pairs, clipped)

        return tapped

    def _write(self, pairs: Pairs, applied: List[Any]) -> List[Any]:
        writes = []
        for (_, v), g in zip(pairs, applied):
            grad, wrote = self._slot(v)
            writes += [grad.assign(tf.cast(tf.convert_to_tensor(g), grad.dtype)), wrote.assign(True)]
        return writes

    def _slot(self, variable: Any) -> Slot:
        """A weight's variables, made outside the step the first time it is traced or built."""
        if id(variable) not in self.slots:
            with tf.init_scope():
                dtype = tf.as_dtype(variable.dtype).base_dtype
                self.slots[id(variable)] = (
                    tf.Variable(tf.zeros(variable.shape, dtype), trainable=False),
                    tf.Variable(False, trainable=False),
                )
        return self.slots[id(variable)]

    def _mark_read(self, flags: List[Any]) -> None:
        if self.graph:
            self.backend.get_session().run(self.mark_read)
        else:
            for flag in flags:
                flag.assign(False)


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


def _check(model: Model, every: List[Steps], clip: bool, graph: bool) -> None:
    """Refuse what the tap cannot record, before anything is changed."""
    function = model.train_function
    if function is not None and not _made_by_keras(function, graph):
        raise UnsupportedModelError(
            "model.train_function: expected the one Keras makes, got "
            f"{getattr(function, '__qualname__', type(function).__name__)}; GradientLogger taps the step "
            "Keras makes. Set model.train_function = None to train with Keras' own"
        )
    clips_before = [
        s for s in every if s.clips and not s.clips_in_apply and hasattr(s.optimizer, s.apply_method)
    ]
    if not clip and clips_before:
        raise InvalidArgumentError(
            "clip",
            "True for this optimizer: its Keras (TF < 2.4) clips in get_gradients or the train step, "
            "before apply_gradients, so the unclipped gradients never reach the optimizer",
            "False",
        )


def _made_by_keras(function: Any, graph: bool) -> bool:
    """Eager: a function ``make_train_function`` defines; graph mode: a ``K.function`` of Keras' backend."""
    if graph:
        return type(function).__module__.split(".")[-1] in ("backend", "tensorflow_backend")
    made_by = getattr(getattr(function, "python_function", function), "__qualname__", "")
    return ".make_train_function.<locals>." in made_by
