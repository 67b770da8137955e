"""Gradients over a whole dataset: batch by batch, as a running sum, so memory stays at one batch.

A batch's loss averages over its examples (Keras' default reduction), so the loss over the
concatenated data weighs each batch by its size: sum_b n_b * g_b / sum_b n_b, regularization
losses included once. A loss reduced with SUM adds up over batches instead: sum_b g_b.
"""

import sys
from typing import Any, Iterator, List, NamedTuple, Optional, Tuple, cast

import numpy as np

from . import _paths, versions
from ._types import Model
from .arguments import Batch, check_batch
from .arrays import numpy_dtype
from .backends import EagerEngine, Engine, Request, Result
from .detect import Flavour
from .errors import InvalidArgumentError


class Sums(NamedTuple):
    """Running sums over a dataset's batches: each weighted by its size (1 for SUM-reduced losses)."""

    grads: List[Optional[Any]]  # arrays (at least float32), one per variable; None where unconnected
    loss: float
    examples: int
    batches: int
    loss_scale: float  # the last batch's


def is_dataset(x: Any) -> bool:
    """A tf.data.Dataset (or a distributed one), a Keras Sequence / PyDataset, or an iterator of batches."""
    if isinstance(x, (np.ndarray, list, tuple, dict)):  # a batch, told first: the common call
        return False
    tf = sys.modules.get("tensorflow")
    if (tf is not None and isinstance(x, tf.data.Dataset)) or versions.is_distributed_dataset(x):
        return True
    if hasattr(x, "__next__") and hasattr(x, "__iter__"):  # generators and other iterators
        return True
    return versions.is_keras_sequence(x)


def over_dataset(
    model: Model,
    flavour: Flavour,
    engine: Engine,
    request: Request,
    dataset: Any,
    steps: Optional[int],
    verbose: int,
) -> Result:
    """The gradient over the dataset's batches (the first ``steps``), as on their concatenation.

    A ``tf.data.Dataset`` run eagerly by a compiled step
    stays in the graph, a chunk of batches per call (``_dataset_loop``); every other source (a
    generator, a Sequence, a distributed dataset, graph mode, class weights, a strategy) goes
    batch by batch through the engine, as single batches do.
    """
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise InvalidArgumentError("steps", "None or a positive number of batches", repr(steps))
    total = _length(dataset)
    if total == -1 and steps is None:
        raise InvalidArgumentError("steps", "a number of batches for an infinite dataset", "None")
    target = steps if steps is not None else (total if total is not None and total >= 0 else None)
    progress = _paths.load(flavour.root, "progbar").Progbar(target) if verbose else None
    summed = _sum_reduced(model)

    if _stays_in_graph(model, flavour, request, dataset):
        from .backends import _dataset_loop

        x, y, sample_weight = _unpack(dataset.element_spec)
        check_batch(model, x, y, sample_weight, custom_step=False)  # the structure, once for every batch
        arity = 2 if sample_weight is None else 3
        step = cast(EagerEngine, engine).traced_step(model, flavour, request, arity)
        sums = _dataset_loop.sums(model, step, request.variables, dataset, steps, summed, progress)
    else:
        sums = _batch_by_batch(model, flavour, engine, request, dataset, steps, summed, progress)
    if progress is not None and progress.target is None:  # an unknown length: now known, the bar ends
        progress.target = sums.batches
        progress.update(sums.batches)
    if sums.examples == 0:
        raise InvalidArgumentError("x", "a dataset with at least one batch", "an empty one")
    divisor = 1.0 if summed else float(sums.examples)
    grads = [
        None if s is None else (s / divisor).astype(numpy_dtype(v))
        for s, v in zip(sums.grads, request.variables)
    ]
    return Result(grads, sums.loss / divisor, sums.loss_scale)


def _stays_in_graph(model: Model, flavour: Flavour, request: Request, dataset: Any) -> bool:
    """Whether the in-graph loop can run it: a plain tf.data.Dataset, eagerly, through a compiled
    step that neither a strategy splits nor class weights reweigh (those go batch by batch)."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(dataset, tf.data.Dataset) or not tf.executing_eagerly():
        return False
    from .backends._distribute import strategy_of

    eager_compiled_step = not flavour.graph and not flavour.custom_step
    return eager_compiled_step and request.class_weight is None and strategy_of(model) is None


def _batch_by_batch(
    model: Model,
    flavour: Flavour,
    engine: Engine,
    request: Request,
    dataset: Any,
    steps: Optional[int],
    summed: bool,
    progress: Any,
) -> Sums:
    """Each batch checked and run through the engine as a single batch is; sums kept in numpy."""
    totals: List[Any] = [None] * len(request.variables)
    examples, loss, loss_scale, count = 0, 0.0, 1.0, 0
    for count, (x, y, sample_weight) in enumerate(batches(model, flavour.root, dataset, steps), 1):
        batch = distributed_batch(x, y, sample_weight) or check_batch(
            model, x, y, sample_weight, custom_step=False
        )
        result = engine.gradients(model, flavour, request, batch)
        assert batch.size is not None  # known for arrays and eager tensors; None only in an element_spec
        weight = 1.0 if summed else float(batch.size)
        for i, g in enumerate(result.grads):
            if g is not None:
                weighted = weight * np.asarray(g, np.float64)
                totals[i] = weighted if totals[i] is None else totals[i] + weighted
        examples += batch.size
        loss += weight * float(result.loss)
        loss_scale = float(result.loss_scale)
        if progress is not None:
            progress.update(count)
    return Sums(totals, loss, examples, count, loss_scale)


def batches(model: Model, root: str, dataset: Any, steps: Optional[int]) -> Iterator[tuple]:
    for index, element in enumerate(_elements(model, root, dataset)):
        if steps is not None and index >= steps:
            return
        yield _unpack(element)


def _elements(model: Model, root: str, dataset: Any) -> Iterator[Any]:
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(dataset, tf.data.Dataset) and not tf.executing_eagerly():
        # Graph mode: one iterator op per pass, its batches fetched in the model's session.
        next_element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        session = _paths.load(root, "backend").get_session()
        while True:
            try:
                yield session.run(next_element)
            except tf.errors.OutOfRangeError:
                return
    elif versions.is_keras_sequence(dataset):
        for index in range(len(dataset)):
            yield dataset[index]
    else:
        yield from dataset


def _unpack(element: Any) -> Tuple[Any, Any, Any]:
    if not isinstance(element, (tuple, list)) or len(element) not in (2, 3):
        raise InvalidArgumentError(
            "x", "a dataset yielding (x, y) or (x, y, sample_weight)", type(element).__name__
        )
    return (tuple(element) + (None,))[:3]


def distributed_batch(x: Any, y: Any, sample_weight: Any) -> Optional[Batch]:
    """A batch of a distributed dataset as it is, sized by this worker's parts together; None for any
    other batch."""
    if isinstance(x, np.ndarray):  # the common call, told first
        return None
    leaf = x
    while isinstance(leaf, (list, tuple, dict)):
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    if not is_distributed(leaf):
        return None
    return Batch(x, y, sample_weight, sum(int(part.shape[0]) for part in leaf.values))


def is_distributed(value: Any) -> bool:
    """Values with one part per replica (``tf.distribute.DistributedValues``), told without importing
    TensorFlow."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(value, versions.distributed_values_class(tf))


def _length(dataset: Any) -> Optional[int]:
    """Batches in the dataset if known; -1 for an infinite tf.data.Dataset."""
    if versions.is_keras_sequence(dataset):
        return len(dataset)
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(dataset, tf.data.Dataset) and tf.executing_eagerly():
        cardinality = int(tf.data.experimental.cardinality(dataset))
        return (
            -1
            if cardinality == int(tf.data.experimental.INFINITE_CARDINALITY)
            else cardinality
            if cardinality >= 0
            else None
        )
    return None


def _sum_reduced(model: Model) -> bool:
    """Whether the compiled losses are reduced with SUM (all of them; a mix cannot be summed over batches)."""
    losses = getattr(model, "loss", None)
    leaves = (
        list(losses.values())
        if isinstance(losses, dict)
        else list(losses)
        if isinstance(losses, (list, tuple))
        else [losses]
    )
    sums = [getattr(loss, "reduction", None) == "sum" for loss in leaves if loss is not None]
    if any(sums) and not all(sums):
        raise InvalidArgumentError(
            "model", "losses all averaged over the batch or all summed, to add up over batches", "a mix"
        )
    if any(sums) and model.losses:
        raise InvalidArgumentError(
            "model",
            "no regularization losses next to a SUM-reduced loss over a dataset "
            "(they would count once per batch)",
            f"{len(model.losses)} regularization losses",
        )
    return bool(sums) and all(sums)


def check_dataset_arguments(y: Any, sample_weight: Any, sparse: bool, tensors: List[Any]) -> None:
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None:
            raise InvalidArgumentError(
                name,
                "None when x is a dataset (it yields (x, y) or (x, y, sample_weight))",
                type(value).__name__,
            )
    if sparse:
        raise InvalidArgumentError(
            "sparse", "False with a dataset (the sum over batches is kept dense)", True
        )
    if tensors:
        raise InvalidArgumentError(
            "params",
            "variables only with a dataset (a layer output or input has one row per example)",
            f"{len(tensors)} graph tensors",
        )


def check_not_dataset_arguments(steps: Optional[int]) -> None:
    if steps is not None:
        raise InvalidArgumentError("steps", "None unless x is a dataset, generator or Sequence", repr(steps))
