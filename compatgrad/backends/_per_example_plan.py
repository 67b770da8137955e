"""What the per-example engines (``_per_example`` on TensorFlow, ``_per_example_keras3``) are given and
give back: one interface, no framework imported."""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

GRADIENTS, NORMS, DOT = "gradients", "norms", "dot"


class Ghost(NamedTuple):
    """A Dense layer whose per-example norms or dot products come from its input and output gradient."""

    layer: Any
    kernel: Optional[int]  # its kernel's index among the plan's variables, if wanted
    bias: Optional[int]


class Plan(NamedTuple):
    """What the per-example functions compute; built once per model and plan."""

    variables: Tuple[Any, ...]  # the wanted variables the loss depends on
    kinds: Tuple[Optional[str], ...]  # per flat output, what the loss reads: "output", "logits", None
    mode: str  # GRADIENTS (per example), NORMS (squared, per variable), DOT (with a vector, per variable)
    sparse: Tuple[bool, ...]  # per variable: its gradient kept sparse, (values, indices) per example
    training: bool
    ghosts: Tuple[Ghost, ...]  # NORMS and DOT only

    def key(self) -> Tuple[Any, ...]:
        ghosts = tuple((id(g.layer), g.kernel, g.bias) for g in self.ghosts)
        return (tuple(map(id, self.variables)), self.kinds, self.mode, self.sparse, self.training, ghosts)


class Inputs(NamedTuple):
    """One chunk's values: the model's inputs, the output gradients (of the outputs the loss reads),
    the loss scale to take gradients at, and per variable its share of ``model.losses``' gradient
    and (DOT) its vector. A None says there is nothing to do (no loss scaling; no share reaching
    that variable): the ops are then built without the pass over every example's gradient it costs."""

    x: Any
    cotangents: List[np.ndarray]
    scale: Optional[float]
    shared: List[Optional[np.ndarray]]
    vectors: List[np.ndarray]


class Runner(NamedTuple):
    """(chunk -> per variable: per-example gradients, squared norms or dot products), (batch -> the
    gradient of <c, outputs>), and how the per-example gradients ran: "vectorized" or "loop"."""

    chunk: Callable[[Inputs], List[Any]]
    batch: Callable[[Inputs], List[np.ndarray]]
    paths: Dict[str, str]
