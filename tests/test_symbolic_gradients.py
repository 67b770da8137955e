"""symbolic_gradients: the step's gradients as tensors inside a tf.function, a custom train_step under
fit (jit_compile too) and graph-mode code, against train_on_batch and hand-written tapes."""

import numpy as np
import pytest

import kit
from compatgrad import errors, get_gradients, layer_outputs, symbolic_gradients

kit.TENSORFLOW.needed_by_module()

keras, tf = kit.keras, kit.tf
layers = keras.layers
TOL = 1e-5
eager_only = pytest.mark.skipif(kit.GRAPH, reason="eager mode: tf.function and train_step")
graph_only = pytest.mark.skipif(not kit.GRAPH, reason="graph mode: tensors of the model's graph")


def compiled_loss(model, x, y, y_pred, sample_weight=None):
    """The compiled loss as the default train_step computes it (a hand-written tape's loss)."""
    y, sample_weight = (None if v is None else tf.convert_to_tensor(v) for v in (y, sample_weight))
    if hasattr(model, "compute_loss"):  # Keras >= 2.8, Keras 3
        return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
    return model.compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)


def regression(**optimizer):
    model = keras.Sequential([layers.Dense(5, activation="tanh", input_shape=(4,)), layers.Dense(1)])
    model.compile(kit.sgd(**optimizer), "mse")
    return model


def batch(rng):
    x, y = rng.randn(16, 4).astype("float32"), 3 * rng.randn(16, 1).astype("float32")
    return x, y, rng.uniform(0, 2, size=16).astype("float32")


@eager_only
def test_inside_a_tf_function_as_the_step_clips(rng):
    x, y, w = batch(rng)
    model = regression(clipnorm=0.05)

    @tf.function
    def gradients(x, y, w, clip):
        return symbolic_gradients(model, x, y, sample_weight=w, training=True, clip=clip)

    clipped = [g.numpy() for g in gradients(tf.constant(x), tf.constant(y), tf.constant(w), True)]
    unclipped = [g.numpy() for g in gradients(tf.constant(x), tf.constant(y), tf.constant(w), False)]
    with tf.GradientTape() as tape:
        loss = compiled_loss(model, x, y, model(x, training=True), w)
    by_hand = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
    assert kit.max_difference(clipped, unclipped) > 1e-3
    assert kit.max_difference(unclipped, by_hand) <= TOL
    assert kit.parity_difference(clipped, kit.train_step_delta(model, x, y, w)) <= TOL


@eager_only
def test_get_gradients_inside_a_tf_function_points_here(rng):
    x, y, _ = batch(rng)
    model = regression()

    @tf.function
    def gradients(x, y):
        return get_gradients(model, x, y)

    with pytest.raises(errors.ModeError, match="symbolic_gradients returns tensors there"):
        gradients(tf.constant(x), tf.constant(y))


def embedding_model(cls, epsilon):
    """tokens -> "embed" (a nested model: Embedding) -> "head" (a nested model: Flatten, Dense)."""
    tokens = layers.Input(shape=(6,), dtype="int32")
    embed = keras.Model(tokens, layers.Embedding(20, 4)(tokens), name="embed")
    vectors = layers.Input(shape=(6, 4))
    head = keras.Model(vectors, layers.Dense(1)(layers.Flatten()(vectors)), name="head")
    model = cls(tokens, head(embed(tokens)))
    model.epsilon = epsilon
    return model


class Adversarial(keras.Model):
    """Embedding-space adversarial training: the step trains on the embeddings moved along the loss
    gradient with respect to them, taken by compatgrad inside the step."""

    def direction(self, x, y):
        return symbolic_gradients(self, x, y, layer_outputs(self, ["embed"]))[0]

    def train_step(self, data):
        x, y = data[0], data[1]
        direction = tf.stop_gradient(self.direction(x, y))
        with tf.GradientTape() as tape:
            vectors = self.get_layer("embed")(x, training=True)
            y_pred = self.get_layer("head")(vectors + self.epsilon * direction, training=True)
            loss = compiled_loss(self, x, y, y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class HandWritten(Adversarial):
    """The same step with the direction from a hand-written tape."""

    def direction(self, x, y):
        with tf.GradientTape() as tape:
            vectors = self.get_layer("embed")(x, training=False)
            tape.watch(vectors)
            loss = compiled_loss(self, x, y, self.get_layer("head")(vectors, training=False))
        return tape.gradient(loss, vectors)


@eager_only
@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=kit.JIT_COMPILE.needed)], ids=["", "jit"])
def test_adversarial_training_inside_a_compiled_train_step(jit, rng):
    tokens = rng.randint(0, 20, size=(16, 6)).astype("int32")
    y = rng.randn(16, 1).astype("float32")
    models = [
        embedding_model(Adversarial, 1.0),
        embedding_model(HandWritten, 1.0),
        embedding_model(HandWritten, 0.0),
    ]
    for model in models[1:]:
        model.set_weights(models[0].get_weights())
    for model in models:
        model.compile(kit.sgd(learning_rate=0.1), "mse", **({"jit_compile": True} if jit else {}))
        model.fit(tokens, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    ours, by_hand, plain = (kit.values(model.trainable_weights) for model in models)
    assert kit.max_difference(ours, plain) > 1e-4  # the step moved the embeddings
    assert kit.max_difference(ours, by_hand) <= TOL


class WithUnusedWeight(layers.Layer):
    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), 1), initializer="ones")
        self.unused = self.add_weight(name="unused", shape=(2,), initializer="ones")

    def call(self, inputs):
        return tf.matmul(inputs, self.kernel)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


@eager_only
def test_unconnected_inside_a_tf_function(rng):
    x, y, _ = batch(rng)
    inputs = layers.Input(shape=(4,))
    layer = WithUnusedWeight()
    model = keras.Model(inputs, layer(inputs))
    model.compile(kit.sgd(), "mse")
    params = [layer.kernel, layer.unused]

    @tf.function
    def gradients(x, y, unconnected):
        return symbolic_gradients(model, x, y, params, unconnected=unconnected)

    kernel, unused = gradients(x, y, "skip")
    assert unused is None
    kernel_value = kit.values([layer.kernel])[0]
    assert kit.max_difference([kernel.numpy()], [2 * x.T @ (x @ kernel_value - y) / len(x)]) <= TOL
    _, zeros = gradients(x, y, "zero")
    assert zeros.shape == (2,) and not zeros.numpy().any()
    with pytest.raises(errors.UnconnectedGradientError, match="unused"):
        gradients(x, y, "raise")


@eager_only
def test_an_unconnected_layer_output_gets_zeros_of_the_batch_inside_a_tf_function(rng):
    """The crossentropy reads the logits under the softmax, so the softmax output has no gradient."""
    x = rng.randn(16, 4).astype("float32")
    labels = rng.randint(0, 3, size=16)
    inputs = layers.Input(shape=(4,))
    model = keras.Model(inputs, layers.Dense(3, activation="softmax", name="probs")(inputs))
    model.compile(kit.sgd(), "sparse_categorical_crossentropy")
    params = layer_outputs(model, ["probs"])

    @tf.function
    def gradients(x, y):
        return symbolic_gradients(model, x, y, params, unconnected="zero")

    (zeros,) = gradients(tf.constant(x), tf.constant(labels))
    assert zeros.shape == (16, 3) and not zeros.numpy().any()


@graph_only
def test_graph_mode_tensors_fed_through_the_models_feeds(rng):
    x, y, w = batch(rng)
    model = regression(clipnorm=0.05)
    kit.train(
        model, x, y, sample_weight=w
    )  # the model's sample-weight feeds exist, as legacy code found them
    grads = symbolic_gradients(model)
    K = kit.backend
    feeds = model._feed_inputs + model._feed_targets + model._feed_sample_weights + [K.learning_phase()]
    values = K.function(feeds, grads)([x, y, w, 1])
    assert kit.parity_difference(values, kit.train_step_delta(model, x, y, w)) <= TOL
    with pytest.raises(errors.InvalidArgumentError, match="^x: expected None in graph mode"):
        symbolic_gradients(model, x, y)


@graph_only
def test_graph_mode_tensors_are_made_once(rng):
    model = regression()
    graph = kit.graph_of(model)
    first = symbolic_gradients(model)
    ops = len(graph.get_operations())
    assert all(a is b for a, b in zip(symbolic_gradients(model), first))
    assert len(graph.get_operations()) == ops
    np.testing.assert_equal(len(first), len(model.trainable_weights))
