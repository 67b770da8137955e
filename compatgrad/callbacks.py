"""Keras callbacks. ``GradientLogger``: the gradients ``fit`` applies, recorded while it trains.

    logger = compatgrad.callbacks.GradientLogger(log_dir="logs/grads", histograms_every=100)
    model.fit(x, y, callbacks=[logger])
    logger.history[-1]["global_norm"]

Importing this module imports no framework: the tap (``backends._tap``) comes with the first model.
"""

import logging
import math
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .errors import InvalidArgumentError

LOG = logging.getLogger("compatgrad")


class GradientLogger:
    """A Keras callback (any flavour: it is duck-typed to each Keras' ``CallbackList``) recording the
    gradients the training step applies, on the batches ``fit`` trains on, with no pass of its own: the
    optimizer's apply method is wrapped while ``fit`` traces its step, and keeps what the optimizer
    applies (after loss-scale removal, aggregation and clipping: ``get_gradients``' contract) in
    variables this logger reads after the step. Training is bit for bit what it is without it.

    Every ``every`` steps (a step: one update, counted by ``model.optimizer.iterations``; with
    ``steps_per_execution`` above 1, the last step of each execution) it appends to ``history`` a dict:
    ``step``, ``global_norm``, ``norms`` and ``update_ratios`` by weight name (how far the update moved
    the weight over its norm before, 0 for a weight that was all zeros), ``layer_norms`` by layer name,
    ``alerts``, and every ``histograms_every`` steps ``histograms`` (weight name -> numpy's
    ``(counts, bin_edges)``). With ``log_dir`` it writes the same to TensorBoard; ``on_gradients(step,
    grads)`` gets the applied gradients as numpy arrays in ``model.trainable_weights``' order (None for a
    weight the step applied nothing to).

    Alerts, logged once per layer and kind on the ``compatgrad`` logger: ``non-finite``, ``vanishing``
    (a layer's norm under ``vanishing``), ``exploding`` (over ``exploding``).

    ``clip=False`` records the gradients before the optimizer's clipping (``clipnorm``, ``clipvalue``,
    ``global_clipnorm``). Eager training steps only for now (tf.keras 2.2+, tf_keras, Keras 3 on
    TensorFlow, custom ``train_step`` models included); graph mode, standalone Keras and distribution
    strategies raise ``compatgrad.errors`` when ``fit`` starts.
    """

    # What Keras' CallbackList reads of a callback besides its hooks (TF 2.3+, Keras 3).
    _supports_tf_logs = False
    _chief_worker_only = None

    def __init__(
        self,
        log_dir: Optional[str] = None,
        every: int = 1,
        histograms_every: Optional[int] = None,
        on_gradients: Optional[Callable[[int, List[Optional[np.ndarray]]], Any]] = None,
        clip: bool = True,
        vanishing: float = 1e-7,
        exploding: float = 1e3,
    ):
        _check_every("every", every)
        if histograms_every is not None:
            _check_every("histograms_every", histograms_every)
        if on_gradients is not None and not callable(on_gradients):
            raise InvalidArgumentError("on_gradients", "a function (step, grads) or None", repr(on_gradients))
        if not isinstance(clip, bool):
            raise InvalidArgumentError("clip", "True or False", repr(clip))
        self.log_dir, self.every, self.histograms_every = log_dir, every, histograms_every
        self.on_gradients, self.clip = on_gradients, clip
        self.vanishing, self.exploding = vanishing, exploding
        self.history: List[Dict[str, Any]] = []
        self.model: Any = None
        self.params: Dict[str, Any] = {}
        self._tap: Any = None
        self._writer: Any = None
        self._training = False
        self._alerted: set = set()

    # --- Keras' hooks ---------------------------------------------------------------------------------

    def set_params(self, params: Dict[str, Any]) -> None:
        self.params = params

    def set_model(self, model: Any) -> None:
        """Called as ``fit`` (or ``evaluate``, ``predict``) starts, before ``fit`` makes its train function:
        the tap goes in here, so that the function is traced with it."""
        from .backends._tap import Tap  # imports TensorFlow, which the model's Keras has imported
        from .detect import flavour_of

        self.model = model
        if self._tap is None or self._tap.model_ref() is not model:
            self._tap = Tap(model, flavour_of(model), self.clip)
        if not self._tap.patched:
            self._tap.install()

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._training = True
        if self.log_dir is not None and self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every:
            return
        from .backends._tap import layer_of, weight_names

        weights = list(self.model.trainable_weights)
        applied = self._tap.read(weights)
        entry = _entry(step, weight_names(weights), applied, layer_of(self.model), weights)
        if self.histograms_every and step % self.histograms_every == 0:
            entry["histograms"] = {
                name: np.histogram(g, bins=30)
                for name, g in zip(weight_names(weights), applied.grads)
                if g is not None and np.all(np.isfinite(g))
            }
        self._alert(entry)
        self.history.append(entry)
        if self._writer is not None:
            self._write(entry, weight_names(weights), applied.grads)
        if self.on_gradients is not None:
            self.on_gradients(step, applied.grads)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._training = False
        self._remove()
        if self._writer is not None:
            self._writer.flush()

    def on_test_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._training:  # an evaluate of its own, not fit's validation
            self._remove()

    def on_predict_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._remove()

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        """Every other hook of any Keras (``on_epoch_begin``, ``on_test_batch_end``, ...) does nothing."""
        if name.startswith("on_"):
            return _nothing
        raise AttributeError(name)

    # --- What is logged ---------------------------------------------------------------------------------

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
        import tensorflow as tf

        step = entry["step"]
        with self._writer.as_default():
            tf.summary.scalar("gradients/global_norm", entry["global_norm"], step=step)
            for name, norm in entry["norms"].items():
                tf.summary.scalar(f"gradient_norms/{_tag(name)}", norm, step=step)
            for name, ratio in entry["update_ratios"].items():
                tf.summary.scalar(f"update_ratios/{_tag(name)}", ratio, step=step)
            for layer, norm in entry["layer_norms"].items():
                tf.summary.scalar(f"layer_gradient_norms/{_tag(layer)}", norm, step=step)
            if "histograms" in entry:
                for name, g in zip(names, grads):
                    if name in entry["histograms"]:
                        tf.summary.histogram(f"gradients/{_tag(name)}", g, step=step)


def _entry(
    step: int, names: List[str], applied: Any, layers: Dict[int, str], weights: List[Any]
) -> Dict[str, Any]:
    norms, ratios, layer_squares = {}, {}, {}  # type: Dict[str, float], Dict[str, float], Dict[str, float]
    for weight, name, grad, ratio in zip(weights, names, applied.grads, applied.update_ratios):
        if grad is None:
            continue
        square = float(np.sum(np.square(grad, dtype=np.float64)))
        norms[name], ratios[name] = math.sqrt(square), ratio
        layer = layers.get(id(weight), name)
        layer_squares[layer] = layer_squares.get(layer, 0.0) + square
    return {
        "step": step,
        "global_norm": math.sqrt(sum(n * n for n in norms.values())),
        "norms": norms,
        "update_ratios": ratios,
        "layer_norms": {layer: math.sqrt(s) for layer, s in layer_squares.items()},
        "alerts": [],
    }


def _tag(name: str) -> str:
    """A TensorBoard tag from a weight name: ``dense/kernel:0`` -> ``dense/kernel``."""
    return name.split(":")[0]


def _check_every(argument: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(argument, "a positive number of steps", repr(value))


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


_nothing._is_default = True  # type: ignore[attr-defined]  # Keras 3 then keeps its batches asynchronous
