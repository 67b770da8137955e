"""The gradients ``fit`` applies, kept as it trains: the optimizer's apply method, wrapped while ``fit``'s
train function is made, takes what the optimizer applies (``_steps``: unscaled, aggregated, clipped as
that Keras does) into variables of its own, then applies as before.

Nothing runs twice: the wrapper sees the gradients the step computed once. The update itself is the
optimizer's own call on the step's own gradients, so training is bit for bit what it is without a tap.
Per weight a logged step writes the squared norms of its gradient, of its update and of the weight
before it (the last two only on the steps its update ratios are taken), with the optimizer's count,
into one (3, weights + 1) array, which comes back with what the step returns (eagerly, on one device;
in graph mode with the step's own session run; else read after it); the gradients themselves only if
asked for. What a step does not log it does not compute: the step tells from the optimizer's count whether
it is one to log (``_due``), so the host sets nothing between steps.

Eager (tf.keras 2.2+, tf_keras, Keras 3): the train function is made again, traced with the wrapper, and
dropped after ``fit``. Graph mode (TF 1.x, TF 2 graph mode, standalone Keras): ``fit`` has made its
``K.function`` before any callback hears of it, and holds it; the tapped function is built next to it and
takes its place in that same object for the run, which gets its own back after. Either way the function
``fit`` calls is guarded: a ``fit`` that raises (no ``on_train_end``) leaves nothing behind.
"""

import functools
import math
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type

import numpy as np
import tensorflow as tf

from .. import _paths
from .._types import Model
from ..arguments import name_of
from ..detect import Flavour
from ..errors import InvalidArgumentError, UnsupportedModelError
from ._distribute import strategy_of
from ._layers import all_layers
from ._steps import Keras2Steps, Keras3Steps, Steps
from .custom_step import optimizers_of

Pairs = List[Tuple[Any, Any]]
GRAD, MOVED, BEFORE = 0, 1, 2  # the rows of the squared norms: gradient, update, weight before it
# What a step logs: the norms, the update ratios (the weights held across the update: the update then
# copies them first), the gradients themselves (copied out).
NORMS, RATIOS, GRADS = 1, 2, 4
# Eager: the key of ``squares`` in what the tapped ``train_step`` returns (``_return_squares``).
RETURNED = "compatgrad_squares"


class Record:
    """What the last logged step applied, per trainable weight (``model.trainable_weights``' order);
    None where it applied nothing, or for what was not kept. ``step``: the optimizer's count after it
    (None: no step was logged); ``now``: its count after the last step, logged or not."""

    def __init__(
        self,
        step: Optional[int],
        now: Optional[int],
        norms: List[Optional[float]],
        update_ratios: List[Optional[float]],
        grads: List[Optional[np.ndarray]],
    ):
        self.step, self.now = step, now
        self.norms, self.update_ratios, self.grads = norms, update_ratios, grads


class Tap:
    """Installed on a model for one ``fit``: ``install`` as ``fit`` starts, ``read`` after a step,
    ``remove`` when ``fit`` ends. The steps logged are those whose count (the optimizer's, after the
    step) is a multiple of ``every``; of those, the multiples of ``ratios_every`` also take how far
    the update moved each weight, the multiples of ``grads_every`` also keep the gradients themselves
    (None: never). ``accumulate``: also the running sum of the gradients and of their squared norms
    (float64), every step."""

    def __init__(
        self,
        model: Model,
        flavour: Flavour,
        clip: bool,
        every: int,
        ratios_every: Optional[int],
        grads_every: Optional[int],
        accumulate: bool = False,
    ):
        self.strategy = strategy_of(model)
        self.steps_class: Type[Steps] = Keras3Steps if flavour.name == "keras3" else Keras2Steps
        if self.strategy is not None and flavour.graph:
            raise UnsupportedModelError(
                "model: built under a distribution strategy in graph mode; GradientLogger taps replicated "
                "steps in eager mode (TF 2) only"
            )
        scales_loss = flavour.name == "keras3" and hasattr(model.optimizer, "inner_optimizer")
        if self.strategy is not None and scales_loss:
            raise UnsupportedModelError(
                "model.optimizer: a Keras 3 LossScaleOptimizer under a distribution strategy, where "
                "GradientLogger's tapped step has been seen to apply non-finite updates that Keras' own "
                "does not; log on one device, or without mixed_float16"
            )
        if (
            self.strategy is not None
            and accumulate
            and (flavour.custom_step or not self.steps_class(model.optimizer).sums_in_apply)
        ):
            raise InvalidArgumentError(
                "noise_scale_batch_size",
                "None for this model under a distribution strategy: its optimizer is handed gradients "
                "already summed across replicas (TF 2.2-2.3's train step, or a custom train_step may), "
                "and the noise scale there is estimated from each replica's own",
                "a batch size",
            )
        # Each replica's step is a batch of 1 / replicas of the one fit trains on.
        self.replicas = 1 if self.strategy is None else self.strategy.num_replicas_in_sync
        self.model_ref = weakref.ref(model)
        self.clip, self.accumulate, self.graph = clip, accumulate, flavour.graph
        self.ratios, self.keep = ratios_every is not None, grads_every is not None
        # Every how many steps each bit is logged, for the bits some steps log and others not.
        cadences = {NORMS: every, RATIOS: _lcm(every, ratios_every), GRADS: _lcm(every, grads_every)}
        self.cadences = {bit: cadence for bit, cadence in cadences.items() if cadence not in (None, 1)}
        self.backend = _paths.load(flavour.root, "backend")
        self.patched: List[Tuple[Any, str]] = []  # (optimizer or model, the method wrapped)
        # graph mode: (the K.function fit calls, its own state and class)
        self.replaced: Optional[Tuple[Any, Dict[str, Any], type]] = None
        self.pending = False  # the train function ran a step the logger has not heard of
        self.writes: List[Any] = []  # graph mode: the ops writing ``squares``
        self.fetched: Any = None  # ``squares`` as the last call wrote it, where it returns them
        self.written_in_call = False  # run eagerly (nothing traced): a step's first write is done
        # graph mode: (optimizer, its slots as fit made them, (fit's, the tapped step's) pairs)
        self.slots: List[Tuple[Any, List[Any], Pairs]] = []
        self.index: Dict[int, int] = {}  # id(weight) -> its column
        # (3, weights + 1), float64: -1 where the last logged step wrote nothing; the last column: the
        # optimizer's count after that step, 1 if it kept the gradients, the count after the last step
        self.squares: Any = None
        self.grads: Dict[int, Any] = {}  # id(weight) -> its last gradient (``keep``)
        self.sums: Dict[int, Any] = {}  # id(weight) -> the sum of its gradients so far (``accumulate``)
        self.sum_of_squares: Any = None  # (``accumulate``) of every gradient's squared norm so far, steps
        # the step graphs that clear ``squares``, each with the replicas traced into it that do
        self.cleared: weakref.WeakKeyDictionary[Any, Set[int]] = weakref.WeakKeyDictionary()

    def install(self) -> None:
        model = self.model_ref()
        assert model is not None  # the logger holds it
        stale = getattr(model.train_function, "compatgrad_tap", None)
        if stale is not None:  # another logger's, left by a fit that raised: it goes first
            stale.remove()
        every = [self.steps_class(optimizer) for optimizer in optimizers_of(model)]
        _check(model, every, self.clip, self.graph)
        if self.graph and model.train_function is None:  # Keras' own first: the tapped one goes into it
            model._make_train_function()
        self.squares = None  # made by the first step traced: a model may build its weights there
        self.cleared = weakref.WeakKeyDictionary()
        self.writes = []
        for steps in every:
            self._patch(steps)
        fits = model.train_function
        model.train_function = None
        if not self.graph:  # made again now, traced with the wrappers at fit's first step
            self._return_squares(model)
            model.make_train_function()  # Keras 3's returns nothing: it sets model.train_function
            model.train_function = self._guarded(model.train_function)
            return
        slots = [(optimizer, list(optimizer.weights)) for optimizer in optimizers_of(model)]
        # Keras' session first initializes what fit would (the optimizer's count): standalone Keras makes
        # its slots in the tapped step, after the count is read, their initial values too.
        session = self.backend.get_session()
        model._make_train_function()
        tapped = model.train_function
        self._carry_slots(slots)
        created = [self.squares, *self.grads.values(), *self.sums.values(), self.sum_of_squares]
        made = [v for v in created if v is not None and not _initialized(session, v)]
        session.run(tf.compat.v1.variables_initializer(made))
        self._fetch_with_the_step(tapped)
        if self.keep:  # read once now: the session makes the executor of this read now, not in a step
            self.values(self._kept_of(list(model.trainable_weights)))
        # fit holds this one: it runs the tapped graph until remove
        self.replaced = (fits, dict(vars(fits)), type(fits))
        vars(fits).update(vars(tapped))
        fits.__class__ = self._guarded_class(type(fits))
        model.train_function = fits

    def _return_squares(self, model: Model) -> None:
        """Eager: the tapped ``train_step`` returns ``squares`` as its writes left them, with its logs;
        ``_call`` takes them out before ``fit`` sees them. The host then reads them with no op: the
        first op after a step cost it 45-70 microseconds on a 2-core VM, the rest of the read 10-15.
        Not under a strategy (Keras adds up or averages what replicas return), nor over a
        ``train_step`` set on the model itself: ``read`` then reads them with an op."""
        if self.strategy is not None or "train_step" in vars(model):
            return
        train_step = model.train_step

        def returning(data: Any) -> Any:
            logs = train_step(data)
            if not isinstance(logs, dict) or self.squares is None:  # no optimizer call made ``squares``
                return logs
            # Read after the step's writes: a tf.function runs the ops on a variable in the order made.
            return {**logs, RETURNED: tf.identity(self.squares)}

        model.train_step = returning
        self.patched.append((model, "train_step"))

    def _fetch_with_the_step(self, function: Any) -> None:
        """Graph mode: ``squares`` as the step wrote it, fetched by the step's own session run where
        the ``K.function`` takes fetches of others (tf.keras', Keras 2.3's; not Keras 2.2's): else
        ``read`` runs the session once more, a few hundred microseconds a step."""
        if self.squares is None or not hasattr(function, "fetch_callbacks"):
            return
        with self.backend.get_session().graph.as_default(), tf.control_dependencies(self.writes):
            written = tf.identity(self.squares)

        def fetched(value: np.ndarray) -> None:
            self.fetched = value

        function.fetches.append(written)
        function.fetch_callbacks[written] = fetched

    def _carry_slots(self, slots: List[Tuple[Any, List[Any]]]) -> None:
        """Standalone Keras' ``get_updates`` makes its optimizer's slots (momenta, ...) anew each time
        it is called: the tapped step's take the values of fit's own, which get the values back at
        ``remove`` (else fit would go on from before the tapped steps)."""
        for optimizer, before in slots:
            now = list(optimizer.weights)
            pairs = [(b, n) for b, n in zip(before, now) if b is not n]
            if len(before) != len(now) or not pairs:
                continue
            self.backend.batch_set_value(
                [(n, v) for (_, n), v in zip(pairs, self.backend.batch_get_value([b for b, _ in pairs]))]
            )
            self.slots.append((optimizer, before, pairs))

    def remove(self) -> None:
        for owner, method in self.patched:
            delattr(owner, method)
        self.patched = []
        for optimizer, before, pairs in self.slots:
            values = self.backend.batch_get_value([n for _, n in pairs])
            self.backend.batch_set_value([(b, v) for (b, _), v in zip(pairs, values)])
            optimizer.weights = before
        self.slots = []
        model = self.model_ref()
        if model is not None:
            model.train_function = None  # the tapped one: the next call makes Keras' own again
        if self.replaced is not None:  # fit's own, back as it was
            fits, state, cls = self.replaced
            fits.__class__ = cls
            vars(fits).clear()
            vars(fits).update(state)
            if model is not None:
                model.train_function = fits
            self.replaced = None

    def stepped(self) -> None:
        """The logger heard of the step the train function just ran (see ``_guarded``)."""
        self.pending = False

    # --- If fit raises (Keras then calls no on_train_end) ----------------------------------------

    def _guarded(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """The tapped train function as ``fit`` calls it: the tap goes if the step raises, or if the
        function is called twice with no word from the logger between (a ``fit`` without it, after one
        that raised between steps: that call runs Keras' own function, made again)."""
        tap = self

        def train_function(*args: Any, **kwargs: Any) -> Any:
            if tap.pending or not tap.patched:
                tap.remove()
                model = tap.model_ref()
                assert model is not None  # its fit calls this
                model.make_train_function()
                return model.train_function(*args, **kwargs)
            return tap._call(function, args, kwargs)

        train_function.compatgrad_tap = self  # type: ignore[attr-defined]
        return train_function

    def _guarded_class(self, cls: type) -> type:
        """Graph mode: ``fit``'s ``K.function``'s class, its call guarded as in ``_guarded``."""
        tap = self

        def __call__(function: Any, *args: Any, **kwargs: Any) -> Any:
            if tap.pending or not tap.patched:
                tap.remove()
                return function(*args, **kwargs)  # Keras' own again
            return tap._call(lambda *a, **k: cls.__call__(function, *a, **k), args, kwargs)

        return type(cls.__name__, (cls,), {"__call__": __call__, "compatgrad_tap": self})

    def _call(self, function: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        self.pending, self.written_in_call, self.fetched = True, False, None
        try:
            outputs = function(*args, **kwargs)
            if isinstance(outputs, dict) and RETURNED in outputs:
                self.fetched = outputs.pop(RETURNED)
            return outputs
        except (StopIteration, tf.errors.OutOfRangeError):  # the data ran out: fit goes on
            self.pending = False
            raise
        except BaseException:
            self.remove()
            raise

    def read(self, weights: List[Any], with_grads: bool) -> Record:
        """What the last logged step wrote; ``with_grads``: the gradients too (if kept)."""
        if self.squares is None:  # no step has run
            return Record(None, None, [None] * len(weights), [None] * len(weights), [None] * len(weights))
        grads = [self.grads.get(id(w)) for w in weights] if with_grads and self.keep else []
        kept_grads = self._kept_of(weights) if grads else []
        if self.fetched is None:
            squares, *kept_values = self._own_values([self.squares] + kept_grads)
        else:  # returned or fetched by the step itself
            squares = np.asarray(self.fetched)
            kept_values = self._own_values(kept_grads) if kept_grads else []
        grad, moved, before = squares.tolist()  # a few numbers each: faster as Python's
        step = int(grad[-1]) if grad[-1] >= 0 else None
        now = int(before[-1]) if before[-1] >= 0 else None
        if moved[-1] < 0:  # that step kept no gradients: those kept are an earlier step's
            grads = []
        arrays = iter(kept_values)
        norms: List[Optional[float]] = []
        ratios: List[Optional[float]] = []
        kept: List[Optional[np.ndarray]] = []
        for i, weight in enumerate(weights):
            array = next(arrays) if grads and grads[i] is not None else None
            column = self.index.get(id(weight))
            written = column is not None and grad[column] >= 0
            norms.append(math.sqrt(grad[column]) if written else None)
            ratios.append(_ratio(moved[column], before[column]) if written and moved[column] >= 0 else None)
            kept.append(array if written else None)
        return Record(step, now, norms, ratios, kept)

    def sums_so_far(self, weights: List[Any]) -> Tuple[float, int, List[Optional[np.ndarray]]]:
        """(The sum of every applied gradient's squared norm, the steps summed, per weight the sum of
        its gradients); under a strategy, each replica's own gradients, over every replica (a step
        counts once a replica)."""
        sums = [self.sums.get(id(w)) for w in weights]
        if self.sum_of_squares is None:
            return 0.0, 0, [None] * len(weights)
        variables = [self.sum_of_squares] + [v for v in sums if v is not None]
        values = iter(self._own_values(variables, every_replica=True))
        total, steps = next(values).tolist()
        return total, int(steps), [None if v is None else next(values) for v in sums]

    def values(self, variables: List[Any]) -> List[Any]:
        if self.graph:
            return list(self.backend.get_session().run(variables))
        return [np.asarray(v.numpy()) for v in variables]

    def _kept_of(self, weights: List[Any]) -> List[Any]:
        """The variables the gradients of ``weights`` are kept in, where kept."""
        return [self.grads[id(w)] for w in weights if id(w) in self.grads]

    def _own_values(self, variables: List[Any], every_replica: bool = False) -> List[Any]:
        """The values of the tap's own ``tf.Variable``s: eagerly, one op each (``numpy()`` costs three
        times as much, read after every logged step). Under a strategy the first replica's copies, or
        with ``every_replica`` the sum of this worker's replicas' copies."""
        if self.graph:
            return self.values(variables)

        def read(variable: Any) -> Any:
            return tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype).numpy()

        if self.strategy is None:
            return [read(v) for v in variables]
        copies = [self.strategy.experimental_local_results(v) for v in variables]
        return [sum(read(c) for c in replicas) if every_replica else read(replicas[0]) for replicas in copies]

    # --- The wrappers ----------------------------------------------------------------------------

    def _patch(self, steps: Steps) -> None:
        optimizer = steps.optimizer
        if hasattr(optimizer, steps.apply_method):
            setattr(optimizer, steps.apply_method, steps.intercepted(self._recorder(steps)))
            self.patched.append((optimizer, steps.apply_method))
        else:  # standalone Keras: get_updates takes get_gradients' gradients to ops of its own
            optimizer.get_updates = self._get_updates(steps)
            self.patched.append((optimizer, "get_updates"))

    def _recorder(self, steps: Steps) -> Callable[[Pairs, bool], Tuple[List[Any], Callable[[Any], Any]]]:
        def record(pairs: Pairs, aggregate: bool) -> Tuple[List[Any], Callable[[Any], Any]]:
            steps.build([v for _, v in pairs])  # as its apply would, before its loss scale is read
            applied = steps.applied(pairs, self.clip, aggregate)
            first = self._first_in_step(pairs)
            # Under a strategy the noise scale takes each replica's own (unscaled, unclipped) gradient.
            own = steps.unscale_in_apply([g for g, _ in pairs]) if self.strategy is not None else applied
            summed = self._accumulate(pairs, own, first)
            due = self._due(steps.inner)
            before = self._before(pairs, due)

            def after(result: Any) -> Any:
                written = self._write(pairs, applied, before, [result], first, steps.inner, due)
                return tf.group(result, written, *summed) if self.graph else result

            return (before or []) + list(due.values()), after

        return record

    def _get_updates(self, steps: Steps) -> Callable[[Any, List[Any]], List[Any]]:
        optimizer = steps.optimizer
        get_updates, gradients = optimizer.get_updates, self.backend.gradients

        def tapped(loss: Any, params: List[Any]) -> List[Any]:
            raw: List[Any] = []

            def kept(loss: Any, variables: List[Any]) -> List[Any]:
                raw[:] = gradients(loss, variables)
                return raw

            due = self._due(steps.inner)
            before = self._before([(None, v) for v in params], due)
            self.backend.gradients = kept  # type: ignore[attr-defined]  # get_gradients' call, before it clips
            try:
                with tf.control_dependencies((before or []) + list(due.values())):  # the reads come first
                    updates = get_updates(loss, params)
            finally:
                self.backend.gradients = gradients  # type: ignore[attr-defined]
            present = [i for i, g in enumerate(raw) if g is not None]
            pairs = [(raw[i], params[i]) for i in present]
            before = None if before is None else [before[i] for i in present]
            # Clipped again as get_gradients does (clip=False: not at all), from its raw gradients.
            clipped = steps.clip(pairs) if self.clip and steps.clips else [g for g, _ in pairs]
            first = self._first_in_step(pairs)
            written = self._write(pairs, clipped, before, updates, first, steps.inner, due)
            return list(updates) + [written] + self._accumulate(pairs, clipped, first)

        return tapped

    def _accumulate(self, pairs: Pairs, applied: List[Any], first: bool) -> List[Any]:
        """Every step (``accumulate``): the running sums of the gradients, of their squared norms and
        (``first``: this step's first optimizer) of the steps."""
        if not self.accumulate or not pairs:
            return []
        grads = [tf.cast(g, tf.float64) for g in _dense(applied)]
        total = 2 * tf.add_n([tf.nn.l2_loss(g) for g in grads])
        counted = tf.stack([total, tf.constant(1.0 if first else 0.0, tf.float64)])
        return [self._sum(v).assign_add(g) for (_, v), g in zip(pairs, grads)] + [
            self._sum_of_squares().assign_add(counted)
        ]

    def _before(self, pairs: Pairs, due: Dict[int, Any]) -> Optional[List[Any]]:
        """The weights as they are before the update, on a step that takes its update ratios (the
        update runs after these reads), or None: no update ratios, or a weight is a RefVariable (TF 1.x
        reads one of those through a snapshot that the update overwrites in place, so how far it moved
        cannot be read in the step)."""
        variables = [v for _, v in pairs]
        if not self.ratios or not variables or any(type(v).__name__ == "RefVariable" for v in variables):
            return None
        return self._when(
            due,
            RATIOS,
            lambda: [tf.identity(v) for v in variables],
            # On the other steps, of the same shape (XLA wants both branches alike) but not the weight,
            # which held across the update would make the update copy it: its gradient where that is
            # a tensor alike, else a fill.
            lambda: [_alike(g, v) for g, v in pairs],
        )

    def _write(
        self,
        pairs: Pairs,
        applied: List[Any],
        before: Optional[List[Any]],
        updates: List[Any],
        first: bool,
        counter: Any,
        due: Dict[int, Any],
    ) -> Any:
        """After ``updates``, ``counter``'s count (the optimizer that applies, inside a loss-scale one)
        into ``squares``; on a step to be logged, with it every weight's squared norms, in one write
        (its gradient's; how far the update moved it and its norm before, on a step that takes the
        update ratios), and the gradients themselves where kept (on a step that keeps them, which the
        array says). ``first`` (the step's first optimizer): a logged step writes -1 everywhere before,
        so what no optimizer of the step writes reads as nothing; a step not logged leaves the last
        logged one's as they were (with several steps an execution, the host reads after the last)."""
        squares = self._squares()
        kept = [(self._kept(v), g) for (_, v), g in zip(pairs, applied)] if self.keep else []
        present = [(i, self.index[id(v)]) for i, (_, v) in enumerate(pairs) if id(v) in self.index]
        if not present:
            return tf.no_op()
        # The column of the counts; ``count``, ``due_after``: made below, after the update.
        last = len(self.index)

        def write(cells: List[Tuple[int, int]], values: List[Any], base: Any) -> Any:
            # One write of the whole array (a replica's copy under a strategy has no scatter of its own).
            written = tf.tensor_scatter_nd_update(base, tf.constant(cells), tf.concat(values, 0))
            return tf.group(squares.assign(written))

        def logged() -> Any:
            grads = _dense(applied)  # here: the steps not logged make no embedding's gradient dense
            columns = [column for _, column in present]
            cells, values = [(GRAD, c) for c in columns], [_squares_of([grads[i] for i, _ in present])]
            if before is not None:

                def moved_and_before() -> Any:
                    weights = [before[i] for i, _ in present]
                    moved = [tf.identity(pairs[i][1]) - b for (i, _), b in zip(present, weights)]
                    return _squares_of(moved + weights)

                cells += [(MOVED, c) for c in columns] + [(BEFORE, c) for c in columns]
                unwritten = functools.partial(_unwritten, 2 * len(present))
                values.append(self._when(due_after, RATIOS, moved_and_before, unwritten))

            def keep_grads() -> Any:  # copied, and a 1 to say so
                with tf.control_dependencies([v.assign(tf.cast(g, v.dtype)) for v, g in kept]):
                    return tf.ones([1], tf.float64)

            kept_now = _unwritten(1)
            if kept:
                kept_now = self._when(due_after, GRADS, keep_grads, lambda: _unwritten(1))
            cells += [(GRAD, last), (MOVED, last), (BEFORE, last)]
            values += [[count], kept_now, [count]]
            base = -tf.ones(squares.shape, tf.float64) if first else tf.convert_to_tensor(squares)
            return write(cells, values, base)

        def not_logged() -> Any:
            return write([(BEFORE, last)], [[count]], tf.convert_to_tensor(squares))

        with tf.control_dependencies(updates if self.graph else []):  # reads how far the update moved
            count = tf.cast(tf.convert_to_tensor(counter.iterations), tf.float64)
            # The conditions again, after the update: graph mode's lowered tf.cond starts a branch's
            # reads once its condition is known (the variables' reads too, without these).
            due_after = {bit: tf.identity(condition) for bit, condition in due.items()}
            written = self._when(due_after, NORMS, logged, not_logged)
        if self.graph:
            self.writes.append(written)
        return written

    def _first_in_step(self, pairs: Pairs) -> bool:
        """Whether this optimizer call, writing some of the weights, is the first such of the step
        being made: the first in the graph it is traced in, or, run eagerly (nothing traced), the first
        since the train function was called."""
        self._squares()  # the index of the weights
        if not any(id(v) in self.index for _, v in pairs):
            return False
        if tf.executing_eagerly():
            first, self.written_in_call = not self.written_in_call, True
            return first
        # Under a strategy each replica's trace writes its own copy: its first call clears it.
        context = tf.distribute.get_replica_context()
        replica = 0 if context is None else int(tf.get_static_value(context.replica_id_in_sync_group))
        traced = self.cleared.setdefault(tf.compat.v1.get_default_graph(), set())
        first = replica not in traced
        traced.add(replica)
        return first

    def _due(self, counter: Any) -> Dict[int, Any]:
        """Per bit that only some steps log (``cadences``), whether the step being made logs it: its
        count, ``counter``'s after the update, a multiple of the bit's cadence. Read before the update
        (what must come first waits for these)."""
        if not self.cadences:
            return {}
        step = tf.cast(tf.convert_to_tensor(counter.iterations), tf.int64) + 1
        return {bit: tf.equal(step % cadence, 0) for bit, cadence in self.cadences.items()}

    def _when(
        self, due: Dict[int, Any], bit: int, logged: Callable[[], Any], otherwise: Callable[[], Any]
    ) -> Any:
        """``logged()`` on a step that logs ``bit``, else ``otherwise()``: a ``tf.cond`` on ``due``
        (``_due``); none where every step logs it."""
        if bit not in due:
            return logged()
        return tf.compat.v1.cond(due[bit], logged, otherwise, strict=True)

    def _squares(self) -> Any:
        """The (3, weights + 1) array, made when the first step is traced (or built), when the model's
        weights exist, outside the step."""
        if self.squares is None:
            model = self.model_ref()
            assert model is not None  # it is being traced
            weights = list(model.trainable_weights)
            self.index = {id(w): i for i, w in enumerate(weights)}
            self.squares = self._variable(lambda: -tf.ones([3, len(weights) + 1], tf.float64))
        return self.squares

    def _sum(self, variable: Any) -> Any:
        if id(variable) not in self.sums:
            self.sums[id(variable)] = self._variable(lambda: tf.zeros(variable.shape, tf.float64))
        return self.sums[id(variable)]

    def _sum_of_squares(self) -> Any:
        if self.sum_of_squares is None:
            self.sum_of_squares = self._variable(lambda: tf.zeros([2], tf.float64))
        return self.sum_of_squares

    def _kept(self, variable: Any) -> Any:
        """The variable a weight's gradient is kept in, made outside the step the first time."""
        if id(variable) not in self.grads:
            dtype = tf.as_dtype(variable.dtype).base_dtype
            self.grads[id(variable)] = self._variable(lambda: tf.zeros(variable.shape, dtype))
        return self.grads[id(variable)]

    def _variable(self, initial: Callable[[], Any]) -> Any:
        """A variable of the tap's, made outside the step. Under a strategy, a copy a replica (each
        replica writes its own, in replica context), read from the first. ``initial``: made out there too."""
        with tf.init_scope():
            if self.strategy is None:
                return tf.Variable(initial, trainable=False)
            return tf.Variable(
                initial,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )


def _dense(grads: List[Any]) -> List[Any]:
    """Embeddings' ``tf.IndexedSlices`` as the dense gradient they add up to."""
    return [tf.convert_to_tensor(g) for g in grads]


def _squares_of(values: List[Any]) -> Any:
    """Their squared L2 norms, float64; ``tf.nn.l2_loss``, one op each, in float32 (mixed precision's
    float16 would overflow)."""
    halves = [tf.nn.l2_loss(v if v.dtype == tf.float32 else tf.cast(v, tf.float32)) for v in values]
    return 2 * tf.cast(tf.stack(halves), tf.float64)


def _unwritten(size: int) -> Any:
    return -tf.ones([size], tf.float64)


def _alike(grad: Any, variable: Any) -> Any:
    """A tensor of the weight's shape and dtype that is not the weight: its gradient if that is one
    (no work), else zeros."""
    dtype = tf.as_dtype(variable.dtype).base_dtype
    if isinstance(grad, tf.Tensor) and grad.dtype == dtype and grad.shape == variable.shape:
        return grad
    return tf.zeros(variable.shape, dtype)


def _lcm(every: int, other: Optional[int]) -> Optional[int]:
    """Every how many steps a step is a multiple of both (None: never)."""
    return None if other is None else every * other // math.gcd(every, other)


def _initialized(session: Any, variable: Any) -> bool:
    """Whether a variable made in an earlier fit already holds its values (they are kept)."""
    return bool(session.run(tf.compat.v1.is_variable_initialized(variable)))


def _ratio(moved: float, before: float) -> float:
    """How far the update moved the weight over its norm before (0 for a weight that was all zeros)."""
    return math.sqrt(moved / before) if before > 0 else 0.0


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
    """Eager: a function a Keras trainer module defines (``make_train_function``'s, Keras 3's
    ``_make_function``'s); graph mode: a ``K.function`` of Keras' backend."""
    if graph:
        return type(function).__module__.split(".")[-1] in ("backend", "tensorflow_backend")
    python_function = getattr(function, "python_function", function)
    module, name = getattr(python_function, "__module__", ""), getattr(python_function, "__qualname__", "")
    return module.split(".")[0] in ("keras", "tf_keras", "tensorflow") and "<locals>" in name
