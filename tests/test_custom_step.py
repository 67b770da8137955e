"""Models that override train_step: the gradients their own step hands its optimizers, against fit.

The oracle is one epoch of ``fit`` over one batch with SGD(learning_rate=1.0): w0 - w1 is what the
step applied. ``fit`` rather than ``train_on_batch``: Keras 3's train_on_batch hands the step
``(x, y, None)``, which the ``x, y = data`` of every guide's custom step cannot unpack.
"""

import inspect

import numpy as np
import pytest

import kit
from compatgrad import errors, get_gradients

kit.TENSORFLOW.needed_by_module()

eager_only = pytest.mark.skipif(kit.GRAPH, reason="the graph engine never calls train_step")
keras, tf = kit.keras, kit.tf
layers = keras.layers
TOL = 1e-5
optimizer_names = pytest.mark.parametrize("opt", sorted(kit.OPTIMIZERS))


def compiled_loss(model, x, y, y_pred):
    if hasattr(model, "compute_loss"):  # Keras >= 2.8, Keras 3
        return model.compute_loss(x=x, y=y, y_pred=y_pred)
    return model.compiled_loss(y, y_pred, regularization_losses=model.losses)


def functional(cls, seed=0):
    inputs = layers.Input(shape=(4,))
    hidden = layers.Dense(
        5, activation="tanh", name="hidden", kernel_initializer=keras.initializers.GlorotUniform(seed)
    )(inputs)
    return cls(
        inputs,
        layers.Dense(2, name="head", kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(hidden),
    )


def twins(cls, optimizer=None, **compile_kwargs):
    """Two identical compiled models of ``cls``."""
    models = []
    for _ in range(2):
        model = functional(cls)
        model.compile(optimizer() if optimizer else kit.sgd(), "mse", **compile_kwargs)
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    return models


def fit_delta(model, x, y=None):
    """w0 - w1 of the model's weights after one fit step over the whole batch."""
    weights = list(model.weights)
    before = kit.values(weights)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return [b - a for b, a in zip(before, kit.values(weights))]


def batch(rng, n=16):
    return rng.randn(n, 4).astype("float32"), rng.randn(n, 2).astype("float32")


def penalized_loss(model, x, y):
    loss = compiled_loss(model, x, y, model(x, training=True))
    return loss + 0.1 * tf.reduce_sum(tf.square(model.get_layer("hidden").kernel))


class PenalizedSubset(keras.Model):
    """The compiled loss plus a penalty on the hidden kernel; the head's bias is never updated."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = penalized_loss(self, x, y)
        variables = self.trainable_variables[:-1]
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"loss": loss}


class Minimizes(keras.Model):
    """Keras 2's optimizer.minimize with the step's own tape."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = compiled_loss(self, x, y, self(x, training=True)) * 3.0
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return {"loss": loss}


class Applies(keras.Model):
    """Keras 3's optimizer.apply(grads, variables), the loss scaled through the optimizer's own API."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = compiled_loss(self, x, y, self(x, training=True))
            scaled = self.optimizer.scale_loss(loss)
        self.optimizer.apply(tape.gradient(scaled, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


class ScalesLossItself(keras.Model):
    """Keras 2's LossScaleOptimizer API used by hand: get_scaled_loss, get_unscaled_gradients."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = compiled_loss(self, x, y, self(x, training=True))
            scaled = self.optimizer.get_scaled_loss(loss)
        grads = self.optimizer.get_unscaled_gradients(tape.gradient(scaled, self.trainable_variables))
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


@eager_only
@optimizer_names
def test_apply_gradients_on_a_subset_with_an_own_term(opt, rng):
    x, y = batch(rng)
    model, twin = twins(PenalizedSubset, lambda: kit.sgd(opt))
    grads = get_gradients(model, x, y, unconnected="zero")
    delta = fit_delta(twin, x, y)
    assert kit.parity_difference(grads, delta) < TOL
    assert not np.any(grads[-1]) and not np.any(delta[-1])  # the bias the step leaves alone
    with pytest.raises(errors.UnconnectedGradientError, match="head/bias|bias"):
        get_gradients(model, x, y)


@eager_only
@pytest.mark.skipif(
    kit.GRAPH or kit.KERAS3 or "tape" not in inspect.signature(keras.optimizers.SGD.minimize).parameters,
    reason="minimize(loss, variables, tape=) of Keras 2 from TF 2.4, eager",
)
@optimizer_names
def test_minimize(opt, rng):
    x, y = batch(rng)
    model, twin = twins(Minimizes, lambda: kit.sgd(opt))
    assert kit.parity_difference(get_gradients(model, x, y), fit_delta(twin, x, y)) < TOL


@eager_only
@pytest.mark.skipif(not kit.KERAS3, reason="optimizer.apply and scale_loss are Keras 3's")
def test_apply_with_scale_loss(rng):
    x, y = batch(rng)
    model, twin = twins(Applies, lambda: keras.optimizers.LossScaleOptimizer(kit.sgd()))
    grads, info = get_gradients(model, x, y, return_info=True)
    assert info.loss_scale == 2.0**15
    assert kit.parity_difference(grads, fit_delta(twin, x, y)) < TOL


@pytest.mark.skipif(
    kit.KERAS3 or not hasattr(getattr(keras, "mixed_precision", None), "LossScaleOptimizer"),
    reason="Keras 2's LossScaleOptimizer API (TF >= 2.4)",
)
@eager_only
@optimizer_names
def test_loss_scaled_by_the_step_itself(opt, rng):
    x, y = batch(rng)
    model, twin = twins(ScalesLossItself, lambda: keras.mixed_precision.LossScaleOptimizer(kit.sgd(opt)))
    grads, info = get_gradients(model, x, y, return_info=True)
    assert info.loss_scale == 2.0**15
    assert kit.parity_difference(grads, fit_delta(twin, x, y)) < TOL


@eager_only
@pytest.mark.parametrize("clip", [True, False], ids=["clipped", "unclipped"])
def test_the_optimizers_clipping(clip, rng):
    """What apply_gradients applies: clipped where it clips (TF 2.2-2.3's does not, only their own
    train step did); clip=False: the gradient the step computed, as a hand-written tape computes it."""
    x, y = batch(rng)
    model, twin = twins(PenalizedSubset, lambda: kit.sgd(clipnorm=0.05))
    params = model.trainable_weights[:-1]
    with tf.GradientTape() as tape:
        loss = penalized_loss(model, tf.constant(x), tf.constant(y))
    unclipped = [np.array(g) for g in tape.gradient(loss, params)]
    grads = get_gradients(model, x, y, params, clip=clip)
    if clip:
        assert kit.parity_difference(grads, fit_delta(twin, x, y)[:-1]) < TOL
    else:
        assert kit.max_difference(grads, unclipped) < TOL


class GAN(keras.Model):
    """The discriminator / generator pattern: two optimizers held as attributes, applied in turn."""

    def __init__(self, generator, discriminator):
        super().__init__()
        self.generator, self.discriminator = generator, discriminator

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    def call(self, x):  # what Keras 3 builds from the batch under a strategy
        return self.discriminator(x)

    def train_step(self, data):
        real = data[0] if isinstance(data, tuple) else data
        z = tf.reshape(tf.range(tf.cast(tf.size(real[:, :3]), tf.float32), dtype=tf.float32), (-1, 3)) / 50.0
        with tf.GradientTape() as tape:  # the discriminator first: real scores up, fake ones down
            fake = self.generator(z, training=True)
            d_loss = tf.reduce_mean(self.discriminator(fake, training=True)) - tf.reduce_mean(
                self.discriminator(real, training=True)
            )
        d_vars = self.discriminator.trainable_variables
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, d_vars), d_vars))
        with tf.GradientTape() as tape:  # then the generator, against the discriminator as just updated
            g_loss = -tf.reduce_mean(self.discriminator(self.generator(z, training=True), training=True) ** 2)
        g_vars = self.generator.trainable_variables
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, g_vars), g_vars))
        return {"d_loss": d_loss, "g_loss": g_loss}


def gan(opt=None):
    generator = keras.Sequential([layers.Dense(4, activation="tanh", input_shape=(3,)), layers.Dense(4)])
    discriminator = keras.Sequential([layers.Dense(3, activation="tanh", input_shape=(4,)), layers.Dense(1)])
    model = GAN(generator, discriminator)
    model.compile(kit.sgd(opt), kit.sgd(opt))
    return model


@eager_only
def test_two_optimizers_in_one_step(rng):
    x = rng.randn(8, 4).astype("float32")
    model, twin = gan(), gan()
    twin.set_weights(model.get_weights())
    params = model.generator.trainable_weights + model.discriminator.trainable_weights
    grads = get_gradients(model, x, params=params)
    twin_params = twin.generator.trainable_weights + twin.discriminator.trainable_weights
    before = kit.values(twin_params)
    twin.fit(x, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    delta = [b - a for b, a in zip(before, kit.values(twin_params))]
    assert kit.parity_difference(grads, delta) < TOL
    # The generator's gradient goes through the discriminator as the step just updated it: through
    # the discriminator as it was, it differs.
    z = tf.reshape(tf.range(x.size * 3 // 4, dtype=tf.float32), (-1, 3)) / 50.0  # the step's z
    with tf.GradientTape() as tape:
        g_loss = -tf.reduce_mean(model.discriminator(model.generator(z, training=True), training=True) ** 2)
    stale = [np.array(g) for g in tape.gradient(g_loss, model.generator.trainable_variables)]
    assert kit.max_difference(stale, delta[: len(stale)]) > 1e-3


@eager_only
@optimizer_names
def test_no_side_effects(opt, rng):
    x = rng.randn(8, 4).astype("float32")
    model, twin = gan(opt), gan(opt)
    twin.set_weights(model.get_weights())
    for m in (model, twin):  # optimizer iterations and slots exist
        m.fit(x, batch_size=len(x), epochs=1, shuffle=False, verbose=0)

    def state(m):
        return kit.values(m.weights) + kit.values(
            kit.optimizer_variables(m.d_optimizer) + kit.optimizer_variables(m.g_optimizer)
        )

    before = state(model)
    get_gradients(model, x)
    get_gradients(model, x)
    assert kit.max_difference(state(model), before) == 0.0
    for m in (model, twin):
        m.fit(x, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    assert kit.max_difference(state(model), state(twin)) == 0.0


class AppliesTwice(keras.Model):
    def train_step(self, data):
        x, y = data
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = compiled_loss(self, x, y, self(x, training=True))
            self.optimizer.apply_gradients(
                zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            )
        return {"loss": loss}


class AssignsDirectly(keras.Model):
    """Clips a kernel by assign after the update, as a WGAN clips its critic."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = compiled_loss(self, x, y, self(x, training=True))
        self.optimizer.apply_gradients(
            zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        )
        kernel = self.get_layer("hidden").kernel
        kernel.assign(tf.clip_by_value(kernel, -0.01, 0.01))
        return {"loss": loss}


@pytest.mark.parametrize(
    "cls, message",
    [(AppliesTwice, "twice"), (AssignsDirectly, "other than through an optimizer")],
    ids=["applied twice", "assigned directly"],
)
@eager_only
@optimizer_names
def test_steps_it_cannot_describe_raise_and_change_nothing(cls, message, opt, rng):
    x, y = batch(rng)
    model = functional(cls)
    model.compile(kit.sgd(opt, momentum=0.9), "mse")
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)  # momentum slots exist
    before = kit.values(model.weights) + kit.values(kit.optimizer_variables(model.optimizer))
    with pytest.raises(errors.UnsupportedModelError, match=message):
        get_gradients(model, x, y)
    assert (
        kit.max_difference(
            kit.values(model.weights) + kit.values(kit.optimizer_variables(model.optimizer)), before
        )
        == 0.0
    )


@eager_only
def test_layer_outputs_and_datasets_are_refused(rng):
    x, y = batch(rng)
    model = functional(PenalizedSubset)
    model.compile(kit.sgd(), "mse")
    with pytest.raises(errors.InvalidArgumentError, match="train_step"):
        get_gradients(model, x, y, params=[model.get_layer("hidden").output])
    with pytest.raises(errors.InvalidArgumentError, match="train_step"):
        get_gradients(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(8))


@pytest.mark.skipif(
    not kit.GRAPH or not hasattr(keras.Model, "train_step"),
    reason="graph mode of a Keras that has train_step",
)
def test_graph_mode_trains_the_compiled_loss_as_train_on_batch_does(rng):
    """The v1 engine never calls train_step: its train_on_batch applies the compiled loss's gradient."""
    x, y = batch(rng)
    model = functional(PenalizedSubset)
    model.compile(kit.sgd(), "mse")
    grads = get_gradients(model, x, y)
    assert kit.parity_difference(grads, kit.train_step_delta(model, x, y)) < TOL


@eager_only
@optimizer_names
def test_two_optimizers_under_a_mirrored_strategy(opt, rng):
    """The step runs on both replicas, each on half the batch as fit splits it, and each optimizer
    applies the cross-replica gradient (Keras 3.0-3.4: its own); compatgrad records it where it is applied."""
    x = rng.randn(8, 4).astype("float32")
    with kit.mirrored().scope():
        model, twin = gan(opt), gan(opt)
    twin.set_weights(model.get_weights())
    grads = get_gradients(model, x)
    before = kit.values(twin.trainable_weights)
    twin.fit(x, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    assert (
        kit.parity_difference(grads, [b - a for b, a in zip(before, kit.values(twin.trainable_weights))])
        < TOL
    )
    assert kit.max_difference(kit.values(model.weights), before) == 0.0
