"""Training parity: get_gradients equals w0 - w1 of one train_on_batch with SGD(learning_rate=1.0)."""

import numpy as np
import pytest

import kit
from compatgrad import get_gradients

layers = kit.keras.layers
TOL = 1e-5
optimizer_names = pytest.mark.parametrize("opt", sorted(kit.OPTIMIZERS))


def regression_model(opt="sgd", regularize=False, **optimizer_kwargs):
    regularizer = kit.keras.regularizers.l2(0.05) if regularize else None
    model = kit.keras.Sequential(
        [
            layers.Dense(8, activation="tanh", input_shape=(5,), kernel_regularizer=regularizer),
            layers.Dense(1, kernel_regularizer=regularizer),
        ]
    )
    model.compile(kit.sgd(opt if opt in kit.OPTIMIZERS else None, **optimizer_kwargs), "mse")
    return model


def assert_parity(model, x, y, sample_weight=None, class_weight=None, tol=TOL, **kwargs):
    grads = get_gradients(
        model,
        x,
        y,
        model.trainable_weights,
        sample_weight,
        class_weight=class_weight,
        learning_phase=1,
        **kwargs,
    )
    oracle_weight = list(sample_weight.values()) if isinstance(sample_weight, dict) else sample_weight
    delta = kit.train_step_delta(model, x, y, sample_weight=oracle_weight, class_weight=class_weight)
    difference = kit.parity_difference(grads, delta)
    assert difference <= tol, difference
    return grads


@optimizer_names
def test_dense_regression_mse(opt, rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    assert_parity(regression_model(opt), x, y)


@optimizer_names
def test_seed_call_positional(opt, rng):
    """The legacy recipe's call, verbatim and positional, learning_phase defaulting to 0."""
    x, y = rng.randn(16, 5).astype("float32"), rng.randn(16, 1).astype("float32")
    model = regression_model(opt)
    grads = get_gradients(model, x, y, model.trainable_weights)
    assert [g.shape for g in grads] == [tuple(w.shape) for w in model.trainable_weights]
    assert all(isinstance(g, np.ndarray) for g in grads)
    assert kit.parity_difference(grads, kit.train_step_delta(model, x, y)) <= TOL


@pytest.mark.skipif(kit.GRAPH, reason="graph-mode tensors are symbolic: graph mode is fed numpy arrays")
def test_tensor_inputs(rng):
    x, y = rng.randn(16, 5).astype("float32"), rng.randn(16, 1).astype("float32")
    weights = rng.uniform(0, 2, size=16).astype("float32")
    model = regression_model()
    from_tensors = get_gradients(
        model, kit.ops.constant(x), kit.ops.constant(y), sample_weight=kit.ops.constant(weights)
    )
    assert kit.max_difference(from_tensors, get_gradients(model, x, y, sample_weight=weights)) == 0.0
    assert_parity(model, x, y, sample_weight=weights)


@optimizer_names
def test_classifier_sparse_categorical(opt, rng):
    x, y = rng.randn(32, 6).astype("float32"), rng.randint(0, 4, size=(32, 1))
    model = kit.keras.Sequential(
        [layers.Dense(16, activation="relu", input_shape=(6,)), layers.Dense(4, activation="softmax")]
    )
    model.compile(kit.sgd(opt), "sparse_categorical_crossentropy", metrics=["accuracy"])
    assert_parity(model, x, y)


@optimizer_names
def test_l2_regularizers(opt, rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    model = regression_model(opt, regularize=True)
    plain = regression_model(opt)
    plain.set_weights(model.get_weights())
    assert kit.max_difference(get_gradients(model, x, y), get_gradients(plain, x, y)) > 1e-3
    assert_parity(model, x, y)


@optimizer_names
def test_sample_weights(opt, rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    weights = rng.uniform(0, 3, size=32).astype("float32")
    model = regression_model(opt)
    weighted = get_gradients(model, x, y, sample_weight=weights)
    unweighted = get_gradients(model, x, y)
    assert kit.max_difference(weighted, unweighted) > 1e-3  # the weights matter
    assert kit.parity_difference(weighted, kit.train_step_delta(model, x, y, sample_weight=weights)) <= TOL


@optimizer_names
def test_sample_weights_after_an_unweighted_step(opt, rng):
    """Graph mode: the model has no sample-weight feed yet and a built train function."""
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    weights = rng.uniform(0, 3, size=32).astype("float32")
    model = regression_model(opt)
    kit.train(model, x, y)
    assert_parity(model, x, y, sample_weight=weights)
    assert_parity(model, x, y)  # and back to unweighted
    assert_parity(model, x, y, sample_weight=weights)


@optimizer_names
def test_class_weights(opt, rng):
    x, y = rng.randn(48, 6).astype("float32"), rng.randint(0, 3, size=(48, 1))
    model = kit.keras.Sequential(
        [layers.Dense(8, activation="relu", input_shape=(6,)), layers.Dense(3, activation="softmax")]
    )
    model.compile(kit.sgd(opt), "sparse_categorical_crossentropy")
    class_weight = {0: 0.2, 1: 1.0, 2: 4.0}
    plain = get_gradients(model, x, y)
    grads = assert_parity(model, x, y, class_weight=class_weight)
    assert kit.max_difference(grads, plain) > 1e-4


def two_output_model(opt):
    inputs = layers.Input(shape=(5,), name="features")
    hidden = layers.Dense(6, activation="tanh", name="hidden")(inputs)
    model = kit.keras.Model(
        inputs, [layers.Dense(1, name="a")(hidden), layers.Dense(3, activation="softmax", name="b")(hidden)]
    )
    model.compile(
        kit.sgd(opt),
        loss={"a": "mse", "b": "sparse_categorical_crossentropy"},
        loss_weights={"a": 0.3, "b": 2.0},
    )
    return model


@optimizer_names
def test_two_outputs_with_loss_weights(opt, rng):
    x = rng.randn(32, 5).astype("float32")
    y = {"a": rng.randn(32, 1).astype("float32"), "b": rng.randint(0, 3, size=(32, 1))}
    assert_parity(two_output_model(opt), x, y)


@optimizer_names
def test_two_outputs_per_output_sample_weights(opt, rng):
    x = rng.randn(32, 5).astype("float32")
    y = [rng.randn(32, 1).astype("float32"), rng.randint(0, 3, size=(32, 1))]
    weights = {
        "a": rng.uniform(0, 2, size=32).astype("float32"),
        "b": rng.uniform(0, 2, size=32).astype("float32"),
    }
    model = two_output_model(opt)
    as_list = get_gradients(model, x, y, sample_weight=[weights["a"], weights["b"]])
    assert kit.max_difference(get_gradients(model, x, y, sample_weight=weights), as_list) == 0.0
    assert kit.max_difference(get_gradients(model, x, y), as_list) > 1e-4
    assert_parity(model, x, y, sample_weight=weights)


def test_one_output_weighted_the_other_not(rng):
    # None: that output unweighted, as ones (graph mode leaves its placeholder to its default).
    x = rng.randn(32, 5).astype("float32")
    y = [rng.randn(32, 1).astype("float32"), rng.randint(0, 3, size=(32, 1))]
    weights = rng.uniform(0, 2, size=32).astype("float32")
    model = two_output_model(None)
    grads = get_gradients(model, x, y, sample_weight=[weights, None])
    assert kit.max_difference(grads, get_gradients(model, x, y)) > 1e-4
    delta = kit.train_step_delta(model, x, y, sample_weight=[weights, np.ones(32, "float32")])
    assert kit.parity_difference(grads, delta) <= TOL


@pytest.mark.skipif(not kit.GRAPH, reason="sessions are graph mode's")
def test_the_session_keras_would_train_in(rng):
    """A default session of the model's graph holds other values of its weights: the gradient is that
    session's."""
    model, x, y = regression_model(), rng.randn(16, 5).astype("float32"), rng.randn(16, 1).astype("float32")
    in_keras_session = get_gradients(model, x, y)
    session = kit.tf.compat.v1.Session(graph=model.total_loss.graph)
    with session.as_default(), model.total_loss.graph.as_default():
        session.run(kit.tf.compat.v1.global_variables_initializer())
        model.set_weights([w + 0.5 for w in model.get_weights()])
        grads = assert_parity(model, x, y)
    session.close()
    assert kit.max_difference(grads, in_keras_session) > 1e-3
    assert kit.max_difference(get_gradients(model, x, y), in_keras_session) == 0.0  # back in Keras' session


CLIPPING = [
    pytest.param("clipnorm", 0.05, id="clipnorm"),
    pytest.param("clipvalue", 0.01, id="clipvalue"),
    pytest.param("global_clipnorm", 0.05, id="global_clipnorm", marks=kit.GLOBAL_CLIPNORM.needed),
]


@optimizer_names
@pytest.mark.parametrize("setting,value", CLIPPING)
def test_clipping(opt, setting, value, rng):
    x, y = rng.randn(32, 5).astype("float32"), 3 * rng.randn(32, 1).astype("float32")
    model = regression_model(opt, **{setting: value})
    clipped = get_gradients(model, x, y)
    unclipped = get_gradients(model, x, y, clip=False)
    assert kit.max_difference(clipped, unclipped) > 1e-3
    assert (
        kit.max_difference(unclipped, kit.reference_gradients(model, x, y, model.trainable_weights, 0)) <= TOL
    )
    assert kit.parity_difference(clipped, kit.train_step_delta(model, x, y)) <= TOL


@kit.GLOBAL_CLIPNORM.needed
@kit.TRAINS_A_LAYER_FROZEN_AFTER_COMPILE.needed
@optimizer_names
def test_freezing_takes_effect_on_recompile_as_in_the_train_step(opt, rng):
    """The train step reads the trainable weights when it is built: a layer frozen after that still
    trains, under a global norm over all the weights, until a recompile (as Keras documents)."""
    x, y = rng.randn(32, 5).astype("float32"), 3 * rng.randn(32, 1).astype("float32")
    model = regression_model(opt, global_clipnorm=0.05)
    weights = list(model.trainable_weights)
    kit.train(model, x, y)  # the train step is built
    get_gradients(model, x, y)  # and compatgrad's
    model.layers[0].trainable = False
    grads = get_gradients(model, x, y, weights)
    before = kit.values(weights)
    kit.train(model, x, y)
    assert kit.parity_difference(grads, [b - a for b, a in zip(before, kit.values(weights))]) <= TOL
    model.compile(kit.sgd(opt if opt in kit.OPTIMIZERS else None, global_clipnorm=0.05), "mse")
    assert len(model.trainable_weights) == 2
    assert_parity(model, x, y)


def batchnorm_model(opt):
    model = kit.keras.Sequential(
        [
            layers.Dense(6, input_shape=(4,)),
            layers.BatchNormalization(),
            layers.Activation("tanh"),
            layers.Dense(1),
        ]
    )
    model.compile(kit.sgd(opt), "mse")
    return model


@optimizer_names
def test_batchnorm_learning_phase(opt, rng):
    x, y = rng.randn(32, 4).astype("float32"), rng.randn(32, 1).astype("float32")
    model = batchnorm_model(opt)
    moving = [w for w in model.weights if "moving" in w.name]
    moving_before = kit.values(moving)
    inference = get_gradients(model, x, y, learning_phase=0)
    training = get_gradients(model, x, y, learning_phase=1)
    assert kit.max_difference(inference, training) > 1e-4
    assert kit.max_difference(kit.values(moving), moving_before) == 0.0  # moving statistics untouched
    assert (
        kit.max_difference(inference, kit.reference_gradients(model, x, y, model.trainable_weights, 0)) <= TOL
    )
    assert kit.parity_difference(training, kit.train_step_delta(model, x, y)) <= TOL


@kit.MIXED_PRECISION.needed
@optimizer_names
def test_mixed_precision_loss_scaling(opt, mixed_float16, rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    model = kit.keras.Sequential(
        [layers.Dense(8, activation="tanh", input_shape=(5,)), layers.Dense(1, dtype="float32")]
    )
    model.compile(kit.sgd(opt), "mse")
    assert "LossScaleOptimizer" in type(model.optimizer).__name__, "compile did not wrap the optimizer"
    assert_parity(model, x, y, tol=1e-3)


@pytest.mark.skipif(not kit.KERAS3, reason="mixed_bfloat16 checked on Keras 3 (TensorFlow, JAX, PyTorch)")
def test_mixed_bfloat16_without_loss_scaling(rng):
    """bfloat16 has float32's range: compile wraps no LossScaleOptimizer, the step scales nothing."""
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    kit.set_mixed_precision("mixed_bfloat16")
    try:
        model = kit.keras.Sequential(
            [layers.Dense(8, activation="tanh", input_shape=(5,)), layers.Dense(1, dtype="float32")]
        )
        model.compile(kit.sgd(), "mse")
        assert "LossScaleOptimizer" not in type(model.optimizer).__name__
        assert_parity(model, x, y, tol=1e-3)
    finally:
        kit.set_mixed_precision(None)


@optimizer_names
def test_dict_inputs(opt, rng):
    a, b = layers.Input(shape=(3,), name="a"), layers.Input(shape=(2,), name="b")
    out = layers.Dense(1)(layers.Dense(4, activation="tanh")(layers.Concatenate()([a, b])))
    model = kit.keras.Model([a, b], out)
    model.compile(kit.sgd(opt), "mse")
    x = {"a": rng.randn(16, 3).astype("float32"), "b": rng.randn(16, 2).astype("float32")}
    assert_parity(model, x, rng.randn(16, 1).astype("float32"))


def test_closed_form_linear_mse(rng):
    x, y = rng.randn(20, 3).astype("float32"), rng.randn(20, 1).astype("float32")
    model = kit.keras.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile(kit.sgd(), "mse")
    kernel, bias = model.get_weights()
    residual = x.astype(np.float64) @ kernel + bias - y
    expected = [2.0 / len(x) * x.T @ residual, 2.0 / len(x) * residual.sum(axis=0)]
    assert kit.max_difference(get_gradients(model, x, y), expected) <= TOL


def test_finite_differences_conv_net(rng):
    with kit.float64():
        model = kit.keras.Sequential(
            [
                # sigmoid: Keras 3.15's tanh on JAX returns float32 for float64 inputs (result_type(x, float))
                layers.Conv2D(3, 3, activation="sigmoid", input_shape=(6, 6, 2)),
                # a 4x4 convolution as the dense head: Keras 3.15 on torch does float64 matmuls in float32
                layers.Conv2D(2, 4),
                layers.Flatten(),
            ]
        )
        model.compile(kit.sgd(), "mse")
        assert all(value.dtype == np.float64 for value in kit.values(model.weights))
        x, y = rng.randn(4, 6, 6, 2), rng.randn(4, 2)
        grads = get_gradients(model, x, y)
        eps = 1e-6
        for weight, grad in zip(model.trainable_weights, grads):
            base = kit.values([weight])[0]
            for index in [tuple(rng.randint(0, n) for n in base.shape) for _ in range(4)]:
                losses = []
                for sign in (1, -1):
                    shifted = base.copy()
                    shifted[index] += sign * eps
                    kit.assign(weight, shifted)
                    losses.append(np.mean((model.predict_on_batch(x) - y) ** 2))  # MSE, in float64
                kit.assign(weight, base)
                assert abs((losses[0] - losses[1]) / (2 * eps) - grad[index]) <= 1e-6


@pytest.mark.skipif(not kit.KERAS3, reason="gradient_accumulation_steps is Keras 3's")
@pytest.mark.parametrize("optimizer_kwargs", [{}, {"clipnorm": 0.05}], ids=["plain", "clipnorm"])
def test_gradient_accumulation(optimizer_kwargs, rng):
    """Each step's gradient as the optimizer adds it to its own accumulators; every third step applies
    their mean."""
    model = regression_model(gradient_accumulation_steps=3, **optimizer_kwargs)
    batches = [(rng.randn(16, 5).astype("float32"), rng.randn(16, 1).astype("float32")) for _ in range(3)]
    start = kit.values(model.trainable_weights)
    returned = []
    for step, (x, y) in enumerate(batches, 1):
        grads, info = get_gradients(model, x, y, return_info=True)
        assert info.applies_update == (step == 3)
        returned.append(grads)
        kit.train(model, x, y)
        if step < 3:
            accumulated = kit.values(model.optimizer._accumulated_gradients)
            assert kit.parity_difference(accumulated, [sum(g) for g in zip(*returned)]) < TOL
            assert kit.max_difference(kit.values(model.trainable_weights), start) == 0.0
    if not optimizer_kwargs:
        applied = [a - b for a, b in zip(start, kit.values(model.trainable_weights))]
        assert kit.parity_difference(applied, [sum(g) / 3 for g in zip(*returned)]) < TOL
