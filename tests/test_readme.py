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
