"""Per-example gradients on Keras 3's JAX backend, with the interface of ``_per_example`` (``Plan``,
``Inputs``, ``Runner``), under ``jax.vmap``.

As there, the step's loss reaches the variables through the model's outputs and through
``model.losses``; the engine gives c = dL/d(outputs) (loss scale undone), and example i's share is the
gradient of <c_i, output_i> on the example alone: ``jax.grad`` of that surrogate, from the model's
``stateless_call`` on one example, vectorized over the examples by ``jax.vmap`` and jitted once per
plan. No variable, seed or moving statistic changes: the call is stateless and what it returns of
the state is dropped. JAX keeps no logits on an output (a jax array takes no attribute), so the
loss always reads the outputs themselves. No Dense shortcut (``ghosts``) and no sparse gradients here.
"""

import weakref
from typing import Any, Callable, List, Optional

import jax
import numpy as np

from .. import _paths
from .._cache import cached
from .._types import Model, ModelRef
from ..detect import Flavour
from ._per_example_plan import GRADIENTS, NORMS, Inputs, Plan, Runner


def runner(model: Model, flavour: Flavour, plan: Plan, eager: bool) -> Runner:
    """The plan's functions for this model, built once (and again on recompile)."""
    key = ("per example jax", *plan.key())
    return cached(model, key, (model.optimizer,), lambda: _build(weakref.ref(model), plan))


def ghosts(model: Model, variables: Any) -> tuple:
    return ()


def ghosted(plan: Plan) -> List[int]:
    return []


def model_inputs(model: Model, flavour: Flavour, batch: Any, eager: bool) -> Any:
    """The batch's x, floating arrays in the model's float type, as the trainer converts them."""
    floatx = _paths.load(flavour.root, "backend").floatx()

    def convert(part: Any) -> Any:
        array = np.asarray(part)
        return array.astype(floatx, copy=False) if array.dtype.kind == "f" else array

    return jax.tree_util.tree_map(convert, batch.x)


def rows(x: Any, start: int, stop: int) -> Any:
    """Examples ``start:stop`` of every input."""
    return jax.tree_util.tree_map(lambda part: part[start:stop], x)


def _build(model_ref: ModelRef, plan: Plan) -> Runner:
    model = model_ref()
    trainable = list(model.trainable_variables)
    non_trainable = list(model.non_trainable_variables)
    wanted = {id(v): i for i, v in enumerate(plan.variables)}
    places = [(0, i) for i, v in enumerate(trainable) if id(v) in wanted]
    places += [(1, i) for i, v in enumerate(non_trainable) if id(v) in wanted]
    order = [wanted[id((trainable, non_trainable)[kind][i])] for kind, i in places]

    def surrogate(values: List[Any], state: Any, x: Any, cotangents: List[Any], scale: Any) -> Any:
        """sum_k <c_k, output k> at the step's loss scale, as a function of the wanted variables' values."""
        trainable_values, non_trainable_values = list(state[0]), list(state[1])
        for (kind, index), value in zip(places, values):
            (trainable_values if kind == 0 else non_trainable_values)[index] = value
        kwargs = {"training": plan.training} if model_ref()._call_has_training_arg else {}
        outputs, _ = model_ref().stateless_call(trainable_values, non_trainable_values, x, **kwargs)
        read = [o for o, kind in zip(jax.tree_util.tree_leaves(outputs), plan.kinds) if kind is not None]
        dtype = "float64" if any(r.dtype == "float64" for r in read) else "float32"
        total = sum(
            (jax.numpy.sum(r.astype(dtype) * c.astype(dtype)) for r, c in zip(read, cotangents)),
            jax.numpy.zeros((), dtype),
        )
        return total * scale

    def gradients(state: Any, x: Any, cotangents: List[Any], scale: Any) -> List[Any]:
        """The surrogate's gradient per wanted variable, in the plan's order, unscaled."""
        values = [state[kind][index] for kind, index in places]
        grads = jax.grad(surrogate)(values, state, x, cotangents, scale)
        ordered: List[Any] = [None] * len(order)
        for position, grad in zip(order, grads):
            ordered[position] = grad / scale
        return ordered

    def one(state: Any, shared: List[Optional[Any]], vectors: List[Any], scale: Any) -> Callable[..., Any]:
        def example(x: Any, cotangents: List[Any]) -> List[Any]:
            batch_of_one = jax.tree_util.tree_map(lambda t: t[None], x)
            grads = gradients(state, batch_of_one, [c[None] for c in cotangents], scale)
            results = []
            for i, grad in enumerate(grads):
                total = grad if shared[i] is None else grad + shared[i]
                if plan.mode == GRADIENTS:
                    results.append(total)
                elif plan.mode == NORMS:
                    results.append(jax.numpy.sum(jax.numpy.square(total)))
                else:
                    results.append(jax.numpy.sum(total * vectors[i]))
            return results

        return example

    @jax.jit
    def chunk(state: Any, x: Any, cotangents: List[Any], scale: Any, shared: Any, vectors: Any) -> Any:
        return jax.vmap(one(state, shared, vectors, scale))(x, cotangents)

    batch = jax.jit(gradients)

    def state() -> Any:
        model = model_ref()
        return (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
        )

    def run_chunk(inputs: Inputs) -> List[Any]:
        results = chunk(
            state(), inputs.x, list(inputs.cotangents), _scale(inputs), inputs.shared, inputs.vectors
        )
        return [np.asarray(r) for r in results]

    def run_batch(inputs: Inputs) -> List[np.ndarray]:
        return [np.asarray(g) for g in batch(state(), inputs.x, list(inputs.cotangents), _scale(inputs))]

    return Runner(run_chunk, run_batch, {"path": "vectorized"})


def _scale(inputs: Inputs) -> np.float32:
    return np.float32(1.0 if inputs.scale is None else inputs.scale)
