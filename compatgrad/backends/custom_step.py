"""Models whose class overrides ``train_step``: their own step runs, and each update is read as applied.

The step is traced once into a ``tf.function`` with every optimizer the model holds
(``model.optimizer`` and optimizers set as its attributes, as a GAN holds two) wrapped: when the
step hands an optimizer its gradients (``apply_gradients``, ``minimize``; Keras 3 ``apply``), the
wrapper records what that optimizer applies, after its own unscale (Keras 3), aggregation and
clipping (``_steps``), and lets the update happen, so later parts of the step (a generator after
its discriminator) see the weights the real step sees. Then every variable the step may write is
put back: weights, optimizer iterations, slots and loss scale, metrics, layer states. A trainable
weight changed by anything but a wrapped optimizer (a direct ``assign``, an optimizer the model
does not hold) would make the answer wrong: its value is compared, and the call raises. Under a
strategy the step runs on every replica, each recording on its own (``Interceptor``).
"""

import contextlib
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

import tensorflow as tf

from .. import _paths
from .._cache import cached
from .._types import Model, ModelRef, Variable
from ..arguments import name_of
from ..arrays import to_numpy
from ..data import is_distributed
from ..errors import InvalidArgumentError, UnsupportedModelError
from . import Request, Result
from ._distribute import split_batch, strategy_of
from ._state import PreservedState
from ._steps import Steps

StepOutput = Tuple[List[Any], Any, Any]  # (gradients, loss, loss scale)


def optimizers_of(model: Model) -> List[Any]:
    """``model.optimizer``, then every optimizer among the model's attributes, each once."""
    found = [model.optimizer]
    for value in vars(model).values():
        is_optimizer = hasattr(value, "apply_gradients") and hasattr(value, "iterations")
        if is_optimizer and all(value is not known for known in found):
            found.append(value)
    return found


def gradients(model: Model, steps_class: Type[Steps], request: Request, data: Any) -> Result:
    """``data``: the batch packed as ``fit`` hands it to the step (``x`` alone, ``(x, y)`` or ``(x, y,
    sample_weight)``), and split across a strategy's replicas as ``fit`` splits it."""
    key = ("custom step", *request.key())
    optimizers = optimizers_of(model)  # a compile that replaces them replaces the step
    run = cached(
        model,
        key,
        optimizers,
        lambda: _build(weakref.ref(model), steps_class, request, strategy_of(model)),
    )
    grads, loss, loss_scale = run(data)
    return Result([to_numpy(g) for g in grads], loss, loss_scale)


def _build(
    model_ref: ModelRef,
    steps_class: Type[Steps],
    request: Request,
    strategy: Optional[Any],
) -> Callable[[Any], StepOutput]:
    if request.tensors:
        raise InvalidArgumentError(
            "params",
            "variables only, for a model that overrides train_step (its step has no loss "
            "compatgrad could take the gradients of layer outputs or inputs of)",
            "graph tensors",
        )
    watched: List[Any] = []  # the trainable variables the step was checked on, as traced
    run_on = strategy or tf.distribute.get_strategy()

    def step(data: Any) -> Tuple[List[Any], Any, Any, Any]:
        model = model_ref()
        # Trainable weights are saved and restored outside the replicas: a mirrored weight can be
        # assigned only there. What each replica's optimizers write is saved where they apply.
        at_start = {id(v): (v, tf.identity(v)) for v in model.trainable_variables}
        interceptor = Interceptor(steps_class, request.clip, at_start)

        def replica_step(data: Any) -> Tuple[List[Any], Any, Any, List[Any]]:
            preserved = PreservedState(model, training=True)
            recorder = interceptor.recorder()
            model.train_step(data)
            late = [v for v in recorder.applied if id(v) not in at_start]
            watched[:] = list(model.trainable_variables) + late
            changed = [recorder.changed(v) for v in watched]
            preserved.restore()
            grads = [recorder.grads.get(id(p)) for p in request.variables]
            saved = [value for _, value in recorder.saved.values()]
            return grads, recorder.loss_scale(), tf.stack(changed or [False]), saved

        if strategy is not None and not is_distributed(tf.nest.flatten(data)[0]):
            (data,) = split_batch(strategy, (data,))
        with interceptor.wrapping(optimizers_of(model)):
            grads, loss_scale, changed, saved = run_on.run(replica_step, args=(data,))

        def first(value: Any) -> Any:  # the first replica's (they may differ: versions.sums_across_replicas)
            return None if value is None else run_on.experimental_local_results(value)[0]

        written = [v for v, _ in interceptor.saved()]
        for variable, value in list(at_start.values()) + list(zip(written, map(first, saved))):
            variable.assign(value)
        grads = [first(g) for g in grads]
        grads = grads if request.sparse else [None if g is None else tf.convert_to_tensor(g) for g in grads]
        changed = tf.reduce_any(tf.stack(run_on.experimental_local_results(changed)), axis=0)
        return grads, tf.constant(float("nan")), first(loss_scale), changed

    traced = _paths.relaxed_function(step, 1)

    def run(data: Any) -> StepOutput:
        grads, loss, loss_scale, changed = traced(data)
        moved = [name_of(v) for v, flag in zip(watched, changed.numpy()) if flag]  # zip drops the [False] pad
        if moved:  # the variables are back as they were; the gradients do not describe this step
            raise UnsupportedModelError(
                "model.train_step: changes {} other than through an optimizer the model holds "
                "(model.optimizer or an optimizer attribute), e.g. by assign; compatgrad cannot tell "
                "what that step applies. Hold every optimizer the step uses as a model attribute, and "
                "update weights only through them".format(", ".join(moved))
            )
        return grads, loss, loss_scale

    return run


class Interceptor:
    """Wraps the optimizers' apply methods while the step is traced; each replica records on its own.

    A strategy's replicas trace the step in threads of their own, taking turns at every cross-replica
    call: the wrappers are set once around them, and each call goes to its thread's ``Recorder``.
    """

    def __init__(self, steps_class: Type[Steps], clip: bool, at_start: Dict[int, Tuple[Any, Any]]):
        self.steps_class, self.clip, self.at_start = steps_class, clip, at_start
        self.recorders: Dict[int, Recorder] = {}

    def recorder(self) -> "Recorder":
        return self.recorders.setdefault(threading.get_ident(), Recorder(self.clip, self.at_start))

    def saved(self) -> List[Tuple[Any, Any]]:
        """What the optimizers write, as any replica saved it (every replica applies the same)."""
        return list(next(iter(self.recorders.values())).saved.values()) if self.recorders else []

    @contextlib.contextmanager
    def wrapping(self, optimizers: List[Any]) -> Iterator[None]:
        """Instance attributes over the optimizers' apply methods for the trace; the class's after it."""
        name = self.steps_class.apply_method
        patched = []
        try:
            for optimizer in optimizers:
                setattr(optimizer, name, self._wrap(self.steps_class(optimizer)))
                patched.append(optimizer)
            yield
        finally:
            for optimizer in patched:
                delattr(optimizer, name)

    def _wrap(self, steps: Steps) -> Callable:
        def record(pairs: List[Tuple[Any, Any]], aggregate: bool) -> Tuple[List[Any], Callable[[Any], Any]]:
            recorder = self.recorder()
            recorder.record(steps, pairs, aggregate)

            def after(result: Any) -> Any:
                for _, v in pairs:
                    recorder.after[id(v)] = tf.identity(v)
                return result

            return [], after

        return steps.intercepted(record)


class Recorder:
    """One replica's record of what its optimizers applied, and what they write, saved before they do."""

    def __init__(self, clip: bool, at_start: Dict[int, Tuple[Any, Any]]):
        self.clip, self.at_start = clip, at_start
        self.saved: Dict[int, Tuple[Any, Any]] = {}  # id -> (optimizer-written variable, its value before)
        self.grads: Dict[int, Any] = {}  # id(variable) -> the gradient its optimizer applied
        self.applied: List[Any] = []
        self.before: Dict[int, Any] = {}  # id -> whether the variable was still as it began when applied
        self.after: Dict[int, Any] = {}  # id -> its value right after its optimizer applied
        self.scales: List[Any] = []

    def record(self, steps: Steps, pairs: List[Tuple[Any, Any]], aggregate: bool) -> None:
        variables = [v for _, v in pairs]
        for v in variables:
            if id(v) in self.grads:
                raise UnsupportedModelError(
                    f"model.train_step: applies a gradient to {name_of(v)} twice in one step; compatgrad "
                    "returns one gradient per variable, so it cannot say which update the step makes"
                )
        steps.build(variables)
        for v in variables + steps.state():
            if id(v) not in self.at_start and id(v) not in self.saved:
                self.saved[id(v)] = (v, tf.identity(v))
        for v in variables:
            if id(v) in self.at_start:
                self.before[id(v)] = tf.logical_not(_differs(v, self.at_start[id(v)][1]))
        for (_, v), g in zip(pairs, steps.applied(pairs, self.clip, aggregate)):
            self.grads[id(v)] = g
            self.applied.append(v)
        self.scales.append(steps.loss_scale())

    def changed(self, v: Any) -> Any:
        """Whether ``v`` ends the step other than as its optimizer left it (or as it began, if none did)."""
        if id(v) in self.after:
            return tf.logical_or(_differs(v, self.after[id(v)]), tf.logical_not(self.before.get(id(v), True)))
        return _differs(v, self.at_start[id(v)][1])

    def loss_scale(self) -> Any:
        """The first applying optimizer's loss scale (1.0 without loss scaling)."""
        return self.scales[0] if self.scales else tf.constant(1.0)


def _differs(variable: Variable, value: Any) -> Any:
    """Whether the variable now holds anything else than ``value`` (NaN equal to NaN)."""
    now = tf.identity(variable)
    differs = tf.not_equal(now, value)
    if now.dtype.is_floating:
        both_nan = tf.logical_and(tf.math.is_nan(now), tf.math.is_nan(value))
        differs = tf.logical_and(differs, tf.logical_not(both_nan))
    return tf.reduce_any(differs)
