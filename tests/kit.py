"""What the tests need to know about the Keras under test, and the independent oracles.

The cell is chosen by environment variables, read before any model is built:
COMPATGRAD_KERAS = tf.keras (default) | keras (standalone Keras 2.2/2.3) | tf_keras | keras3,
COMPATGRAD_MODE = eager (default) | graph. TF 1.x is always graph mode.
Keras 3 cells on another backend set KERAS_BACKEND (jax, torch): they install no TensorFlow and import none.
"""

import contextlib
import functools
import importlib
import inspect
import os
import re
from typing import Callable, List, NamedTuple, Optional, Tuple, Type

import numpy as np
import pytest

from compatgrad.errors import InvalidArgumentError, UnsupportedModelError

FLAVOUR = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow") if FLAVOUR == "keras3" else "tensorflow"
tf = importlib.import_module("tensorflow") if BACKEND == "tensorflow" else None
TF1 = tf is not None and (not hasattr(tf, "function") or tf.__version__.startswith("1."))
MODE = "graph" if TF1 else os.environ.get("COMPATGRAD_MODE", "eager")
GRAPH = MODE == "graph"

if GRAPH and not TF1:
    tf.compat.v1.disable_eager_execution()


def _two_logical_cpus():
    """Eager cells split the CPU in two devices, before TensorFlow starts, for MirroredStrategy tests."""
    configure = (
        getattr(tf.config, "set_logical_device_configuration", None)
        or tf.config.experimental.set_virtual_device_configuration
    )
    configuration = (
        getattr(tf.config, "LogicalDeviceConfiguration", None)
        or tf.config.experimental.VirtualDeviceConfiguration
    )
    devices = (
        getattr(tf.config, "list_physical_devices", None) or tf.config.experimental.list_physical_devices
    )
    configure(devices("CPU")[0], [configuration(), configuration()])


if not GRAPH and tf is not None:
    _two_logical_cpus()

keras = (
    tf.keras
    if FLAVOUR == "tf.keras"
    else importlib.import_module("keras" if FLAVOUR == "keras3" else FLAVOUR)
)
backend = keras.backend
KERAS3 = keras.Model.__module__.endswith(".models.model")  # also tf.keras on TF >= 2.16


def _full_float32_precision():
    """float32 sums in full precision on a GPU too, as on a CPU (where this changes nothing).

    On Ampere and later GPUs, JAX's float32 matmuls and convolutions and torch's cuDNN convolutions
    default to TF32 (a 10-bit mantissa): two programs that sum the same products in another order then
    differ by about 1e-5 (2.3e-5 seen on an H200 for JAX, issue 20), the parity tolerance itself. The
    tests check that compatgrad computes the step's gradients, not how two TF32 programs round, so they
    run at the precision where the same sums agree to float32 rounding.
    """
    if BACKEND == "jax":
        importlib.import_module("jax").config.update("jax_default_matmul_precision", "highest")
    elif BACKEND == "torch":
        torch_backends = importlib.import_module("torch").backends
        torch_backends.cuda.matmul.allow_tf32 = False  # torch's default since 1.12, set all the same
        torch_backends.cudnn.allow_tf32 = False


_full_float32_precision()


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
        kwargs["learning_rate" if "learning_rate" in inspect.signature(cls.__init__).parameters else "lr"] = (
            learning_rate
        )
    return cls(**kwargs)


class _Ops(NamedTuple):
    """The few tensor ops the tests' own layers and initializers call, from this cell's framework."""

    constant: Callable  # (value, dtype=None) -> an eager tensor
    matmul: Callable
    mean: Callable  # over every axis
    square: Callable


ops = (
    _Ops(keras.ops.convert_to_tensor, keras.ops.matmul, keras.ops.mean, keras.ops.square)
    if tf is None
    else _Ops(tf.constant, tf.matmul, tf.reduce_mean, tf.square)
)


@contextlib.contextmanager
def float64():
    """Keras' floatx float64 for models built inside (on JAX, which computes in float64 only with
    jax_enable_x64, that too)."""
    backend.set_floatx("float64")
    if BACKEND == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        backend.set_floatx("float32")
        if BACKEND == "jax":
            jax.config.update("jax_enable_x64", False)


def values(variables):
    if KERAS3:
        return [np.array(v.numpy()) for v in variables]
    return [np.array(v) for v in backend.batch_get_value(list(variables))]


def assign(variable, value):
    variable.assign(value) if KERAS3 else backend.set_value(variable, value)


def train(model, x, y, sample_weight=None, class_weight=None, keep_metrics=False):
    """train_on_batch; keep_metrics: do not reset the metrics (Keras 3 always resets them first)."""
    takes_reset = (
        "reset_metrics" in inspect.signature(model.train_on_batch).parameters
    )  # not standalone Keras 2.2
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
    xs, ys, weights = model._standardize_user_data(
        x, y, sample_weight=sample_weight, class_weight=class_weight
    )
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
        feeds = (
            model._feed_inputs + model._feed_targets + model._feed_sample_weights + [backend.learning_phase()]
        )
        function = backend.function(feeds, backend.gradients(model.total_loss, list(weights)))
        return function(xs + ys + ones + [training])
    if BACKEND == "jax":
        return _jax_reference_gradients(model, x, y, weights, training)
    if BACKEND == "torch":
        return _torch_reference_gradients(model, x, y, weights, training)
    x, y = tf.nest.map_structure(tf.convert_to_tensor, (x, y))
    with tf.GradientTape() as tape:
        y_pred = model(x, training=bool(training))
        if hasattr(model, "compute_loss"):
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        else:
            loss = model.compiled_loss(y, y_pred, regularization_losses=model.losses)
    return [np.array(g) for g in tape.gradient(loss, list(weights))]


def _jax_reference_gradients(model, x, y, weights, training):
    """jax.grad of the compiled loss with ``weights`` (trainable variables) read as its argument."""
    import jax

    def loss(values):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):  # nothing it assigns stays
            return model.compute_loss(x=x, y=y, y_pred=model(x, training=bool(training)))

    return [np.array(g) for g in jax.grad(loss)([w.value for w in weights])]


def _torch_reference_gradients(model, x, y, weights, training):
    """torch.autograd.grad of the compiled loss with respect to ``weights`` (trainable variables)."""
    import torch

    loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=bool(training)))
    return [g.detach().numpy() for g in torch.autograd.grad(loss, [w.value for w in weights])]


def session():
    """Graph mode: the session holding the models' variables (the public backend may not export
    get_session)."""
    return importlib.import_module(keras.Model.__module__.split(".engine")[0] + ".backend").get_session()


def hand_gradients(forward, xs, y, wanted):
    """d mean((forward(x) - y)**2) / d [what ``wanted(x, tensors)`` picks], written by hand for each mode.

    ``forward(xs, tap) -> (prediction, {name: tensor})`` calls the model's layers directly, so no
    compatgrad code is involved, and passes each named tensor through ``tap(name, tensor)`` as it makes
    it (JAX differentiates with respect to a zero added there); ``wanted`` names the tensors, or "x0",
    "x1", ... for the inputs.
    """
    if GRAPH:
        placeholders = [tf.compat.v1.placeholder(x.dtype, shape=(None,) + x.shape[1:]) for x in xs]
        prediction, tensors = forward(placeholders, _untapped)
        tensors.update((f"x{i}", p) for i, p in enumerate(placeholders))
        loss = tf.reduce_mean(tf.square(prediction - y))
        gradients = tf.gradients(loss, [tensors[name] for name in wanted])
        return session().run(gradients, dict(zip(placeholders, xs)))
    if BACKEND == "torch":
        return _torch_hand_gradients(forward, xs, y, wanted)
    if BACKEND == "jax":
        return _jax_hand_gradients(forward, xs, y, wanted)
    constants = [tf.constant(x) for x in xs]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(constants)
        prediction, tensors = forward(constants, _untapped)
        tensors.update((f"x{i}", c) for i, c in enumerate(constants))
        loss = tf.reduce_mean(tf.square(prediction - y))
    return [np.array(g) for g in tape.gradient(loss, [tensors[name] for name in wanted])]


def _untapped(name, tensor):
    return tensor


def _torch_hand_gradients(forward, xs, y, wanted):
    import torch

    leaves = [torch.tensor(x, requires_grad=True) for x in xs]
    prediction, tensors = forward(leaves, _untapped)
    tensors.update((f"x{i}", leaf) for i, leaf in enumerate(leaves))
    loss = torch.mean(torch.square(prediction - torch.tensor(y)))
    return [g.numpy() for g in torch.autograd.grad(loss, [tensors[name] for name in wanted])]


def _jax_hand_gradients(forward, xs, y, wanted):
    import jax

    _, tensors = forward(xs, _untapped)
    probes = {name: np.zeros(tensors[name].shape, "float32") for name in wanted if name in tensors}

    def loss(probes, xs):
        prediction, _ = forward(xs, lambda name, tensor: tensor + probes[name] if name in probes else tensor)
        return jax.numpy.mean(jax.numpy.square(prediction - y))

    by_probe, by_input = jax.grad(loss, argnums=(0, 1))(probes, list(xs))
    return [np.array(by_probe[name] if name in probes else by_input[int(name[1:])]) for name in wanted]


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
    return max(
        [
            float(np.max(np.abs(np.asarray(left, np.float64) - np.asarray(right, np.float64))))
            for left, right in zip(a, b)
        ]
        or [0.0]
    )


PARITY_DIFFERENCES = []  # (difference, test) for every comparison with train_on_batch, for the summary


def parity_difference(grads, delta):
    """max_difference against a train_on_batch delta, recorded for the session's summary line."""
    difference = max_difference(grads, delta)
    PARITY_DIFFERENCES.append((difference, os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]))
    return difference


def set_mixed_precision(name):
    """Set the global dtype policy (None: the default) with the API this Keras has. Where it has none, this
    raises (see MIXED_PRECISION): standalone Keras has no mixed_precision, TF 1.x tf.keras
    only the "infer" policies."""
    mixed = keras.mixed_precision
    if hasattr(mixed, "set_global_policy"):
        mixed.set_global_policy(name if name or not KERAS3 else "float32")
    else:
        mixed.experimental.set_policy(name)


def optimizer_variables(optimizer):
    try:
        variables = getattr(optimizer, "variables", None)
        if callable(variables):  # OptimizerV2: a method
            variables = variables()
    except AttributeError:  # TF 2.11's LossScaleOptimizerV3.variables() fails: read its parts
        return optimizer_variables(optimizer.inner_optimizer) + [
            optimizer.loss_scale,
            optimizer.dynamic_counter,
        ]
    return list(variables if variables is not None else optimizer.weights)


def metric_variables(model):
    """Standalone Keras 2.2 lists its compile arguments (names, functions) as metrics: no variables."""
    return [
        v
        for metric in model.metrics
        for v in getattr(metric, "variables", None) or getattr(metric, "weights", None) or []
    ]


def graph_of(model):
    return model.total_loss.graph


# tf.function's shape relaxation: reduce_retracing (TF >= 2.9) generalizes on the first new shape,
# experimental_relax_shapes (TF 2.2-2.8) on the second, so three traces there.
# jax.jit traces once per shape (three sizes: three).
MAX_TRACES_OVER_BATCH_SIZES = (
    2 if tf is not None and "reduce_retracing" in inspect.signature(tf.function).parameters else 3
)


def compiled_steps(model):
    """The compiled steps compatgrad built for ``model``: tf.functions, or (JAX) jitted functions;
    none on PyTorch (A_COMPILED_STEP)."""
    from compatgrad import _cache

    built = [getattr(entry, "step", entry) for entry in _cache.built(model)]  # JAX: a Built holds it
    return [f for f in built if hasattr(f, "get_concrete_function") or hasattr(f, "_cache_size")]


def tracing_count(function):
    if hasattr(function, "_cache_size"):  # jax.jit: one compiled program per shape
        return function._cache_size()
    count = getattr(function, "experimental_get_tracing_count", None) or function._get_tracing_count
    return count()


# What each cell cannot do, declared in one place: per capability, the cells that lack it and why.
# A test that needs a capability carries its `needed` mark and runs in every cell. Where the cell lacks
# it, the test is a strict expected failure that must raise the declared exception: a cell that gains
# the capability fails (XPASS strict), and so does one that fails some other way. A capability declared
# with raises=None cannot be tried at all where it is missing (a step whose outcome varies from run to
# run, two packages that the cell does not install together): there the mark is a skip, decided by this
# table before the test runs, never by catching what a test raised. The cell is told by the installed
# versions and COMPATGRAD_KERAS / COMPATGRAD_MODE: fine in the tests (compatgrad never reads versions).
Version = Tuple[int, int]


def major_minor(text: str) -> Version:
    """(major, minor) of a version string: "2.3.0-tf" -> (2, 3), "2.23.0-dev20261026" -> (2, 23)."""
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


# A cell without TensorFlow (Keras 3 on JAX or PyTorch) has no TF version, so none of the limits of old TFs.
NO_TENSORFLOW: Version = (999, 0)


class Cell(NamedTuple):
    tf: Version  # TensorFlow's (major, minor), NO_TENSORFLOW where there is none
    flavour: str  # COMPATGRAD_KERAS: tf.keras | keras (standalone 2.2 / 2.3) | tf_keras | keras3
    keras: Version  # the standalone or Keras 3 package's own version; Keras 2 tf.keras and tf_keras: TF's
    mode: str  # eager | graph
    backend: str  # Keras 3's backend (KERAS_BACKEND); "tensorflow" for every Keras 2


def _this_cell() -> Cell:
    tf_version = NO_TENSORFLOW if tf is None else major_minor(tf.__version__)
    own_package = FLAVOUR in ("keras", "keras3") or KERAS3  # tf.keras 2.13-2.15 has no __version__
    keras_version = major_minor(keras.__version__) if own_package else tf_version
    return Cell(tf_version, FLAVOUR, keras_version, MODE, BACKEND)


CELL = _this_cell()


class Capability(NamedTuple):
    name: str
    missing_in: Callable[[Cell], bool]
    reason: str
    raises: Optional[Type[BaseException]]  # what a test needing it raises where it is missing; None: skip

    @property
    def missing(self) -> bool:
        return self.missing_in(CELL)

    @property
    def why(self) -> str:
        return f"{self.name}: {self.reason}"

    def needed_by_module(self) -> None:
        """Called at the top of a test module that needs this capability throughout (a skip capability):
        where it is missing, the whole module is one declared skip, its code never run."""
        assert self.raises is None, "only a skip capability can stand for a whole module"
        if self.missing:
            pytest.skip(self.why, allow_module_level=True)

    @property
    def needed(self) -> pytest.MarkDecorator:
        """The mark of a test (or of one parameter) that needs this capability."""
        if self.raises is None:
            return pytest.mark.skipif(self.missing, reason=self.why)
        return pytest.mark.xfail(self.missing, reason=self.why, strict=True, raises=self.raises)


MIXED_PRECISION = Capability(
    name="mixed precision",
    missing_in=lambda cell: cell.tf < (2, 0),
    reason="TF 1.x tf.keras has the 'infer' policies only, standalone Keras no mixed_precision at all",
    raises=AttributeError if CELL.flavour == "keras" else ValueError,
)
GLOBAL_CLIPNORM = Capability(
    name="global_clipnorm",
    missing_in=lambda cell: cell.flavour == "keras" or cell.tf < (2, 4),
    reason="optimizers take global_clipnorm from TF 2.4 on, standalone Keras' never",
    raises=TypeError,  # "Unexpected keyword argument passed to optimizer"
)
CLIPPING_UNDER_A_STRATEGY = Capability(
    name="clipping under a strategy",
    missing_in=lambda cell: cell.flavour == "tf.keras" and cell.tf < (2, 4),
    reason="before TF 2.4, an optimizer that clips refuses to be built under a distribution strategy",
    raises=ValueError,
)
REPLICAS_AVERAGED = Capability(
    name="replicas averaged",
    missing_in=lambda cell: (3, 0) <= cell.keras < (3, 8),
    reason=(
        "Keras 3 < 3.8 does not average the replicas' gradients (3.0-3.4: each applies its own, "
        "3.5-3.7: their sum of whole losses): not one device's gradient on the whole batch"
    ),
    raises=AssertionError,
)
COMPILE_WITHOUT_A_LOSS = Capability(
    name="compile without a loss",
    missing_in=lambda cell: cell.mode == "graph",
    reason="the graph engine's compile refuses a model without a loss: 'no loss to optimize'",
    raises=ValueError,
)
ADAMW = Capability(
    name="AdamW",
    missing_in=lambda cell: cell.mode == "graph" or cell.tf < (2, 12),
    reason="keras.optimizers has AdamW from TF 2.12 on (before: .experimental), the legacy ones never",
    raises=AttributeError,
)
LOSS_CLASSES = Capability(  # for test_datasets' sum-reduced losses
    name="loss classes",
    missing_in=lambda cell: cell.flavour == "keras" and cell.keras < (2, 3),
    reason="standalone Keras 2.2 has no loss classes (keras.losses.MeanSquaredError), so no loss reductions",
    raises=AttributeError,
)
JIT_COMPILE = Capability(
    name="jit_compile",
    missing_in=lambda cell: cell.tf < (2, 8),
    reason="Model.compile takes jit_compile from TF 2.8 on",
    raises=TypeError,  # "Invalid keyword argument(s) in `compile`"
)
STEPS_PER_EXECUTION = Capability(
    name="steps_per_execution",
    missing_in=lambda cell: cell.tf < (2, 4),
    reason="Model.compile takes steps_per_execution from TF 2.4 on (2.3: experimental_steps_per_execution)",
    raises=TypeError,  # "Invalid keyword argument(s) in `compile`"
)
AN_EPOCHS_LAST_EXECUTION_CUT_SHORT = Capability(
    name="an epoch's last execution cut short",
    missing_in=lambda cell: cell.flavour == "keras3" and cell.keras < (3, 7),
    reason=(
        "Keras 3.0-3.6's TF trainer takes each step of an execution with next(iterator): an epoch's "
        "last, cut short, ends in OutOfRange, so fit calls no on_train_batch_end for it and the "
        "optimizer counts a step that applied nothing (Keras 3.7 stops at the data's end)"
    ),
    raises=AssertionError,
)
UNCLIPPED_IN_APPLY = Capability(
    name="unclipped gradients in apply_gradients",
    missing_in=lambda cell: cell.flavour != "keras" and cell.tf < (2, 4),
    reason=(
        "tf.keras before TF 2.4 clips in get_gradients (TF 2.2-2.3: and the train step), before "
        "apply_gradients: the step's unclipped gradients never reach the optimizer"
    ),
    raises=InvalidArgumentError,
)
UNTOUCHED_CLIPNORM_GRAPH = Capability(
    name="clipnorm's graph untouched by a reader",
    missing_in=lambda cell: cell.flavour == "keras" and cell.keras >= (2, 3),
    reason=(
        "standalone Keras 2.3 clips by the global norm in plain graph ops that Grappler rewrites by "
        "what reads the gradients: with GradientLogger's tap reading them too, the weights train to "
        "within an ulp of those without it, not bit for bit (without clipnorm they are identical)"
    ),
    raises=AssertionError,
)
UPDATES_READ_IN_THE_STEP = Capability(
    name="updates read in the step",
    missing_in=lambda cell: cell.flavour == "keras" and cell.keras < (2, 3),
    reason=(
        "standalone Keras 2.2's weights are RefVariables, read through a snapshot the update overwrites "
        "in place: GradientLogger records no update ratios there"
    ),
    raises=AssertionError,
)
# Declared skips: nothing to try where these are missing (test_no_side_effects reads the first two itself).
LOSS_SCALE_PER_MODEL = Capability(
    name="a loss scale per model",
    missing_in=lambda cell: (2, 2) <= cell.tf < (2, 4) and cell.mode == "graph",
    reason=(
        "TF 2.2-2.3: the optimizers compile wraps under mixed_float16 share the policy's one "
        "DynamicLossScale, and in graph mode the session's first step overflows and halves it: "
        "a twin trains with another scale"
    ),
    raises=None,
)
RACE_FREE_STEP = Capability(
    name="race-free step",
    missing_in=lambda cell: cell.flavour == "keras" and cell.keras < (2, 3),
    reason=(
        "standalone Keras 2.2 updates its RefVariables racing the gradients that read them "
        "(RACY_TRAIN_STEP): its train_on_batch applies a gradient that varies from run to run"
    ),
    raises=None,
)
MODEL_KNOWS_ITS_STRATEGY = Capability(
    name="a model's own strategy",
    missing_in=lambda cell: cell.tf < (2, 2) or cell.flavour == "keras",
    reason=(
        "Model.distribute_strategy and its replicated train_step come with TF 2.2 (TF 1.x-2.1 train "
        "under a strategy through distributed loops of their own); standalone Keras knows no strategy"
    ),
    raises=None,
)
NOISE_SCALE_UNDER_A_STRATEGY = Capability(
    name="the noise scale under a strategy",
    missing_in=lambda cell: cell.flavour == "tf.keras" and cell.tf < (2, 4),
    reason=(
        "TF 2.2-2.3's train step sums the replicas' gradients before apply_gradients: no replica's "
        "own reaches the optimizer"
    ),
    raises=InvalidArgumentError,
)
LOSS_SCALE_LOGGED_UNDER_A_STRATEGY = Capability(
    name="a loss scale logged under a strategy",
    missing_in=lambda cell: cell.flavour == "keras3",
    reason=(
        "Keras 3's LossScaleOptimizer under MirroredStrategy: the tapped step applied NaN updates "
        "where Keras' own did not (3.15; seen, not yet understood): GradientLogger refuses it"
    ),
    raises=UnsupportedModelError,
)
FIT_UNDER_MULTI_WORKER_MIRRORED = Capability(
    name="fit under MultiWorkerMirroredStrategy",
    missing_in=lambda cell: cell.flavour == "keras3",
    reason=(
        "Keras 3's fit fails there on its own, with no callback: 3.3-3.6 sum a scalar over axis 0 "
        "('Invalid reduction dimension 0'), 3.9+ convert a PerReplica batch to a tensor"
    ),
    raises=AssertionError,  # a worker exits with Keras' error
)
STATEFUL_RNN_STATES_CARRIED = Capability(
    name="stateful RNN states carried from step to step",
    missing_in=lambda cell: cell.backend in ("jax", "torch"),
    reason=(
        "Keras 3's JAX step neither updates a stateful RNN's states nor reads them as they change: "
        "they stay zeros after train_on_batch; its PyTorch step cannot train one at all: the forward "
        "pass assigns the states in place after reading them, and backward() refuses (RuntimeError)"
    ),
    raises=RuntimeError if CELL.backend == "torch" else AssertionError,
)
A_COMPILED_STEP = Capability(
    name="a compiled step",
    missing_in=lambda cell: cell.backend == "torch",
    reason="Keras 3's PyTorch step runs eagerly (jit_compile='auto' is off there), and so does compatgrad's",
    raises=None,
)
TRAINS_A_LAYER_FROZEN_AFTER_COMPILE = Capability(
    name="a layer frozen after compile trains until a recompile",
    missing_in=lambda cell: cell.backend in ("jax", "torch"),
    reason=(
        "Keras 3's JAX and PyTorch steps read the trainable variables at every call: JAX refuses a list "
        "other than the one its optimizer was built for (ValueError), and compatgrad refuses such a model "
        "too; PyTorch stops training the frozen layer at once (it moves no more, unlike the others)"
    ),
    raises=UnsupportedModelError if CELL.backend == "jax" else AssertionError,
)
TF_KERAS_NEXT_TO_KERAS3 = Capability(
    name="tf_keras next to Keras 3",
    missing_in=lambda cell: cell.flavour != "tf_keras",
    reason="only the tf_keras cells install both (TF >= 2.16 requires Keras 3, tf_keras stands next to it)",
    raises=None,
)

TENSORFLOW = Capability(
    name="TensorFlow",
    missing_in=lambda cell: cell.backend != "tensorflow",
    reason=(
        "the test drives TensorFlow itself (tf.function, tf.data, tf.distribute, a GradientTape oracle) "
        "or a compatgrad feature built on it (test_errors checks their refusal there); the cell has none"
    ),
    raises=None,
)
FEATURES_BUILT_ON_TENSORFLOW = Capability(
    name="features built on TensorFlow's engines",
    missing_in=lambda cell: cell.backend != "tensorflow",
    reason=(
        "models that override train_step, symbolic_gradients, GradientLogger and apply_gradients run on "
        "Keras 3's TensorFlow backend: compatgrad refuses them on JAX and PyTorch"
    ),
    raises=UnsupportedModelError,
)
FLOAT64_MATMUL = Capability(
    name="float64 matrix products",
    missing_in=lambda cell: cell.backend == "torch",
    reason=(
        "Keras 3.15's matmul on torch casts float64 operands to float32 (Dense and LSTM layers of a float64 "
        "model are float32-accurate there), so float64 finite differences cannot resolve their gradients"
    ),
    raises=AssertionError,
)
OUTPUTS_OF_A_SHARED_LAYER = Capability(
    name="the outputs of a layer called more than once, as params",
    missing_in=lambda cell: cell.backend == "jax",
    reason=(
        "on JAX compatgrad adds a zero to a wanted tensor where its layer is called, and cannot tell one "
        "call of a shared layer from another: it refuses them"
    ),
    raises=UnsupportedModelError,
)
SPARSE_GRADIENTS = Capability(
    name="sparse gradients (sparse=True)",
    missing_in=lambda cell: cell.backend != "tensorflow",
    reason="tf.IndexedSlices are TensorFlow's: JAX and torch differentiate an Embedding to a dense array",
    raises=AssertionError,
)

CAPABILITIES = [
    MIXED_PRECISION,
    GLOBAL_CLIPNORM,
    CLIPPING_UNDER_A_STRATEGY,
    REPLICAS_AVERAGED,
    COMPILE_WITHOUT_A_LOSS,
    ADAMW,
    LOSS_CLASSES,
    JIT_COMPILE,
    STEPS_PER_EXECUTION,
    AN_EPOCHS_LAST_EXECUTION_CUT_SHORT,
    UNCLIPPED_IN_APPLY,
    UNTOUCHED_CLIPNORM_GRAPH,
    UPDATES_READ_IN_THE_STEP,
    LOSS_SCALE_PER_MODEL,
    RACE_FREE_STEP,
    MODEL_KNOWS_ITS_STRATEGY,
    NOISE_SCALE_UNDER_A_STRATEGY,
    FIT_UNDER_MULTI_WORKER_MIRRORED,
    LOSS_SCALE_LOGGED_UNDER_A_STRATEGY,
    STATEFUL_RNN_STATES_CARRIED,
    A_COMPILED_STEP,
    TRAINS_A_LAYER_FROZEN_AFTER_COMPILE,
    TF_KERAS_NEXT_TO_KERAS3,
    TENSORFLOW,
    FEATURES_BUILT_ON_TENSORFLOW,
    FLOAT64_MATMUL,
    OUTPUTS_OF_A_SHARED_LAYER,
    SPARSE_GRADIENTS,
]


def missing_capabilities() -> List[str]:
    return [capability.name for capability in CAPABILITIES if capability.missing]
