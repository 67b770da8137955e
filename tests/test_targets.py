"""Gradients with respect to layer outputs and model inputs, against hand-written gradients."""

import numpy as np
import pytest

import kit
from compatgrad import SparseGradient, errors, get_gradients, layer_outputs

layers = kit.keras.layers
TOL = 1e-5


def skip_model(frozen_first=False):
    """inputs -> d1 -> d2 -> add(d1, d2) -> out: a skip connection around d2."""
    inputs = layers.Input(shape=(5,), name="features")
    first = layers.Dense(4, activation="tanh", name="d1", trainable=not frozen_first)
    second, add, last = (
        layers.Dense(4, activation="tanh", name="d2"),
        layers.Add(name="add"),
        layers.Dense(1, name="out"),
    )
    h1 = first(inputs)
    model = kit.keras.Model(inputs, last(add([h1, second(h1)])))
    model.compile(kit.sgd(), "mse")

    def forward(xs, tap):
        h1 = tap("d1", first(xs[0]))
        total = tap("add", add([h1, second(h1)]))
        return last(total), {"d1": h1, "add": total}

    return model, forward


def data(rng, n=16):
    return rng.randn(n, 5).astype("float32"), rng.randn(n, 1).astype("float32")


def test_layer_outputs_and_inputs_match_hand_written_gradients(rng):
    x, y = data(rng)
    model, forward = skip_model()
    wanted = layer_outputs(model, ["d1", "add"]) + list(model.inputs)
    grads = get_gradients(model, x, y, wanted)
    assert [g.shape for g in grads] == [(16, 4), (16, 4), (16, 5)]
    assert kit.max_difference(grads, kit.hand_gradients(forward, [x], y, ["d1", "add", "x0"])) <= TOL


def test_input_gradient_matches_finite_differences(rng):
    x, y = data(rng, n=4)
    model, _ = skip_model()
    grads = get_gradients(model, x, y, list(model.inputs))[0]

    def loss(values):  # the compiled mse, in float64 from the model's predictions
        return float(np.mean((model.predict(values, verbose=0).astype("float64") - y) ** 2))

    for i, j in [(0, 0), (1, 3), (3, 4)]:
        step = np.zeros_like(x)
        step[i, j] = 1e-2
        estimate = (loss(x + step) - loss(x - step)) / 2e-2
        assert abs(estimate - grads[i, j]) <= 1e-3 * max(1.0, abs(estimate)), (i, j, estimate, grads[i, j])


def test_weights_and_outputs_in_one_call_keep_training_parity(rng):
    x = rng.randn(32, 5).astype("float32")
    y = {"a": rng.randn(32, 1).astype("float32"), "b": rng.randint(0, 3, size=(32, 1))}
    weights = [rng.uniform(0, 2, size=32).astype("float32"), rng.uniform(0, 2, size=32).astype("float32")]
    inputs = layers.Input(shape=(5,), name="features")
    hidden = layers.Dense(6, activation="tanh", name="hidden")(inputs)
    model = kit.keras.Model(
        inputs, [layers.Dense(1, name="a")(hidden), layers.Dense(3, activation="softmax", name="b")(hidden)]
    )
    model.compile(
        kit.sgd(),
        loss={"a": "mse", "b": "sparse_categorical_crossentropy"},
        loss_weights={"a": 0.3, "b": 2.0},
    )
    variables = list(model.trainable_weights)
    params = layer_outputs(model, ["hidden"]) + variables[:2] + model.inputs + variables[2:]
    grads = get_gradients(model, x, y, params, sample_weight=weights, learning_phase=1)
    assert grads[0].shape == (32, 6) and grads[3].shape == (32, 5)
    delta = kit.train_step_delta(model, x, y, sample_weight=weights)
    assert kit.parity_difference(grads[1:3] + grads[4:], delta) <= TOL


def test_frozen_layer_still_has_an_output_gradient(rng):
    """Nothing upstream of d1 is trainable: the inputs must be watched for d1's output to get a gradient."""
    x, y = data(rng)
    model, forward = skip_model(frozen_first=True)
    grads = get_gradients(model, x, y, layer_outputs(model, ["d1"]) + list(model.trainable_weights))
    assert len(grads) == 1 + 4  # d2 and out only are trainable
    assert np.abs(grads[0]).max() > 0
    assert kit.max_difference(grads[:1], kit.hand_gradients(forward, [x], y, ["d1"])) <= TOL


def test_nested_sequential_output_by_name_index_and_object(rng):
    x, y = data(rng)
    inner = kit.keras.Sequential(
        [layers.Dense(3, activation="tanh", input_shape=(4,), name="inner_dense")], name="inner"
    )
    first, last = layers.Dense(4, activation="tanh", name="d1"), layers.Dense(1, name="out")
    inputs = layers.Input(shape=(5,))
    model = kit.keras.Model(inputs, last(inner(first(inputs))))
    model.compile(kit.sgd(), "mse")

    def forward(xs, tap):
        nested = tap("inner", inner(first(xs[0])))
        return last(nested), {"inner": nested}

    by_name = get_gradients(model, x, y, layer_outputs(model, ["inner"]))
    by_index = get_gradients(model, x, y, layer_outputs(model, [model.layers.index(inner)]))
    by_object = get_gradients(model, x, y, layer_outputs(model, [inner]))
    assert kit.max_difference(by_name, by_index) == 0.0 and kit.max_difference(by_name, by_object) == 0.0
    assert kit.max_difference(by_name, kit.hand_gradients(forward, [x], y, ["inner"])) <= TOL
    with pytest.raises(errors.InvalidArgumentError, match=r"layers\[0\].*inner_dense.*nested"):
        layer_outputs(model, [inner.layers[0]])


@kit.OUTPUTS_OF_A_SHARED_LAYER.needed
def test_outputs_of_a_layer_called_twice(rng):
    (a, b), y = [rng.randn(16, 5).astype("float32") for _ in range(2)], rng.randn(16, 1).astype("float32")
    shared, add, last = layers.Dense(4, activation="tanh", name="shared"), layers.Add(), layers.Dense(1)
    inputs = [layers.Input(shape=(5,)), layers.Input(shape=(5,))]
    model = kit.keras.Model(inputs, last(add([shared(inputs[0]), shared(inputs[1])])))
    model.compile(kit.sgd(), "mse")

    def forward(xs, tap):
        first, second = tap("first", shared(xs[0])), tap("second", shared(xs[1]))
        return last(add([first, second])), {"first": first, "second": second}

    grads = get_gradients(model, [a, b], y, layer_outputs(model, ["shared"]))
    assert kit.max_difference(grads, kit.hand_gradients(forward, [a, b], y, ["first", "second"])) <= TOL


def test_as_dict_names_are_unique_and_stable(rng):
    x, y = data(rng)
    model, _ = skip_model()
    params = list(model.trainable_weights) + layer_outputs(model, ["d1", "d1"]) + list(model.inputs)
    first = get_gradients(model, x, y, params, as_dict=True)
    second = get_gradients(model, x, y, params, as_dict=True)
    assert list(first) == list(second) and len(set(first)) == len(params)
    assert "d1/output" in first and "d1/output (2)" in first
    assert kit.max_difference(list(first.values()), get_gradients(model, x, y, params)) == 0.0


def embedding_model():
    model = kit.keras.Sequential(
        [
            layers.Embedding(20, 3, input_length=6) if not kit.KERAS3 else layers.Embedding(20, 3),
            layers.Flatten(),
            layers.Dense(1),
        ]
    )
    model.build((None, 6))
    model.compile(kit.sgd(), "mse")
    return model


@kit.SPARSE_GRADIENTS.needed
def test_embedding_gradient_dense_by_default_sparse_on_request(rng):
    tokens, y = rng.randint(0, 20, size=(8, 6)), rng.randn(8, 1).astype("float32")
    model = embedding_model()
    dense = get_gradients(model, tokens, y)
    sparse = get_gradients(model, tokens, y, sparse=True)
    assert isinstance(dense[0], np.ndarray) and dense[0].shape == (20, 3)
    assert isinstance(sparse[0], SparseGradient) and sparse[0].shape == (20, 3)
    assert sparse[0].values.shape[0] == tokens.size  # one row per token looked up, repeats included
    assert dense[0].flags.writeable and sparse[0].values.flags.writeable
    assert kit.max_difference([sparse[0].dense()] + sparse[1:], dense) <= 1e-6
    assert kit.parity_difference(dense, kit.train_step_delta(model, tokens, y)) <= TOL


def test_embedding_output_gradient_adds_up_to_the_trained_embedding_gradient(rng):
    """Only a tensor wanted, behind an integer input: its gradient, added up per token, is the step's."""
    tokens, y = rng.randint(0, 20, size=(8, 6)), rng.randn(8, 1).astype("float32")
    model = embedding_model()
    wanted = layer_outputs(model, [0])
    (output_gradient,) = get_gradients(model, tokens, y, wanted)
    per_token = np.zeros((20, 3), dtype="float32")
    np.add.at(per_token, tokens, output_gradient)
    assert np.abs(per_token - kit.train_step_delta(model, tokens, y)[0]).max() <= TOL


def loss_has_gradient_for_output(model, x, y):
    """Whether the compiled loss depends on the output tensor itself, by a hand-written gradient taken
    where the training step takes it: in a graph (TF 2.2-2.3 read the logits of graph tensors only)."""
    if kit.GRAPH:
        return kit.tf.gradients(model.total_loss, model.outputs)[0] is not None
    if kit.BACKEND == "jax":  # a jax array takes no attribute: no output of Keras' keeps its logits there
        import jax

        return bool(jax.numpy.any(jax.grad(lambda p: model.compute_loss(x=x, y=y, y_pred=p))(model(x))))
    if kit.BACKEND == "torch":
        import torch

        y_pred = model(x)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        return torch.autograd.grad(loss, y_pred, allow_unused=True)[0] is not None
    found = []

    def probe(x, y):
        with kit.tf.GradientTape() as tape:
            y_pred = model(x)
            tape.watch(y_pred)
            loss = (
                model.compute_loss(x=x, y=y, y_pred=y_pred)
                if hasattr(model, "compute_loss")
                else model.compiled_loss(y, y_pred)
            )
        found.append(tape.gradient(loss, y_pred) is not None)
        return loss

    kit.tf.function(probe)(kit.tf.constant(x), kit.tf.constant(y))
    return found[0]


def test_a_softmax_output_read_through_its_logits_is_explained(rng):
    x, _ = data(rng)
    y = np.eye(3, dtype="float32")[rng.randint(0, 3, size=16)]
    inputs = layers.Input(shape=(5,))
    model = kit.keras.Model(inputs, layers.Dense(3, activation="softmax", name="probabilities")(inputs))
    model.compile(kit.sgd(), "categorical_crossentropy")
    wanted = layer_outputs(model, ["probabilities"])
    if loss_has_gradient_for_output(model, x, y):  # standalone Keras 2.2, tf.keras 2.3 in graph mode
        p = model.predict(x).astype(np.float64)  # d/dp mean(-sum(y log(p / sum(p)))) with sum(p) = 1:
        assert kit.max_difference(get_gradients(model, x, y, wanted), [(1 - y / p) / len(x)]) <= TOL
    else:
        with pytest.raises(errors.UnconnectedGradientError, match="probabilities/output.*logits"):
            get_gradients(model, x, y, wanted)


def test_integer_input_has_no_gradient(rng):
    tokens, y = rng.randint(0, 20, size=(8, 6)), rng.randn(8, 1).astype("float32")
    model = embedding_model()
    with pytest.raises(errors.UnconnectedGradientError, match="output") as raised:
        get_gradients(model, tokens, y, list(model.inputs))
    assert "logits" not in str(raised.value)
    zeros = get_gradients(model, tokens, y, list(model.inputs), unconnected="zero")
    assert zeros[0].shape == (8, 6) and not zeros[0].any()


def test_tensors_not_in_the_model_graph_are_refused(rng):
    x, y = data(rng)
    model, _ = skip_model()
    other, _ = skip_model()
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"params\[1\]: expected a variable of this model or a tensor of its graph",
    ):
        get_gradients(model, x, y, [model.trainable_weights[0], other.layers[1].output])
    with pytest.raises(errors.InvalidArgumentError, match=r"layers\[1\].*among"):
        layer_outputs(model, ["d1", "nope"])
    with pytest.raises(errors.InvalidArgumentError, match=r"layers\[0\]: expected an index"):
        layer_outputs(model, [99])
    with pytest.raises(errors.InvalidTypeError, match="layers"):
        layer_outputs(model, "d1")
