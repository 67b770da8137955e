"""per_example_gradients against the training step: the examples add up to train_on_batch's gradient,
each is its share of the step on that example alone, float64 finite differences, norms and dot
products equal those of the materialized gradients, and what cannot be split into examples is refused."""

import contextlib

import numpy as np
import pytest

import kit
from compatgrad import SparseGradient, errors, get_gradients, per_example_gradients

keras, tf = kit.keras, kit.tf
layers = keras.layers
TOL = 1e-5
N = 8


@contextlib.contextmanager
def restored(model):
    """The model's weights as they were, after a step taken for an oracle."""
    weights = list(model.weights)
    before = kit.values(weights)
    yield
    for variable, value in zip(weights, before):
        kit.assign(variable, value)


def step_on(model, x, y, sample_weight=None, class_weight=None):
    """The gradient train_on_batch applies to this batch (w0 - w1 with SGD(1.0)), weights put back."""
    with restored(model):
        return kit.train_step_delta(model, x, y, sample_weight=sample_weight, class_weight=class_weight)


def classifier(loss="sparse_categorical_crossentropy", regularized=False, loss_weights=None):
    """4 -> Dense(6, tanh) -> Dense(3, softmax): the loss reads the logits under the softmax."""
    regularizer = keras.regularizers.l2(0.05) if regularized else None
    inputs = layers.Input(shape=(4,))
    hidden = layers.Dense(
        6, activation="tanh", kernel_regularizer=regularizer, activity_regularizer=regularizer
    )(inputs)
    model = keras.Model(inputs, layers.Dense(3, activation="softmax")(hidden))
    model.compile(kit.sgd(), loss)
    return model


def classes(rng):
    return (
        rng.randn(N, 4).astype("float32"),
        rng.randint(0, 3, size=(N,)),
        rng.uniform(0.5, 2, N).astype("float32"),
    )


def sum_reduced():
    return keras.losses.SparseCategoricalCrossentropy(reduction="sum")


def flat(grads):
    """Per example, every param's gradient in one row."""
    return np.concatenate([np.asarray(g).reshape(len(g), -1) for g in grads], axis=1)


@pytest.mark.parametrize(
    "loss, weighting",
    [
        ("sparse_categorical_crossentropy", None),
        ("sparse_categorical_crossentropy", "sample"),
        ("sparse_categorical_crossentropy", "class"),
        pytest.param(sum_reduced, "sample", marks=kit.LOSS_CLASSES.needed),
    ],
)
def test_examples_add_up_to_the_step_regularization_shared(rng, loss, weighting):
    x, y, w = classes(rng)
    model = classifier(loss() if callable(loss) else loss, regularized=True)
    sample_weight = w if weighting == "sample" else None
    class_weight = {0: 0.5, 1: 2.0, 2: 1.5} if weighting == "class" else None
    grads = per_example_gradients(model, x, y, sample_weight=sample_weight, class_weight=class_weight)
    assert [g.shape for g in grads] == [(N,) + tuple(v.shape) for v in model.trainable_weights]
    expected = step_on(model, x, y, sample_weight, class_weight)
    assert kit.parity_difference([g.sum(axis=0) for g in grads], expected) <= TOL


@pytest.mark.parametrize(
    "loss, share",
    [
        ("sparse_categorical_crossentropy", 1.0 / N),
        pytest.param(sum_reduced, 1.0, marks=kit.LOSS_CLASSES.needed),
    ],
)
def test_each_example_is_its_share_of_the_step_on_it_alone(rng, loss, share):
    """Mean reduction: the step on example i alone (weight w_i) averages over one example, the batch's
    over N, so example i's share is 1/N of it; a SUM-reduced loss adds the examples as they are."""
    x, y, w = classes(rng)
    model = classifier(loss() if callable(loss) else loss)
    grads = per_example_gradients(model, x, y, sample_weight=w)
    for i in (0, 5):
        alone = step_on(model, x[i : i + 1], y[i : i + 1], w[i : i + 1])
        assert kit.max_difference([g[i] for g in grads], [share * a for a in alone]) <= TOL


def two_outputs():
    inputs = layers.Input(shape=(4,))
    hidden = layers.Dense(5, activation="relu")(inputs)
    model = keras.Model(
        inputs,
        [layers.Dense(2, name="first")(hidden), layers.Dense(3, activation="softmax", name="second")(hidden)],
    )
    model.compile(kit.sgd(), ["mse", "sparse_categorical_crossentropy"], loss_weights=[0.3, 2.0])
    return model


def test_multi_output_loss_weights(rng):
    x, labels, _ = classes(rng)
    y = [rng.randn(N, 2).astype("float32"), labels]
    model = two_outputs()
    grads = per_example_gradients(model, x, y)
    assert kit.parity_difference([g.sum(axis=0) for g in grads], step_on(model, x, y)) <= TOL
    alone = step_on(model, x[2:3], [y[0][2:3], y[1][2:3]])
    assert kit.max_difference([g[2] for g in grads], [a / N for a in alone]) <= TOL


# --- Layers ------------------------------------------------------------------------------------------

MULTI_HEAD_ATTENTION = kit.Capability(
    name="MultiHeadAttention",
    missing_in=lambda cell: cell.flavour == "keras" or cell.tf < (2, 4),
    reason="keras.layers has MultiHeadAttention from TF 2.4 on, standalone Keras never",
    raises=AttributeError,
)
LAYER_NORMALIZATION = kit.Capability(
    name="LayerNormalization",
    missing_in=lambda cell: cell.flavour == "keras",
    reason="standalone Keras 2.2 / 2.3 has no LayerNormalization",
    raises=AttributeError,
)


def sequence_model(kind):
    """Integer tokens (0 = padding) or vectors through one layer kind, then a Dense head."""
    if kind in ("lstm masked", "gru", "embedding"):
        tokens = layers.Input(shape=(5,), dtype="int32")
        vectors = layers.Embedding(10, 3, mask_zero=kind == "lstm masked")(tokens)
        if kind == "embedding":
            hidden = layers.Flatten()(vectors)
        else:
            hidden = (layers.LSTM(4) if kind == "lstm masked" else layers.GRU(4))(vectors)
        return tokens, hidden
    if kind == "conv2d":
        images = layers.Input(shape=(5, 5, 2))
        return images, layers.Flatten()(layers.Conv2D(3, 3, activation="relu")(images))
    series = layers.Input(shape=(5, 3))
    if kind == "conv1d":
        hidden = layers.Conv1D(4, 2, activation="tanh")(series)
    elif kind == "layer norm":
        hidden = layers.LayerNormalization()(layers.Dense(4)(series))
    elif kind == "attention":
        hidden = layers.MultiHeadAttention(num_heads=2, key_dim=2)(series, series)
    else:  # "nested": a model inside the model
        inner_inputs = layers.Input(shape=(5, 3))
        inner = keras.Model(inner_inputs, layers.Dense(4, activation="relu")(inner_inputs), name="inner")
        hidden = inner(series)
    return series, layers.Flatten()(hidden)


def layer_batch(kind, rng):
    if kind in ("lstm masked", "gru", "embedding"):
        x = rng.randint(1, 10, size=(N, 5)).astype("int32")
        x[:, 3:] *= rng.randint(0, 2, size=(N, 1)).astype("int32")  # some end padded
        return x
    return (
        rng.randn(N, 5, 5, 2).astype("float32") if kind == "conv2d" else rng.randn(N, 5, 3).astype("float32")
    )


@pytest.mark.parametrize(
    "kind",
    [
        "conv1d",
        "conv2d",
        "embedding",
        "lstm masked",
        "gru",
        "nested",
        pytest.param("layer norm", marks=LAYER_NORMALIZATION.needed),
        pytest.param("attention", marks=MULTI_HEAD_ATTENTION.needed),
    ],
)
def test_layers_add_up_and_each_example_is_its_share(rng, kind):
    inputs, hidden = sequence_model(kind)
    model = keras.Model(inputs, layers.Dense(2)(hidden))
    model.compile(kit.sgd(), "mse")
    x, y = layer_batch(kind, rng), rng.randn(N, 2).astype("float32")
    grads = per_example_gradients(model, x, y)
    assert kit.parity_difference([g.sum(axis=0) for g in grads], step_on(model, x, y)) <= TOL
    alone = step_on(model, x[3:4], y[3:4])
    assert kit.max_difference([g[3] for g in grads], [a / N for a in alone]) <= TOL


@pytest.fixture
def float64():
    with kit.float64():
        yield


@kit.FLOAT64_MATMUL.needed
@pytest.mark.parametrize("kind", ["conv1d", "lstm"])
def test_float64_finite_differences(rng, float64, kind):
    """Example i's share is 1/N of the derivative of its own loss, the mean squared error of the
    model's float64 prediction for it (not test_on_batch: TF 1.x tf.keras reports its loss in
    float32), by central differences on a few entries of every variable."""
    series = layers.Input(shape=(5, 3))
    # sigmoid, not tanh: Keras 3.15's tanh on JAX computes in float32 even on float64 inputs
    hidden = (
        layers.Conv1D(3, 2, activation="sigmoid")(series)
        if kind == "conv1d"
        else layers.LSTM(3, activation="sigmoid")(series)
    )
    model = keras.Model(series, layers.Dense(1)(layers.Flatten()(hidden) if kind == "conv1d" else hidden))
    model.compile(kit.sgd(), "mse")
    x, y = rng.randn(N, 5, 3), rng.randn(N, 1)
    grads = per_example_gradients(model, x, y)
    assert all(g.dtype == np.float64 for g in grads)
    i, step = 4, 1e-6
    for variable, grad in zip(model.trainable_weights, grads):
        value = kit.values([variable])[0]
        for flat_index in rng.choice(value.size, size=min(3, value.size), replace=False):
            losses = []
            for sign in (1, -1):
                moved = value.copy().reshape(-1)
                moved[flat_index] += sign * step
                kit.assign(variable, moved.reshape(value.shape))
                losses.append(float(np.mean((model.predict(x[i : i + 1]) - y[i : i + 1]) ** 2)))
            kit.assign(variable, value)
            derivative = (losses[0] - losses[1]) / (2 * step)
            assert abs(grad[i].reshape(-1)[flat_index] - derivative / N) <= 1e-7 + 1e-5 * abs(derivative)


# --- Norms, dot products, chunks, sparse -------------------------------------------------------------


def test_norms_and_dot_products_are_those_of_the_gradients(rng):
    """Dense layers' norms come from their activations ("ghost"), the Conv1D's from its gradients."""
    x, y, w = classes(rng)
    series = layers.Input(shape=(4, 1))
    hidden = layers.Dense(6, activation="tanh", kernel_regularizer=keras.regularizers.l2(0.05))(
        layers.Flatten()(layers.Conv1D(2, 2)(series))
    )
    model = keras.Model(series, layers.Dense(3, activation="softmax")(hidden))
    model.compile(kit.sgd(), "sparse_categorical_crossentropy")
    x = x[..., None]
    grads = per_example_gradients(model, x, y, sample_weight=w)
    rows = flat(grads)
    norms, info = per_example_gradients(model, x, y, sample_weight=w, norms_only=True, return_info=True)
    assert np.abs(norms - np.linalg.norm(rows, axis=1)).max() <= TOL
    dense = "ghost" if kit.BACKEND == "tensorflow" else "vectorized"  # the shortcut is TensorFlow's engine's
    assert list(info.paths.values()) == ["vectorized", "vectorized"] + [dense] * 4
    per_param = per_example_gradients(model, x, y, sample_weight=w, norms_only="per_param", chunk_size=3)
    assert kit.max_difference(per_param, [np.linalg.norm(g.reshape(N, -1), axis=1) for g in grads]) <= TOL
    vectors = [rng.randn(*v.shape).astype("float32") for v in model.trainable_weights]
    scores = per_example_gradients(model, x, y, sample_weight=w, dot=vectors)
    assert np.abs(scores - rows @ np.concatenate([v.ravel() for v in vectors])).max() <= 1e-4


def test_chunks_change_nothing(rng):
    x, y, w = classes(rng)
    model = classifier(regularized=True)
    whole = per_example_gradients(model, x, y, sample_weight=w)
    assert (
        kit.max_difference(per_example_gradients(model, x, y, sample_weight=w, chunk_size=3), whole) <= 1e-6
    )


@kit.SPARSE_GRADIENTS.needed
def test_sparse_embedding_gradients(rng):
    tokens = layers.Input(shape=(5,), dtype="int32")
    model = keras.Model(tokens, layers.Dense(1)(layers.Flatten()(layers.Embedding(10, 3)(tokens))))
    model.compile(kit.sgd(), "mse")
    x, y = rng.randint(0, 10, size=(N, 5)).astype("int32"), rng.randn(N, 1).astype("float32")
    dense = per_example_gradients(model, x, y)
    sparse = per_example_gradients(model, x, y, sparse=True)
    assert isinstance(sparse[0], SparseGradient) and sparse[0].shape == (N, 10, 3)
    assert sparse[0].values.shape == (N * 5, 3) and sparse[0].indices.shape == (N * 5, 2)
    assert kit.max_difference([sparse[0].dense()] + sparse[1:], dense) <= 1e-7


@kit.TENSORFLOW.needed
def test_a_dataset_streams_norms_and_tracin_scores(rng):
    """Each dataset batch is a batch of the step: example i's share is 1/4 of the step on it alone."""
    x, y, _ = classes(rng)
    model = classifier()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    alone = [flat([a[None] / 4 for a in step_on(model, x[i : i + 1], y[i : i + 1])])[0] for i in range(N)]
    norms = per_example_gradients(model, dataset, norms_only=True, verbose=0)
    assert np.abs(norms - np.linalg.norm(alone, axis=1)).max() <= TOL
    test_gradient = [rng.randn(*v.shape).astype("float32") for v in model.trainable_weights]
    scores = per_example_gradients(model, dataset, dot=test_gradient, verbose=0)
    assert np.abs(scores - np.array(alone) @ flat([g[None] for g in test_gradient])[0]).max() <= 1e-4


@kit.MIXED_PRECISION.needed
def test_mixed_precision_adds_up_to_the_step(rng, mixed_float16):
    x, y, w = classes(rng)
    inputs = layers.Input(shape=(4,))
    hidden = layers.Dense(6, activation="tanh")(inputs)
    model = keras.Model(inputs, layers.Dense(3, activation="softmax", dtype="float32")(hidden))
    model.compile(kit.sgd(), "sparse_categorical_crossentropy")
    grads = per_example_gradients(model, x, y, sample_weight=w)
    step = step_on(model, x, y, w)
    # The step's hidden-layer gradient is float16, summed in its own order: two float16 ulps (2 ** -10
    # of the magnitude each) at the largest gradient. 1e-3 absolute was one ulp at 1.13: a full tox run
    # in TF 2.11 read 1.13e-3 once, and the test alone passed three times out of three.
    largest = max(1.0, max(float(np.abs(d).max()) for d in step))
    assert kit.parity_difference([g.sum(axis=0) for g in grads], step) <= 2 * 2**-10 * largest


# --- What cannot be split, and no side effects -------------------------------------------------------


@pytest.mark.parametrize("layer", ["BatchNormalization", "Dropout"])
def test_training_mode_layers_that_mix_or_draw_are_refused(rng, layer):
    x, y, _ = classes(rng)
    inputs = layers.Input(shape=(4,))
    hidden = getattr(layers, layer)(**({"rate": 0.5} if layer == "Dropout" else {}))(layers.Dense(6)(inputs))
    model = keras.Model(inputs, layers.Dense(3, activation="softmax")(hidden))
    model.compile(kit.sgd(), "sparse_categorical_crossentropy")
    with pytest.raises(
        errors.InvalidArgumentError, match=f"learning_phase: expected 0 for a model with {layer}"
    ):
        per_example_gradients(model, x, y, learning_phase=1)
    grads = per_example_gradients(model, x, y)  # inference: the layer stands still
    assert kit.max_difference([g.sum(axis=0) for g in grads], get_gradients(model, x, y, clip=False)) <= TOL


@kit.TENSORFLOW.needed
def test_layer_outputs_and_whole_datasets_of_gradients_are_refused(rng):
    x, y, _ = classes(rng)
    model = classifier()
    with pytest.raises(errors.InvalidArgumentError, match="params: expected variables"):
        per_example_gradients(model, x, y, params=[model.layers[1].output])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.raises(errors.InvalidArgumentError, match="x: expected one batch for per-example gradients"):
        per_example_gradients(model, dataset)


def test_no_side_effects(rng):
    x, y, w = classes(rng)
    model = classifier(regularized=True)
    expected = step_on(model, x, y, w)
    weights, losses = kit.values(model.weights), len(model.losses)
    nodes = [len(layer._inbound_nodes) for layer in model.layers]
    per_example_gradients(model, x, y, sample_weight=w)
    per_example_gradients(model, x, y, sample_weight=w, norms_only=True)
    assert kit.max_difference(kit.values(model.weights), weights) == 0
    assert len(model.losses) == losses and [len(layer._inbound_nodes) for layer in model.layers] == nodes
    assert kit.parity_difference(kit.train_step_delta(model, x, y, w), expected) <= TOL
