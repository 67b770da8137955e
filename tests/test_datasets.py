"""Whole-dataset gradients equal the training step's gradient on the concatenated data."""

import numpy as np
import pytest
from test_behaviour import WithUnusedWeight

import kit
from compatgrad import errors, get_gradients

layers = kit.keras.layers
TOL = 1e-5
SequenceBase = getattr(kit.keras.utils, "PyDataset", None) or kit.keras.utils.Sequence


def regularized_model(loss="mse"):
    model = kit.keras.Sequential(
        [
            layers.Dense(
                6, activation="tanh", input_shape=(5,), kernel_regularizer=kit.keras.regularizers.l2(0.05)
            ),
            layers.Dense(1),
        ]
    )
    model.compile(kit.sgd(), loss)
    return model


def data(rng, n=40):
    return (
        rng.randn(n, 5).astype("float32"),
        rng.randn(n, 1).astype("float32"),
        rng.uniform(0, 2, size=n).astype("float32"),
    )


class Batches(SequenceBase):
    def __init__(self, arrays, batch_size):
        super().__init__()
        self.arrays, self.batch_size = arrays, batch_size

    def __len__(self):
        return -(-len(self.arrays[0]) // self.batch_size)

    def __getitem__(self, index):
        return tuple(a[index * self.batch_size : (index + 1) * self.batch_size] for a in self.arrays)


def generator(arrays, batch_size):
    for start in range(0, len(arrays[0]), batch_size):
        yield tuple(a[start : start + batch_size] for a in arrays)


def tf_dataset(arrays, batch_size):
    return kit.tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)


@pytest.mark.parametrize(
    "source",
    [pytest.param(tf_dataset, marks=kit.TENSORFLOW.needed), generator, Batches],
    ids=["tf.data", "generator", "Sequence"],
)
def test_uneven_batches_add_up_to_the_step_on_all_the_data(source, rng):
    """Batches of 16, 16 and 8, sample weights and an L2 penalty counted once."""
    x, y, weights = data(rng)
    model = regularized_model()
    grads = get_gradients(model, source((x, y, weights), 16), verbose=0)
    assert kit.parity_difference(grads, kit.train_step_delta(model, x, y, sample_weight=weights)) <= TOL


@kit.TENSORFLOW.needed
def test_steps_stops_early_and_the_loss_is_the_mean(rng):
    x, y, _ = data(rng)
    model = regularized_model()
    grads, info = get_gradients(model, tf_dataset((x, y), 16), steps=2, verbose=0, return_info=True)
    loss = float(np.ravel(model.test_on_batch(x[:32], y[:32]))[0])
    assert abs(info.loss - loss) <= 1e-5 * max(1.0, abs(loss)) and info.all_finite
    assert kit.parity_difference(grads, kit.train_step_delta(model, x[:32], y[:32])) <= TOL


def sum_reduced_mse():
    return kit.keras.losses.MeanSquaredError(reduction="sum")


@kit.LOSS_CLASSES.needed
def test_sum_reduced_loss_adds_up_over_batches(rng):
    x, y, _ = data(rng)
    model = kit.keras.Sequential([layers.Dense(6, activation="tanh", input_shape=(5,)), layers.Dense(1)])
    model.compile(kit.sgd(learning_rate=0.01), sum_reduced_mse())
    grads = get_gradients(model, generator((x, y), 16), verbose=0)
    delta = [d / 0.01 for d in kit.train_step_delta(model, x, y)]
    assert kit.max_difference(grads, delta) <= 1e-3 * max(1.0, max(float(np.abs(d).max()) for d in delta))


@kit.TENSORFLOW.needed
def test_progress_bar_unless_verbose_0(rng, capsys):
    x, y, _ = data(rng)
    model = regularized_model()
    get_gradients(model, tf_dataset((x, y), 16), verbose=0)
    assert capsys.readouterr().out == ""
    get_gradients(model, Batches((x, y), 16))
    assert "3/3" in capsys.readouterr().out


@kit.TENSORFLOW.needed
def test_dataset_arguments_are_checked(rng):
    x, y, _ = data(rng)
    model = regularized_model()
    with pytest.raises(errors.InvalidArgumentError, match="y: expected None when x is a dataset"):
        get_gradients(model, generator((x, y), 16), y)
    with pytest.raises(errors.InvalidArgumentError, match=r"x: expected a dataset yielding \(x, y\)"):
        get_gradients(model, generator((x,), 16), verbose=0)
    with pytest.raises(errors.InvalidArgumentError, match="params: expected variables only with a dataset"):
        get_gradients(model, generator((x, y), 16), params=list(model.inputs), verbose=0)
    with pytest.raises(errors.InvalidArgumentError, match="steps: expected None unless x is a dataset"):
        get_gradients(model, x, y, steps=2)
    with pytest.raises(errors.InvalidArgumentError, match="x: expected a dataset with at least one batch"):
        get_gradients(model, iter([]), verbose=0)
    if not kit.GRAPH:
        with pytest.raises(
            errors.InvalidArgumentError, match="steps: expected a number of batches for an infinite dataset"
        ):
            get_gradients(model, tf_dataset((x, y), 16).repeat(), verbose=0)
        assert len(get_gradients(model, tf_dataset((x, y), 16).repeat(), steps=5, verbose=0)) == 4


@kit.LOSS_CLASSES.needed
def test_sum_reduced_loss_next_to_regularization_is_refused(rng):
    x, y, _ = data(rng)
    summed = regularized_model(sum_reduced_mse())
    with pytest.raises(
        errors.InvalidArgumentError,
        match="model: expected no regularization losses next to a SUM-reduced loss",
    ):
        get_gradients(summed, generator((x, y), 16), verbose=0)


def two_output_model():
    inputs = layers.Input((5,))
    hidden = layers.Dense(4, activation="tanh", name="hidden")(inputs)
    model = kit.keras.Model(inputs, [layers.Dense(1, name="a")(hidden), layers.Dense(2, name="b")(hidden)])
    model.compile(kit.sgd(), ["mse", "mse"], loss_weights=[1.0, 0.5])
    return model


@kit.TENSORFLOW.needed
def test_many_batches_with_per_output_weights_add_up(rng):
    """More batches than one chunk of the in-graph loop (eager tf.data), per-output sample weights."""
    x, ya, yb = (
        rng.randn(42, 5).astype("float32"),
        rng.randn(42, 1).astype("float32"),
        rng.randn(42, 2).astype("float32"),
    )
    weights = rng.uniform(0, 2, size=42).astype("float32")
    model = two_output_model()
    targets, per_output = {"a": ya, "b": yb}, {"a": weights, "b": weights[::-1].copy()}
    dataset = kit.tf.data.Dataset.from_tensor_slices((x, targets, per_output)).batch(2)
    grads = get_gradients(model, dataset, verbose=0)
    delta = kit.train_step_delta(model, x, [ya, yb], sample_weight=[weights, weights[::-1].copy()])
    assert kit.parity_difference(grads, delta) <= TOL


@kit.TENSORFLOW.needed
def test_a_variable_without_gradient_over_a_dataset(rng):
    """Unconnected over a dataset: raises, or zeros, and the rest still adds up."""
    x, y = rng.randn(40, 3).astype("float32"), rng.randn(40, 1).astype("float32")
    inputs = layers.Input(shape=(3,))
    layer = WithUnusedWeight(name="with_unused")
    model = kit.keras.Model(inputs, layer(inputs))
    model.compile(kit.sgd(), "mse")
    dataset = tf_dataset((x, y), 16)
    with pytest.raises(errors.UnconnectedGradientError, match="unused"):
        get_gradients(model, dataset, verbose=0)
    kernel, zeros = get_gradients(
        model, dataset, params=[layer.kernel, layer.unused], unconnected="zero", verbose=0
    )
    assert zeros.shape == (2,) and not zeros.any()
    if not kit.GRAPH:  # the eager step skips None gradients; graph mode's get_updates refuses them
        assert kit.parity_difference([kernel], kit.train_step_delta(model, x, y)[:1]) <= TOL


@kit.TENSORFLOW.needed
def test_progress_bar_counts_every_batch_of_a_tf_dataset(rng, capsys):
    x, y, _ = data(rng)
    model = regularized_model()
    get_gradients(model, tf_dataset((x, y), 2))
    # Graph mode reads no cardinality: there the bar learns its end when the dataset ends.
    assert "20/20" in capsys.readouterr().out
