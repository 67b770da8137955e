"""``compatgrad check``: the parity contract on small embedded models, for every Keras importable here.

Each case compares ``get_gradients`` with ``w0 - w1`` of one ``train_on_batch`` under
``SGD(learning_rate=1.0)``; the layer-outputs case also compares the gradient with respect to the
model's output with its closed form under mse, 2 (prediction - y) / batch. Eager cases run in this
process; graph cases in a subprocess, since graph mode must be switched on before any model is built.
"""

import json
import subprocess
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import versions
from ..detect import installed_flavours

TOLERANCE = 1e-5


class Row(NamedTuple):
    flavour: str
    mode: str
    case: str
    difference: Optional[float]  # None: not applicable
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.difference is None or self.difference <= TOLERANCE


def run_cases(flavour: str, keras: Any, mode: str) -> List[Row]:
    """The cases for ``flavour`` (``keras``: its module) in ``mode``, which this process runs in."""
    from .. import errors, get_gradients, layer_outputs

    layers = keras.layers
    legacy = versions.legacy_optimizers(keras) if mode == "graph" else None
    sgd_class = legacy.SGD if legacy is not None else keras.optimizers.SGD
    learning_rate = versions.learning_rate_argument(sgd_class)
    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    labels = rng.randint(0, 3, size=(32, 1))
    weights = rng.uniform(0, 2, size=32).astype("float32")

    def mlp(
        loss: str = "mse", units: int = 1, regularizer: Any = None, batchnorm: bool = False, **optimizer: Any
    ) -> Any:
        stack = [layers.Dense(8, input_shape=(5,), kernel_regularizer=regularizer)]
        stack += [layers.BatchNormalization()] if batchnorm else []
        stack += [layers.Activation("tanh"), layers.Dense(units, activation="softmax" if units > 1 else None)]
        model = keras.Sequential(stack)
        model.compile(sgd_class(**{learning_rate: 1.0}, **optimizer), loss)
        return model

    cases: Dict[str, Callable[[], Tuple[Any, Any, Any, Any]]] = {
        "dense mse": lambda: (mlp(), x, y, None),
        "classifier": lambda: (mlp("sparse_categorical_crossentropy", units=3), x, labels, None),
        "l2 regularizer": lambda: (mlp(regularizer=keras.regularizers.l2(0.05)), x, y, None),
        "sample weights": lambda: (mlp(), x, y, weights),
        "clipnorm": lambda: (mlp(clipnorm=0.05), x, 3 * y, None),
        "batchnorm, learning_phase=1": lambda: (mlp(batchnorm=True), x, y, None),
        "weights + layer outputs": lambda: (mlp(), x, y, None),
    }
    rows = []
    for case, build in cases.items():
        try:
            model, inputs, targets, sample_weight = build()
            variables = list(model.trainable_weights)
            outputs = layer_outputs(model, [-1]) if "outputs" in case else []
            grads = get_gradients(
                model, inputs, targets, variables + outputs, sample_weight=sample_weight, learning_phase=1
            )
            differences = []
            if outputs:  # mse of a Dense(1) output: d loss / d prediction = 2 (prediction - y) / batch
                closed_form = 2 * (model.predict(inputs, verbose=0) - targets) / len(targets)
                differences.append(float(np.max(np.abs(grads.pop() - closed_form))))
            before = _values(keras, variables)
            model.train_on_batch(inputs, targets, sample_weight=sample_weight)
            after = _values(keras, variables)
            differences += [float(np.max(np.abs(b - a - g))) for b, a, g in zip(before, after, grads)]
            rows.append(Row(flavour, mode, case, max(differences)))
        except errors.CompatgradError as error:
            rows.append(Row(flavour, mode, case, None, f"n/a: {error}"))
    return rows


def _values(keras: Any, variables: List[Any]) -> List[np.ndarray]:
    """The variables' values: Keras 3 (any backend) reads each, Keras 2 all at once (one session run)."""
    if hasattr(keras, "config") and hasattr(keras.config, "backend"):  # Keras 3
        return [np.array(v.numpy()) for v in variables]
    return [np.array(v) for v in keras.backend.batch_get_value(variables)]


def modes(flavour: str, keras: Any) -> Dict[str, str]:
    """mode -> "here" (this process), "subprocess", or why it does not apply; ``keras``: the flavour's
    module."""
    if flavour == "keras3":  # on TensorFlow or JAX: nothing here imports TensorFlow
        return {"eager": "here", "graph": "n/a: Keras 3 cannot train in graph mode"}
    import tensorflow as tf

    if flavour == "keras" and versions.updates_race_gradients(keras):
        return {
            "graph": "n/a: standalone Keras 2.2's train_on_batch races (see compatgrad doctor), "
            "so it is no oracle"
        }
    if not tf.executing_eagerly():  # TF 1.x
        return {"graph": "here"}
    if flavour == "keras":
        return {"eager": "n/a: standalone Keras runs in graph mode on TF 1.x only"}
    return {"eager": "here", "graph": "subprocess"}


def check(flavours: Dict[str, Any]) -> List[Row]:
    """The cases for each of ``flavours`` (``installed_flavours()``), in each mode it trains in."""
    rows: List[Row] = []
    for flavour, keras in flavours.items():
        for mode, where in modes(flavour, keras).items():
            if where == "here":
                rows += run_cases(flavour, keras, mode)
            elif where == "subprocess":
                rows += _in_subprocess(flavour, mode)
            else:
                rows.append(Row(flavour, mode, "all cases", None, where))
    return rows


def _in_subprocess(flavour: str, mode: str) -> List[Row]:
    command = [sys.executable, "-m", "compatgrad", "check", "--only", flavour, mode]
    result = subprocess.run(command, capture_output=True, text=True)
    try:
        return [Row(*row) for row in json.loads(result.stdout.strip().splitlines()[-1])]
    except (ValueError, IndexError):
        return [Row(flavour, mode, "subprocess", float("inf"), "failed: " + result.stderr.strip()[-300:])]


def run_only(flavour: str, mode: str) -> str:
    """The subprocess side: switch graph mode on first, then run and print the rows as JSON."""
    import tensorflow as tf

    if mode == "graph" and tf.executing_eagerly():
        tf.compat.v1.disable_eager_execution()
    return json.dumps([list(row) for row in run_cases(flavour, installed_flavours()[flavour], mode)])


def table(rows: List[Row]) -> str:
    lines = ["{:<10} {:<6} {:<28} {:>12}  {}".format("flavour", "mode", "case", "max |diff|", "result")]
    for row in rows:
        shown = "-" if row.difference is None else f"{row.difference:.2e}"
        result = row.note if row.difference is None else ("pass" if row.ok else "FAIL " + row.note)
        lines.append(f"{row.flavour:<10} {row.mode:<6} {row.case:<28} {shown:>12}  {result}")
    return "\n".join(lines)
