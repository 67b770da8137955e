"""Keras callbacks. ``GradientLogger``: the gradients ``fit`` applies, recorded while it trains.

    logger = compatgrad.callbacks.GradientLogger(log_dir="logs/grads", histograms_every=100)
    model.fit(x, y, callbacks=[logger])
    logger.history[-1]["global_norm"]

Importing this module imports no framework: the tap (``backends._tap``) comes with the first model.
"""

import logging
import math
import os
import socket
import time
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import versions
from .errors import InvalidArgumentError

LOG = logging.getLogger("compatgrad")


class AnyKerasCallback:
    """A callback any Keras' ``fit`` takes (duck-typed to each ``CallbackList``, so that this module
    imports no Keras): the hooks a subclass does not define do nothing."""

    # What Keras' CallbackList reads of a callback besides its hooks (TF 2.3+, Keras 3).
    _supports_tf_logs = True  # it reads no logs: Keras need not turn them into numbers for it
    _chief_worker_only = None

    def __init__(self) -> None:
        self.model: Any = None
        self.params: Dict[str, Any] = {}

    def set_params(self, params: Dict[str, Any]) -> None:
        self.params = params

    def set_model(self, model: Any) -> None:
        self.model = model

    def _implements_train_batch_hooks(self) -> bool:
        return any(hasattr(type(self), hook) for hook in ("on_train_batch_begin", "on_train_batch_end"))

    def _implements_test_batch_hooks(self) -> bool:
        return any(hasattr(type(self), hook) for hook in ("on_test_batch_begin", "on_test_batch_end"))

    def _implements_predict_batch_hooks(self) -> bool:
        return any(hasattr(type(self), hook) for hook in ("on_predict_batch_begin", "on_predict_batch_end"))

    def __getattr__(self, name: str) -> Any:
        """Every other hook of any Keras (``on_epoch_begin``, ``on_test_batch_end``, ...) does nothing."""
        if name.startswith("on_"):
            return _nothing
        raise AttributeError(name)


class GradientLogger(AnyKerasCallback):
    """A Keras callback (any flavour: it is duck-typed to each Keras' ``CallbackList``) recording the
    gradients the training step applies, on the batches ``fit`` trains on, with no pass of its own: the
    optimizer's apply method is wrapped while ``fit`` traces its step, and keeps what the optimizer
    applies (after loss-scale removal, aggregation and clipping: ``get_gradients``' contract) in
    variables this logger reads after the step. Training is bit for bit what it is without it.

    Every ``every`` steps (a step: one batch ``fit`` trains on, counted as ``model.optimizer.iterations``
    counts them: the steps logged are those whose count after them is a multiple of ``every``, which
    the step itself tells, and nothing is read after the others; with ``steps_per_execution`` above 1,
    the last of an execution's) it appends to ``history`` a dict:
    ``step``, ``global_norm``, ``norms`` by weight name, ``layer_norms`` by layer name, ``alerts``, and
    every ``update_ratios_every`` steps ``update_ratios`` by weight name (how far the update moved the
    weight over its norm before, 0 for a weight that was all zeros; else empty), every
    ``histograms_every`` steps ``histograms`` (weight name -> numpy's ``(counts, bin_edges)``).
    An update ratio costs the step a copy of each weight (held across the optimizer's in-place update)
    and three passes over it, as much memory traffic as plain SGD's update and more: hence its cadence
    of its own, every 10 steps unless ``update_ratios_every`` says otherwise (1: every logged step;
    None: never). With ``log_dir`` it writes the same to TensorBoard; ``on_gradients(step,
    grads)`` gets the applied gradients as numpy arrays in ``model.trainable_weights``' order (None for a
    weight the step applied nothing to).

    Alerts, logged once per layer and kind on the ``compatgrad`` logger: ``non-finite``, ``vanishing``
    (a layer's norm under ``vanishing``), ``exploding`` (over ``exploding``).

    ``clip=False`` records the gradients before the optimizer's clipping (``clipnorm``, ``clipvalue``,
    ``global_clipnorm``); refused where tf.keras clips before the optimizer sees them (TF < 2.4).
    Every Keras ``fit`` runs: eagerly (tf.keras 2.2+, tf_keras, Keras 3 on TensorFlow, custom
    ``train_step`` models included) and in graph mode (TF 1.x, TF 2, standalone Keras; no update ratios
    for standalone Keras 2.2's RefVariables); under a distribution strategy eagerly (each replica keeps
    what it applies, the logger reads the first replica's, whose weights ``model.trainable_weights``
    read). Refused with ``compatgrad.errors`` when ``fit`` starts, before anything is changed: a
    ``train_function`` set from outside Keras, a strategy in graph mode, the noise scale under a strategy
    where the optimizer is handed gradients already summed across replicas, Keras 3's
    ``LossScaleOptimizer`` under a strategy.

    ``noise_scale_batch_size`` (the batch size ``fit`` trains with) turns on the gradient noise scale
    estimate (``NoiseScale``), every ``noise_scale_window`` steps, in ``noise.estimate`` and ``history``.

    The step itself computes each weight's squared norms (of its gradient, its update, the weight before
    it) into one array the logger reads after the step; the gradients are copied out only on the steps
    ``on_gradients`` or histograms need them.
    """

    def __init__(
        self,
        log_dir: Optional[str] = None,
        every: int = 1,
        histograms_every: Optional[int] = None,
        on_gradients: Optional[Callable[[int, List[Optional[np.ndarray]]], Any]] = None,
        clip: bool = True,
        update_ratios_every: Optional[int] = 10,
        vanishing: float = 1e-7,
        exploding: float = 1e3,
        noise_scale_batch_size: Optional[int] = None,
        noise_scale_window: int = 8,
        noise_scale_smoothing: float = 0.9,
    ):
        _check_every("every", every)
        for argument, cadence in (
            ("histograms_every", histograms_every),
            ("update_ratios_every", update_ratios_every),
        ):
            if cadence is not None:
                _check_every(argument, cadence)
        if on_gradients is not None and not callable(on_gradients):
            raise InvalidArgumentError("on_gradients", "a function (step, grads) or None", repr(on_gradients))
        if not isinstance(clip, bool):
            raise InvalidArgumentError("clip", "True or False", repr(clip))
        self.log_dir, self.every, self.histograms_every = log_dir, every, histograms_every
        self.update_ratios_every = update_ratios_every
        self.on_gradients, self.clip = on_gradients, clip
        self.vanishing, self.exploding = vanishing, exploding
        if noise_scale_batch_size is not None:
            _check_every("noise_scale_batch_size", noise_scale_batch_size)
        _check_every("noise_scale_window", noise_scale_window)
        if noise_scale_window < 2 or not 0 <= noise_scale_smoothing < 1:
            raise InvalidArgumentError(
                "noise_scale_window, noise_scale_smoothing",
                "a window of 2 steps or more and a smoothing in [0, 1)",
                f"{noise_scale_window!r}, {noise_scale_smoothing!r}",
            )
        super().__init__()
        # It reads no logs: tf.keras (2.2+) then hands the batch hooks its tensors as they are, not
        # copied to numpy every step.
        self._supports_tf_logs = True
        self.noise = NoiseScale(noise_scale_batch_size, noise_scale_window, noise_scale_smoothing)
        self.history: List[Dict[str, Any]] = []
        self._tap: Any = None
        self._writer: Any = None
        self._training = False
        self._weights: List[Any] = []  # the model's trainable weights, their names, their layers' names
        self._names: List[str] = []
        self._layers: Dict[int, str] = {}
        self._alerted: set = set()
        self._steps = self._epoch_start = 0  # counted as fit trains
        self._logged: Optional[int] = None  # the step of the last entry, or the count fit started at
        self._unreported = 0  # the batches an execution runs past the one fit reports (on_train_begin)

    # --- Keras' hooks ---------------------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        """Called as ``fit`` (or ``evaluate``, ``predict``) starts, before ``fit`` makes its train function:
        the tap goes in here, so that the function is traced with it."""
        from .backends import require_tensorflow
        from .detect import flavour_of

        flavour = flavour_of(model)
        require_tensorflow(flavour.root, "GradientLogger")
        from .backends._tap import Tap  # imports TensorFlow, which the model's Keras has imported

        self.model = model
        self._training = False  # fit, evaluate or predict starts (fit's validation calls no set_model)
        if self._tap is None or self._tap.model_ref() is not model:
            self._tap = Tap(
                model,
                flavour,
                self.clip,
                every=self.every,
                ratios_every=self.update_ratios_every,
                grads_every=1 if self.on_gradients is not None else self.histograms_every,
                accumulate=self.noise.batch_size is not None,
            )
            self.noise.replicas = self._tap.replicas
        if not self._tap.patched:
            self._tap.install()
            if model.built:  # else its first step builds it (on_train_batch_end looks again)
                self._describe(model)

    def _describe(self, model: Any) -> None:
        """The model's trainable weights, their names and their layers' names."""
        from .backends._tap import layer_of, weight_names

        self._weights = list(model.trainable_weights)
        self._names = weight_names(self._weights)
        self._layers = layer_of(model)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._tap.patched:  # another logger's set_model took the model over after this one's
            other = getattr(self.model.train_function, "compatgrad_tap", None)
            if other is not None:
                other.remove()
            raise InvalidArgumentError(
                "callbacks", "one GradientLogger a fit", "two tapping the same model's step"
            )
        self._training = True
        self._tap.stepped()
        if self.log_dir is not None and self._writer is None:
            self._writer = _EventWriter(self.log_dir)
        # Steps are counted here, from the optimizer's count as fit starts (and as each logged step
        # wrote it): nothing is read on the steps in between.
        # The count of the optimizer that applies: Keras 3.3-3.6's LossScaleOptimizer has one of its
        # own that no step moves.
        counter = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        self._steps = self._epoch_start = int(self._tap.values([counter.iterations])[0])
        # A count that has not moved since is no step: one a loss scale skipped (its gradients overflow).
        self._logged = self._steps
        # The batches an execution runs past the one fit reports after it (Keras 3.3-3.9 report its first).
        self._unreported = 0
        if not versions.reports_an_executions_last_batch(self.model):
            self._unreported = int(getattr(self.model, "steps_per_execution", None) or 1) - 1

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch_start = self._steps

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        """``batch``: the epoch's batch the call trained on (with ``steps_per_execution``, its last, or in
        Keras 3.3-3.9 its first)."""
        self._tap.stepped()
        before = self._steps
        last = batch + self._unreported
        if self._unreported and self.params.get("steps"):  # an epoch's last execution may be cut short
            last = min(last, self.params["steps"] - 1)
        step = self._steps = self._epoch_start + last + 1
        if not self._weights:  # a model its first step built
            self._describe(self.model)
        if self.noise.due(step):
            self.noise.update(step, *self._tap.sums_so_far(self._weights))
        if not self._due(step, before, self.every):
            return
        with_grads = self.on_gradients is not None or self._due(step, before, self.histograms_every)
        record = self._tap.read(self._weights, with_grads)
        if record.now is not None:  # the count the steps reached: the host's may drift (an execution
            self._epoch_start += record.now - step  # cut short, a step a loss scale skipped)
            self._steps = record.now
        if record.step is None or record.step == self._logged:  # no step logged since the last read
            return
        self._logged = step = record.step
        names, grads = self._names, record.grads
        entry = _entry(step, names, record, self._layers, self._weights)
        if self.noise.estimate is not None:
            entry["noise_scale"] = self.noise.estimate
        if self.histograms_every is not None and step % self.histograms_every == 0:
            entry["histograms"] = {
                name: np.histogram(g, bins=30)
                for name, g in zip(names, grads)
                if g is not None and np.all(np.isfinite(g))
            }
        self._alert(entry)
        self.history.append(entry)
        if self._writer is not None:
            self._write(entry, names, grads)
        if self.on_gradients is not None:
            self.on_gradients(step, grads)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._training = False
        self._remove()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def on_test_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._training:  # an evaluate of its own, not fit's validation
            self._remove()

    def on_predict_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._training:  # a predict of its own, not one called while fit trains
            self._remove()

    # --- What is logged ---------------------------------------------------------------------------------

    @staticmethod
    def _due(step: int, before: int, every: Optional[int]) -> bool:
        """Whether the steps after ``before`` up to ``step`` reach a multiple of ``every`` (None: never)."""
        return every is not None and step // every > before // every

    def _remove(self) -> None:
        if self._tap is not None:
            self._tap.remove()

    def _alert(self, entry: Dict[str, Any]) -> None:
        for layer, norm in entry["layer_norms"].items():
            kind = (
                "non-finite"
                if not math.isfinite(norm)
                else "vanishing"
                if norm < self.vanishing
                else "exploding"
                if norm > self.exploding
                else None
            )
            if kind is None:
                continue
            entry["alerts"].append({"layer": layer, "kind": kind, "norm": norm})
            if (layer, kind) not in self._alerted:
                self._alerted.add((layer, kind))
                LOG.warning(
                    "GradientLogger: %s gradients in layer %s at step %d (norm %g)",
                    kind,
                    layer,
                    entry["step"],
                    norm,
                )

    def _write(self, entry: Dict[str, Any], names: List[str], grads: List[Optional[np.ndarray]]) -> None:
        event = self._writer.event(entry["step"])
        add = event.summary.value.add  # values added in place: a few microseconds each
        add(tag="gradients/global_norm", simple_value=entry["global_norm"])
        if "noise_scale" in entry:
            add(tag="gradients/noise_scale", simple_value=entry["noise_scale"])
        for prefix, values in (
            ("gradient_norms", entry["norms"]),
            ("update_ratios", entry["update_ratios"]),
            ("layer_gradient_norms", entry["layer_norms"]),
        ):
            for name, value in values.items():
                add(tag=f"{prefix}/{_tag(name)}", simple_value=value)
        histograms = entry.get("histograms", {})
        for name, g in zip(names, grads):
            if g is not None and name in histograms:
                add(tag=f"gradients/{_tag(name)}", histo=_histogram(g, *histograms[name]))
        self._writer.write(event)


class NoiseScale:
    """The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A), from
    two batch sizes one device's training already has: each step's gradient (``batch_size`` examples)
    and the mean of a ``window`` of successive steps' (``window * batch_size``). From the mean squared
    norm of the small ones, S, and the squared norm of their mean, L:
    |G|^2 ~ (B_big L - B_small S) / (B_big - B_small), tr(Sigma) ~ (S - L) / (1 / B_small - 1 / B_big),
    each smoothed by an exponential moving average before the ratio is taken. Its bias: the steps of a
    window are taken at successive weights, so their mean is not one batch's gradient; the bias grows
    with how far the weights move within a window (the learning rate). The gradients are what the
    logger records: unscaled, clipped unless ``clip=False`` (clipping shrinks both terms unevenly).
    Under a distribution strategy the small ones are each replica's own gradient at each step
    (``batch_size / replicas`` examples: fit splits its batch), unscaled and unclipped, and the big one
    their mean over the replicas and the window (a ratio: how Keras scales a replica's loss cancels)."""

    def __init__(self, batch_size: Optional[int], window: int, smoothing: float):
        self.batch_size, self.window, self.smoothing = batch_size, window, smoothing
        self.replicas = 1  # under a strategy, each replica's own gradient is a small batch
        self.estimate: Optional[float] = None
        self.averages: Optional[List[float]] = None  # of |G|^2 and tr(Sigma)
        self.start: Optional[Tuple[int, float, int, List[Any]]] = None  # (step, the sums so far)

    def due(self, step: int) -> bool:
        """Whether a window ends at ``step`` (or the first one starts): the sums are read then."""
        return self.batch_size is not None and (self.start is None or step - self.start[0] >= self.window)

    def update(self, step: int, sum_of_squares: float, summed: int, sums: List[Optional[np.ndarray]]) -> None:
        """At ``step`` (the logger's count), the running sums: of the squared norms, of the steps
        summed (as the step counts them), of the gradients."""
        start, self.start = self.start, (step, sum_of_squares, summed, sums)
        count = summed - start[2] if start is not None else 0
        if start is None or self.batch_size is None or count < 2:
            return
        small = (sum_of_squares - start[1]) / count  # S
        large = sum(  # L
            float(np.sum(np.square((now - (0 if before is None else before)) / count)))
            for now, before in zip(sums, start[3])
            if now is not None
        )
        small_batch = self.batch_size / self.replicas
        norm, trace = noise_scale_terms(small_batch, small_batch * count, small, large)
        if self.averages is None:
            self.averages = [norm, trace]
        else:
            self.averages = [
                self.smoothing * a + (1 - self.smoothing) * v for a, v in zip(self.averages, (norm, trace))
            ]
        self.estimate = self.averages[1] / self.averages[0] if self.averages[0] > 0 else None


def noise_scale_terms(
    small_batch: float, big_batch: float, small_mean_square: float, big_square: float
) -> Tuple[float, float]:
    """Unbiased estimates of |G|^2 and tr(Sigma) (McCandlish et al. 2018, appendix A.1) from the mean
    squared norm of gradients of ``small_batch`` examples and the squared norm of one (or the mean)
    of ``big_batch``: their ratio is B_simple."""
    norm = (big_batch * big_square - small_batch * small_mean_square) / (big_batch - small_batch)
    trace = (small_mean_square - big_square) / (1.0 / small_batch - 1.0 / big_batch)
    return norm, trace


def _entry(
    step: int, names: List[str], record: Any, layers: Dict[int, str], weights: List[Any]
) -> Dict[str, Any]:
    norms: Dict[str, float] = {}
    update_ratios: Dict[str, float] = {}
    layer_squares: Dict[str, float] = {}
    for weight, name, norm, ratio in zip(weights, names, record.norms, record.update_ratios):
        if norm is None:
            continue
        norms[name] = norm
        if ratio is not None:
            update_ratios[name] = ratio
        layer = layers.get(id(weight), name)
        layer_squares[layer] = layer_squares.get(layer, 0.0) + norm * norm
    return {
        "step": step,
        "global_norm": math.sqrt(sum(n * n for n in norms.values())),
        "norms": norms,
        "update_ratios": update_ratios,
        "layer_norms": {layer: math.sqrt(s) for layer, s in layer_squares.items()},
        "alerts": [],
    }


class _EventWriter:
    """A TensorBoard event file: TFRecords of ``Event`` protos holding TF 1 ``Summary`` values, written
    with TensorFlow's own record writer. One Python call a step and no op (``tf.summary``'s writer ran
    one op a step, a few hundred microseconds on a small CPU), the same in graph mode and eagerly."""

    FLUSH_SECONDS = 10.0  # how stale a running fit's file may be for a TensorBoard reading it

    def __init__(self, log_dir: str) -> None:
        import tensorflow as tf

        self.protos = tf.compat.v1  # Event, Summary
        tf.io.gfile.makedirs(log_dir)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{uuid.uuid4().hex}"
        self.records = tf.io.TFRecordWriter(os.path.join(log_dir, name))
        self.flushed = time.monotonic()
        self._append(self.protos.Event(file_version="brain.Event:2"))
        # Closed (what is buffered written) when fit ends, or when the logger goes: a fit that raised
        # never ends.
        self.close = weakref.finalize(self, self.records.close)

    def event(self, step: int) -> Any:
        """An event of ``step``, for its summary's values."""
        return self.protos.Event(step=step)

    def write(self, event: Any) -> None:
        self._append(event)
        if time.monotonic() - self.flushed > self.FLUSH_SECONDS:
            self.records.flush()
            self.flushed = time.monotonic()

    def _append(self, event: Any) -> None:
        event.wall_time = time.time()
        self.records.write(event.SerializeToString())


def _histogram(values: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> Any:
    """A ``HistogramProto`` of ``values``, from numpy's histogram of them: each bucket given by its
    upper edge."""
    import tensorflow as tf

    flat = values.astype(np.float64).ravel()
    return tf.compat.v1.HistogramProto(
        min=float(flat.min()),
        max=float(flat.max()),
        num=float(flat.size),
        sum=float(flat.sum()),
        sum_squares=float(np.dot(flat, flat)),
        bucket_limit=[float(e) for e in edges[1:]],
        bucket=[float(c) for c in counts],
    )


def _tag(name: str) -> str:
    """A TensorBoard tag from a weight name: ``dense/kernel:0`` -> ``dense/kernel``."""
    return name.split(":")[0]


def _check_every(argument: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(argument, "a positive number of steps", repr(value))


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


_nothing._is_default = True  # type: ignore[attr-defined]  # Keras 3 then keeps its batches asynchronous
