"""What a Keras 3 optimizer's ``apply`` does to the gradients it is handed, on every backend.

``BaseOptimizer.apply`` divides by the loss scales (a LossScaleOptimizer's dynamic scale, the
``loss_scale_factor``), then ``_backend_apply_gradients`` accumulates (``gradient_accumulation_steps``)
and clips (``clipnorm``, ``clipvalue``, ``global_clipnorm``). Only attributes are read here: each
engine does the arithmetic in its own framework.
"""

from typing import Any, List

from .. import versions


def inner(optimizer: Any) -> Any:
    """The optimizer that accumulates and clips: a LossScaleOptimizer's inner optimizer, or itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def accumulation_steps(optimizer: Any) -> int:
    """``gradient_accumulation_steps`` (0 for none)."""
    return getattr(inner(optimizer), "gradient_accumulation_steps", None) or 0


def clips(optimizer: Any) -> bool:
    """Whether the optimizer clips the gradient of one batch: it clips, and not only the mean that
    gradient accumulation applies every k-th step."""
    clipping = inner(optimizer)
    setting = any(getattr(clipping, name, None) for name in ("clipnorm", "global_clipnorm", "clipvalue"))
    return setting and not (accumulation_steps(optimizer) and versions.clips_accumulated_mean(clipping))


def loss_scales(optimizer: Any) -> List[Any]:
    """What ``apply`` divides gradients by: a LossScaleOptimizer's dynamic scale (its initial one
    before it is built, as ``scale_loss`` says), the inner optimizer's ``loss_scale_factor``."""
    scales = []
    if inner(optimizer) is not optimizer:
        scales.append(optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale)
    if inner(optimizer).loss_scale_factor is not None:
        scales.append(inner(optimizer).loss_scale_factor)
    return scales


def applies_update(optimizer: Any) -> bool:
    """Whether the next step updates the weights: every step, or every k-th under gradient accumulation
    (the others only add their gradients to the optimizer's accumulators)."""
    steps = accumulation_steps(optimizer)
    return not steps or (int(versions.step_counter(inner(optimizer)).numpy()) + 1) % steps == 0
