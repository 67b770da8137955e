"""Models people train that are not the plain compiled functional model: trained by add_loss alone
(y=None), or not built until their first batch."""

import numpy as np
import pytest

import kit
from compatgrad import errors, get_gradients

keras, tf = kit.keras, kit.tf
layers = keras.layers
TOL = 1e-5


class Reconstruction(layers.Layer):
    """A VAE-style loss added in the layer's call; the model is compiled without a loss."""

    def call(self, inputs):
        x, reconstructed = inputs
        self.add_loss(kit.ops.mean(kit.ops.square(reconstructed - x)))
        return reconstructed


def autoencoder(loss=None):
    inputs = layers.Input(shape=(4,))
    reconstructed = layers.Dense(4)(layers.Dense(3, activation="tanh")(inputs))
    model = keras.Model(inputs, Reconstruction()([inputs, reconstructed]))
    model.compile(kit.sgd(), loss)
    return model


def test_add_loss_only_with_y_none(rng):
    x = rng.randn(8, 4).astype("float32")
    model, twin = autoencoder(), autoencoder()
    twin.set_weights(model.get_weights())
    grads = get_gradients(model, x)
    assert kit.parity_difference(grads, kit.train_step_delta(twin, x, None)) < TOL


def test_y_none_with_a_compiled_loss_is_refused(rng):
    model = autoencoder(loss="mse")
    with pytest.raises(errors.InvalidArgumentError, match="y: expected an array"):
        get_gradients(model, rng.randn(8, 4).astype("float32"))


@kit.COMPILE_WITHOUT_A_LOSS.needed
def test_no_loss_at_all_is_refused(rng):
    inputs = layers.Input(shape=(4,))
    model = keras.Model(inputs, layers.Dense(2)(inputs))
    model.compile(kit.sgd())
    with pytest.raises(errors.NotCompiledError, match="loss"):
        get_gradients(model, rng.randn(8, 4).astype("float32"))


def seeded(seed):
    """The same weights wherever the build runs: seeded random initializers draw differently eagerly
    and in a traced build on TF 2.7-2.9, and compatgrad builds eagerly where train_on_batch traces."""

    def initializer(shape, dtype=None, **kwargs):
        values = np.random.RandomState(seed).uniform(-1.0, 1.0, size=tuple(int(d) for d in shape))
        return kit.ops.constant(values, dtype=dtype or "float32")

    return initializer


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layers.Dense(3, activation="tanh", kernel_initializer=seeded(1))
        self.head = layers.Dense(2, kernel_initializer=seeded(2))

    def call(self, x):
        return self.head(self.hidden(x))


def sequential_without_input_shape():
    return keras.Sequential(
        [
            layers.Dense(3, activation="tanh", kernel_initializer=seeded(1)),
            layers.Dense(2, kernel_initializer=seeded(2)),
        ]
    )


@kit.RACE_FREE_STEP.needed
@pytest.mark.parametrize(
    "make", [sequential_without_input_shape, Subclassed], ids=["sequential", "subclassed"]
)
def test_built_from_the_first_batch_as_the_step_builds_it(make, rng):
    """Both models build to the same weights: compatgrad's build is the one the twin's step makes."""
    x, y = rng.randn(8, 4).astype("float32"), rng.randn(8, 2).astype("float32")
    model, twin = make(), make()
    for m in (model, twin):
        m.compile(kit.sgd(), "mse")
    grads = get_gradients(model, x, y)
    built = kit.values(model.trainable_weights)
    assert len(grads) == 4
    kit.train(twin, x, y)
    assert (
        kit.parity_difference(grads, [b - a for b, a in zip(built, kit.values(twin.trainable_weights))]) < TOL
    )
    kit.train(model, x, y)  # the build was the only change
    assert kit.max_difference(kit.values(model.trainable_weights), kit.values(twin.trainable_weights)) < TOL


@kit.TENSORFLOW.needed
@pytest.mark.skipif(kit.TF1, reason="tf.data datasets: TF 2")
def test_an_unbuilt_model_with_a_dataset_is_refused(rng):
    model = sequential_without_input_shape()
    model.compile(kit.sgd(), "mse")
    dataset = tf.data.Dataset.from_tensor_slices(
        (rng.randn(8, 4).astype("float32"), rng.randn(8, 2).astype("float32"))
    ).batch(4)
    with pytest.raises(errors.InvalidArgumentError, match="built"):
        get_gradients(model, dataset)
