"""apply_gradients, mask_gradients and freeze, with train_on_batch and a closed form as oracles."""

import numpy as np
import pytest

import kit
from compatgrad import apply_gradients, errors, freeze, get_gradients, mask_gradients, unfreeze

kit.TENSORFLOW.needed_by_module()

layers = kit.keras.layers
optimizer_names = pytest.mark.parametrize("opt", sorted(kit.OPTIMIZERS))


def optimizer(name, **kwargs):
    """An optimizer class of this cell by name (graph mode and "legacy_" names: the legacy ones)."""
    legacy = None if kit.KERAS3 else getattr(kit.keras.optimizers, "legacy", None)
    if legacy is not None and (kit.GRAPH or name.startswith("legacy_")):
        module = legacy
    else:
        module = kit.keras.optimizers
    # AttributeError where this Keras has no such optimizer (see kit.ADAMW)
    return kit.make_optimizer(getattr(module, name.replace("legacy_", "")), **kwargs)


def variable(value):
    return (
        kit.backend.variable(np.array(value, "float32"))
        if kit.GRAPH
        else kit.tf.Variable(np.array(value, "float32"))
    )


def two_layer_model(opt, units=2, **optimizer_kwargs):
    model = kit.keras.Sequential([layers.Dense(3, activation="tanh", input_shape=(4,)), layers.Dense(units)])
    model.compile(kit.sgd(opt, **optimizer_kwargs), "mse")
    return model


@kit.RACE_FREE_STEP.needed
@optimizer_names
def test_apply_gradients_is_the_training_step(opt, rng):
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 2).astype("float32")
    model, twin = two_layer_model(opt, momentum=0.9), two_layer_model(opt, momentum=0.9)
    twin.set_weights(model.get_weights())
    for _ in range(3):
        apply_gradients(model.optimizer, get_gradients(model, x, y), model.trainable_weights)
        kit.train(twin, x, y)
    assert kit.max_difference(kit.values(model.trainable_weights), kit.values(twin.trainable_weights)) <= 1e-5


@pytest.mark.skipif(kit.GRAPH, reason="mixed precision loss scaling is an eager feature here")
@kit.MIXED_PRECISION.needed
def test_apply_gradients_under_loss_scaling_is_the_training_step(mixed_float16, rng):
    """get_gradients unscales; apply_gradients must not unscale again (Keras 3's apply divides by the
    scale)."""
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 2).astype("float32")
    model, twin = two_layer_model("sgd"), two_layer_model("sgd")
    assert "LossScale" in type(model.optimizer).__name__, "compile did not wrap the optimizer"
    twin.set_weights(model.get_weights())
    for _ in range(2):
        apply_gradients(model.optimizer, get_gradients(model, x, y), model.trainable_weights)
        kit.train(twin, x, y)
    assert kit.max_difference(kit.values(model.trainable_weights), kit.values(twin.trainable_weights)) <= 1e-3


@optimizer_names
def test_apply_gradients_refuses_gradients_that_do_not_pair_up(opt, rng):
    model = two_layer_model(opt)
    weights = model.trainable_weights
    grads = get_gradients(model, rng.randn(8, 4).astype("float32"), rng.randn(8, 2).astype("float32"))
    before = kit.values(weights)
    with pytest.raises(
        errors.InvalidArgumentError, match=r"grads: expected 4 gradients, one per variable, got 1 gradients"
    ):
        apply_gradients(model.optimizer, [np.zeros(2, "float32")], weights)
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"grads\[2\] \(for .*kernel.*\): expected shape \(3, 2\), got shape \(2,\)",
    ):
        apply_gradients(model.optimizer, grads[:2] + [np.zeros(2, "float32")] + grads[3:], weights)
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"grads\[1\] \(for .*bias.*\): expected a gradient of shape \(3,\) "
        r"\(or missing='zero'\), got None",
    ):
        apply_gradients(model.optimizer, [grads[0], None] + grads[2:], weights)
    with pytest.raises(errors.InvalidTypeError, match="grads"):
        apply_gradients(model.optimizer, grads[0], weights)
    assert kit.max_difference(kit.values(weights), before) == 0.0
    apply_gradients(model.optimizer, [grads[0], None] + grads[2:], weights, missing="zero")
    after = kit.values(weights)
    assert np.array_equal(after[1], before[1]) and not np.array_equal(after[0], before[0])


@optimizer_names
def test_masked_head_trains_only_its_first_unit(opt, rng):
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 2).astype("float32")
    model = two_layer_model(opt, momentum=0.9)
    kernel, bias = model.layers[1].kernel, model.layers[1].bias
    initial_kernel, initial_bias = kit.values([kernel, bias])
    masks = [None, None, np.array([[1.0, 0.0]]), np.array([1.0, 0.0])]  # the kernel's columns broadcast
    for _ in range(3):
        apply_gradients(model.optimizer, get_gradients(model, x, y), model.trainable_weights, masks=masks)
    final_kernel, final_bias = kit.values([kernel, bias])
    assert np.array_equal(final_kernel[:, 1], initial_kernel[:, 1]) and final_bias[1] == initial_bias[1]
    assert not np.array_equal(final_kernel[:, 0], initial_kernel[:, 0]) and final_bias[0] != initial_bias[0]


def test_mask_gradients_validates_and_copies():
    grads = [np.ones((3, 2), "float32"), np.ones(2, "float32")]
    masked = mask_gradients(grads, [np.array([0.0, 1.0]), None])
    assert masked[0].tolist() == [[0.0, 1.0]] * 3 and masked[1] is grads[1] and grads[0].all()
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"masks\[0\]: expected a mask that broadcasts to shape \(3, 2\), got shape \(3,\)",
    ):
        mask_gradients(grads, [np.ones(3), None])
    with pytest.raises(errors.InvalidArgumentError, match="masks: expected 2 masks"):
        mask_gradients(grads, [None])


def objective_gradient(x):
    """d/dx of x0**2 + x1**2 + 1/(x0 + x1), in closed form."""
    pull = 1.0 / (x[0] + x[1]) ** 2
    return np.array([2 * x[0] - pull, 2 * x[1] - pull], "float32")


def bisect(f, low, high):
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if f(low) * f(middle) > 0 else (low, middle)
    return (low + high) / 2


def test_frozen_entry_stays_exact_while_sgd_finds_the_other():
    x = variable([1.0, 2.0])
    freeze(x, [True, False])
    sgd = optimizer("SGD", learning_rate=0.1)
    for step in range(200):
        apply_gradients(sgd, [objective_gradient(kit.values([x])[0])], [x])
        if step == 0 and kit.GRAPH:
            ops = len(x.graph.get_operations())
    x0, x1 = kit.values([x])[0]
    assert x0 == np.float32(1.0)
    assert abs(x1 - bisect(lambda t: 2 * t - 1 / (1 + t) ** 2, 0.0, 1.0)) <= 1e-5
    if kit.GRAPH:
        assert len(x.graph.get_operations()) == ops


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("SGD", {"momentum": 0.9}),
        ("Adam", {}),
        pytest.param("AdamW", {"weight_decay": 0.1}, marks=kit.ADAMW.needed),
    ],
)
def test_freeze_holds_where_a_zero_gradient_does_not(name, kwargs):
    """After a first step, momentum / moments / weight decay move an entry whose gradient is zero."""
    masked, frozen = variable([1.0, 2.0]), variable([1.0, 2.0])
    masked_opt, frozen_opt = (
        optimizer(name, learning_rate=0.05, **kwargs),
        optimizer(name, learning_rate=0.05, **kwargs),
    )
    apply_gradients(masked_opt, [objective_gradient(np.array([1.0, 2.0]))], [masked])
    apply_gradients(frozen_opt, [objective_gradient(np.array([1.0, 2.0]))], [frozen])
    held = kit.values([frozen])[0][0]
    freeze(frozen, np.array([True, False]))
    for _ in range(5):
        apply_gradients(
            masked_opt, [objective_gradient(kit.values([masked])[0])], [masked], masks=[np.array([0.0, 1.0])]
        )
        apply_gradients(frozen_opt, [objective_gradient(kit.values([frozen])[0])], [frozen])
    assert kit.values([masked])[0][0] != held  # a zero gradient did not hold it
    assert kit.values([frozen])[0][0] == held  # bit for bit
    unfreeze(frozen)
    apply_gradients(frozen_opt, [objective_gradient(kit.values([frozen])[0])], [frozen])
    assert kit.values([frozen])[0][0] != held


def test_freeze_holds_through_train_on_batch(rng):
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 2).astype("float32")
    model = kit.keras.Sequential([layers.Dense(3, activation="tanh", input_shape=(4,)), layers.Dense(2)])
    model.compile(optimizer("Adam", learning_rate=0.05), "mse")
    kernel = model.layers[0].kernel
    before = kit.values([kernel])[0]
    freeze(
        kernel, np.array([[True], [False], [False], [False]])
    )  # the first input's row; before the step is built
    for _ in range(3):
        kit.train(model, x, y)
    after = kit.values([kernel])[0]
    assert np.array_equal(after[0], before[0]) and not np.array_equal(after[1:], before[1:])


def test_freeze_validates_its_mask():
    x = variable([1.0, 2.0])
    with pytest.raises(
        errors.InvalidArgumentError,
        match=r"mask: expected a mask that broadcasts to shape \(2,\), got shape \(3,\)",
    ):
        freeze(x, [True, False, True])
    with pytest.raises(errors.InvalidTypeError, match="mask: expected a boolean mask"):
        freeze(x, [1.0, 0.0])
    with pytest.raises(
        errors.InvalidArgumentError, match="variable: expected a variable frozen by compatgrad.freeze"
    ):
        unfreeze(x)
