"""Per-example gradients on Keras 3's JAX and PyTorch backends, with the interface of ``_per_example``
(``Plan``, ``Inputs``, ``Runner``): one function per example, vectorized over the examples.

As there, the step's loss reaches the variables through the model's outputs and through
``model.losses``; the engine gives c = dL/d(outputs) (loss scale undone), and example i's share is the
gradient of <c_i, what the loss reads of output_i> on the example alone: the framework's ``grad`` of
that surrogate, from the model's ``stateless_call`` on one example, under its ``vmap`` (JAX: jitted
once per plan; torch: ``torch.func``, eager). No variable, seed or moving statistic changes: the call
is stateless and what it returns of the state is dropped. No Dense shortcut (``ghosts``) and no sparse
gradients here. Each framework is one small class (``_Jax``, ``_Torch``), imported only for its models.
"""

import weakref
from typing import Any, Callable, List, Optional

import numpy as np

from .. import _paths
from .._cache import cached
from .._types import Model, ModelRef
from ..detect import Flavour, keras3_backend
from ._layers import losses_kept
from ._per_example_plan import GRADIENTS, NORMS, Inputs, Plan, Runner


class _Jax:
    def __init__(self) -> None:
        import jax

        self.jax = jax
        self.grad, self.vmap, self.compiled = jax.grad, jax.vmap, jax.jit

    def values(self, variables: List[Any]) -> List[Any]:
        return [v.value for v in variables]

    def scalar(self, value: float) -> Any:
        return np.float32(value)

    def zero(self, dtype: str) -> Any:
        return self.jax.numpy.zeros((), dtype)

    def logits(self, output: Any) -> Any:
        return output  # a jax array takes no attribute: Keras keeps no logits on JAX

    def cast(self, value: Any, dtype: str) -> Any:
        return value.astype(dtype)

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def stack(self, values: List[Any]) -> Any:
        return self.jax.numpy.stack(values)


class _Torch:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.grad, self.vmap = torch.func.grad, torch.func.vmap
        self.compiled = lambda function: function  # eager, as Keras' torch step

    def values(self, variables: List[Any]) -> List[Any]:
        return [v.value.detach() for v in variables]

    def scalar(self, value: float) -> Any:
        return self.torch.tensor(value, dtype=self.torch.float32)

    def zero(self, dtype: str) -> Any:
        return self.torch.zeros((), dtype=getattr(self.torch, dtype))

    def logits(self, output: Any) -> Any:
        return getattr(output, "_keras_logits", output)  # where a crossentropy reads them

    def cast(self, value: Any, dtype: str) -> Any:
        return value.to(getattr(self.torch, dtype))

    def to_numpy(self, value: Any) -> np.ndarray:
        return value.detach().cpu().numpy()

    def stack(self, values: List[Any]) -> Any:
        return self.torch.stack(values)


def runner(model: Model, flavour: Flavour, plan: Plan, eager: bool) -> Runner:
    """The plan's functions for this model, built once (and again on recompile)."""
    key = ("per example keras3", *plan.key())

    def build() -> Runner:
        framework = _Jax() if keras3_backend(flavour.root) == "jax" else _Torch()
        return _build(
            weakref.ref(model),
            plan,
            framework,
            _paths.load(flavour.root, "backend"),
            _paths.load(flavour.root, "tree"),
        )

    return cached(model, key, (model.optimizer,), build)


def ghosts(model: Model, variables: Any) -> tuple:
    """None: the Dense shortcut for norms and dot products is the TensorFlow engine's."""
    return ()


def ghosted(plan: Plan) -> List[int]:
    """None (see ``ghosts``)."""
    return []


def model_inputs(model: Model, flavour: Flavour, batch: Any, eager: bool) -> Any:
    """The batch's x as numpy, floating arrays in the model's float type, as the trainer converts them."""
    floatx = _paths.load(flavour.root, "backend").floatx()
    tree = _paths.load(flavour.root, "tree")

    def convert(part: Any) -> Any:
        array = np.asarray(part)
        return array.astype(floatx, copy=False) if array.dtype.kind == "f" else array

    return tree.map_structure(convert, batch.x)


def rows(x: Any, start: int, stop: int) -> Any:
    """Examples ``start:stop`` of every input (numpy arrays, nested in lists, tuples and dicts)."""
    if isinstance(x, dict):
        return {name: rows(part, start, stop) for name, part in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(rows(part, start, stop) for part in x)
    return x[start:stop]


def _build(model_ref: ModelRef, plan: Plan, framework: Any, backend: Any, tree: Any) -> Runner:
    """``backend``, ``tree``: Keras' modules (its ``convert_to_tensor``, its nested-structure functions)."""
    model = model_ref()
    trainable = list(model.trainable_variables)
    non_trainable = list(model.non_trainable_variables)
    wanted = {id(v): i for i, v in enumerate(plan.variables)}
    places = [(0, i) for i, v in enumerate(trainable) if id(v) in wanted]
    places += [(1, i) for i, v in enumerate(non_trainable) if id(v) in wanted]
    order = [wanted[id((trainable, non_trainable)[kind][i])] for kind, i in places]

    def surrogate(values: List[Any], state: Any, x: Any, cotangents: List[Any], scale: Any) -> Any:
        """sum_k <c_k, what the loss reads of output k> at the step's loss scale, as a function of the
        wanted variables' values."""
        trainable_values, non_trainable_values = list(state[0]), list(state[1])
        for (kind, index), value in zip(places, values):
            (trainable_values if kind == 0 else non_trainable_values)[index] = value
        kwargs = {"training": plan.training} if model_ref()._call_has_training_arg else {}
        outputs, _ = model_ref().stateless_call(trainable_values, non_trainable_values, x, **kwargs)
        read = [
            output if kind == "output" else framework.logits(output)
            for output, kind in zip(tree.flatten(outputs), plan.kinds)
            if kind is not None  # an output without a loss
        ]
        dtype = "float64" if any("float64" in str(r.dtype) for r in read) else "float32"
        total = framework.zero(dtype)
        for r, c in zip(read, cotangents):
            total = total + (framework.cast(r, dtype) * framework.cast(c, dtype)).sum()
        return total * scale

    def gradients(state: Any, x: Any, cotangents: List[Any], scale: Any) -> List[Any]:
        """The surrogate's gradient per wanted variable, in the plan's order, unscaled."""
        values = [state[kind][index] for kind, index in places]
        grads = framework.grad(surrogate)(values, state, x, cotangents, scale)
        ordered: List[Any] = [None] * len(order)
        for position, grad in zip(order, grads):
            ordered[position] = grad / scale
        return ordered

    def one(state: Any, shared: List[Optional[Any]], vectors: List[Any], scale: Any) -> Callable[..., Any]:
        def example(x: Any, cotangents: List[Any]) -> List[Any]:
            batch_of_one = tree.map_structure(lambda t: t[None], x)
            grads = gradients(state, batch_of_one, [c[None] for c in cotangents], scale)
            results = []
            for i, grad in enumerate(grads):
                total = grad if shared[i] is None else grad + shared[i]
                if plan.mode == GRADIENTS:
                    results.append(total)
                elif plan.mode == NORMS:
                    results.append((total * total).sum())
                else:
                    results.append((total * vectors[i]).sum())
            return results

        return example

    @framework.compiled
    def chunk(state: Any, x: Any, cotangents: List[Any], scale: Any, shared: Any, vectors: Any) -> Any:
        return framework.vmap(one(state, shared, vectors, scale))(x, cotangents)

    batch = framework.compiled(gradients)

    def state() -> Any:
        model = model_ref()
        return (framework.values(model.trainable_variables), framework.values(model.non_trainable_variables))

    def arrays(value: Any) -> Any:
        """Numpy arrays (nested) as the framework's, on Keras' device."""
        return tree.map_structure(backend.convert_to_tensor, value)

    def scale(inputs: Inputs) -> Any:
        return framework.scalar(1.0 if inputs.scale is None else inputs.scale)

    def loop(state: Any, x: Any, cotangents: List[Any], scale: Any, shared: Any, vectors: Any) -> Any:
        example = one(state, shared, vectors, scale)
        results = [
            example(tree.map_structure(lambda t, i=i: t[i], x), [c[i] for c in cotangents])
            for i in range(len(cotangents[0]))
        ]
        return [framework.stack([r[k] for r in results]) for k in range(len(order))]

    paths = {"path": "vectorized"}

    def run_chunk(inputs: Inputs) -> List[Any]:
        values = (
            state(),
            arrays(inputs.x),
            arrays(list(inputs.cotangents)),
            scale(inputs),
            [None if s is None else arrays(s) for s in inputs.shared],
            [arrays(v) for v in inputs.vectors],
        )
        with losses_kept(model_ref()):
            if paths["path"] == "vectorized":
                try:
                    return [framework.to_numpy(r) for r in chunk(*values)]
                # torch.func's vmap has no batching rule for some ops (a channels-last Conv2D's clone):
                # then example by example; an error of the model itself the loop raises again
                except Exception:  # noqa: BLE001
                    paths["path"] = "loop"
            return [framework.to_numpy(r) for r in loop(*values)]

    def run_batch(inputs: Inputs) -> List[np.ndarray]:
        with losses_kept(model_ref()):
            grads = batch(state(), arrays(inputs.x), arrays(list(inputs.cotangents)), scale(inputs))
        return [framework.to_numpy(g) for g in grads]

    return Runner(run_chunk, run_batch, paths)
