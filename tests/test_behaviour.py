"""No side effects, caching (no graph growth, no retracing), invalidation on recompile, a light import."""

import subprocess
import sys

import numpy as np
import pytest

import kit
from compatgrad import get_gradients
from compatgrad.backends._layers import layer_states
from compatgrad.errors import UnconnectedGradientError

layers = kit.keras.layers
optimizer_names = pytest.mark.parametrize("opt", sorted(kit.OPTIMIZERS))


def bn_model(opt, metrics=("mae",)):
    model = kit.keras.Sequential(
        [
            layers.Dense(6, input_shape=(4,)),
            layers.BatchNormalization(),
            layers.Activation("tanh"),
            layers.Dense(1, dtype="float32"),
        ]
    )
    model.compile(kit.sgd(opt, learning_rate=0.1, momentum=0.9), "mse", metrics=list(metrics))
    return model


def state(model):
    return (
        kit.values(model.weights)
        + kit.values(kit.optimizer_variables(model.optimizer))
        + kit.values(kit.metric_variables(model))
    )


@pytest.fixture(params=["float32", pytest.param("mixed_float16", marks=kit.MIXED_PRECISION.needed)])
def policy(request):
    if request.param != "float32":
        kit.set_mixed_precision(request.param)
    yield request.param
    if request.param != "float32":
        kit.set_mixed_precision(None)


@optimizer_names
def test_no_side_effects(opt, policy, rng):
    """Weights, optimizer slots, iterations and loss scale, metric totals, train function: all untouched."""
    x, y = rng.randn(32, 4).astype("float32"), rng.randn(32, 1).astype("float32")
    weights = rng.uniform(0, 2, size=32).astype("float32")
    model, twin = bn_model(opt), bn_model(opt)
    twin.set_weights(model.get_weights())
    for m in (model, twin):  # optimizer slots and metric totals exist and are non-zero
        kit.train(m, x, y, sample_weight=weights, keep_metrics=True)
    before = state(model)
    twins_agree = kit.max_difference(before, state(twin)) == 0.0
    train_function = getattr(model, "train_function", None)

    for phase in (0, 1):
        get_gradients(model, x, y, learning_phase=phase)
        get_gradients(model, x, y, sample_weight=weights, learning_phase=phase)
    assert kit.max_difference(state(model), before) == 0.0
    if not kit.GRAPH:
        assert model.train_function is train_function

    # Where the cell declares that identical models train differently, there is no twin to compare with.
    if kit.RACE_FREE_STEP.missing:  # whether the twins agree varies from run to run
        pytest.skip(kit.RACE_FREE_STEP.why)
    if policy == "mixed_float16" and kit.LOSS_SCALE_PER_MODEL.missing:  # they never agree: fail if they do
        assert not twins_agree, f"the twins trained alike: undeclare {kit.LOSS_SCALE_PER_MODEL.name!r}"
        pytest.skip(kit.LOSS_SCALE_PER_MODEL.why)
    assert twins_agree, "two identical models trained differently before compatgrad ran"
    for m in (model, twin):
        kit.train(m, x, y, sample_weight=weights, keep_metrics=True)
        kit.train(m, x, y, keep_metrics=True)
    assert kit.max_difference(state(model), state(twin)) == 0.0


def test_a_two_output_models_metric_totals_are_untouched(rng):
    """A loss per output: Keras 3's compiled loss keeps a total per output, written with the loss."""
    inputs = layers.Input(shape=(5,))
    hidden = layers.Dense(6, activation="tanh")(inputs)
    model = kit.keras.Model(inputs, [layers.Dense(1, name="a")(hidden), layers.Dense(2, name="b")(hidden)])
    model.compile(kit.sgd(), loss=["mse", "mae"], loss_weights=[0.3, 2.0])
    x, ys = (
        rng.randn(16, 5).astype("float32"),
        [rng.randn(16, 1).astype("float32"), rng.randn(16, 2).astype("float32")],
    )
    kit.train(model, x, ys, keep_metrics=True)
    before = state(model)
    for phase in (0, 1):
        get_gradients(model, x, ys, learning_phase=phase)
    assert kit.max_difference(state(model), before) == 0.0


@pytest.mark.skipif(not kit.GRAPH, reason="graph mode only")
def test_graph_does_not_grow_over_1000_calls(rng):
    x, y = rng.randn(64, 4).astype("float32"), rng.randn(64, 1).astype("float32")
    weights = rng.uniform(0, 2, size=64).astype("float32")
    model = bn_model(None)
    graph = kit.graph_of(model)
    for sample_weight in (None, weights):
        get_gradients(model, x, y, sample_weight=sample_weight)
        graph = kit.graph_of(model)  # a weighted call recompiles the loss once
        ops = len(graph.get_operations())
        for _ in range(1000):
            get_gradients(model, x, y, sample_weight=sample_weight)
        assert len(graph.get_operations()) == ops
    print(f"graph ops after the first call and after 1000 more: {ops} {len(graph.get_operations())}")


@pytest.mark.skipif(kit.GRAPH, reason="eager mode only")
@kit.A_COMPILED_STEP.needed
def test_eager_step_is_traced_once_per_shape_family(rng):
    model = bn_model(None)
    data = {n: (rng.randn(n, 4).astype("float32"), rng.randn(n, 1).astype("float32")) for n in (128, 100, 64)}
    for _ in range(5):
        get_gradients(model, *data[128])
    (step,) = kit.compiled_steps(model)
    assert kit.tracing_count(step) == 1
    for n in (100, 64, 128):
        get_gradients(model, *data[n])
    traces = kit.tracing_count(step)
    for n in (100, 64, 128):
        get_gradients(model, *data[n])
    assert traces <= kit.MAX_TRACES_OVER_BATCH_SIZES and kit.tracing_count(step) == traces
    print(f"traces over batch sizes 128, 100, 64, 128: {traces}")


@optimizer_names
def test_recompile_invalidates_the_cache(opt, rng):
    x, y = rng.randn(32, 4).astype("float32"), rng.randn(32, 1).astype("float32")
    model = bn_model(opt, metrics=())
    mse = get_gradients(model, x, y, learning_phase=1)
    model.compile(kit.sgd(opt), "mae")
    mae = get_gradients(model, x, y, learning_phase=1)
    assert kit.max_difference(mse, mae) > 1e-3
    assert kit.parity_difference(mae, kit.train_step_delta(model, x, y)) <= 1e-5


def test_gradients_are_writable_arrays_of_their_own(rng):
    """As graph mode's session outputs: a caller may scale them in place, and the next call is unaffected."""
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    model = bn_model(None, metrics=())
    first = get_gradients(model, x, y)
    expected = [g.copy() for g in first]
    for g in first:
        g *= 0.0  # a read-only array (an eager tensor's buffer) raises here
    assert kit.max_difference(get_gradients(model, x, y), expected) == 0.0


@pytest.mark.skipif(kit.BACKEND != "torch", reason="only torch variables hold a .grad")
def test_torch_grad_attributes_are_as_the_last_step_left_them(rng):
    """torch.autograd.grad writes no .grad: the trainer's backward() leaves this step's gradients there."""
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    model = bn_model(None, metrics=())
    values = [v.value for v in model.trainable_variables]
    get_gradients(model, x, y)
    assert all(value.grad is None for value in values)
    kit.train(model, x, y)
    left = [value.grad.clone() for value in values]
    get_gradients(model, x, y, learning_phase=1)
    assert kit.max_difference([value.grad.numpy() for value in values], [g.numpy() for g in left]) == 0.0


class WithUnusedWeight(layers.Layer):
    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel", shape=(int(input_shape[-1]), 1), initializer="glorot_uniform"
        )
        self.unused = self.add_weight(name="unused", shape=(2,), initializer="ones")

    def call(self, inputs):
        return kit.ops.matmul(inputs, self.kernel)

    def compute_output_shape(self, input_shape):  # standalone Keras assumes the input's shape otherwise
        return (input_shape[0], 1)


@optimizer_names
def test_unconnected_params(opt, rng):
    x, y = rng.randn(8, 3).astype("float32"), rng.randn(8, 1).astype("float32")
    inputs = layers.Input(shape=(3,))
    layer = WithUnusedWeight(name="with_unused")
    model = kit.keras.Model(inputs, layer(inputs))
    model.compile(kit.sgd(opt), "mse")
    with pytest.raises(UnconnectedGradientError, match="unused") as raised:
        get_gradients(model, x, y)
    assert list(raised.value.missing.values()) == [layer.unused]
    [name] = raised.value.missing  # the name as_dict gives it
    assert name in get_gradients(model, x, y, unconnected="zero", as_dict=True)

    zeros = get_gradients(model, x, y, [layer.unused], unconnected="zero")
    assert zeros[0].shape == (2,) and not zeros[0].any()
    kernel, unused = get_gradients(model, x, y, [layer.kernel, layer.unused], unconnected="skip")
    assert unused is None
    # The kernel's gradient in closed form: mse of a linear map, 2 x^T (x k - y) / (batch * outputs).
    kernel_value = kit.values([layer.kernel])[0]
    closed_form = 2 * x.T @ (x @ kernel_value - y) / len(x)
    assert kit.max_difference([kernel], [closed_form]) <= 1e-5
    skipped = get_gradients(model, x, y, [layer.kernel, layer.unused], unconnected="skip", as_dict=True)
    assert len(skipped) == 1 and kit.max_difference(list(skipped.values()), [kernel]) == 0.0
    if not kit.GRAPH:  # the eager step skips None gradients; graph mode's get_updates refuses them
        grads = get_gradients(model, x, y, unconnected="zero")
        assert kit.parity_difference(grads, kit.train_step_delta(model, x, y)) <= 1e-5


def stateful_rnn_model(kind):
    """``kind`` (a stateful recurrent layer, a fixed batch of 4), a stateful LSTM(2), a Dense head."""
    inputs = layers.Input(batch_shape=(4, 5, 3))
    if kind == "Bidirectional":
        recurrent = layers.Bidirectional(layers.GRU(6, stateful=True, return_sequences=True))
    elif kind == "nested":  # the stateful layer inside a model inside the model
        inner = layers.Input(batch_shape=(4, 5, 3))
        recurrent = kit.keras.Model(inner, layers.LSTM(6, stateful=True, return_sequences=True)(inner))
    else:
        recurrent = getattr(layers, kind)(6, stateful=True, return_sequences=True)
    hidden = layers.LSTM(2, stateful=True)(recurrent(inputs))
    model = kit.keras.Model(inputs, layers.Dense(1)(hidden))
    model.compile(kit.sgd(), "mse")
    return model


# The first layer's state variables (Bidirectional: one per GRU), then the LSTM(2)'s two.
STATE_VARIABLES = {"LSTM": 2 + 2, "GRU": 1 + 2, "SimpleRNN": 1 + 2, "Bidirectional": 2 + 2, "nested": 2 + 2}


@kit.STATEFUL_RNN_STATES_CARRIED.needed
@pytest.mark.parametrize("kind", sorted(STATE_VARIABLES))
def test_stateful_rnn_states_are_preserved(kind, rng):
    """A stateful RNN's states (in neither model.weights nor non_trainable_variables) stay as they were in
    either learning phase, so the next train_on_batch starts from them and applies the gradient returned."""
    x, y = rng.randn(4, 5, 3).astype("float32"), rng.randn(4, 1).astype("float32")
    model = stateful_rnn_model(kind)
    kit.train(model, x, y)  # the states are no longer zeros
    states = layer_states(model)
    assert len(states) == STATE_VARIABLES[kind]
    before = kit.values(states)
    assert min(float(np.abs(value).max()) for value in before) > 0.0

    x, y = rng.randn(4, 5, 3).astype("float32"), rng.randn(4, 1).astype("float32")
    grads = [get_gradients(model, x, y, learning_phase=phase) for phase in (0, 1)]
    assert kit.max_difference(kit.values(states), before) == 0.0
    assert kit.parity_difference(grads[1], kit.train_step_delta(model, x, y)) <= 1e-5
    assert kit.max_difference(kit.values(states), before) > 0.0  # the step advanced exactly these variables


def test_layer_states_of_layers_without_state():
    """Stateless RNNs hold no state variables; a stateful one has none before it is built."""
    inputs = layers.Input(shape=(5, 3))
    model = kit.keras.Model(inputs, layers.Dense(1)(layers.LSTM(2)(inputs)))
    assert layer_states(model) == []
    assert layer_states(layers.GRU(2, stateful=True)) == []


def test_import_adds_no_optional_dependency():
    framework = "tensorflow" if kit.tf is not None else kit.BACKEND
    probe = (
        f"import sys, {framework}; before = set(sys.modules); import compatgrad; "
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    added = set(
        subprocess.run(
            [sys.executable, "-c", probe], stdout=subprocess.PIPE, check=True, text=True
        ).stdout.split()
    )
    assert "compatgrad" in added
    assert not added & {
        "matplotlib",
        "tqdm",
        "scipy",
        "pandas",
        "tensorflow",
        "jax",
        "torch",
        "keras",
        "tf_keras",
        "h5py",
    }, added
