"""Per-example gradients at fit()'s scale: each example's share of the loss the training step minimizes.

    grads = per_example_gradients(model, x, y)                  # per param: (batch, *param.shape)
    norms = per_example_gradients(model, x, y, norms_only=True)  # (batch,): global L2 norms

Example i's gradient is the gradient of its share of the step's loss as that Keras computes it (its
reduction, sample and class weights, multi-output loss weights; loss scaling undone), so the
per-example gradients add up to ``get_gradients(..., clip=False)``. The part of the loss that is
not any example's (``model.losses``: weight and activity regularization, ``add_loss`` terms; and
whatever a ``compute_loss`` override adds besides its outputs' loss) is shared evenly: each
example gets 1/batch of its gradient. How: ``backends._per_example`` (``_per_example_keras3`` on JAX
and PyTorch).
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _paths, arguments, data, sources
from ._types import Model
from .api import as_output, handle_unconnected, zeros_shape
from .arrays import SparseGradient, numpy_dtype
from .backends import Request, engine_for, per_example_engine
from .detect import Flavour, flavour_of, keras3_backend
from .errors import InvalidArgumentError, InvalidTypeError, UnsupportedModelError

# Layers whose output for one example depends on the others' in training, or that draw random numbers
# there (per example, those draws could not be the step's); told by class name, subclasses included.
MIXING_IN_TRAINING = ("BatchNormalization", "SyncBatchNormalization")
DRAWING_IN_TRAINING = (
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "AlphaDropout",
    "GaussianDropout",
    "GaussianNoise",
)
# What a sum of per-example gradients may differ from the batch's by, relative to its largest entry,
# before the examples are taken to be mixed (float16 arithmetic differs by 1e-3, mixing by far more).
MIXING_TOLERANCE = 1e-2


class PerExampleInfo(NamedTuple):
    paths: Dict[str, str]  # per param name: "vectorized", "loop" (tf.map_fn) or "ghost" (from activations)
    loss: float  # the step's loss, unscaled (the last batch's, for a dataset)
    loss_scale: float
    examples: int


def per_example_gradients(
    model: Model,
    x: Any,
    y: Any = None,
    params: Optional[Sequence[Any]] = None,
    sample_weight: Any = None,
    learning_phase: int = 0,
    *,
    class_weight: Optional[Dict[Any, float]] = None,
    norms_only: Union[bool, str] = False,
    dot: Optional[Sequence[Any]] = None,
    chunk_size: Optional[int] = None,
    unconnected: str = "raise",
    return_info: bool = False,
    as_dict: bool = False,
    sparse: bool = False,
    steps: Optional[int] = None,
    verbose: int = 1,
) -> Any:
    """Each example's gradient of its share of the training step's loss, as numpy arrays.

    ``params`` (variables; default ``model.trainable_weights``): one array per param of shape
    ``(batch, *param.shape)``; unclipped (the optimizer clips the batch's gradient, not examples').
    ``sparse=True`` keeps embedding gradients sparse: a ``SparseGradient`` of dense shape
    ``(batch, *param.shape)`` whose ``indices`` are (example, row) pairs.
    ``norms_only=True``: one array ``(batch,)`` of global L2 norms; ``norms_only="per_param"``: one
    per param. ``dot=[v, ...]`` (an array per param): ``(batch,)`` of <gradient_i, v> (TracIn scores).
    Dense layers' norms and dot products come from their activations, no per-example gradient made.
    ``chunk_size`` bounds memory: examples per vectorized chunk (default: the whole batch).
    ``x`` may be a dataset (as for ``get_gradients``) with ``norms_only`` or ``dot``: each of its
    batches is a batch of the step, the results are concatenated, a chunk at a time in memory.
    ``learning_phase=1`` is refused for layers that mix examples or draw random numbers in training
    (BatchNormalization, Dropout, ...). ``return_info=True`` adds a ``PerExampleInfo``.
    """
    flavour = flavour_of(model)
    split = per_example_engine(flavour.root)  # the engine that splits a batch's gradient into examples
    arguments.check_compiled(model, flavour.custom_step, losses_listed=flavour.name != "keras3")
    training = arguments.check_learning_phase(learning_phase)
    unconnected = arguments.check_unconnected(unconnected)
    mode = _check_mode(norms_only, dot)
    _check_chunk_size(chunk_size)
    _check_model(model, flavour, training)
    engine = engine_for(model, flavour)
    dataset = data.is_dataset(x)
    if dataset and mode == "gradients":
        raise InvalidArgumentError(
            "x",
            "one batch for per-example gradients (a dataset streams norms_only=True or dot=...)",
            type(x).__name__,
        )
    batches = data.batches(model, flavour.root, x, steps) if dataset else [(x, y, sample_weight)]
    if not dataset:
        data.check_not_dataset_arguments(steps)

    wanted: Optional[sources.Sources] = None
    progress = _paths.load(flavour.root, "progbar").Progbar(None) if dataset and verbose else None
    parts: List[List[Any]] = []
    examples = 0
    paths: Dict[str, str] = {}
    loss, loss_scale = 0.0, 1.0
    for count, (bx, by, bw) in enumerate(batches, 1):
        batch = arguments.check_batch(model, bx, by, bw, custom_step=False)
        if not model.built:
            engine.build(model, flavour, batch)
        if wanted is None:
            wanted = _resolve(model, params)
            vectors = _check_dot(dot, wanted) if mode == "dot" else []
        request = Request(
            wanted.variables, (), training, False, class_weight, bool(sparse), output_grads=True
        )
        one = _one_batch(model, flavour, engine, split, request, batch, mode, vectors, chunk_size)
        parts.append(one.results)
        examples += one.size
        paths = {wanted.names[i]: path for i, path in one.paths.items()}
        loss, loss_scale = one.loss, one.loss_scale
        if progress is not None:
            progress.update(count)
    if wanted is None:
        raise InvalidArgumentError("x", "a dataset with at least one batch", "an empty one")

    results = [_concatenate([p[i] for p in parts]) for i in range(len(wanted.variables))]
    grads = handle_unconnected(
        model,
        flavour,
        wanted,
        results,
        unconnected,
        lambda name, param: np.zeros(
            [examples] + (zeros_shape(name, param, None) if mode == "gradients" else []),
            numpy_dtype(param),
        ),
    )
    output = _finish(mode, norms_only, wanted, grads, as_dict, examples)
    if return_info:
        return output, PerExampleInfo(paths, loss, loss_scale, examples)
    return output


class _Batch(NamedTuple):
    results: List[Any]  # per variable: (examples, ...) arrays, SparseGradient, or None where unconnected
    size: int  # examples
    paths: Dict[int, str]
    loss: float
    loss_scale: float


def _one_batch(
    model: Model,
    flavour: Flavour,
    engine: Any,
    split: Any,
    request: Request,
    batch: arguments.Batch,
    mode: str,
    vectors: List[Any],
    chunk_size: Optional[int],
) -> _Batch:
    """One batch of the step: its gradients and output gradients from the engine, then per example
    (``split``: the per-example engine, ``backends.per_example_engine``)."""
    result = engine.gradients(model, flavour, request, batch)
    count = len(request.variables)
    batch_grads, output_grads = result.grads[:count], result.grads[count:]
    kinds, cotangents = [], []
    for output_grad, logits_grad in zip(output_grads[0::2], output_grads[1::2]):
        read = "output" if output_grad is not None else "logits" if logits_grad is not None else None
        kinds.append(read)
        if read is not None:
            cotangents.append(output_grad if output_grad is not None else logits_grad)
    connected = [i for i, g in enumerate(batch_grads) if g is not None]
    variables = tuple(request.variables[i] for i in connected)
    plan = split.Plan(
        variables,
        tuple(kinds),
        mode,
        tuple(isinstance(batch_grads[i], SparseGradient) for i in connected),
        request.training,
        split.ghosts(model, variables) if mode != "gradients" else (),
    )
    eager = not flavour.graph  # else the graph engine ran
    run = split.runner(model, flavour, plan, eager)
    x = split.model_inputs(model, flavour, batch, eager)
    size = int(batch.size or 0)
    scale = float(result.loss_scale)
    unscaled = None if scale == 1.0 else scale  # None: no loss scaling to take gradients at

    through_outputs = run.batch(split.Inputs(x, cotangents, unscaled, [], []))
    dense = [_dense(batch_grads[i]) for i in connected]
    shared = [_share(g, o, size) for g, o in zip(dense, through_outputs)]
    chunk = chunk_size or size
    pieces = []
    for start in range(0, size, chunk):
        inputs = split.Inputs(
            split.rows(x, start, start + chunk),
            [c[start : start + chunk] for c in cotangents],
            unscaled,
            shared,
            [vectors[i] for i in connected] if mode == "dot" else [],
        )
        pieces.append(run.chunk(inputs))
    per_variable = [_concatenate([p[k] for p in pieces]) for k in range(len(connected))]
    if mode == "gradients":
        # Dense ones hold their share of model.losses' gradient already; sparse ones get it here.
        batch_sums = [
            o if isinstance(p, tuple) else g for p, g, o in zip(per_variable, dense, through_outputs)
        ]
        _check_not_mixed(variables, per_variable, batch_sums)
        per_variable = [
            _sparse_with_share(v, p, s) if isinstance(p, tuple) else p
            for v, p, s in zip(variables, per_variable, shared)
        ]
    results: List[Any] = [None] * count
    paths: Dict[int, str] = {}
    ghosted = set(split.ghosted(plan))
    for k, i in enumerate(connected):
        results[i] = per_variable[k]
        paths[i] = "ghost" if k in ghosted else run.paths.get("path", "vectorized")
    return _Batch(results, size, paths, float(result.loss), scale)


def _share(batch: np.ndarray, through_outputs: np.ndarray, size: int) -> Optional[np.ndarray]:
    """Each example's share of the gradient ``model.losses`` add to the step's (the batch gradient
    less its part through the outputs, split evenly); None where that is nothing up to float
    rounding, as for a variable without regularization: then nothing is added to every example."""
    share = batch - through_outputs
    return None if np.abs(share).max() <= 1e-6 * np.abs(batch).max() else share / size


def _sparse_with_share(
    variable: Any, per_example: Tuple[Any, Any], shared: Optional[np.ndarray]
) -> SparseGradient:
    """Sparse per-example gradients with their share of ``model.losses``' gradient: kept sparse only
    where that share is nothing (as for an embedding without regularization)."""
    values, indices = per_example  # (examples, rows, ...), (examples, rows)
    if shared is not None:
        raise InvalidArgumentError(
            "sparse",
            f"sparse=False for {arguments.name_of(variable)} (model.losses' gradient reaches it, "
            "and each example's share of that is dense)",
            "sparse=True",
        )
    examples = np.repeat(np.arange(values.shape[0]), values.shape[1])
    return SparseGradient(
        values.reshape((-1,) + values.shape[2:]),
        np.stack([examples, indices.reshape(-1)], axis=1),
        (values.shape[0],) + tuple(int(d) for d in variable.shape),
    )


def _check_not_mixed(variables: Sequence[Any], per_example: List[Any], batch: List[Any]) -> None:
    """The per-example gradients add up to the batch's, unless a layer mixes the examples (or draws
    random numbers) in a way the front door did not refuse: then raise."""
    for variable, grads, expected in zip(variables, per_example, batch):
        total = _dense_sum(grads, expected.shape)
        if np.abs(total - expected).max() > MIXING_TOLERANCE * np.abs(expected).max() + 1e-6:
            raise UnsupportedModelError(
                f"model: the per-example gradients of {arguments.name_of(variable)} do not add up to "
                "the batch's (a layer mixes examples or draws random numbers); use learning_phase=0, "
                "or report this model"
            )


def _dense_sum(grads: Any, shape: Tuple[int, ...]) -> np.ndarray:
    if not isinstance(grads, tuple):  # a product with ones: BLAS's threads read it twice as fast as sum
        return np.tensordot(np.ones(len(grads), grads.dtype), grads, axes=1)
    values, indices = grads
    total = np.zeros(shape, values.dtype)
    np.add.at(total, indices.reshape(-1), values.reshape((-1,) + values.shape[2:]))
    return total


def _finish(
    mode: str, norms_only: Any, wanted: sources.Sources, grads: List[Any], as_dict: bool, examples: int
) -> Any:
    if mode == "gradients" or (mode == "norms" and norms_only == "per_param"):
        if mode == "norms":
            grads = [None if g is None else np.sqrt(np.maximum(g, 0.0)) for g in grads]
        return as_output(wanted, grads, as_dict)
    total = np.zeros(examples, np.float64)
    for g in grads:
        if g is not None:
            total += g
    return np.sqrt(np.maximum(total, 0.0)) if mode == "norms" else total


def _check_mode(norms_only: Any, dot: Any) -> str:
    if norms_only not in (False, True, "per_param"):
        raise InvalidArgumentError("norms_only", 'False, True or "per_param"', repr(norms_only))
    if norms_only and dot is not None:
        raise InvalidArgumentError("dot", "None with norms_only (one or the other)", "both")
    return "norms" if norms_only else "dot" if dot is not None else "gradients"


def _check_chunk_size(chunk_size: Any) -> None:
    if chunk_size is not None and (
        not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1
    ):
        raise InvalidArgumentError("chunk_size", "None or a positive number of examples", repr(chunk_size))


def _strategy_of(model: Model) -> Any:
    from .backends._distribute import strategy_of  # imports TensorFlow

    return strategy_of(model)


def _check_model(model: Model, flavour: Flavour, training: bool) -> None:
    """Refuse what per-example gradients cannot be taken of, before anything runs."""
    from .backends._layers import all_layers, layer_states

    if flavour.custom_step:
        raise UnsupportedModelError(
            "model: overrides train_step, whose loss compatgrad cannot split into examples' shares; "
            "per-example gradients follow the default train_step's loss (get_gradients takes your step's)"
        )
    if keras3_backend(flavour.root) in (None, "tensorflow") and _strategy_of(model) is not None:
        raise UnsupportedModelError(
            "model: built under a distribution strategy; per-example gradients run on one device "
            "(build the model outside the strategy's scope)"
        )
    if layer_states(model):
        raise UnsupportedModelError(
            "model: has stateful layers (stateful=True), whose state carries one batch's examples into "
            "the next; per-example gradients need examples that stand alone"
        )
    if not training:
        return
    for layer in all_layers(model):
        names = {cls.__name__ for cls in type(layer).__mro__}
        mixing = names.intersection(MIXING_IN_TRAINING)
        drawing = names.intersection(DRAWING_IN_TRAINING) or (
            {"a seed generator"} if getattr(layer, "seed_generator", None) is not None else set()
        )
        if mixing or drawing:
            raise InvalidArgumentError(
                "learning_phase",
                "0 for a model with {} {!r} ({} in training: its per-example gradients are not the "
                "step's)".format(
                    sorted(mixing or drawing)[0],
                    layer.name,
                    "mixes the examples of a batch" if mixing else "draws random numbers",
                ),
                1,
            )


def _resolve(model: Model, params: Optional[Sequence[Any]]) -> sources.Sources:
    wanted = sources.resolve(model, params)
    if wanted.tensors:
        raise InvalidArgumentError(
            "params",
            "variables (a graph tensor's gradient from get_gradients is per example already: row i is "
            "example i's)",
            ", ".join(n for n, p in zip(wanted.names, wanted.params) if not _is_variable(p, wanted)),
        )
    return wanted


def _is_variable(param: Any, wanted: sources.Sources) -> bool:
    return any(param is v for v in wanted.variables)


def _check_dot(dot: Any, wanted: sources.Sources) -> List[np.ndarray]:
    """One array per param, shaped like it (a list in params order, or a dict by param name)."""
    if isinstance(dot, dict):
        missing = [n for n in wanted.names if n not in dot]
        if missing:
            raise InvalidArgumentError("dot", f"an array for every param (by name: {wanted.names})", missing)
        dot = [dot[n] for n in wanted.names]
    if not isinstance(dot, (list, tuple)):
        raise InvalidTypeError(
            "dot", "a list of arrays, one per param, or a dict by param name", type(dot).__name__
        )
    if len(dot) != len(wanted.params):
        raise InvalidArgumentError("dot", f"{len(wanted.params)} arrays, one per param", f"{len(dot)}")
    vectors = []
    for name, param, vector in zip(wanted.names, wanted.params, dot):
        vector = vector.dense() if isinstance(vector, SparseGradient) else np.asarray(vector)
        if tuple(vector.shape) != tuple(int(d) for d in param.shape):
            raise InvalidArgumentError(f"dot[{name!r}]", f"shape {tuple(param.shape)}", tuple(vector.shape))
        vectors.append(vector.astype(numpy_dtype(param)))
    return vectors


def _dense(grad: Any) -> np.ndarray:
    return grad.dense() if isinstance(grad, SparseGradient) else np.asarray(grad)


def _concatenate(pieces: List[Any]) -> Any:
    """Pieces along the examples: arrays, or (values, indices) pairs of sparse gradients."""
    if any(p is None for p in pieces):
        return None
    if len(pieces) == 1:
        return pieces[0]
    if isinstance(pieces[0], tuple):
        return tuple(np.concatenate(part) for part in zip(*pieces))
    return np.concatenate(pieces)
