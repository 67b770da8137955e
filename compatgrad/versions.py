"""Where TF / Keras versions differ: every version probe compatgrad runs, one small function each.

A probe is a feature check on the objects at hand (an attribute, a name in a code object, a class's
module), never a version string. Each is registered with what differs and which versions have what;
``tools/versions_table.py`` writes them into the README ("Where versions differ"). Importing this
module imports no framework: probes take the objects they look at, or import TensorFlow inside.

Versions are named one way throughout, by the package that ships the Keras concerned:

- ``TF 2.4``: TensorFlow 2.4 and the tf.keras it ships (tf.keras 2.6-2.15 is the ``keras`` package of
  the same number). ``TF 1.x`` is TF 1.14-1.15.
- ``tf_keras 2.16``: the tf_keras package (``TF_USE_LEGACY_KERAS=1``), for TF 2.16+.
- ``Keras 3.4``: Keras 3 (on the TensorFlow backend).
- ``standalone Keras 2.2``: the ``keras`` 2.2 / 2.3 packages, on TF 1.x.

``TF 2.2-2.3`` includes both ends, ``TF 2.4+`` every release from 2.4 on, and a line named alone
(``tf_keras``, ``Keras 3``) all its releases. Ranges start at the oldest release compatgrad covers
(TF 1.14, standalone Keras 2.2, tf_keras 2.16, Keras 3.3: older Keras 3 lack what compatgrad calls),
or where what they describe begins (Keras 2's eager ``train_step``: TF 2.2).
The Keras 2 optimizers come in two families, named so: ``OptimizerV2`` (the default up to TF 2.10,
``optimizers.legacy`` from TF 2.11 and in tf_keras) and ``optimizer.Optimizer`` (experimental in
TF 2.8-2.10, the default from TF 2.11 and in tf_keras).
"""

import inspect
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, TypeVar


class Probe(NamedTuple):
    name: str  # the probe function's
    differs: str  # what differs
    sides: Dict[str, str]  # versions, in the vocabulary above -> what they have


PROBES: List[Probe] = []
_Function = TypeVar("_Function", bound=Callable[..., Any])


def probe(differs: str, sides: Dict[str, str]) -> Callable[[_Function], _Function]:
    """Register the decorated function as the probe of ``differs``; ``sides``: versions -> what they have."""

    def register(function: _Function) -> _Function:
        PROBES.append(Probe(function.__name__, differs, sides))
        return function

    return register


# --- Where Keras lives -------------------------------------------------------------------------------

# Package roots of Keras modules -> the versions whose modules are under it, in the order Keras
# copies are looked for. Paths of internals relative to a root: ``_paths``.
KERAS_ROOTS: Dict[str, str] = {
    "tf_keras.src": "tf_keras",
    "tf_keras": "tf_keras (its public modules)",
    "keras.src": "TF 2.13-2.15, Keras 3",
    "keras": "standalone Keras 2.2-2.3, TF 2.6-2.12 (and TF 2.5's keras-nightly), Keras 3's public modules",
    "tensorflow.python.keras": "TF 1.x-2.5 (TF 2.6+ still import it, unused)",
    "tensorflow_core.python.keras": "TF 1.15-2.1 (behind the tensorflow.python.keras alias)",
}


@probe(
    "the package root of Keras' modules", {versions: f"`{root}`" for root, versions in KERAS_ROOTS.items()}
)
def keras_root(module: str) -> Optional[str]:
    """The root in ``KERAS_ROOTS`` a module is under (the longest that fits); None outside Keras."""
    roots = [root for root in KERAS_ROOTS if module == root or module.startswith(root + ".")]
    return max(roots, key=len) if roots else None


# --- The model and its training step ------------------------------------------------------------------


@probe(
    "an eager training step",
    {
        "TF 1.x-2.1, standalone Keras 2.2-2.3": "none: only graph mode (`total_loss`) can match",
        "TF 2.2+, tf_keras, Keras 3": "`Model.train_step`, which eager `fit` / `train_on_batch` run",
    },
)
def has_train_step(model: Any) -> bool:
    """Whether the model (or model class) has ``train_step``."""
    return hasattr(model, "train_step")


@probe(
    "the loss of a Keras 2 eager step",
    {
        "TF 2.2-2.7": "`compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)`",
        "TF 2.8+, tf_keras": "`compute_loss(x, y, y_pred, sample_weight)`, which a model may override",
    },
)
def has_compute_loss(model: Any) -> bool:
    """Whether ``train_step`` takes its loss from ``model.compute_loss``."""
    return hasattr(model, "compute_loss")


@probe(
    "1-D arrays in a Keras 2 eager step",
    {
        "TF 2.2-2.6": "`train_step` expands them to 2-D (`data_adapter.expand_1d`)",
        "TF 2.7+, tf_keras": "no `expand_1d`: they stay 1-D",
    },
)
def expands_1d(data_adapter: Any) -> bool:
    """Whether the version's data adapter module expands 1-D arrays in ``train_step``."""
    return hasattr(data_adapter, "expand_1d")


@probe(
    "the loss of a Keras 3 step",
    {
        "Keras 3.3": "`compute_loss(x, y, y_pred, sample_weight)`",
        "Keras 3.4+": "`_compute_loss(..., training=)`: `training` passed on where `compute_loss` takes it",
    },
)
def passes_training_to_loss(model: Any) -> bool:
    """Whether the Keras 3 step computes its loss through ``_compute_loss(..., training=)``."""
    return hasattr(model, "_compute_loss")


@probe(
    "a Keras 3 replica's loss under a strategy",
    {
        "Keras 3.3-3.7": "all of the loss of the batch the replica was given",
        "Keras 3.8+": "divided by the replica count (`scale_loss_for_distribution`), as in TF and tf_keras",
    },
)
def divides_loss_by_replicas(losses_module: Any) -> bool:
    """Whether Keras 3 divides each replica's loss by the replica count (``losses_module``: losses.loss)."""
    return hasattr(losses_module, "scale_loss_for_distribution")


@probe(
    "`training=` of a model call",
    {
        "TF, tf_keras": "always taken (`Model.__call__` drops it where `call` has no such argument)",
        "Keras 3": "passed only where `call` takes it (`_call_has_training_arg`)",
    },
)
def call_takes_training(model: Any) -> bool:
    """Whether the model is called with ``training=``."""
    return getattr(model, "_call_has_training_arg", True)


# --- Keras 2 optimizers -------------------------------------------------------------------------------


@probe(
    "the optimizer inside a Keras 2 LossScaleOptimizer",
    {
        "TF 1.15-2.3": "`_optimizer` (the experimental LossScaleOptimizer)",
        "TF 2.4+, tf_keras, Keras 3": "`inner_optimizer`",
    },
)
def loss_scale_inner(optimizer: Any) -> Optional[Any]:
    """The optimizer a LossScaleOptimizer wraps; None for any other optimizer."""
    return getattr(optimizer, "inner_optimizer", None) or getattr(optimizer, "_optimizer", None)


@probe(
    "the loss scale's variables of a Keras 2 LossScaleOptimizer",
    {
        "TF 1.15-2.3": "in a `LossScale` object, `_loss_scale`",
        "TF 2.4+ (OptimizerV2)": "in a `_DynamicLossScaleState`, `_loss_scale`",
        "TF 2.11+, tf_keras (LossScaleOptimizerV3)": "attributes of the optimizer itself: no `_loss_scale`",
    },
)
def loss_scale_state(optimizer: Any) -> Optional[Any]:
    """The object holding a Keras 2 LossScaleOptimizer's scale and counter; None where the optimizer does."""
    return getattr(optimizer, "_loss_scale", None)


# Every name under which a Keras 2 optimizer keeps a clipping setting.
_KERAS2_CLIP_SETTINGS = (
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "_clipnorm",
    "_clipvalue",
    "_global_clipnorm",
    "gradient_transformers",
)


@probe(
    "a Keras 2 optimizer's clipping settings",
    {
        "TF 1.x-2.3, standalone Keras 2.2-2.3": "`clipnorm`, `clipvalue` (TF 1.x-2.1: set only where given)",
        "TF 2.4+ (OptimizerV2)": "also `global_clipnorm`, `gradient_transformers` (over `_clipnorm`, ...)",
        "TF 2.8+ (optimizer.Optimizer), tf_keras": "`clipnorm`, `clipvalue`, `global_clipnorm`",
    },
)
def keras2_clips(optimizer: Any) -> bool:
    """Whether a Keras 2 optimizer has any clipping set."""
    return any(getattr(optimizer, name, None) for name in _KERAS2_CLIP_SETTINGS)


@probe(
    "where an OptimizerV2 clips",
    {
        "TF 1.x-2.3": "`get_gradients` (TF 2.2-2.3: and the train step) clip, `apply_gradients` not",
        "TF 2.4+ (OptimizerV2), tf_keras": "`apply_gradients`' `_transform_gradients`, after the sum",
    },
)
def has_transform_gradients(optimizer: Any) -> bool:
    """Whether the optimizer clips in ``apply_gradients`` through ``_transform_gradients`` (clipvalue,
    clipnorm, global_clipnorm)."""
    return hasattr(optimizer, "_transform_gradients")


@probe(
    "`_clip_gradients(grads)`",
    {
        "TF 1.x-2.1, TF 2.4+ (OptimizerV2), tf_keras (OptimizerV2)": "none",
        "TF 2.2-2.3 (OptimizerV2)": "called by the train step's `_minimize`, not by `apply_gradients`",
        "TF 2.8+ (optimizer.Optimizer), tf_keras, Keras 3": "called by `apply_gradients` / `apply`",
    },
)
def has_clip_gradients(optimizer: Any) -> bool:
    """Whether the optimizer has ``_clip_gradients(grads)``."""
    return hasattr(optimizer, "_clip_gradients")


@probe(
    "how standalone Keras clips",
    {
        "standalone Keras 2.2-2.3": "`get_gradients` clips `clipnorm` to the global norm of all gradients",
        "TF 1.x-2.1 (OptimizerV2)": "`get_gradients` clips `clipnorm` per tensor, then `clipvalue`",
    },
)
def is_standalone_keras_optimizer(optimizer: Any) -> bool:
    """Whether the optimizer's class is one of standalone Keras' (module ``keras.optimizers``: no tf.Module
    to tell it by, TF 1.x's OptimizerV2 is none either)."""
    return type(optimizer).__module__ == "keras.optimizers"


@probe(
    "the cross-replica sum of a Keras 2 optimizer",
    {
        "TF 1.x-2.1, standalone Keras 2.2-2.3": "none: each replica applies its own gradient",
        "TF 2.2+ (OptimizerV2), tf_keras": "`_aggregate_gradients`, if the class sets `_HAS_AGGREGATE_GRAD`",
    },
)
def has_aggregate_grad(optimizer: Any) -> bool:
    """Whether an OptimizerV2 sums gradients across replicas itself (``_aggregate_gradients``)."""
    return getattr(optimizer, "_HAS_AGGREGATE_GRAD", False)


@probe(
    "what sums and clips in a Keras 2 `apply_gradients`",
    {
        "TF 1.x-2.15, tf_keras (OptimizerV2)": "`_aggregate_gradients`, `_transform_gradients`",
        "TF 2.8+ (optimizer.Optimizer), tf_keras": "`aggregate_gradients`, then `_clip_gradients`",
    },
)
def has_aggregate_gradients(optimizer: Any) -> bool:
    """Whether the optimizer is an optimizer.Optimizer, told by its public ``aggregate_gradients``."""
    return hasattr(optimizer, "aggregate_gradients")


@probe(
    "the transformation of gradients before the sum",
    {
        "TF 1.x-2.3": "none",
        "TF 2.4+ (OptimizerV2), tf_keras": "`_transform_unaggregated_gradients` in `apply_gradients`",
    },
)
def has_transform_unaggregated_gradients(optimizer: Any) -> bool:
    """Whether an OptimizerV2 transforms gradients before summing them (``gradient_aggregator`` hooks)."""
    return hasattr(optimizer, "_transform_unaggregated_gradients")


@probe(
    "what `_aggregate_gradients` returns",
    {
        "TF 2.2-2.3": "the summed gradients",
        "TF 2.4+ (OptimizerV2), tf_keras": "(gradient, variable) pairs",
    },
)
def aggregated_gradients(aggregated: Any) -> List[Any]:
    """The gradients of ``_aggregate_gradients``' result."""
    return [g[0] if isinstance(g, tuple) else g for g in aggregated]


@probe(
    "what an `apply_gradients` call says about the cross-replica sum",
    {
        "TF 2.2+ (OptimizerV2), tf_keras": "`experimental_aggregate_gradients=False` skips it",
        "TF 2.8+ (optimizer.Optimizer), tf_keras": "`skip_gradients_aggregation=True` (or that)",
    },
)
def apply_call_sums(kwargs: Dict[str, Any]) -> bool:
    """Whether an ``apply_gradients`` call with these keyword arguments sums across replicas."""
    return kwargs.get("experimental_aggregate_gradients", True) and not kwargs.get(
        "skip_gradients_aggregation", False
    )


@probe(
    "how an OptimizerV2 creates its variables",
    {
        "TF 1.x-2.1": "`iterations`, `_create_hypers()`, `_create_slots(variables)` one by one",
        "TF 2.2+ (OptimizerV2), tf_keras": "`_create_all_weights(variables)`",
        "TF 2.8+ (optimizer.Optimizer), tf_keras, Keras 3": "`build(variables)`, once",
    },
)
def has_create_all_weights(optimizer: Any) -> bool:
    """Whether the optimizer creates iterations, hyperparameters and slots in ``_create_all_weights``."""
    return hasattr(optimizer, "_create_all_weights")


@probe(
    "slot variables",
    {
        "TF 1.x-2.15, tf_keras (OptimizerV2)": "`_create_slots(variables)`",
        "TF 2.8+ (optimizer.Optimizer), tf_keras, Keras 3": "none: `build(variables)` creates them",
    },
)
def has_create_slots(optimizer: Any) -> bool:
    """Whether the optimizer creates its slots in ``_create_slots`` (an OptimizerV2)."""
    return hasattr(optimizer, "_create_slots")


@probe(
    "an optimizer's `variables`",
    {
        "TF 1.x-2.15, tf_keras (OptimizerV2)": "a method",
        "TF 2.8+ (optimizer.Optimizer), tf_keras, Keras 3": "a property",
    },
)
def optimizer_variables(optimizer: Any) -> List[Any]:
    """The optimizer's variables."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


@probe(
    "graph-mode training's update",
    {
        "TF 1.x-2.15, tf_keras (OptimizerV2), standalone Keras 2.2-2.3": "`get_updates(loss, params)`",
        "TF 2.8+ (optimizer.Optimizer), tf_keras, Keras 3": "none: no graph-mode training",
    },
)
def has_get_updates(optimizer: Any) -> bool:
    """Whether the optimizer has ``get_updates``, the update every graph-mode training step runs."""
    return hasattr(optimizer, "get_updates")


# --- Keras 3 optimizers -------------------------------------------------------------------------------


@probe(
    "how an optimizer is handed gradients",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": "`apply_gradients(grads_and_vars)`, which unscales nothing",
        "Keras 3": "`apply(grads, variables)`, which divides by the loss scale (`scale_loss` scales)",
    },
)
def has_keras3_apply(optimizer: Any) -> bool:
    """Whether the optimizer is a Keras 3 one: ``apply`` and ``scale_loss``."""
    return hasattr(optimizer, "scale_loss") and hasattr(optimizer, "apply")


@probe(
    "the cross-replica sum of a Keras 3 optimizer",
    {
        "Keras 3.3-3.4": "`_all_reduce_sum_gradients` runs inside `merge_call`, where it sums nothing: "
        "each replica applies its own gradient",
        "Keras 3.5+": "`_backend_update_step` sums the gradients across replicas before the update",
    },
)
def sums_across_replicas(optimizer: Any) -> bool:
    """Whether a Keras 3 optimizer's update step sums gradients across replicas, told by what it calls."""
    update_step = getattr(type(optimizer), "_backend_update_step", None)
    return update_step is None or "_all_reduce_sum_gradients" in update_step.__code__.co_names


@probe(
    "clipping under Keras 3 gradient accumulation",
    {
        "Keras 3.3-3.4": "`apply` clips each batch's gradient as it is accumulated",
        "Keras 3.5+": "`_backend_apply_gradients` clips only the mean it applies every k-th step",
    },
)
def clips_accumulated_mean(optimizer: Any) -> bool:
    """Whether a Keras 3 optimizer clips the accumulated mean (``_backend_apply_gradients`` clips)."""
    return "_clip_gradients" in type(optimizer)._backend_apply_gradients.__code__.co_names


@probe(
    "the Keras 3 optimizer's step counter",
    {
        "Keras 3.3-3.4": "`iterations`, which counts steps",
        "Keras 3.5+": "`_iterations`; `iterations` counts updates under gradient accumulation",
    },
)
def step_counter(optimizer: Any) -> Any:
    """The variable counting a Keras 3 optimizer's steps, applied or accumulated."""
    return optimizer._iterations if hasattr(optimizer, "_iterations") else optimizer.iterations


@probe(
    "the batch `fit` hands `on_train_batch_end` after an execution of several steps (`steps_per_execution`)",
    {
        "TF 2.4+, tf_keras, Keras 3.11+": "the execution's last (`end_step`)",
        "Keras 3.3-3.9": "its first, the one `on_train_batch_begin` had (3.10 not read here)",
    },
)
def reports_an_executions_last_batch(model: Any) -> bool:
    """Whether the model's ``fit`` hands ``on_train_batch_end`` an execution's last batch (else its first).
    Every ``fit`` of the class's MRO is read: a model's own ``fit`` calls Keras'."""
    fits = [inspect.unwrap(vars(cls)["fit"]) for cls in type(model).__mro__ if "fit" in vars(cls)]
    return any("end_step" in fit.__code__.co_varnames for fit in fits if hasattr(fit, "__code__"))


# --- Graph mode: sessions and feeds -------------------------------------------------------------------


@probe(
    "per-output training endpoints of a graph-mode model",
    {
        "standalone Keras 2.2-2.3": "none",
        "TF, tf_keras": "`_training_endpoints`: per output its loss, target and sample-weight placeholder",
    },
)
def training_endpoints(model: Any) -> Optional[List[Any]]:
    """The model's ``_training_endpoints``; None where it has none."""
    return getattr(model, "_training_endpoints", None)


@probe(
    "the graph a Keras backend's session runs",
    {
        "standalone Keras 2.2": "no `get_graph`: the default graph",
        "standalone Keras 2.3, TF, tf_keras": "`backend.get_graph()`",
    },
)
def backend_graph(backend: Any) -> Any:
    """The graph of a Keras 2 backend module's session."""
    import tensorflow as tf

    return getattr(backend, "get_graph", tf.compat.v1.get_default_graph)()


@probe(
    "sessions",
    {
        "standalone Keras 2.2-2.3, TF, tf_keras": "`backend.get_session()`",
        "Keras 3": "none",
    },
)
def has_sessions(backend: Any) -> bool:
    """Whether a Keras backend module has sessions."""
    return hasattr(backend, "get_session")


@probe(
    "which variables a Keras backend made",
    {
        "standalone Keras 2.2-2.3": "not kept",
        "TF, tf_keras": "`backend._GRAPH_VARIABLES`, per graph",
    },
)
def backend_variables(backend: Any, graph: Any) -> Any:
    """The variables a Keras 2 backend module made in ``graph`` (none where it does not keep them)."""
    return getattr(backend, "_GRAPH_VARIABLES", {}).get(graph, ())


@probe(
    "the session a Keras backend has made",
    {
        "standalone Keras 2.2": "a global `tensorflow_backend._SESSION`",
        "standalone Keras 2.3, TF, tf_keras": "`backend._SESSION.session` (2.3: tf.keras')",
    },
)
def live_session(backend: Any) -> Any:
    """The session a Keras 2 backend module has made, without making one; None if none yet."""
    state = getattr(backend, "_SESSION", None) or getattr(
        getattr(backend, "tensorflow_backend", None), "_SESSION", None
    )
    return state if hasattr(state, "run") else getattr(state, "session", None)


# --- Layers and the model's graph ---------------------------------------------------------------------


@probe(
    "a model's layers, nested ones included",
    {
        "TF 1.x-2.2, standalone Keras 2.2-2.3": "walked through `layers`, `layer`, `forward_layer`, ...",
        "TF 2.3+, tf_keras, Keras 3": "`_flatten_layers(include_self=, recursive=)`",
    },
)
def flattens_layers(model: Any) -> bool:
    """Whether the model lists its nested layers itself (``_flatten_layers``)."""
    return callable(getattr(model, "_flatten_layers", None))


@probe(
    "the layer of a graph node",
    {
        "TF 1.x-2.2, standalone Keras 2.2-2.3": "`Node.outbound_layer`",
        "TF 2.3+, tf_keras": "`Node.layer`",
        "Keras 3": "`Node.operation`",
    },
)
def node_layer(node: Any) -> Any:
    """The layer a node of the model's graph calls."""
    return getattr(node, "operation", None) or getattr(node, "layer", None) or node.outbound_layer


@probe(
    "the graph of a Sequential model",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": "the model itself (a functional model)",
        "Keras 3": "a Functional kept in `_functional`",
    },
)
def functional_graph(model: Any) -> Any:
    """The functional model holding the model's graph of layers."""
    return getattr(model, "_functional", None) or model


@probe(
    "a model's inputs and outputs nested as its call takes them",
    {
        "standalone Keras 2.2-2.3": "none: `inputs` / `outputs` are flat",
        "TF, tf_keras": "`_nested_inputs` / `_nested_outputs`",
        "Keras 3": "`_inputs_struct` / `_outputs_struct`",
    },
)
def nested_endpoints(graph: Any, which: str) -> Any:
    """The graph's inputs (``which="inputs"``) or outputs, nested; None where it keeps them flat only."""
    for attribute in (f"_{which}_struct", f"_nested_{which}"):
        if getattr(graph, attribute, None) is not None:
            return getattr(graph, attribute)
    return None


@probe(
    "the names of a model's inputs and outputs",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": "`input_names`, `output_names`",
        "Keras 3": "`output_names` on functional models only; no `input_names`",
    },
)
def endpoint_names(model: Any, which: str) -> Optional[List[str]]:
    """``model.input_names`` (``which="input"``) or ``output_names``; None (or empty) where there are none."""
    return getattr(model, which + "_names", None)


# --- Variables, tensors and metrics -------------------------------------------------------------------


@probe(
    "a unique name of a variable",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": '`name` ("dense/kernel:0")',
        "Keras 3": '`path` ("dense/kernel"); its `name` is bare ("kernel")',
    },
)
def variable_name(variable: Any) -> Optional[str]:
    """The variable's unique name; None where it has none."""
    return getattr(variable, "path", None) or getattr(variable, "name", None)


@probe(
    "a static shape",
    {
        "TF 1.x": "a `TensorShape` of `Dimension` objects (`as_list()` gives ints)",
        "TF 2.0+": "a `TensorShape` of ints and None",
        "Keras 3": "a tuple for its symbolic tensors (`KerasTensor`)",
    },
)
def shape_tuple(shape: Any) -> Tuple[Optional[int], ...]:
    """A static shape as a tuple of ints, None where unknown."""
    return tuple(shape.as_list()) if hasattr(shape, "as_list") else tuple(shape)


@probe(
    "a variable's dtype",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": "a `tf.DType`",
        "Keras 3": 'a dtype name ("float32")',
    },
)
def numpy_dtype_of(dtype: Any) -> Any:
    """What ``np.dtype`` takes for a variable's or tensor's dtype."""
    return getattr(dtype, "as_numpy_dtype", dtype)


@probe(
    "where a variable keeps its constraint",
    {
        "TF, tf_keras (mixed precision)": "in the variable an `AutoCastVariable` wraps (`_variable`)",
        "TF, tf_keras, Keras 3": "`_constraint`: `tf.Variable.constraint` is read-only, Keras 3.3's setter "
        "takes `Constraint` instances only",
    },
)
def constraint_holder(variable: Any) -> Any:
    """The variable whose ``_constraint`` ``variable.constraint`` reads."""
    return (
        getattr(variable, "_variable", variable)
        if type(variable).__name__ == "AutoCastVariable"
        else variable
    )


@probe(
    "resetting a metric",
    {
        "TF 1.x-2.4": "`reset_states()`",
        "TF 2.5+, tf_keras, Keras 3": "`reset_state()`",
    },
)
def metric_reset(metric: Any) -> Callable[[], Any]:
    """The metric's method putting it back to its fresh state."""
    return getattr(metric, "reset_state", None) or metric.reset_states


# --- TensorFlow ---------------------------------------------------------------------------------------


@probe(
    "the `tf.function` option that stops retracing on new batch sizes",
    {
        "TF 1.x-2.8": "`experimental_relax_shapes` (generalizes on the second new shape)",
        "TF 2.9+": "`reduce_retracing` (generalizes on the first)",
    },
)
def relax_shapes_keyword() -> str:
    """The name of ``tf.function``'s keyword that relaxes shapes."""
    import inspect

    import tensorflow as tf

    parameters = inspect.signature(tf.function).parameters
    return "reduce_retracing" if "reduce_retracing" in parameters else "experimental_relax_shapes"


@probe(
    "`tf.vectorized_map` on an op it cannot vectorize",
    {
        "TF 1.x-2.2": "raises (no `fallback_to_while_loop`): compatgrad loops over the examples instead",
        "TF 2.3+": "`fallback_to_while_loop=True` loops over that op alone",
    },
)
def vectorized_map_fallback() -> Dict[str, bool]:
    """``tf.vectorized_map``'s keyword for its per-op fallback, where it has one."""
    import inspect

    import tensorflow as tf

    parameters = inspect.signature(tf.vectorized_map).parameters
    return {"fallback_to_while_loop": True} if "fallback_to_while_loop" in parameters else {}


@probe(
    "what `tf.map_fn` is told of its results",
    {"TF 1.x-2.2": "`dtype` (dtypes)", "TF 2.3+": "`fn_output_signature` (TensorSpecs)"},
)
def map_fn_signature_keyword() -> str:
    import inspect

    import tensorflow as tf

    parameters = inspect.signature(tf.map_fn).parameters
    return "fn_output_signature" if "fn_output_signature" in parameters else "dtype"


@probe(
    "the class of distribution strategies",
    {
        "TF 1.x (and tf.compat.v1.distribute)": "named with `V1` (`MirroredStrategyV1`)",
        "TF 2.0+": "`MirroredStrategy`; `MultiWorkerMirroredStrategy` is a `CollectiveAllReduceStrategy`",
    },
)
def strategy_class_names(strategy: Any) -> List[str]:
    """The names of the strategy's classes, the ``V1`` suffix dropped."""
    names = [cls.__name__ for cls in type(strategy).__mro__]
    return [name[:-2] if name.endswith("V1") else name for name in names]


@probe(
    "telling whether code runs in a `tf.function`",
    {
        "TF 1.x-2.1": "no public `tf.compat.v1.executing_eagerly_outside_functions`",
        "TF 2.2+": "`tf.compat.v1.executing_eagerly_outside_functions()`",
    },
)
def executing_eagerly_outside_functions() -> bool:
    """Whether eager execution is on outside ``tf.function`` (False where TF cannot tell)."""
    import tensorflow as tf

    return getattr(tf.compat.v1, "executing_eagerly_outside_functions", lambda: False)()


@probe(
    "the next element of a tf.data iterator as an Optional",
    {
        "TF 1.x-2.2": "`tf.data.experimental.get_next_as_optional(iterator)`",
        "TF 2.3+": "`iterator.get_next_as_optional()`",
    },
)
def has_get_next_as_optional(iterator: Any) -> bool:
    """Whether the iterator has a ``get_next_as_optional`` method."""
    return hasattr(iterator, "get_next_as_optional")


@probe(
    "the class of values with one part per replica",
    {
        "TF 1.x-2.1": "none public",
        "TF 2.2+": "`tf.distribute.DistributedValues`",
    },
)
def distributed_values_class(tf: Any) -> Any:
    """``tf.distribute.DistributedValues`` for ``isinstance``; an empty tuple where TF has none public."""
    return getattr(tf.distribute, "DistributedValues", ())


@probe(
    "the class of a distributed dataset",
    {
        "TF 1.x-2.2": "private (`input_lib.DistributedDataset...`)",
        "TF 2.3+": "public: `tf.distribute.DistributedDataset`; in every TF a class `DistributedDataset*`",
    },
)
def is_distributed_dataset(value: Any) -> bool:
    """Whether ``value`` is ``strategy.experimental_distribute_dataset``'s result, told by its class name."""
    return any(cls.__name__.startswith("DistributedDataset") for cls in type(value).__mro__)


@probe(
    "Keras' dataset class",
    {
        "TF, tf_keras, standalone Keras 2.2-2.3": "`keras.utils.Sequence`",
        "Keras 3": "`keras.utils.PyDataset` (`Sequence` an alias)",
    },
)
def is_keras_sequence(value: Any) -> bool:
    """Whether ``value`` is a Keras ``Sequence`` / ``PyDataset``."""
    return any(
        cls.__name__ in ("Sequence", "PyDataset") and "keras" in (cls.__module__ or "")
        for cls in type(value).__mro__
    )


@probe(
    "listing devices",
    {
        "TF 1.x-2.0": "`tf.config.experimental.list_physical_devices`",
        "TF 2.1+": "`tf.config.list_physical_devices`",
    },
)
def physical_devices(tf: Any) -> List[Any]:
    """The physical devices TensorFlow sees."""
    listing = (
        getattr(tf.config, "list_physical_devices", None) or tf.config.experimental.list_physical_devices
    )
    return list(listing())


# --- The environment (compatgrad doctor / check) ------------------------------------------------------


@probe(
    "`keras.optimizers.legacy`",
    {
        "TF 1.x-2.8, standalone Keras 2.2-2.3": "none",
        "TF 2.9-2.10": "OptimizerV2 classes beside the OptimizerV2 defaults",
        "TF 2.11+, tf_keras": "OptimizerV2 classes (`get_updates`); the defaults are optimizer.Optimizer",
        "Keras 3": "classes that raise",
    },
)
def legacy_optimizers(keras: Any) -> Optional[Any]:
    """``keras.optimizers.legacy`` where its SGD is not the default one; None elsewhere."""
    legacy = getattr(keras.optimizers, "legacy", None)
    return legacy if getattr(legacy, "SGD", keras.optimizers.SGD) is not keras.optimizers.SGD else None


@probe(
    "an optimizer's learning-rate argument",
    {
        "standalone Keras 2.2": "`lr`",
        "standalone Keras 2.3, TF, tf_keras, Keras 3": "`learning_rate`",
    },
)
def learning_rate_argument(optimizer_class: Any) -> str:
    """The name of the learning-rate argument of ``optimizer_class``."""
    import inspect

    return (
        "learning_rate" if "learning_rate" in inspect.signature(optimizer_class.__init__).parameters else "lr"
    )


@probe(
    "standalone Keras' `train_on_batch` updates",
    {
        "standalone Keras 2.2": "wait for the loss only, racing the gradients that read the weights",
        "standalone Keras 2.3": "ordered after the gradients (its backend is tf.keras': it has `get_graph`)",
    },
)
def updates_race_gradients(keras: Any) -> bool:
    """Whether a standalone Keras' updates race its gradients (2.2's backend has no ``get_graph``)."""
    return not hasattr(keras.backend, "get_graph")
