"""An eager step under the model's ``tf.distribute`` strategy, fed and reduced as its training step does.

Keras 2 (``single_batch_iterator``) splits this worker's batch across its replicas; Keras 3
(``train_on_batch``) hands every replica the whole batch. The losses are already divided by the
replica count (except where ``versions.divides_loss_by_replicas`` says Keras 3 does not: every
replica has all of the loss), so the per-replica losses add up to the batch loss, and the gradients
come out of the optimizer's aggregation as the cross-replica sum, the same on every replica (except
where ``versions.sums_across_replicas`` says Keras 3 does not sum: each replica keeps its own).
"""

from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from .. import versions
from .._types import Model, Tensor
from ..data import is_distributed
from ..errors import UnsupportedModelError
from . import StepOutput

# Strategies whose training step is strategy.run + an all-reduce in replica context.
SUPPORTED = (
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategy",
    "OneDeviceStrategy",
)


def strategy_of(model: Model) -> Optional[Any]:
    """The model's strategy; None for the default (no) strategy. Unsupported ones raise."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        return None
    names = versions.strategy_class_names(strategy)
    if any(name.startswith("_DefaultDistributionStrategy") for name in names):
        return None
    if not any(name in SUPPORTED for name in names):
        raise UnsupportedModelError(
            "model: built under {}, which compatgrad does not support yet (its step updates variables on "
            "parameter servers or TPU hosts); supported: {}".format(
                type(strategy).__name__, ", ".join(SUPPORTED)
            )
        )
    return strategy


def distributed_step(strategy: Any, replica_step: Callable, tensor_count: int, combine: str) -> Callable:
    """``replica_step(x, y[, sample_weight]) -> (grads, loss, loss_scale)`` run on every replica, reduced.

    Gradients of variables are the same on every replica (taken from the first). Gradients of
    graph tensors belong to each replica's examples: "concat" splits the batch across replicas
    and joins them back; "sum" gives every replica the whole batch and 1/replicas of the loss;
    "first" gives every replica the whole batch and all of the loss (Keras 3.3-3.7).
    """
    split = combine == "concat"

    def step(*data: Any) -> StepOutput:  # (x, y) or (x, y, sample_weight): no None through strategy.run
        already_split = is_distributed(tf.nest.flatten(data[0])[0])  # a distributed dataset's batch
        if split and not already_split:
            data = split_batch(strategy, data)
        grads, loss, loss_scale = strategy.run(replica_step, args=data)
        local = strategy.experimental_local_results
        variables = len(grads) - tensor_count
        reduced: List[Any] = [None if g is None else local(g)[0] for g in grads[:variables]]
        for g in grads[variables:]:
            reduced.append(None if g is None else _combine(list(local(g)), combine))
        if combine == "first":
            loss = local(loss)[0]
        else:
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        return reduced, loss, local(loss_scale)[0]

    return step


def _combine(parts: List[Tensor], combine: str) -> Tensor:
    """One graph tensor's gradient from the replicas' ``parts``, as ``distributed_step`` describes."""
    if combine == "concat":
        return tf.concat(parts, 0)
    return tf.add_n(parts) if combine == "sum" else parts[0]


def split_batch(strategy: Any, data: Tuple[Any, ...]) -> Any:
    """This worker's batch in contiguous parts, one per local replica, sized as tf.data's rebatching does."""
    local_replicas = len(strategy.extended.worker_devices)

    def part(context: Any) -> Tuple[Any, ...]:
        index = context.replica_id_in_sync_group % local_replicas
        size = tf.shape(tf.nest.flatten(data[0])[0])[0]
        base, extra = size // local_replicas, size % local_replicas
        start = index * base + tf.minimum(index, extra)
        length = base + tf.cast(index < extra, size.dtype)
        return tf.nest.map_structure(lambda t: t[start : start + length], data)

    return strategy.experimental_distribute_values_from_function(part)
