"""A Keras 2 optimizer's own loss scaling, aggregation and clipping, shared by the graph and eager backends.

Both engines end in ``optimizer.apply_gradients`` (graph: through ``get_updates``), so both get
the same pipeline: scale -> gradient -> unscale -> aggregate -> clip.
"""
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

Gradient = Callable[[Any, List[Any]], List[Any]]  # (loss, variables) -> gradients, None where unconnected

_CLIP_SETTINGS = ("clipnorm", "clipvalue", "global_clipnorm", "_clipnorm", "_clipvalue", "_global_clipnorm", "gradient_transformers")


class Keras2Optimizer:
    def __init__(self, optimizer: Any):
        self.optimizer = optimizer
        # LossScaleOptimizer (experimental, legacy and V3) all have these two methods.
        self.scales = hasattr(optimizer, "get_scaled_loss") and hasattr(optimizer, "get_unscaled_gradients")
        inner = getattr(optimizer, "inner_optimizer", None) or getattr(optimizer, "_optimizer", None)
        # Aggregation and clipping belong to the wrapped optimizer (the wrapper lacks clipnorm & co).
        self.inner = inner if self.scales and inner is not None else optimizer
        self.clips = any(getattr(self.inner, name, None) for name in _CLIP_SETTINGS)

    def scale(self, loss: Any) -> Any:
        return self.optimizer.get_scaled_loss(loss) if self.scales else loss

    def unscale(self, grads: List[Any]) -> List[Any]:
        return list(self.optimizer.get_unscaled_gradients(grads)) if self.scales else grads

    def aggregate(self, pairs: List[tuple]) -> List[tuple]:
        """Cross-replica sum, as apply_gradients does it (an identity outside a distribution strategy)."""
        inner = self.inner
        if hasattr(inner, "aggregate_gradients"):  # optimizer.Optimizer, Keras >= 2.11
            return list(inner.aggregate_gradients(pairs))
        if hasattr(inner, "_transform_unaggregated_gradients"):  # OptimizerV2, TF >= 2.4
            pairs = inner._transform_unaggregated_gradients(pairs)
        if not getattr(inner, "_HAS_AGGREGATE_GRAD", False):  # TF 1.x, standalone Keras
            return list(pairs)
        aggregated = list(inner._aggregate_gradients(pairs))
        if aggregated and not isinstance(aggregated[0], tuple):  # TF 2.2-2.3 return bare gradients
            aggregated = list(zip(aggregated, [v for _, v in pairs]))
        return aggregated

    def clip(self, pairs: List[tuple]) -> List[Any]:
        """The optimizer's clipping, in its own order; ``pairs`` hold every trainable variable it updates."""
        inner, grads = self.inner, [g for g, _ in pairs]
        if hasattr(inner, "_transform_gradients"):  # OptimizerV2, TF >= 2.4: clipvalue, clipnorm, global_clipnorm
            return [g for g, _ in inner._transform_gradients(list(pairs))]
        if hasattr(inner, "_clip_gradients"):  # optimizer.Optimizer (2.11+) and OptimizerV2 in TF 2.2-2.3
            return list(inner._clip_gradients(grads))
        if type(inner).__module__.split(".")[0] == "keras":  # standalone Keras 2.2/2.3: a global norm
            return _standalone_keras_clip(inner, grads)
        # OptimizerV2.get_gradients of TF 1.x-2.1: per-tensor clipnorm, then clipvalue.
        if hasattr(inner, "clipnorm"):
            grads = [tf.clip_by_norm(g, inner.clipnorm) for g in grads]
        if hasattr(inner, "clipvalue"):
            grads = [tf.clip_by_value(g, -inner.clipvalue, inner.clipvalue) for g in grads]
        return grads


    def gradients(
        self,
        scaled_loss: Any,
        params: Sequence[Any],
        trainable: Sequence[Any],
        gradient: Gradient,
        clip: bool,
    ) -> List[Optional[Any]]:
        """gradient -> unscale -> aggregate -> clip: what the training step hands to the update.

        ``scaled_loss`` is ``self.scale(loss)``, computed where ``gradient`` can see it (inside the
        tape). Clipping sees every trainable variable, since a global norm needs them all; params the
        optimizer does not update (non-trainable variables) come unscaled and aggregated but unclipped.
        Params the loss does not depend on get None.
        """
        param_ids = [id(p) for p in params]
        wrt = list(params)
        if clip and self.clips:
            wrt += [v for v in trainable if id(v) not in param_ids]

        grads = self.unscale(list(gradient(scaled_loss, wrt)))

        present = [i for i, g in enumerate(grads) if g is not None]
        aggregated = self.aggregate([(grads[i], wrt[i]) for i in present]) if present else []
        for i, (g, _) in zip(present, aggregated):
            grads[i] = g
        if clip and self.clips:
            trainable_ids = {id(v) for v in trainable}
            updated = [i for i in present if id(wrt[i]) in trainable_ids]
            for i, g in zip(updated, self.clip([(grads[i], wrt[i]) for i in updated])):
                grads[i] = g
        return [None if g is None else tf.convert_to_tensor(g) for g in grads[: len(params)]]

def _standalone_keras_clip(optimizer: Any, grads: List[Any]) -> List[Any]:
    """As standalone Keras 2.2/2.3 ``Optimizer.get_gradients`` clips."""
    import keras.backend as K
    from keras.optimizers import clip_norm

    if getattr(optimizer, "clipnorm", 0) > 0:
        norm = K.sqrt(sum([K.sum(K.square(g)) for g in grads]))
        grads = [clip_norm(g, optimizer.clipnorm, norm) for g in grads]
    if getattr(optimizer, "clipvalue", 0) > 0:
        grads = [K.clip(g, -optimizer.clipvalue, optimizer.clipvalue) for g in grads]
    return grads

