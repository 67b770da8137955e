"""What gradients can be taken with respect to: the model's variables and tensors of its graph.

A graph tensor is a model input or a layer's output as the model's own graph computes it (a
functional or Sequential model). Eager backends get them from an extraction view of the model,
inputs -> [the wanted tensors, the model's outputs], built once and cached; graph backends take
symbolic gradients of the loss with respect to them directly.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import versions
from ._cache import cached
from ._types import Model, Tensor, Variable
from .arguments import name_of
from .errors import InvalidArgumentError, InvalidTypeError

LayerRef = Any  # a layer name, an index into model.layers, or a layer object


class GraphTensor(NamedTuple):
    tensor: Any
    name: str  # "<layer>/output", "<layer>/output_<i>" for a layer with several outputs
    layer: Any


class Sources(NamedTuple):
    params: List[Any]  # as given
    variables: List[Variable]  # the variables among params, in order
    tensors: List[Any]  # the graph tensors among params, in order
    names: List[str]  # one per param, unique within the call and the same on every call
    order: List[int]  # per param, its place in ``variables + tensors`` (the backends' order)

    def arrange(self, grads: Sequence[Any]) -> List[Any]:
        """``grads`` for ``variables + tensors``, back in the order of ``params``."""
        return [grads[i] for i in self.order]


def resolve(model: Model, params: Optional[Sequence[Any]]) -> Sources:
    if params is None:
        params = list(model.trainable_weights)
        if not params:
            raise InvalidArgumentError("params", "a model with trainable weights (is it built?)", "none")
    elif not isinstance(params, (list, tuple)):
        raise InvalidTypeError(
            "params", "a list of the model's variables or graph tensors", type(params).__name__
        )
    # Cached per list of params: the Sources hold them, so their ids stay theirs while the entry lives.
    return cached(model, ("sources",) + tuple(map(id, params)), (), lambda: _resolve(model, list(params)))


def _resolve(model: Model, params: List[Any]) -> Sources:
    owned = {id(v) for v in model.weights}
    variables: List[Variable] = []
    tensors: List[Tensor] = []
    names: List[str] = []
    places: List[
        Tuple[bool, int]
    ] = []  # per param: whether it is a tensor, and its index among the variables or the tensors
    for index, param in enumerate(params):
        if id(param) in owned:
            places.append((False, len(variables)))
            variables.append(param)
            names.append(name_of(param))
            continue
        found = graph_tensors(model).get(id(param))
        if found is None:
            raise InvalidArgumentError(
                f"params[{index}]",
                "a variable of this model or a tensor of its graph "
                "(model.inputs, a layer's output: see layer_outputs)",
                f"{name_of(param)} ({type(param).__name__})",
            )
        places.append((True, len(tensors)))
        tensors.append(param)
        names.append(found.name)
    order = [len(variables) + i if tensor else i for tensor, i in places]
    return Sources(params, variables, tensors, _unique(names), order)


def layer_outputs(model: Model, layers: Sequence[LayerRef]) -> List[Any]:
    """The output tensors of ``layers`` (names, indices into ``model.layers`` or layer objects) in the
    model's graph.

    A layer with several outputs contributes all of them, in order. A nested model counts as one
    layer: its output as the outer model computes it.
    """
    if not isinstance(layers, (list, tuple)):
        raise InvalidTypeError("layers", "a list of layer names, indices or layers", type(layers).__name__)
    tensors = graph_tensors(model).values()
    found = []
    for index, ref in enumerate(layers):
        layer = _layer(model, f"layers[{index}]", ref)
        outputs = [t.tensor for t in tensors if t.layer is layer]
        if not outputs:
            raise InvalidArgumentError(
                f"layers[{index}]",
                "a layer of this model's graph",
                f"{layer.name!r}, which is not in it",
            )
        found += outputs
    return found


def graph_tensors(model: Model) -> Dict[int, GraphTensor]:
    """The model's graph tensors by id; empty for a subclassed model (it has no graph)."""
    return cached(model, "graph tensors", (), lambda: _graph_tensors(model))


def _graph_tensors(model: Model) -> Dict[int, GraphTensor]:
    graph = versions.functional_graph(model)
    found: Dict[int, GraphTensor] = {}
    for _, nodes in sorted(
        (getattr(graph, "_nodes_by_depth", None) or {}).items(), reverse=True
    ):  # inputs first
        for node in nodes:
            layer = versions.node_layer(node)
            outputs = flatten(node.output_tensors)
            for i, tensor in enumerate(outputs):
                name = "{}/output{}".format(layer.name, f"_{i}" if len(outputs) > 1 else "")
                found.setdefault(id(tensor), GraphTensor(tensor, name, layer))
    return found


def input_structure(model: Model) -> Any:
    """The model's inputs, nested as its call takes them (``versions.nested_endpoints``)."""
    return _structure(model, "inputs")


def output_structure(model: Model) -> Any:
    return _structure(model, "outputs")


def _structure(model: Model, which: str) -> Any:
    nested = versions.nested_endpoints(versions.functional_graph(model), which)
    return getattr(model, which) if nested is None else nested


def _layer(model: Model, argument: str, ref: LayerRef) -> Any:
    layers = list(model.layers)
    if isinstance(ref, str):
        for layer in layers:
            if layer.name == ref:
                return layer
        raise InvalidArgumentError(
            argument, f"a layer name among {[layer.name for layer in layers]}", repr(ref)
        )
    if isinstance(ref, int) and not isinstance(ref, bool):
        if -len(layers) <= ref < len(layers):
            return layers[ref]
        raise InvalidArgumentError(argument, f"an index into model.layers (0..{len(layers) - 1})", ref)
    if any(layer is ref for layer in layers):
        return ref
    raise InvalidArgumentError(
        argument, "a layer name, an index into model.layers or one of its layers", _describe_layer(ref)
    )


def _describe_layer(ref: Any) -> str:
    name = getattr(ref, "name", None)
    return (
        f"{type(ref).__name__} {name!r} (not a layer of this model: "
        "a layer inside a nested model is not in the outer graph)"
        if name
        else repr(ref)
    )


def flatten(value: Any) -> List[Any]:
    """The leaves of nested lists and tuples."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten(item)]
    return [value]


def _unique(names: List[str]) -> List[str]:
    """Repeated names get " (2)", " (3)", ... in order, so they are the same on every call."""
    seen: Dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique


def extraction_view(model: Model, model_class: Any, tensors: Tuple[Any, ...], flat_outputs: List[Any]) -> Any:
    """A model sharing ``model``'s layers: inputs -> tensors + outputs, flat (Keras 3.3 takes no nesting).

    Building it adds no node to the model.
    """
    return model_class(input_structure(model), list(tensors) + list(flat_outputs), name="compatgrad_view")
