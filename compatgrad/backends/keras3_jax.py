"""Keras 3 on JAX, mirroring ``keras.src.backend.jax.trainer.JAXTrainer.train_step``.

The step differentiates ``compute_loss_and_updates`` (the loss as ``compute_loss`` gives it,
regularization included, times the optimizer's ``scale_loss``) with respect to the trainable variables'
values, and ``optimizer.stateless_apply`` divides by the loss scales, accumulates and clips. Here the
same function is differentiated with respect to the wanted variables' values, then unscaled and
clipped in that order, in one ``jax.jit`` function per model and request.

Layer outputs and model inputs as params (``_Probed``): the forward pass runs through the model's
extraction view with a zero added to each wanted tensor where it is made, and the loss, as
``compute_loss_and_updates`` computes it, is differentiated with respect to those zeros as well.

It is called with the model's state as the next step would be: Dropout draws its masks from the
SeedGenerator states the step will use, BatchNormalization normalizes by the batch. The state it
returns (moving statistics, seeds, metric totals) is dropped: the call changes nothing.
"""

import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import jax
import numpy as np

from .. import _paths
from .._cache import cached
from .._types import Model, ModelRef
from ..arguments import Batch
from ..detect import Flavour, model_class
from ..errors import InvalidArgumentError, NotCompiledError, UnsupportedModelError
from ..sources import extraction_view, flatten, output_structure
from . import Request, Result
from . import _keras3_optimizer as keras3_optimizer
from ._keras3_loss import build_compiled_loss, sample_weights

# The step's state, as the trainer passes it: the values of the trainable, non-trainable, metrics and
# optimizer variables.
State = Tuple[List[Any], List[Any], List[Any], List[Any]]


class Built(NamedTuple):
    """What is built once per model and request."""

    # (trainable values, non-trainable values, metrics values, optimizer values, x, y, sample_weight)
    # -> (gradients of the wanted variables, unscaled loss, loss scale), jitted
    step: Callable[..., Tuple[List[Any], Any, Any]]
    # the same arguments -> whether the loss reads each wanted variable (found on the first call)
    connected: Callable[..., List[bool]]


def gradients(model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
    trainable = model.trainable_variables  # read at every call, as the trainer reads it
    _refuse_what_is_not_matched(model, flavour, request, trainable)
    model.jax_state_sync()  # during fit the variables lag the trainer's state until it syncs them
    sample_weight = sample_weights(flavour.root, batch.y, batch.sample_weight, request.class_weight)

    backend = _paths.load(flavour.root, "backend")
    # Before the step is traced: Mean trackers it created would be missing from the state it was traced with.
    build_compiled_loss(model, backend, (batch.x, batch.y, sample_weight), jax.tree_util.tree_map)
    built = _step(model, flavour, backend, request, trainable)
    # The state as the trainer reads it at every call (metrics built since are in it too).
    arguments = (
        [v.value for v in trainable],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.metrics_variables],
        [v.value for v in model.optimizer.variables],
        batch.x,
        batch.y,
        sample_weight,
    )
    linked = built.connected(*arguments)
    grads, loss, loss_scale = built.step(*arguments)
    found = [np.array(g) if read else None for g, read in zip(grads, linked)]
    if request.output_grads:  # per flat output (its gradient, its logits'): no logits on JAX
        count = len(request.variables) + len(request.tensors)
        found = found[:count] + [g for output in found[count:] for g in (output, None)]
    return Result(
        found,
        loss,
        loss_scale,
        applies_update=keras3_optimizer.applies_update(model.optimizer),
    )


def build(model: Model, flavour: Flavour, batch: Batch) -> None:
    """Build the model, its loss, metrics and optimizer from the first batch, as train_on_batch does."""
    model._symbolic_build(data_batch=(batch.x, batch.y, batch.sample_weight))


def _refuse_what_is_not_matched(
    model: Model, flavour: Flavour, request: Request, trainable: List[Any]
) -> None:
    if flavour.custom_step:
        raise UnsupportedModelError(
            f"model: {type(model).__name__} overrides train_step, which compatgrad matches on the "
            "TensorFlow backend only; on JAX, call your step's own jax.grad"
        )
    optimizer = keras3_optimizer.inner(model.optimizer)
    built_for = len(optimizer._trainable_variables) if optimizer.built else None
    if built_for is not None and built_for != len(trainable):
        raise UnsupportedModelError(
            f"model: expected the {built_for} trainable variables its optimizer was built for, got "
            f"{len(trainable)} (a layer frozen or unfrozen since compile): Keras' JAX "
            "step refuses to train it; compile the model again"
        )
    if _paths.load(flavour.root, "distribution").distribution() is not None:
        raise UnsupportedModelError(
            "model: trains under a keras.distribution layout, which compatgrad does not support on JAX; "
            "use one device"
        )


def _step(model: Model, flavour: Flavour, backend: Any, request: Request, trainable: List[Any]) -> Built:
    """The jitted gradient function, and which wanted variables the loss depends on (found once)."""
    optimizer = model.optimizer
    # The trainable variables too: the step reads them at every call (a recompile rebuilds the rest).
    key = ("keras3-jax", *request.key(), request.training, optimizer.built, *map(id, trainable))
    state = (optimizer, model._compile_loss)
    return cached(model, key, state, lambda: _build(weakref.ref(model), flavour, backend, request))


def _build(model_ref: ModelRef, flavour: Flavour, backend: Any, request: Request) -> Built:
    model = model_ref()
    training = request.training
    probed = (
        _Probed(model, flavour, request.tensors, request.output_grads)
        if request.tensors or request.output_grads
        else None
    )
    trainable = list(model.trainable_variables)
    non_trainable = list(model.non_trainable_variables)
    # Each wanted variable's place in the step's state: (0, i) trainable, (1, i) non-trainable.
    places = [_place(v, trainable, non_trainable) for v in request.variables]
    wanted_ids = {id(v) for v in request.variables}
    clip = request.clip and keras3_optimizer.clips(model.optimizer)
    # A global norm needs every gradient the optimizer updates: the others are differentiated too.
    others = [i for i, v in enumerate(trainable) if id(v) not in wanted_ids] if clip else []

    def scaled_loss(
        wanted: List[Any],
        others_values: List[Any],
        state: State,
        x: Any,
        y: Any,
        sample_weight: Any,
    ) -> Tuple[Any, Any]:
        """The step's loss as a function of the wanted variables' values then the wanted tensors'
        probes (and of the others' values that a global norm needs), the rest of the state held fixed."""
        trainable_values, non_trainable_values, metrics_values, optimizer_values = (list(s) for s in state)
        for (kind, index), value in zip(places, wanted):
            (trainable_values if kind == 0 else non_trainable_values)[index] = value
        for index, value in zip(others, others_values):
            trainable_values[index] = value
        model = model_ref()
        if probed is not None:
            return probed.loss(
                model,
                backend,
                (trainable_values, non_trainable_values, metrics_values, optimizer_values),
                wanted[len(places) :],
                x,
                y,
                sample_weight,
                training,
            )
        loss, (unscaled_loss, *_) = model.compute_loss_and_updates(
            trainable_values,
            non_trainable_values,
            metrics_values,
            x,
            y,
            sample_weight,
            training=training,
            optimizer_variables=optimizer_values,
        )
        if not training:  # the step scales the loss it trains on; learning phase 0 must too
            with _optimizer_state(backend, model, optimizer_values):
                loss = model.optimizer.scale_loss(unscaled_loss)
        return loss, unscaled_loss

    def step(*state_and_batch: Any) -> Tuple[List[Any], Any, Any]:
        model = model_ref()
        state, (x, y, sample_weight) = state_and_batch[:4], state_and_batch[4:]
        wanted = _wanted(state, x)
        others_values = [state[0][i] for i in others]
        optimizer_values = state[3]
        (wanted_grads, others_grads), unscaled_loss = jax.grad(scaled_loss, argnums=(0, 1), has_aux=True)(
            wanted, others_values, state, x, y, sample_weight
        )
        with _optimizer_state(backend, model, optimizer_values):
            # apply's order: unscale, then clip what it updates (non-trainable variables: unscaled only)
            scales = keras3_optimizer.loss_scales(model.optimizer)
            grads = [_unscaled(g, scales) for g in list(wanted_grads) + list(others_grads)]
            loss_scale = model.optimizer.scale_loss(1.0)
            if clip:
                updated = [i for i, (kind, _) in enumerate(places) if kind == 0] + list(
                    range(len(wanted), len(grads))
                )
                clipped = keras3_optimizer.inner(model.optimizer)._clip_gradients([grads[i] for i in updated])
                for i, g in zip(updated, clipped):
                    grads[i] = g
        return grads[: len(wanted)], unscaled_loss, loss_scale

    def _wanted(state: Any, x: Any) -> List[Any]:
        """The wanted variables' values, then a zero probe per wanted tensor."""
        values = [state[kind][index] for kind, index in places]
        return values + (probed.zeros(model_ref(), backend, state, x, training) if probed is not None else [])

    found: List[List[bool]] = []  # which wanted variables the loss reads, from the first call's arguments

    def connected(*state_and_batch: Any) -> List[bool]:
        if not found:
            state, (x, y, sample_weight) = state_and_batch[:4], state_and_batch[4:]
            wanted = _wanted(state, x)
            found.append(_read_inputs(scaled_loss, wanted, state, x, y, sample_weight))
        return found[0]

    return Built(jax.jit(step), connected)


class _Probed:
    """The step's forward pass with a zero probe added to each wanted tensor as it is computed, and
    (``output_grads``) to each of the model's flat outputs: the loss's gradient with respect to a probe
    is its gradient with respect to the tensor (jax.grad takes no tensor computed inside the function
    it differentiates).

    Wanted tensors are taken through the model's extraction view (its layers: inputs -> tensors +
    outputs). A probe goes where its tensor is made: on a model input, or on the output of the one call
    of the layer that made it (a layer called more than once in the graph is refused: the call could
    not be told apart).
    """

    def __init__(self, model: Model, flavour: Flavour, tensors: Sequence[Any], output_grads: bool):
        self.count = len(tensors)
        self.output_grads = output_grads
        self.operation_fn = _paths.load(flavour.root, "functional").operation_fn
        self.tree = _paths.load(flavour.root, "tree")
        self.view: Any = None
        # Per wanted tensor: ("input", input index) or (its layer, which of the layer's outputs).
        self.places: List[Tuple[Any, int]] = []
        if tensors:
            self.outputs = output_structure(model)
            self.view = extraction_view(model, model_class(model), tuple(tensors), flatten(self.outputs))
            self.places = _places(self.view, tensors)

    def zeros(self, model: Model, backend: Any, state: Any, x: Any, training: bool) -> List[Any]:
        """A zero per probe, of its tensor's shape and dtype (an integer input's: never added, so no
        gradient)."""
        mapping = _variables_state(model, state[0], state[1])

        def probed(x: Any) -> List[Any]:
            tensors, y_pred = self._forward(model, x, None, training)
            return tensors + (self.tree.flatten(y_pred) if self.output_grads else [])

        with backend.StatelessScope(state_mapping=mapping):
            specs = jax.eval_shape(probed, x)
        return [
            jax.numpy.zeros(spec.shape, spec.dtype)
            if jax.numpy.issubdtype(spec.dtype, jax.numpy.floating)
            else jax.numpy.zeros((), "float32")
            for spec in specs
        ]

    def loss(
        self,
        model: Model,
        backend: Any,
        state: State,
        probes: List[Any],
        x: Any,
        y: Any,
        sample_weight: Any,
        training: bool,
    ) -> Tuple[Any, Any]:
        """(scaled loss, loss), as ``compute_loss_and_updates`` computes them, the forward pass probed."""
        trainable_values, non_trainable_values, metrics_values, optimizer_values = state
        mapping = _variables_state(model, trainable_values, non_trainable_values)
        with backend.StatelessScope(state_mapping=mapping, collect_losses=True):
            _, y_pred = self._forward(model, x, probes, training)
            losses = model.losses
        if losses:  # the forward pass's add_loss losses, as compute_loss_and_updates hands them on
            model._losses_override = losses
        try:
            loss, _ = model.stateless_compute_loss(
                trainable_values,
                non_trainable_values,
                metrics_values,
                x=x,
                y=y,
                y_pred=y_pred,
                sample_weight=sample_weight,
                training=training,
            )
        finally:
            if losses:
                model._losses_override = []
        with _optimizer_state(backend, model, optimizer_values):
            return model.optimizer.scale_loss(loss), loss

    def _forward(
        self, model: Model, x: Any, probes: Optional[List[Any]], training: bool
    ) -> Tuple[List[Any], Any]:
        """(the wanted tensors as computed, y_pred), ``probes`` added (None: nothing added)."""
        tensor_probes = probes[: self.count] if probes is not None else [None] * self.count
        tensors: List[Any] = []
        if self.view is None:
            kwargs = {"training": training} if model._call_has_training_arg else {}
            y_pred = model.call(x, **kwargs)
        else:
            tensors, y_pred = self._through_view(x, tensor_probes, training)
        if probes is not None and self.output_grads:
            leaves = self.tree.flatten(y_pred)
            added = [leaf + probe for leaf, probe in zip(leaves, probes[self.count :])]
            y_pred = self.tree.pack_sequence_as(y_pred, added)
        return tensors, y_pred

    def _through_view(self, x: Any, probes: List[Any], training: bool) -> Tuple[List[Any], Any]:
        flat_x = list(self.view._standardize_inputs(x))
        added: Dict[int, List[Tuple[int, Any]]] = {}  # per layer: (its output's index, probe)
        for (where, index), probe in zip(self.places, probes):
            if where == "input":
                if probe is not None and jax.numpy.issubdtype(flat_x[index].dtype, jax.numpy.floating):
                    flat_x[index] = flat_x[index] + probe
            elif probe is not None:
                added.setdefault(id(where), []).append((index, probe))

        def operation(layer: Any) -> Callable[..., Any]:
            call = self.operation_fn(layer, training=training)
            if id(layer) not in added:
                return call

            def probed(*args: Any, **kwargs: Any) -> Any:
                outputs = call(*args, **kwargs)
                flat = flatten(outputs)
                for index, probe in added[id(layer)]:
                    flat[index] = flat[index] + probe
                return flat[0] if not isinstance(outputs, (list, tuple)) else type(outputs)(flat)

            return probed

        flat = list(self.view._run_through_graph(flat_x, operation_fn=operation))
        tensors = [flat_x[i] if where == "input" else t for (where, i), t in zip(self.places, flat)]
        return tensors, self.tree.pack_sequence_as(self.outputs, flat[self.count :])


def _places(view: Any, tensors: Sequence[Any]) -> List[Tuple[Any, int]]:
    """Where each wanted tensor is made in ``view``: ("input", its index), or (the layer, which output)."""
    inputs = {id(t): i for i, t in enumerate(view.inputs)}
    calls: Dict[int, int] = {}
    for nodes in view._nodes_by_depth.values():
        for node in nodes:
            calls[id(node.operation)] = calls.get(id(node.operation), 0) + 1
    places: List[Tuple[Any, int]] = []
    for tensor in tensors:
        if id(tensor) in inputs:
            places.append(("input", inputs[id(tensor)]))
            continue
        layer, _, index = tensor._keras_history
        if calls.get(id(layer), 0) != 1:
            raise UnsupportedModelError(
                f"params: {layer.name!r} is called {calls.get(id(layer), 0)} times in the model's graph, "
                "and on JAX compatgrad takes the output of a layer called once; ask for its variables"
            )
        places.append((layer, index))
    return places


def _variables_state(model: Model, trainable_values: List[Any], non_trainable_values: List[Any]) -> List[Any]:
    return list(zip(model.trainable_variables, trainable_values)) + list(
        zip(model.non_trainable_variables, non_trainable_values)
    )


def _place(variable: Any, trainable: Sequence[Any], non_trainable: Sequence[Any]) -> Tuple[int, int]:
    for kind, variables in enumerate((trainable, non_trainable)):
        for index, candidate in enumerate(variables):
            if candidate is variable:
                return kind, index
    raise InvalidArgumentError("params", "variables of the model", repr(variable))


def _unscaled(grad: Any, scales: Sequence[Any]) -> Any:
    for scale in scales:
        grad = grad / jax.numpy.asarray(scale, grad.dtype)
    return grad


def _optimizer_state(backend: Any, model: Model, optimizer_values: List[Any]) -> Any:
    """A scope in which the optimizer's variables read as ``optimizer_values`` (the step's state)."""
    return backend.StatelessScope(state_mapping=list(zip(model.optimizer.variables, optimizer_values)))


def _read_inputs(scaled_loss: Callable[..., Any], wanted: List[Any], *rest: Any) -> List[bool]:
    """Which of ``wanted`` the loss reads, followed back from the loss through its traced program.

    ``jax.grad`` gives an unread variable zeros (and the step applies them); compatgrad calls it
    unconnected, as it does on TensorFlow, and so is a value the loss reads only through integers.
    An operation with a program inside (a loop, a condition) counts as reading every input it takes,
    so nothing the loss reads is ever called unconnected.
    """
    program = jax.make_jaxpr(scaled_loss)(wanted, [], *rest).jaxpr
    loss = program.outvars[0]
    if hasattr(loss, "val"):  # a constant: neither a compiled loss nor an add_loss loss
        raise NotCompiledError(
            "model: expected a model compiled with a loss (or with add_loss losses), got none"
        )
    read = {loss}
    for equation in reversed(program.eqns):
        if any(v in read for v in equation.outvars):
            # A literal holds a val; an integer value carries no gradient (an Embedding's indices, a
            # float input cast to them: TensorFlow too calls it unconnected).
            read.update(
                v
                for v in equation.invars
                if not hasattr(v, "val") and jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact)
            )
    return [v in read for v in program.invars[: len(wanted)]]
