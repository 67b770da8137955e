"""gradient_function: the flat list legacy K.function gradient code fed, against train_on_batch."""

import numpy as np
import pytest

import kit
from compatgrad import errors, gradient_function

layers = kit.keras.layers
TOL = 1e-5


def single_model(batchnorm=False):
    stack = [layers.Dense(6, input_shape=(4,))]
    stack += [layers.BatchNormalization()] if batchnorm else []
    stack += [layers.Activation("tanh"), layers.Dense(1)]
    model = kit.keras.Sequential(stack)
    model.compile(kit.sgd(), "mse")
    return model


def two_in_two_out():
    a, b = layers.Input(shape=(3,), name="a"), layers.Input(shape=(2,), name="b")
    hidden = layers.Dense(4, activation="tanh")(layers.concatenate([a, b]))
    first, second = layers.Dense(1, name="first")(hidden), layers.Dense(2, name="second")(hidden)
    model = kit.keras.Model([a, b], [first, second])
    model.compile(kit.sgd(), ["mse", "mse"], loss_weights=[1.0, 0.5])
    return model


def step_delta(model, x, y, sample_weight=None):
    """The training step's gradient, the weights put back after it (SGD keeps no state)."""
    weights = model.get_weights()
    delta = kit.train_step_delta(model, x, y, sample_weight=sample_weight)
    model.set_weights(weights)
    return delta


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("phase", [None, 0, 1], ids=["no phase", "phase 0", "phase 1"])
def test_flat_list_of_one_input_and_output(weighted, phase, rng):
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    weights = rng.uniform(0, 2, size=16).astype("float32")
    model = single_model()
    fn = gradient_function(model)
    flat = [x, y] + ([weights] if weighted else []) + ([] if phase is None else [phase])
    grads = fn(flat)
    expected = step_delta(model, x, y, weights if weighted else None)
    assert kit.parity_difference(grads, expected) <= TOL


def test_the_trailing_learning_phase_is_the_one_run(rng):
    """With BatchNormalization, phase 1 (batch statistics) is the training step's, phase 0 is not."""
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    model = single_model(batchnorm=True)
    kit.train(model, x, y)  # moving statistics away from the batch's
    fn = gradient_function(model)
    training, inference = fn([x, y, 1]), fn([x, y, 0])
    assert kit.max_difference(training, inference) > 1e-3
    assert kit.parity_difference(training, step_delta(model, x, y)) <= TOL


@pytest.mark.parametrize("phase", [None, 1], ids=["no phase", "phase 1"])
def test_flat_list_of_two_inputs_and_outputs_with_weights_per_output(phase, rng):
    a, b = rng.randn(16, 3).astype("float32"), rng.randn(16, 2).astype("float32")
    y1, y2 = rng.randn(16, 1).astype("float32"), rng.randn(16, 2).astype("float32")
    w1, w2 = rng.uniform(0, 2, size=16).astype("float32"), rng.uniform(0, 2, size=16).astype("float32")
    model = two_in_two_out()
    fn = gradient_function(model)
    tail = [] if phase is None else [phase]
    unweighted = fn([a, b, y1, y2] + tail)
    weighted = fn([a, b, y1, y2, w1, w2] + tail)
    assert kit.parity_difference(unweighted, step_delta(model, [a, b], [y1, y2])) <= TOL
    assert kit.parity_difference(weighted, step_delta(model, [a, b], [y1, y2], [w1, w2])) <= TOL


def test_keyword_form_as_get_gradients_takes_it(rng):
    a, b = rng.randn(16, 3).astype("float32"), rng.randn(16, 2).astype("float32")
    y1, y2 = rng.randn(16, 1).astype("float32"), rng.randn(16, 2).astype("float32")
    w1 = rng.uniform(0, 2, size=16).astype("float32")
    model = two_in_two_out()
    fn = gradient_function(model, as_dict=True)
    grads = fn([a, b], [y1, y2], sample_weight=[w1, np.ones(16, "float32")], learning_phase=1)
    expected = step_delta(model, [a, b], [y1, y2], [w1, np.ones(16, "float32")])
    assert kit.parity_difference(list(grads.values()), expected) <= TOL


def test_a_list_of_the_wrong_length_names_the_layout(rng):
    a, b = rng.randn(16, 3).astype("float32"), rng.randn(16, 2).astype("float32")
    y1, y2 = rng.randn(16, 1).astype("float32"), rng.randn(16, 2).astype("float32")
    fn = gradient_function(two_in_two_out())
    expected = (
        r"the flat list: expected \[x: a, x: b, y: first, y: second\] \+ optionally \[sample_weight: first"
    )
    with pytest.raises(errors.InvalidArgumentError, match=expected):
        fn([a, b, y1])
    with pytest.raises(errors.InvalidArgumentError, match="got 8 values"):
        fn([a, b, y1, y2, y1, y2, y1, y2])


@pytest.mark.skipif(not kit.GRAPH, reason="graph mode only")
def test_no_op_added_per_call(rng):
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    model = single_model()
    fn = gradient_function(model)
    fn([x, y, 1])
    graph = kit.graph_of(model)
    ops = len(graph.get_operations())
    for _ in range(20):
        fn([x, y, 1])
    assert len(graph.get_operations()) == ops
