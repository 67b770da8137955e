"""The README's recipes run as written."""

import os
import re

import pytest

import kit

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def recipe_blocks():
    text = open(README).read()
    section = text.split("## Recipes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


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


@pytest.mark.parametrize("index", range(5))
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
