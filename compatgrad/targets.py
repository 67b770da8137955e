"""What gradients can be taken with respect to: the model's variables and tensors of its graph.

A graph tensor is a model input or a layer's output as the model's own graph computes it (a
functional or Sequential model). Eager backends get them from an extraction view of the model,
inputs -> [the wanted tensors, the model's outputs], built once and cached; graph backends take
symbolic gradients of the loss with respect to them directly.
"""
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._cache import cached
from .errors import InvalidArgumentError, InvalidTypeError
from .inputs import name_of

LayerRef = Any  # a layer name, an index into model.layers, or a layer object


class GraphTensor(NamedTuple):
    tensor: Any
    name: str  # "<layer>/output", "<layer>/output_<i>" for a layer with several outputs
    layer: Any


class Targets(NamedTuple):
    params: List[Any]  # as given
    variables: List[Any]  # the variables among params, in order
    tensors: List[Any]  # the graph tensors among params, in order
    names: List[str]  # one per param, unique within the call and the same on every call
    order: List[int]  # per param, its place in ``variables + tensors`` (the backends' order)

    def arrange(self, grads: Sequence[Any]) -> List[Any]:
        """``grads`` for ``variables + tensors``, back in the order of ``params``."""
        return [grads[i] for i in self.order]


def resolve(model: Any, params: Optional[Sequence[Any]]) -> Targets:
    if params is None:
        params = list(model.trainable_weights)
        if not params:
            raise InvalidArgumentError("params", "a model with trainable weights (is it built?)", "none")
    elif not isinstance(params, (list, tuple)):
        raise InvalidTypeError("params", "a list of the model's variables or graph tensors", type(params).__name__)
    # Cached per list of params: the Targets hold them, so their ids stay theirs while the entry lives.
    return cached(model, ("targets",) + tuple(map(id, params)), (), lambda: _resolve(model, list(params)))


def _resolve(model: Any, params: List[Any]) -> Targets:
    owned = {id(v) for v in model.weights}
    variables, tensors, names = [], [], []
    places = []  # per param: whether it is a tensor, and its index among the variables or the tensors
    for index, param in enumerate(params):
        if id(param) in owned:
            places.append((False, len(variables)))
            variables.append(param)
            names.append(name_of(param))
            continue
        found = graph_tensors(model).get(id(param))
        if found is None:
            raise InvalidArgumentError(
                "params[{}]".format(index),
                "a variable of this model or a tensor of its graph (model.inputs, a layer's output: see layer_outputs)",
                "{} ({})".format(name_of(param), type(param).__name__),
            )
        places.append((True, len(tensors)))
        tensors.append(param)
        names.append(found.name)
    order = [len(variables) + i if tensor else i for tensor, i in places]
    return Targets(params, variables, tensors, _unique(names), order)


def layer_outputs(model: Any, layers: Sequence[LayerRef]) -> List[Any]:
    """The output tensors of ``layers`` (names, indices into ``model.layers`` or layer objects) in the model's graph.

    A layer with several outputs contributes all of them, in order. A nested model counts as one
    layer: its output as the outer model computes it.
    """
    if not isinstance(layers, (list, tuple)):
        raise InvalidTypeError("layers", "a list of layer names, indices or layers", type(layers).__name__)
    tensors = graph_tensors(model).values()
    found = []
    for index, ref in enumerate(layers):
        layer = _layer(model, "layers[{}]".format(index), ref)
        outputs = [t.tensor for t in tensors if t.layer is layer]
        if not outputs:
            raise InvalidArgumentError("layers[{}]".format(index), "a layer of this model's graph", "{!r}, which is not in it".format(layer.name))
        found += outputs
    return found


def graph_tensors(model: Any) -> Dict[int, GraphTensor]:
    """The model's graph tensors by id; empty for a subclassed model (it has no graph)."""
    return cached(model, "graph tensors", (), lambda: _graph_tensors(model))


def _graph_tensors(model: Any) -> Dict[int, GraphTensor]:
    graph = getattr(model, "_functional", None) or model  # a Keras 3 Sequential keeps its graph there
    found: Dict[int, GraphTensor] = {}
    for _, nodes in sorted((getattr(graph, "_nodes_by_depth", None) or {}).items(), reverse=True):  # inputs first
        for node in nodes:
            # Node.operation (Keras 3), Node.layer (Keras >= 2.4), Node.outbound_layer (before)
            layer = getattr(node, "operation", None) or getattr(node, "layer", None) or node.outbound_layer
            outputs = _flatten(node.output_tensors)
            for i, tensor in enumerate(outputs):
                name = "{}/output{}".format(layer.name, "_{}".format(i) if len(outputs) > 1 else "")
                found.setdefault(id(tensor), GraphTensor(tensor, name, layer))
    return found


def input_structure(model: Any) -> Any:
    """The model's inputs, nested as its call takes them (Keras 2 ``_nested_inputs``, Keras 3 ``_inputs_struct``)."""
    return _structure(model, "inputs")


def output_structure(model: Any) -> Any:
    return _structure(model, "outputs")


def _structure(model: Any, which: str) -> Any:
    graph = getattr(model, "_functional", None) or model
    for attribute in ("_{}_struct".format(which), "_nested_{}".format(which)):
        if getattr(graph, attribute, None) is not None:
            return getattr(graph, attribute)
    return getattr(model, which)


def _layer(model: Any, argument: str, ref: LayerRef) -> Any:
    layers = list(model.layers)
    if isinstance(ref, str):
        for layer in layers:
            if layer.name == ref:
                return layer
        raise InvalidArgumentError(argument, "a layer name among {}".format([layer.name for layer in layers]), repr(ref))
    if isinstance(ref, int) and not isinstance(ref, bool):
        if -len(layers) <= ref < len(layers):
            return layers[ref]
        raise InvalidArgumentError(argument, "an index into model.layers (0..{})".format(len(layers) - 1), ref)
    if any(layer is ref for layer in layers):
        return ref
    raise InvalidArgumentError(argument, "a layer name, an index into model.layers or one of its layers", _describe_layer(ref))


def _describe_layer(ref: Any) -> str:
    name = getattr(ref, "name", None)
    return "{} {!r} (not a layer of this model: a layer inside a nested model is not in the outer graph)".format(type(ref).__name__, name) if name else repr(ref)


def _flatten(value: Any) -> List[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def _unique(names: List[str]) -> List[str]:
    """Repeated names get " (2)", " (3)", ... in order, so they are the same on every call."""
    seen: Dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else "{} ({})".format(name, seen[name]))
    return unique


def extraction_view(model: Any, model_class: Any, tensors: Tuple[Any, ...], flat_outputs: List[Any]) -> Any:
    """A model sharing ``model``'s layers: inputs -> tensors + outputs, flat (Keras 3.3 takes no nesting).

    Building it adds no node to the model.
    """
    return model_class(input_structure(model), list(tensors) + list(flat_outputs), name="compatgrad_view")
