"""Keras 3 on PyTorch, mirroring ``keras.src.backend.torch.trainer.TorchTrainer.train_step``.

The step calls the model (``training=True``), computes the loss as ``compute_loss`` gives it
(regularization included), multiplies it by the optimizer's ``scale_loss``, and ``backward()``s it;
``optimizer.apply`` then divides by the loss scales, accumulates and clips. Here the same forward pass
and loss are differentiated with ``torch.autograd.grad`` with respect to the wanted variables (and,
under a global norm, every trainable one), which leaves no ``.grad`` behind, then unscaled and clipped
in ``apply``'s order.

The forward pass writes what the step's would: moving statistics, seed-generator states, a stateful
RNN's states, the compiled loss's metric totals. They are read before and written back after. An
unseeded Dropout draws from torch's global generator (as the step's does): it runs in a fork of the
generator, so it draws the mask the next step will draw and leaves the generator where it was.
"""

import contextlib
from typing import Any, Iterator, List, Tuple

import torch

from .. import _paths
from .._cache import cached
from .._types import Model
from ..arguments import Batch
from ..detect import Flavour, model_class
from ..errors import UnsupportedModelError
from ..sources import extraction_view, flatten, output_structure
from . import Request, Result
from . import _keras3_optimizer as keras3_optimizer
from ._keras3_loss import build_compiled_loss, compiled_loss, sample_weights
from ._layers import layer_states, losses_kept


def gradients(model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
    _refuse_what_is_not_matched(model, flavour, request)
    sample_weight = sample_weights(flavour.root, batch.y, batch.sample_weight, request.class_weight)

    backend = _paths.load(flavour.root, "backend")
    tree = _paths.load(flavour.root, "tree")
    # Before the forward pass: Mean trackers it created would keep this call's totals.
    build_compiled_loss(model, backend, (batch.x, batch.y, sample_weight), tree.map_structure)
    wanted = list(request.variables)
    clip = request.clip and keras3_optimizer.clips(model.optimizer)
    # A global norm needs every gradient the optimizer updates: the others are differentiated too.
    wanted_ids = {id(v) for v in wanted}
    others = [v for v in model.trainable_variables if id(v) not in wanted_ids] if clip else []

    with _written_back(model, request.training), _differentiable(wanted), losses_kept(model):
        activations, y_pred = _forward(model, request, batch.x, backend, tree)
        if request.output_grads:  # per flat output: it, and its logits where a crossentropy reads them
            activations += [t for output in tree.flatten(y_pred) for t in (output, _logits(output))]
        loss = compiled_loss(model, batch.x, batch.y, y_pred, sample_weight, request.training)
        scaled_loss = model.optimizer.scale_loss(loss)
        grads = _gradients(scaled_loss, [v.value for v in wanted + others] + activations)

    with torch.no_grad():  # apply's order: unscale, then clip what it updates (non-trainable: unscaled only)
        scales = keras3_optimizer.loss_scales(model.optimizer)
        grads = [None if g is None else _unscaled(g, scales) for g in grads]
        if clip:
            trainable_ids = {id(v) for v in model.trainable_variables}
            updated = [
                i for i, v in enumerate(wanted + others) if id(v) in trainable_ids and grads[i] is not None
            ]
            clipped = keras3_optimizer.inner(model.optimizer)._clip_gradients([grads[i] for i in updated])
            for i, g in zip(updated, clipped):
                grads[i] = g
        loss_scale = float(model.optimizer.scale_loss(1.0))
    grads = grads[: len(wanted)] + grads[len(wanted + others) :]  # the params': variables, then tensors
    return Result(
        [None if g is None else g.detach().cpu().numpy() for g in grads],
        loss.detach(),
        loss_scale,
        applies_update=keras3_optimizer.applies_update(model.optimizer),
    )


def build(model: Model, flavour: Flavour, batch: Batch) -> None:
    """Build the model, its loss, metrics and optimizer from the first batch, as train_on_batch does."""
    model._symbolic_build(data_batch=(batch.x, batch.y, batch.sample_weight))


def _refuse_what_is_not_matched(model: Model, flavour: Flavour, request: Request) -> None:
    if flavour.custom_step:
        raise UnsupportedModelError(
            f"model: {type(model).__name__} overrides train_step, which compatgrad matches on the "
            "TensorFlow backend only; on PyTorch, call torch.autograd.grad in your step"
        )


def _forward(model: Model, request: Request, x: Any, backend: Any, tree: Any) -> Tuple[List[Any], Any]:
    """The step's forward pass: ``(activations, y_pred)``, the activations those of ``request.tensors``.

    Where tensors are wanted, the model's extraction view (its layers, inputs -> tensors + outputs)
    runs instead, on inputs that require a gradient, so that a model input gets one too.
    """
    training = request.training
    if not request.tensors:
        return [], model(x, training=training) if model._call_has_training_arg else model(x)
    outputs = output_structure(model)
    view = cached(
        model,
        ("keras3-torch view", *map(id, request.tensors)),
        (),
        lambda: extraction_view(model, model_class(model), tuple(request.tensors), flatten(outputs)),
    )
    flat = list(view(tree.map_structure(lambda value: _watched(backend, value), x), training=training))
    count = len(request.tensors)
    return flat[:count], tree.pack_sequence_as(outputs, flat[count:])


def _gradients(loss: Any, sources: List[Any]) -> List[Any]:
    """``torch.autograd.grad`` of ``loss`` with respect to ``sources``; None where the loss does not
    depend on one, or where nothing that requires a gradient leads to it (a frozen Embedding's output)."""
    live = [i for i, source in enumerate(sources) if source.requires_grad]
    grads: List[Any] = [None] * len(sources)
    found = torch.autograd.grad(loss, [sources[i] for i in live], allow_unused=True) if live else []
    for i, grad in zip(live, found):
        grads[i] = grad
    return grads


def _logits(output: Any) -> Any:
    """An output's logits, as Keras' crossentropies find them (``_keras_logits``); else the output."""
    return getattr(output, "_keras_logits", output)


def _watched(backend: Any, value: Any) -> Any:
    """An input as a tensor that requires a gradient (floating ones: an Embedding's indices cannot)."""
    if value is None:
        return None
    tensor = backend.convert_to_tensor(value)
    return tensor.detach().requires_grad_(True) if tensor.is_floating_point() else tensor


@contextlib.contextmanager
def _written_back(model: Model, training: bool) -> Iterator[None]:
    """What the forward pass and the loss write, read before and written back after: non-trainable
    variables (in training mode: moving statistics, seed states), stateful RNN states, the compiled
    loss's metric totals; torch's global random generators forked, so that Dropout draws the next
    step's mask."""
    variables = list(model.non_trainable_variables) if training else []
    # The compiled loss's Mean trackers (one per output of a multi-output model): no other metric is
    # written before the step's compute_metrics.
    variables += layer_states(model) + list(getattr(model._compile_loss, "variables", []))
    saved = {id(v): (v, v.value.detach().clone()) for v in variables}
    with torch.random.fork_rng(devices=_cuda_devices()):
        try:
            yield
        finally:
            with torch.no_grad():
                for variable, value in saved.values():
                    variable.value.copy_(value)


@contextlib.contextmanager
def _differentiable(variables: List[Any]) -> Iterator[None]:
    """Wanted non-trainable variables (moving statistics) made differentiable for the call: torch
    differentiates only tensors that require a gradient, and Keras' require one only where trainable."""
    switched = [v.value for v in variables if not v.value.requires_grad]
    for value in switched:
        value.requires_grad_(True)
    try:
        yield
    finally:
        for value in switched:
            value.requires_grad_(False)


def _cuda_devices() -> List[int]:
    """The CUDA devices whose generators a forward pass may draw from: those in use (none on a CPU)."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []


def _unscaled(grad: Any, scales: List[Any]) -> Any:
    for scale in scales:
        grad = grad / torch.as_tensor(getattr(scale, "value", scale), dtype=grad.dtype, device=grad.device)
    return grad
