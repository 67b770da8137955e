"""Per-example gradients: each example's share of the training step's loss, vectorized over the examples.

The step's loss L reaches the variables through what its loss reads of the model's outputs (the
outputs, or their logits: ``_forward.loss_inputs``) and through ``model.losses``. The engine gives
c = dL/d(outputs) as the step computes L (reduction, sample / class / loss weights, loss scale
undone). An example's output depends on that example alone (the front door refuses the layers
that mix examples), so example i's share is the gradient of <c_i, output_i>, taken on the example
alone under ``tf.vectorized_map``; over the batch they add up to the gradient of <c, outputs>.

The same ops serve both modes: traced in a ``tf.function`` (eager) or built once in the model's
graph and run in its session (graph mode). Norms and dot products of Dense layers come from their
activations without materializing a gradient per example (``_ghost``).
"""

import contextlib
import weakref
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from .. import _paths, versions
from .._cache import cached
from .._types import Model, ModelRef, Tensor
from ..detect import Flavour, model_class
from ..sources import extraction_view, graph_tensors, output_structure
from ._forward import logits_of
from ._layers import all_layers
from ._per_example_plan import DOT, GRADIENTS, NORMS, Ghost, Inputs, Plan, Runner


def runner(model: Model, flavour: Flavour, plan: Plan, eager: bool) -> Runner:
    """The plan's functions for this model, built once (and again on recompile)."""
    key = ("per example", eager, *plan.key())
    state = (model.optimizer,) if eager else (model.total_loss, model.optimizer)
    build = _eager_runner if eager else _graph_runner
    return cached(model, key, state, lambda: build(weakref.ref(model), flavour, plan))


def ghosts(model: Model, variables: Sequence[Any]) -> Tuple[Ghost, ...]:
    """The model's Dense layers whose norms and dot products ``_ghost`` can take: a Keras ``Dense`` (not
    a subclass, no LoRA or quantization) called once in the model's own graph on rank-2 inputs, its
    variables in its compute dtype (no mixed precision), with a wanted variable."""
    index = {id(v): i for i, v in enumerate(variables)}
    calls: Dict[int, int] = {}
    for tensor in graph_tensors(model).values():
        calls[id(tensor.layer)] = calls.get(id(tensor.layer), 0) + 1
    found = []
    for layer in getattr(model, "layers", []):
        cls = type(layer)
        plain = cls.__name__ == "Dense" and versions.keras_root(cls.__module__) is not None
        if not plain or calls.get(id(layer)) != 1 or getattr(layer, "lora_enabled", False):
            continue
        if getattr(layer, "quantization_mode", None) is not None or len(layer.input.shape) != 2:
            continue
        # TF 2.4+ and Keras 3 say `compute_dtype`, TF 2.1-2.3 `_compute_dtype`, standalone Keras neither
        compute_dtype = (
            getattr(layer, "compute_dtype", None) or getattr(layer, "_compute_dtype", None) or layer.dtype
        )
        if tf.as_dtype(compute_dtype) != tf.as_dtype(layer.kernel.dtype).base_dtype:
            continue
        kernel = index.get(id(layer.kernel))
        bias = index.get(id(layer.bias)) if layer.use_bias else None
        if kernel is not None or bias is not None:
            found.append(Ghost(layer, kernel, bias))
    return tuple(found)


def model_inputs(model: Model, flavour: Flavour, batch: Any, eager: bool) -> Any:
    """The batch's x as the per-example functions take it: arrays of the model's float type (eager), or
    the model's own standardization of it, one array per input (graph mode)."""
    if not eager:
        from .graph import _standardize

        xs = _standardize(model, batch, None)[0]
        return list(xs) if len(xs) > 1 else xs[0]
    floatx = _paths.load(flavour.root, "backend").floatx()

    def convert(part: Any) -> Any:
        if tf.is_tensor(part):
            return part
        array = np.asarray(part)
        return array.astype(floatx, copy=False) if array.dtype.kind == "f" else array

    return tf.nest.map_structure(convert, batch.x)


def rows(x: Any, start: int, stop: int) -> Any:
    """Examples ``start:stop`` of every input."""
    return tf.nest.map_structure(lambda part: part[start:stop], x)


# --- The ops, for both modes ------------------------------------------------------------------------


def surrogate(outputs: Any, cotangents: Sequence[Tensor], kinds: Sequence[Optional[str]]) -> Tensor:
    """sum_k <c_k, what the loss reads of output k>: its gradient is the loss' through the outputs."""
    reads = [
        output if kind == "output" else logits_of(output)
        for output, kind in zip(tf.nest.flatten(outputs), kinds)
        if kind is not None  # an output without a loss
    ]
    # In float32 at least (a mixed-precision output may be float16), float64 for a float64 model.
    dtype = tf.float64 if any(r.dtype == tf.float64 for r in reads) else tf.float32
    terms = [tf.reduce_sum(tf.cast(r, dtype) * tf.cast(c, dtype)) for r, c in zip(reads, cotangents)]
    return tf.add_n(terms) if terms else tf.zeros([], dtype)


def _per_variable(
    plan: Plan, watched: Sequence[Any], grads: Sequence[Any], scale: Tensor, inputs: Any
) -> List[Any]:
    """One example's result per variable not ghosted: its gradient + the shared part (or, kept sparse,
    its gradient's (values, indices), the shared part left to the caller), the squared norm or the dot
    product of gradient + shared part. Added here, the shared part costs no pass of its own in numpy
    over per-example arrays that may be large."""
    results: List[Any] = []
    for i, (variable, grad) in enumerate(zip(watched, grads)):
        if i in ghosted(plan):
            continue
        if grad is None:
            grad = tf.zeros_like(variable)
        if plan.mode == GRADIENTS and plan.sparse[i] and isinstance(grad, tf.IndexedSlices):
            indices = tf.cast(tf.reshape(grad.indices, [-1]), tf.int64)
            results.append((_unscaled(grad.values, scale), indices))
            continue
        total = _unscaled(tf.convert_to_tensor(grad), scale)
        if inputs.shared[i] is not None:
            total = total + inputs.shared[i]
        if plan.mode == GRADIENTS:
            results.append(total)
        elif plan.mode == NORMS:
            results.append(tf.reduce_sum(tf.square(total)))
        else:
            results.append(tf.reduce_sum(total * inputs.vectors[i]))
    return results


def ghosted(plan: Plan) -> List[int]:
    """The indices of the variables whose results come from ``_ghost``."""
    return [i for g in plan.ghosts for i in (g.kernel, g.bias) if i is not None]


def _chunk_ops(
    plan: Plan,
    call: Callable[[Any], Any],
    watched: Sequence[Any],
    inputs: Inputs,
    activations: Callable[[Any], Tuple[List[Any], Any]],
    paths: Dict[str, str],
    loop: bool,
) -> List[Any]:
    """Per variable, a tensor with the chunk's examples first (see ``Runner``); ``loop``: per example
    in a ``tf.map_fn`` loop rather than vectorized."""
    scale = inputs.scale

    def one(example: Any) -> List[Any]:
        x, cotangents = example
        outputs = call(tf.nest.map_structure(lambda t: t[None], x))
        loss = _scaled(surrogate(outputs, [c[None] for c in cotangents], plan.kinds), scale)
        # Not colocated with the forward ops (tf.gradients' v2 default): TF 2.2 pfor cannot
        # vectorize an op that carries a colocation attribute.
        grads = tf.compat.v1.gradients(loss, list(watched), colocate_gradients_with_ops=False)
        return _per_variable(plan, watched, grads, scale, inputs)

    results: List[Any] = [None] * len(plan.variables)
    if len(ghosted(plan)) < len(plan.variables):
        signature = _output_signature(plan, watched)
        mapped = _map(one, (inputs.x, list(inputs.cotangents)), signature, paths, loop)
        rest = [i for i in range(len(plan.variables)) if i not in ghosted(plan)]
        for i, result in zip(rest, mapped):
            results[i] = result
    if plan.ghosts:
        for i, result in _ghost(plan, watched, inputs, scale, activations).items():
            results[i] = result
    return results


def _map(
    fn: Callable[[Any], Any], elems: Any, signature: List[Any], paths: Dict[str, str], loop: bool
) -> Any:
    """``tf.vectorized_map``, unless told to ``loop`` or it cannot be trusted here (``_vectorized``):
    then a ``tf.map_fn`` loop, which runs any op."""
    mapped = None if loop else _vectorized(fn, elems)
    paths["path"] = "loop" if mapped is None else "vectorized"
    if mapped is None:
        mapped = tf.map_fn(fn, elems, **{versions.map_fn_signature_keyword(): signature})
    return list(mapped)


def _vectorized(fn: Callable[[Any], Any], elems: Any) -> Optional[Any]:
    """``tf.vectorized_map(fn, elems)``; None where it raises or makes a batch matmul of a rank-4+
    operand with one of another rank. TF's oneDNN kernel for those reads out of bounds on CPU,
    corrupting memory (tensorflow#117700, TF 2.16-2.21; found in TF 2.21 from Keras 3 Dense layers on
    sequences, whose per-example calls add a rank). Traced in a function of its own, so that the ops
    it made can be looked at before they are ever run; in graph mode, built into the graph and never
    fetched. Any exception counts as a refusal: pfor's own vary by release (an op it cannot convert;
    TF 1.x-2.2 read a command-line flag there, parsing ``sys.argv``, which raises a flags error under
    another program's arguments; autograph rewraps what it cannot rebuild as a StagingError), and an
    error of ``fn`` itself is raised again by the loop, which runs the same ``fn``."""
    keywords = versions.vectorized_map_fallback()
    try:
        if tf.executing_eagerly() or tf.compat.v1.get_default_graph().building_function:
            function = tf.function(lambda e: tf.vectorized_map(fn, e, **keywords))
            traced = function.get_concrete_function(elems)  # called through function: TF 2.2 takes flat args
            return None if _risky_matmuls(traced.graph.get_operations()) else function(elems)
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        mapped = tf.vectorized_map(fn, elems, **keywords)
        return None if _risky_matmuls(graph.get_operations()[before:]) else mapped
    except Exception:  # noqa: BLE001 -- see the docstring: the loop raises fn's own errors again
        return None


def _risky_matmuls(ops: Sequence[Any]) -> bool:
    for op in ops:
        if op.type.startswith("BatchMatMul"):
            ranks = [t.shape.rank for t in op.inputs[:2]]
            if None in ranks or (max(ranks) >= 4 and ranks[0] != ranks[1]):
                return True
    return False


def _output_signature(plan: Plan, watched: Sequence[Any]) -> List[Any]:
    """What ``one`` returns per example, for ``tf.map_fn``: a TensorSpec (TF 2.3+) or a dtype each."""
    specs: List[Any] = []
    as_specs = versions.map_fn_signature_keyword() == "fn_output_signature"
    for i, variable in enumerate(watched):
        if i in ghosted(plan):
            continue
        dtype = tf.as_dtype(variable.dtype).base_dtype
        shape = tf.TensorShape(variable.shape) if plan.mode == GRADIENTS else tf.TensorShape([])
        if plan.mode == GRADIENTS and plan.sparse[i]:
            values = tf.TensorShape([None]).concatenate(shape[1:])
            spec = (tf.TensorSpec(values, dtype), tf.TensorSpec([None], tf.int64))
            specs.append(spec if as_specs else (dtype, tf.int64))
        else:
            specs.append(tf.TensorSpec(shape, dtype) if as_specs else dtype)
    return specs


def _ghost(
    plan: Plan,
    watched: Sequence[Any],
    inputs: Inputs,
    scale: Tensor,
    activations: Callable[[Any], Tuple[List[Any], Any]],
) -> Dict[int, Tensor]:
    """Squared norms or dot products per example of Dense layers' gradients, from their activations.

    Example i's kernel gradient is the outer product a_i dz_i^T of the layer's input and the gradient
    at its pre-activation z = a W + b, its bias gradient dz_i. So |a_i dz_i^T + R|^2 = |a_i|^2 |dz_i|^2
    + 2 a_i^T R dz_i + |R|^2 and <a_i dz_i^T, V> = a_i^T V dz_i: nothing per example larger than a row.
    """
    flat, outputs = activations(inputs.x)
    loss = _scaled(surrogate(outputs, inputs.cotangents, plan.kinds), scale)
    # Differentiated at the layer's logits where a loss reads them (that is its pre-activation),
    # else at its output, then through its activation.
    layer_outputs = flat[1::2]
    reads = [logits_of(output) for output in layer_outputs]
    read_grads = tf.gradients(loss, reads)
    found: Dict[int, Tensor] = {}
    for ghost, a, output, read, read_grad in zip(plan.ghosts, flat[0::2], layer_outputs, reads, read_grads):
        layer = ghost.layer
        kernel = watched[ghost.kernel] if ghost.kernel is not None else layer.kernel
        a = tf.cast(a, kernel.dtype)
        if read_grad is None:
            dz = tf.zeros_like(output)
        elif read is not output:
            dz = read_grad
        else:
            z = tf.matmul(a, kernel)
            if layer.use_bias:
                z = z + (watched[ghost.bias] if ghost.bias is not None else layer.bias)
            dz = tf.gradients(layer.activation(z), z, grad_ys=read_grad)[0]
        dz = _unscaled(tf.cast(dz, a.dtype), scale)
        for index, is_kernel in ((ghost.kernel, True), (ghost.bias, False)):
            if index is None:
                continue
            shared = inputs.shared[index]
            if plan.mode == NORMS:
                if is_kernel:
                    own = tf.reduce_sum(tf.square(a), 1) * tf.reduce_sum(tf.square(dz), 1)
                else:
                    own = tf.reduce_sum(tf.square(dz), 1)
                if shared is not None:
                    cross = (
                        tf.reduce_sum(tf.matmul(a, shared) * dz, 1)
                        if is_kernel
                        else tf.linalg.matvec(dz, shared)
                    )
                    own = own + 2.0 * cross + tf.reduce_sum(tf.square(shared))
                found[index] = own
            else:
                vector = inputs.vectors[index]
                own = (
                    tf.reduce_sum(tf.matmul(a, vector) * dz, 1) if is_kernel else tf.linalg.matvec(dz, vector)
                )
                found[index] = own if shared is None else own + tf.reduce_sum(shared * vector)
    return found


def _batch_ops(plan: Plan, outputs: Any, watched: Sequence[Any], inputs: Inputs) -> List[Tensor]:
    """The gradient of <c, outputs> over the batch, dense, per variable (zeros where unconnected)."""
    scale = inputs.scale
    grads = tf.gradients(_scaled(surrogate(outputs, inputs.cotangents, plan.kinds), scale), list(watched))
    return [
        tf.zeros_like(v) if g is None else _unscaled(tf.convert_to_tensor(g), scale)
        for v, g in zip(watched, grads)
    ]


def _scaled(loss: Tensor, scale: Optional[Tensor]) -> Tensor:
    """The surrogate at the step's loss scale, so that float16 gradients do not underflow."""
    return loss if scale is None else loss * tf.cast(scale, loss.dtype)


def _unscaled(grad: Tensor, scale: Optional[Tensor]) -> Tensor:
    return grad if scale is None else grad / tf.cast(scale, grad.dtype)


# --- Eager: traced functions ------------------------------------------------------------------------


def _eager_runner(model_ref: ModelRef, flavour: Flavour, plan: Plan) -> Runner:
    model = model_ref()
    keras3 = flavour.name == "keras3"
    paths: Dict[str, str] = {}
    view = _ghost_view(model, plan) if plan.ghosts else None
    relaxed = {versions.relax_shapes_keyword(): True}

    def call(x: Any) -> Any:
        model = model_ref()
        if versions.call_takes_training(model):
            return model(x, training=plan.training)
        return model(x)

    def watched() -> List[Any]:  # Keras 3 variables are differentiated through their tf.Variable
        return [v.value if keras3 else v for v in plan.variables]

    def activations(x: Any) -> Tuple[List[Any], Any]:  # called only where there are ghosts
        assert view is not None
        flat = list(view(x, training=plan.training))
        count = 2 * len(plan.ghosts)
        return flat[:count], tf.nest.pack_sequence_as(output_structure(model_ref()), flat[count:])

    def chunk_function(loop: bool) -> Callable[..., List[Any]]:
        def chunk(x: Any, cotangents: Any, scale: Any, shared: Any, vectors: Any) -> List[Any]:
            inputs = Inputs(x, cotangents, scale, shared, vectors)
            return _chunk_ops(plan, call, watched(), inputs, activations, paths, loop)

        return tf.function(chunk, **relaxed)

    chunks = {False: chunk_function(False), True: chunk_function(True)}

    @tf.function(**relaxed)
    def batch(x: Any, cotangents: Any, scale: Any) -> List[Tensor]:
        return _batch_ops(plan, call(x), watched(), Inputs(x, cotangents, scale, [], []))

    def scale(inputs: Inputs) -> Optional[np.float32]:  # None: traced without loss scaling
        return None if inputs.scale is None else np.float32(inputs.scale)

    def run_chunk(inputs: Inputs) -> List[Any]:
        values = (inputs.x, list(inputs.cotangents), scale(inputs), inputs.shared, inputs.vectors)
        results = _vectorized_else_loop(lambda loop: chunks[loop](*values), paths)
        return [tf.nest.map_structure(np.asarray, r) for r in results]

    def run_batch(inputs: Inputs) -> List[np.ndarray]:
        return [np.asarray(g) for g in batch(inputs.x, list(inputs.cotangents), scale(inputs))]

    return Runner(run_chunk, run_batch, paths)


def _ghost_view(model: Model, plan: Plan) -> Any:
    """inputs -> [input, output of each ghost layer] + outputs, sharing the model's layers."""
    tensors = tuple(t for g in plan.ghosts for t in (g.layer.input, g.layer.output))
    return extraction_view(model, model_class(model), tensors, tf.nest.flatten(output_structure(model)))


# --- Graph mode: ops in the model's graph, run in its session ---------------------------------------


def _graph_runner(model_ref: ModelRef, flavour: Flavour, plan: Plan) -> Runner:
    model = model_ref()
    K = _paths.load(flavour.root, "backend")
    paths: Dict[str, str] = {}
    with model.total_loss.graph.as_default():
        feeds = list(model._feed_inputs)
        read = [o if kind == "output" else logits_of(o) for o, kind in zip(model.outputs, plan.kinds) if kind]
        placeholder = tf.compat.v1.placeholder
        # The examples get placeholders of their own: TF 1.x tf.keras wraps the ops of tensors that come
        # from a keras.Input in layers of their own when the model is called on them, evaluating their
        # constants in the session, which hangs inside a tf.map_fn loop.
        examples = [placeholder(t.dtype.base_dtype, t.shape) for t in feeds]
        every = Inputs(
            examples if len(examples) > 1 else examples[0],
            [placeholder(t.dtype.base_dtype, t.shape) for t in read],
            placeholder(tf.float32, []),
            [placeholder(v.dtype.base_dtype, v.shape) for v in plan.variables],
            [placeholder(v.dtype.base_dtype, v.shape) for v in plan.variables],
        )
        phase = K.learning_phase() if flavour.name == "keras" else K.symbolic_learning_phase()

    def call(x: Any) -> Any:
        return model_ref()(x)

    def activations(x: Any) -> Tuple[List[Any], Any]:  # the model's own tensors, fed its inputs
        return [t for g in plan.ghosts for t in (g.layer.input, g.layer.output)], model_ref().outputs

    def symbolic(values: Inputs) -> Inputs:
        """The placeholders, None where ``values`` has None: ops are built per such pattern."""
        return every._replace(
            scale=None if values.scale is None else every.scale,
            shared=[None if v is None else p for p, v in zip(every.shared, values.shared)],
        )

    built: Dict[Any, Tuple[List[Any], Any]] = {}  # (fetches, their structure) by what they were built for

    def build(key: Any, make: Callable[[], Any]) -> Tuple[List[Any], Any]:
        if key not in built:
            with model_ref().total_loss.graph.as_default(), _calls_leave_no_trace(model_ref()):
                ops = make()
            built[key] = (tf.nest.flatten(ops), ops)
        return built[key]

    def feed(inputs: Inputs, values: Inputs) -> Dict[Any, Any]:
        xs = values.x if isinstance(values.x, list) else [values.x]
        fed = dict(zip(feeds, xs))
        fed.update(zip(examples, xs))
        fed.update(zip(inputs.cotangents, values.cotangents))
        fed.update((p, v) for p, v in zip(inputs.shared, values.shared) if p is not None)
        if inputs.scale is not None:
            fed[inputs.scale] = values.scale
        if plan.mode == DOT:
            fed.update(zip(inputs.vectors, values.vectors))
        if not isinstance(phase, int):
            fed[phase] = int(plan.training)
        return fed

    def run_chunk(values: Inputs) -> List[Any]:
        inputs = symbolic(values)

        def run(loop: bool) -> List[Any]:
            key = ("chunk", loop, inputs.scale is None, tuple(p is None for p in inputs.shared))
            make = partial(_chunk_ops, plan, call, plan.variables, inputs, activations, paths, loop)
            fetches, structure = build(key, make)
            return tf.nest.pack_sequence_as(structure, K.get_session().run(fetches, feed(inputs, values)))

        return _vectorized_else_loop(run, paths)

    def run_batch(values: Inputs) -> List[np.ndarray]:
        inputs = symbolic(values)
        model = model_ref()
        fetches, _ = build(
            ("batch", inputs.scale is None),
            partial(_batch_ops, plan, model.outputs, plan.variables, inputs),
        )
        return list(K.get_session().run(fetches, feed(inputs, values)))

    return Runner(run_chunk, run_batch, paths)


def _vectorized_else_loop(run: Callable[[bool], List[Any]], paths: Dict[str, str]) -> List[Any]:
    """``run(loop=False)``, the vectorized chunk, unless it has failed before; where it fails when it
    runs (tf.vectorized_map converts some while loops into ops that fail on their values: GRU and
    LSTM layers in TF 2.21), ``run(loop=True)`` from then on."""
    if "failed" not in paths:
        try:
            return run(False)
        except tf.errors.OpError as error:
            paths["failed"] = type(error).__name__
    results = run(True)
    paths["path"] = "loop"
    return results


@contextlib.contextmanager
def _calls_leave_no_trace(model: Model) -> Iterator[None]:
    """Calling a graph-mode model on new tensors records the call in its layers (standalone Keras adds
    nodes; every Keras adds conditional losses and updates): the lists and dicts that grew are put
    back as they were, so the model's graph, losses and updates stay its own."""
    saved: List[Tuple[Any, Any]] = []
    for layer in all_layers(model):
        for value in list(vars(layer).values()):
            if isinstance(value, (list, dict)):
                saved.append((value, list(value) if isinstance(value, list) else dict(value)))
    try:
        yield
    finally:
        for value, before in saved:
            if isinstance(value, list) and len(value) > len(before):
                del value[len(before) :]
            elif isinstance(value, dict) and len(value) > len(before):
                for key in [k for k in value if k not in before]:
                    del value[key]
