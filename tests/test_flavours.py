"""Flavour-specific contract: Keras 3 dropout replay, loss-scale info, side-by-side flavours, backends."""

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kit
from compatgrad import GradientInfo, get_gradients

layers = kit.keras.layers


@pytest.mark.skipif(
    not kit.KERAS3, reason="Keras 2 Dropout draws from a stateful global RNG: no step replays its mask"
)
def test_keras3_dropout_in_training_matches_the_step_exactly(rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    model = kit.keras.Sequential(
        [layers.Dense(16, activation="relu", input_shape=(5,)), layers.Dropout(0.5, seed=3), layers.Dense(1)]
    )
    model.compile(kit.sgd(), "mse")
    seeds = [v for v in model.non_trainable_variables if "seed" in v.path]
    seeds_before = kit.values(seeds)
    training = get_gradients(model, x, y, learning_phase=1)
    assert kit.max_difference(kit.values(seeds), seeds_before) == 0.0
    assert kit.max_difference(training, get_gradients(model, x, y, learning_phase=0)) > 1e-4  # dropout was on
    assert kit.parity_difference(training, kit.train_step_delta(model, x, y)) <= 1e-5


def test_return_info_loss_and_scale(rng):
    x, y = rng.randn(32, 5).astype("float32"), rng.randn(32, 1).astype("float32")
    model = kit.keras.Sequential([layers.Dense(4, activation="tanh", input_shape=(5,)), layers.Dense(1)])
    model.compile(kit.sgd(), "mse")
    grads, info = get_gradients(model, x, y, return_info=True, learning_phase=1)
    assert isinstance(info, GradientInfo) and info.loss_scale == 1.0 and info.all_finite
    loss = np.ravel(kit.train(model, x, y))[0]
    assert abs(info.loss - float(loss)) <= 1e-5 * max(1.0, abs(float(loss)))


def overflowing_model():
    model = kit.keras.Sequential([layers.Dense(4, input_shape=(5,)), layers.Dense(1, dtype="float32")])
    model.compile(kit.sgd(), "mse")
    return model


@kit.MIXED_PRECISION.needed
def test_mixed_precision_overflow_is_reported_and_the_step_skips(mixed_float16, rng):
    x = (
        rng.randn(32, 5).astype("float32") * 300.0
    )  # float16 activations near 65504: the scaled loss overflows
    y = rng.randn(32, 1).astype("float32")
    model = overflowing_model()
    before = kit.values(kit.optimizer_variables(model.optimizer))
    grads, info = get_gradients(model, x, y, return_info=True, learning_phase=1)
    assert kit.max_difference(kit.values(kit.optimizer_variables(model.optimizer)), before) == 0.0
    assert info.loss_scale > 1.0
    assert (
        get_gradients(model, x, y, return_info=True, learning_phase=1)[1].loss_scale == info.loss_scale
    )  # not halved
    assert not info.all_finite and not all(np.isfinite(g).all() for g in grads)
    delta = kit.train_step_delta(model, x, y)
    assert all(not d.any() for d in delta), "the step should have skipped its update"


@kit.MIXED_PRECISION.needed
def test_mixed_precision_info_scale_matches_the_optimizer(mixed_float16, rng):
    x, y = 0.1 * rng.randn(32, 5).astype("float32"), 0.1 * rng.randn(32, 1).astype("float32")
    model = overflowing_model()
    _, info = get_gradients(model, x, y, return_info=True)
    assert info.all_finite and info.loss_scale == 2.0**15  # every flavour's initial dynamic scale


@pytest.mark.skipif(kit.GRAPH, reason="Keras 3 runs eagerly only")
@kit.TF_KERAS_NEXT_TO_KERAS3.needed
def test_tf_keras_and_keras3_side_by_side(rng):
    tf_keras, keras3 = importlib.import_module("tf_keras"), importlib.import_module("keras")
    assert keras3.__version__.startswith("3."), keras3.__version__
    x, y = rng.randn(16, 3).astype("float32"), rng.randn(16, 1).astype("float32")
    for keras in (tf_keras, keras3):
        model = keras.Sequential(
            [keras.layers.Dense(2, activation="tanh", input_shape=(3,)), keras.layers.Dense(1)]
        )
        model.compile(keras.optimizers.SGD(learning_rate=1.0), "mse")
        grads = get_gradients(model, x, y, learning_phase=1)
        before = [w.copy() for w in model.get_weights()]
        model.train_on_batch(x, y)
        delta = [b - a for b, a in zip(before, model.get_weights())]
        assert kit.max_difference(grads, delta) <= 1e-5, keras.__name__


@pytest.mark.skipif(
    not kit.KERAS3 or importlib.util.find_spec("jax") is None,
    reason="needs Keras 3 and its numpy backend, which imports jax (py311-tf221-keras3, the JAX cell)",
)
def test_keras3_on_an_unsupported_backend_is_refused():
    """Keras 3's numpy backend: inference only, it cannot train."""
    script = textwrap.dedent("""
        import numpy as np, keras
        from compatgrad import get_gradients, errors
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        try:
            get_gradients(model, np.ones((2, 3)), np.ones((2, 1)))
        except errors.UnsupportedModelError as error:
            print("UnsupportedModelError:", error)
    """)
    env = dict(os.environ, KERAS_BACKEND="numpy")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=300)
    assert (
        "expected a Keras 3 model on the TensorFlow, JAX or PyTorch backend, got the 'numpy' backend"
        in result.stdout.decode()
    ), result.stderr.decode()[-2000:]
