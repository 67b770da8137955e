"""What the tests need to know about the Keras under test, and the independent oracles.

The cell is chosen by environment variables, read before any model is built:
COMPATGRAD_KERAS = tf.keras (default) | keras (standalone Keras 2.2/2.3) | tf_keras | keras3,
COMPATGRAD_MODE = eager (default) | graph. TF 1.x is always graph mode.
"""
import functools
import importlib
import inspect
import os

import numpy as np
import tensorflow as tf

FLAVOUR = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
TF1 = not hasattr(tf, "function") or tf.__version__.startswith("1.")
MODE = "graph" if TF1 else os.environ.get("COMPATGRAD_MODE", "eager")
GRAPH = MODE == "graph"

if GRAPH and not TF1:
    tf.compat.v1.disable_eager_execution()


def _two_logical_cpus():
    """Eager cells split the CPU in two devices, before TensorFlow starts, for MirroredStrategy tests."""
    configure = getattr(tf.config, "set_logical_device_configuration", None) or tf.config.experimental.set_virtual_device_configuration
    configuration = getattr(tf.config, "LogicalDeviceConfiguration", None) or tf.config.experimental.VirtualDeviceConfiguration
    devices = getattr(tf.config, "list_physical_devices", None) or tf.config.experimental.list_physical_devices
    configure(devices("CPU")[0], [configuration(), configuration()])


if not GRAPH:
    _two_logical_cpus()

keras = tf.keras if FLAVOUR == "tf.keras" else importlib.import_module("keras" if FLAVOUR == "keras3" else FLAVOUR)
backend = keras.backend
KERAS3 = keras.Model.__module__.endswith(".models.model")  # also tf.keras on TF >= 2.16


def _optimizer_classes():
    """SGD classes that this cell's training step can use, by name."""
    classes = {}
    optimizers = keras.optimizers
    legacy = None if KERAS3 else getattr(optimizers, "legacy", None)
    if not GRAPH:
        classes["sgd"] = optimizers.SGD
    if legacy is not None and hasattr(legacy, "SGD"):
        classes["legacy_sgd"] = legacy.SGD
    elif GRAPH:
        classes["sgd"] = optimizers.SGD  # before the 2.11 split, SGD is the legacy optimizer
    return classes


OPTIMIZERS = _optimizer_classes()


def sgd(name=None, **kwargs):
    """SGD(learning_rate=1.0): then w0 - w1 is exactly the gradient the step applied."""
    cls = OPTIMIZERS[name or next(iter(OPTIMIZERS))]
    return make_optimizer(cls, learning_rate=kwargs.pop("learning_rate", 1.0), **kwargs)


def make_optimizer(cls, learning_rate=None, **kwargs):
    """``cls(learning_rate=...)``; standalone Keras 2.2 names it ``lr``."""
    if learning_rate is not None:
        kwargs["learning_rate" if "learning_rate" in inspect.signature(cls.__init__).parameters else "lr"] = learning_rate
    return cls(**kwargs)


def values(variables):
    if KERAS3:
        return [np.array(v.numpy()) for v in variables]
    return [np.array(v) for v in backend.batch_get_value(list(variables))]


def assign(variable, value):
    variable.assign(value) if KERAS3 else backend.set_value(variable, value)


def train(model, x, y, sample_weight=None, class_weight=None, keep_metrics=False):
    """train_on_batch; keep_metrics: do not reset the metrics (Keras 3 always resets them first)."""
    takes_reset = "reset_metrics" in inspect.signature(model.train_on_batch).parameters  # not standalone Keras 2.2
    kwargs = {"reset_metrics": False} if keep_metrics and takes_reset else {}
    if class_weight is not None:
        kwargs["class_weight"] = class_weight
    return model.train_on_batch(x, y, sample_weight=sample_weight, **kwargs)


# Standalone Keras 2.2 updates RefVariables ordered after the loss only, not after the gradients that
# read them: its train_on_batch may read a weight that another update has already changed, and applies
# a gradient that varies from run to run (seen on TF 1.14 and 1.15; Keras 2.3 uses resource variables).
RACY_TRAIN_STEP = FLAVOUR == "keras" and keras.__version__.startswith("2.2.")


def train_step_delta(model, x, y, sample_weight=None, class_weight=None):
    """w0 - w1 for the model's trainable weights after one train_on_batch (with SGD(1.0): the gradient).

    Where that step races (RACY_TRAIN_STEP), the gradient its get_updates starts from instead: the
    optimizer's own get_gradients of total_loss, fed as train_on_batch feeds its train function.
    """
    if RACY_TRAIN_STEP:  # the step still runs: callers go on from the trained model
        expected = _race_free_step_gradients(model, x, y, sample_weight, class_weight)
        train(model, x, y, sample_weight=sample_weight, class_weight=class_weight)
        return expected
    weights = list(model.trainable_weights)
    before = values(weights)
    train(model, x, y, sample_weight=sample_weight, class_weight=class_weight)
    return [b - a for b, a in zip(before, values(weights))]


def _race_free_step_gradients(model, x, y, sample_weight, class_weight):
    xs, ys, weights = model._standardize_user_data(x, y, sample_weight=sample_weight, class_weight=class_weight)
    feeds = model._feed_inputs + model._feed_targets + model._feed_sample_weights
    fed = xs + ys + weights
    if model._uses_dynamic_learning_phase():
        feeds, fed = feeds + [backend.learning_phase()], fed + [1.0]
    gradients = model.optimizer.get_gradients(model.total_loss, list(model.trainable_weights))
    return backend.function(feeds, [tf.convert_to_tensor(g) for g in gradients])(fed)  # IndexedSlices: dense


def reference_gradients(model, x, y, weights, training):
    """Hand-written gradients of the compiled loss, without the optimizer (no clipping, no scaling)."""
    if GRAPH:
        xs = x if isinstance(x, list) else [x]
        ys = y if isinstance(y, list) else [y]
        ones = [np.ones(len(xs[0]), "float32") for _ in model._feed_sample_weights]
        feeds = model._feed_inputs + model._feed_targets + model._feed_sample_weights + [backend.learning_phase()]
        function = backend.function(feeds, backend.gradients(model.total_loss, list(weights)))
        return function(xs + ys + ones + [training])
    x, y = tf.nest.map_structure(tf.convert_to_tensor, (x, y))
    with tf.GradientTape() as tape:
        y_pred = model(x, training=bool(training))
        if hasattr(model, "compute_loss"):
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        else:
            loss = model.compiled_loss(y, y_pred, regularization_losses=model.losses)
    return [np.array(g) for g in tape.gradient(loss, list(weights))]


def session():
    """Graph mode: the session holding the models' variables (the public backend may not export get_session)."""
    return importlib.import_module(keras.Model.__module__.split(".engine")[0] + ".backend").get_session()


def hand_gradients(forward, xs, y, wanted):
    """d mean((forward(x) - y)**2) / d [what ``wanted(x, tensors)`` picks], written by hand for each mode.

    ``forward(xs) -> (prediction, {name: tensor})`` calls the model's layers directly, so no
    compatgrad code is involved; ``wanted`` names the tensors, or "x0", "x1", ... for the inputs.
    """
    if GRAPH:
        placeholders = [tf.compat.v1.placeholder(x.dtype, shape=(None,) + x.shape[1:]) for x in xs]
        prediction, tensors = forward(placeholders)
        tensors.update(("x{}".format(i), p) for i, p in enumerate(placeholders))
        loss = tf.reduce_mean(tf.square(prediction - y))
        gradients = tf.gradients(loss, [tensors[name] for name in wanted])
        return session().run(gradients, dict(zip(placeholders, xs)))
    constants = [tf.constant(x) for x in xs]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(constants)
        prediction, tensors = forward(constants)
        tensors.update(("x{}".format(i), c) for i, c in enumerate(constants))
        loss = tf.reduce_mean(tf.square(prediction - y))
    return [np.array(g) for g in tape.gradient(loss, [tensors[name] for name in wanted])]


@functools.lru_cache(maxsize=None)
def mirrored():
    """One MirroredStrategy over the two logical CPUs for the process: strategies made apart number their
    all-reduces from the same collective keys, and two models' all-reduces of different sizes then meet
    as one ("Shape mismatch in the collective instance 100"), train_on_batch's alike (TF 2.18, 2.21)."""
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def max_difference(a, b):
    """Largest absolute difference between two lists of arrays (0.0 for two empty lists)."""
    assert len(a) == len(b), (len(a), len(b))
    for left, right in zip(a, b):
        assert np.shape(left) == np.shape(right), (np.shape(left), np.shape(right))
    return max([float(np.max(np.abs(np.asarray(left, np.float64) - np.asarray(right, np.float64)))) for left, right in zip(a, b)] or [0.0])


PARITY_DIFFERENCES = []  # (difference, test) for every comparison with train_on_batch, for the summary


def parity_difference(grads, delta):
    """max_difference against a train_on_batch delta, recorded for the session's summary line."""
    difference = max_difference(grads, delta)
    PARITY_DIFFERENCES.append((difference, os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]))
    return difference


def set_mixed_precision(name):
    """Set the global dtype policy (None: the default); False where this Keras has no mixed precision API."""
    mixed = getattr(keras, "mixed_precision", None)
    if mixed is None or TF1:  # TF 1.x has only the "infer_float32_vars" policies
        return False
    if hasattr(mixed, "set_global_policy"):
        mixed.set_global_policy(name if name or not KERAS3 else "float32")
        return True
    experimental = getattr(mixed, "experimental", None)
    if experimental is not None and hasattr(experimental, "set_policy") and hasattr(tf, "function"):
        experimental.set_policy(name)
        return True
    return False


def optimizer_variables(optimizer):
    try:
        variables = getattr(optimizer, "variables", None)
        if callable(variables):  # OptimizerV2: a method
            variables = variables()
    except AttributeError:  # TF 2.11's LossScaleOptimizerV3.variables() fails: read its parts
        return optimizer_variables(optimizer.inner_optimizer) + [optimizer.loss_scale, optimizer.dynamic_counter]
    return list(variables if variables is not None else optimizer.weights)


def metric_variables(model):
    """Standalone Keras 2.2 lists its compile arguments (names, functions) as metrics: no variables."""
    return [v for metric in model.metrics for v in getattr(metric, "variables", None) or getattr(metric, "weights", None) or []]


def graph_of(model):
    return model.total_loss.graph


# tf.function's shape relaxation: reduce_retracing (TF >= 2.9) generalizes on the first new shape,
# experimental_relax_shapes (TF 2.2-2.8) on the second, so three traces there.
MAX_TRACES_OVER_BATCH_SIZES = 2 if "reduce_retracing" in inspect.signature(tf.function).parameters else 3


def tracing_count(function):
    count = getattr(function, "experimental_get_tracing_count", None) or function._get_tracing_count
    return count()
