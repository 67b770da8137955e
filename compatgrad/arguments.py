"""Validation of what users pass to ``get_gradients``, the same for every backend.

Everything here only reads the model: a bad argument raises before any backend touches it.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from . import versions
from ._types import Model, Variable
from .errors import InvalidArgumentError, InvalidTypeError, NotCompiledError

Structure = Any  # an array-like, or a list / tuple / dict of them


class Batch(NamedTuple):
    x: Structure
    y: Structure
    # None, one array for every output, or a list in output order (entries may be None).
    sample_weight: Optional[Structure]
    size: Optional[int]  # the batch size (None in a dataset's element_spec, checked once for all batches)


def check_compiled(model: Model, custom_step: bool, losses_listed: bool) -> None:
    """A compiled model; with a loss unless its own train_step says what it minimizes.

    ``losses_listed``: whether ``model.losses`` lists add_loss losses before a call (Keras 3 lists
    them only during one: its step raises there instead).
    """
    if getattr(model, "optimizer", None) is None:
        raise NotCompiledError(
            "model: expected a compiled model, got one without an optimizer; "
            "call model.compile(optimizer, loss) first"
        )
    if not custom_step and losses_listed and not getattr(model, "loss", None) and not model.losses:
        raise NotCompiledError(
            "model: expected a model compiled with a loss (or with add_loss losses), got loss={!r}".format(
                getattr(model, "loss", None)
            )
        )


def check_learning_phase(learning_phase: Any) -> bool:
    if not isinstance(learning_phase, (int, np.integer)) or learning_phase not in (0, 1):
        raise InvalidArgumentError("learning_phase", "0 (inference) or 1 (training)", repr(learning_phase))
    return bool(learning_phase)


def input_names(model: Model) -> List[str]:
    names = versions.endpoint_names(model, "input")
    if names:
        return list(names)
    return [str(getattr(t, "name", f"input_{i}")).split(":")[0] for i, t in enumerate(model.inputs or [])]


def output_names(model: Model) -> List[str]:
    names = versions.endpoint_names(model, "output")
    if names:
        return list(names)
    outputs = graph_endpoints(model, "outputs") or [None]
    return [f"output_{i + 1}" for i in range(len(outputs))]


def graph_endpoints(model: Model, name: str) -> List[Any]:
    """``model.inputs`` / ``model.outputs``; none before the model is built (where Keras 3.3 raises)."""
    return list(getattr(model, name, None) or []) if model.built else []


def check_unconnected(unconnected: Any) -> str:
    if unconnected not in ("raise", "zero", "skip"):
        raise InvalidArgumentError("unconnected", "'raise', 'zero' or 'skip'", repr(unconnected))
    return unconnected


def check_batch(
    model: Model,
    x: Structure,
    y: Structure,
    sample_weight: Optional[Structure],
    custom_step: bool,
) -> Batch:
    """The batch in the forms every Keras accepts; a custom train_step unpacks it itself, so for one
    only the arrays and their one batch size are checked."""
    if custom_step:
        return Batch(x, y, sample_weight, _batch_size(x, y, sample_weight))
    inputs = graph_endpoints(model, "inputs")
    outputs = output_names(model)
    _check_count("x", x, len(inputs), "model inputs")
    if y is not None or getattr(model, "loss", None):  # y=None: a model trained by its add_loss losses alone
        _check_count("y", y, len(outputs), "model outputs")
    if isinstance(y, dict):
        unknown = sorted(set(y) - set(outputs))
        if unknown:
            raise InvalidArgumentError(
                "y", f"keys among the output names {outputs}", f"unknown keys {unknown}"
            )
    sample_weight = per_output(sample_weight, outputs)
    return Batch(x, y, sample_weight, _batch_size(x, y, sample_weight))


def _batch_size(x: Structure, y: Structure, sample_weight: Optional[Structure]) -> Optional[int]:
    sizes: Dict[str, Optional[int]] = {}  # path -> batch size
    for argument, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        for path, leaf in _leaves(argument, value):
            shape = _shape(path, leaf)
            if not shape:
                raise InvalidArgumentError(path, "an array with a batch dimension", "a scalar")
            sizes.setdefault(path, shape[0])
            if argument == "sample_weight" and len(shape) > 2:
                raise InvalidArgumentError(
                    path, "shape (batch,) or (batch, timesteps)", f"shape {tuple(shape)}"
                )
    if not sizes:
        raise InvalidArgumentError("x", "at least one array", repr(x))
    if len(set(sizes.values())) > 1:
        raise InvalidArgumentError(
            "x, y, sample_weight",
            "one batch size for every array",
            ", ".join(f"{k} has {v}" for k, v in sizes.items()),
        )
    return next(iter(sizes.values()))


def _check_count(argument: str, value: Structure, expected: int, what: str) -> None:
    if isinstance(value, (list, tuple)) and expected and len(value) != expected:
        raise InvalidArgumentError(
            argument, f"{expected} arrays, one per {what[:-1]}", f"{len(value)} arrays"
        )
    if isinstance(value, dict) and expected and len(value) > expected:
        raise InvalidArgumentError(
            argument,
            f"at most {expected} entries, one per {what[:-1]}",
            f"{len(value)} entries",
        )
    if value is None or (expected > 1 and not isinstance(value, (list, tuple, dict))):
        raise InvalidArgumentError(
            argument,
            f"{expected} arrays (a list or a dict), one per {what[:-1]}" if expected > 1 else "an array",
            _describe(value),
        )


def per_output(sample_weight: Optional[Structure], outputs: List[str]) -> Optional[Structure]:
    """Sample weights as one array, or a list in output order: the forms every Keras accepts."""
    if sample_weight is None:
        return None
    if isinstance(sample_weight, dict):
        unknown = sorted(set(sample_weight) - set(outputs))
        if unknown:
            raise InvalidArgumentError(
                "sample_weight",
                f"keys among the output names {outputs}",
                f"unknown keys {unknown}",
            )
        sample_weight = [sample_weight.get(name) for name in outputs]
    if isinstance(sample_weight, (list, tuple)):
        if len(sample_weight) != len(outputs):
            raise InvalidArgumentError(
                "sample_weight",
                f"one entry per model output ({len(outputs)})",
                f"{len(sample_weight)} entries",
            )
        if all(w is None for w in sample_weight):
            return None
        return sample_weight[0] if len(outputs) == 1 else list(sample_weight)
    return sample_weight if len(outputs) == 1 else [sample_weight] * len(outputs)


def _leaves(path: str, value: Structure):
    if value is None:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(f"{path}[{key!r}]", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(f"{path}[{index}]", item)
    else:
        yield path, value


def _shape(path: str, leaf: Any) -> Tuple[Optional[int], ...]:
    shape = getattr(leaf, "shape", None)
    if shape is None:
        raise InvalidTypeError(path, "a numpy array or a tensor", type(leaf).__name__)
    # A graph tensor has an op and a graph (an eager tensor raises on both); graph mode feeds values.
    if getattr(leaf, "op", None) is not None and getattr(leaf, "graph", None) is not None:
        raise InvalidTypeError(
            path,
            "a numpy array (graph mode feeds the model's placeholders values)",
            f"a symbolic {type(leaf).__name__}",
        )
    return tuple(shape)


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__} of shape {tuple(shape)}" if shape is not None else type(value).__name__


def name_of(variable: Variable) -> str:
    """The variable's unique name (``versions.variable_name``: Keras 3's ``path``), else its repr."""
    return str(versions.variable_name(variable) or repr(variable))
