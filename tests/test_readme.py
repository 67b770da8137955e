"""The README's recipes run as written."""

import os
import re

import numpy as np
import pytest

import kit

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def recipe_blocks():
    text = open(README).read()
    section = text.split("## Recipes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@kit.TENSORFLOW.needed
@pytest.mark.skipif(kit.GRAPH, reason="the recipes are eager code; test_updates covers graph mode")
def test_recipes_run_as_written():
    blocks = recipe_blocks()
    assert len(blocks) == 3
    namespace = {}
    for block in blocks:
        exec(compile(block, README, "exec"), namespace)
    assert namespace["v"].numpy()[0] == 1.0


def migration_after_blocks():
    text = open(README).read()
    section = text.split("## Migrating", 1)[1].split("\n## ", 1)[0]
    return [
        block for block in re.findall(r"```python\n(.*?)```", section, re.S) if block.startswith("# after")
    ]


@pytest.mark.parametrize(
    "index",
    [0, 1, 2, 3, 4],  # 4: layer outputs
)
def test_migration_after_blocks_match_the_training_step(index, rng):
    blocks = migration_after_blocks()
    assert len(blocks) == 5
    layers = kit.keras.layers
    model = kit.keras.Sequential([layers.Dense(5, activation="tanh", input_shape=(4,)), layers.Dense(1)])
    model.compile(kit.sgd(), "mse")
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    sample_weight = rng.uniform(0, 2, size=16).astype("float32")
    weights = model.get_weights()
    expected = kit.train_step_delta(model, x, y, sample_weight)
    model.set_weights(weights)  # SGD keeps no state: the model is as it was
    namespace = {"model": model, "x": x, "y": y, "sample_weight": sample_weight, "keras": kit.keras}
    exec(compile(blocks[index], README, "exec"), namespace)
    values = namespace["values"]
    values = list(values.values()) if isinstance(values, dict) else values
    assert kit.parity_difference(values, expected) <= 1e-5
    assert len(namespace.get("norms", [None])) >= 1  # the callback logged (16 examples: batch 0)


def per_example_blocks():
    text = open(README).read()
    section = text.split("## Per-example gradients", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@kit.TENSORFLOW.needed  # the blocks build their model with tf.keras
@pytest.mark.skipif(kit.GRAPH, reason="the blocks are eager code; test_per_example covers graph mode")
def test_per_example_blocks_run_and_score_as_the_step():
    """TracIn scores add up, per batch, to <the batch's step, the test example's step>; each norm is
    the norm of the step on that example alone over the batch size (train_on_batch, SGD(0.1))."""
    blocks = per_example_blocks()
    assert len(blocks) == 2
    namespace = {}
    for block in blocks:
        exec(compile(block, README, "exec"), namespace)
    model, x, y, scores, norms = (namespace[k] for k in ("model", "x", "y", "scores", "norms"))

    def applied(xb, yb):
        before = model.get_weights()
        model.train_on_batch(xb, yb)
        step = [(b - a) / 0.1 for b, a in zip(before, model.get_weights())]
        model.set_weights(before)
        return np.concatenate([s.ravel() for s in step]).astype("float64")

    test = applied(x[:1], y[:1])
    for start in (0, 16):
        expected = applied(x[start : start + 16], y[start : start + 16]) @ test
        assert abs(scores[start : start + 16].sum() - expected) <= 1e-4 * max(1.0, abs(expected))
    alone = np.array([np.linalg.norm(applied(x[i : i + 1], y[i : i + 1])) / len(x) for i in range(len(x))])
    assert np.max(np.abs(norms - alone)) <= 1e-4 * max(1.0, np.max(alone))


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
@kit.FEATURES_BUILT_ON_TENSORFLOW.needed
def test_gradient_logger_block_logs_the_steps(rng, tmp_path):
    """The first logged step's global norm is that of train_on_batch's step on the first batch
    (SGD(1.0): w0 - w1), taken on a twin with the same weights."""
    text = open(README).read()
    section = text.split("## Logging the gradients fit applies", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    layers = kit.keras.layers

    def classifier():
        model = kit.keras.Sequential([layers.Dense(5, activation="tanh", input_shape=(4,)), layers.Dense(1)])
        model.compile(kit.sgd(), "mse")
        return model

    model, twin = classifier(), classifier()
    twin.set_weights(model.get_weights())
    x, y = rng.randn(32, 4).astype("float32"), rng.randn(32, 1).astype("float32")
    namespace = {"model": model, "x": x, "y": y, "log_dir": str(tmp_path)}
    exec(compile(block, README, "exec"), namespace)
    first = kit.train_step_delta(twin, x[:16], y[:16])
    assert namespace["first"]["global_norm"] == pytest.approx(
        np.linalg.norm([np.linalg.norm(g) for g in first]), rel=1e-5
    )
    assert [entry["step"] for entry in namespace["logger"].history] == [1, 2, 3, 4]
    assert os.listdir(str(tmp_path))  # an event file
