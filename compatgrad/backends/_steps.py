"""The optimizer's own loss scaling, aggregation and clipping, in the order its training step applies them.

Keras 2 (graph and eager, through ``apply_gradients``): scale -> gradient -> unscale -> aggregate -> clip.
Keras 3 (``BaseOptimizer.apply``): scale -> gradient -> unscale -> clip -> aggregate.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from .. import versions
from .._types import Tensor, Variable
from . import _keras3_optimizer as keras3_optimizer

Gradient = Callable[[Any, List[Any]], List[Any]]  # (loss, variables) -> gradients, None where unconnected
Pairs = List[Tuple[Any, Any]]


class Steps:
    """One optimizer's part of the training step: scale the loss, then, on the gradients, what
    ``gradients`` does from top to bottom (unscale, then ``transform``: aggregate and clip in this
    Keras' order)."""

    apply_method: str  # the optimizer method every update goes through (apply_gradients, minimize, apply)
    clips_in_apply: bool  # whether that method clips (else only the library's own training step does)
    optimizer: Any
    inner: Any  # the optimizer that aggregates and clips (inside a LossScaleOptimizer)
    clips: bool  # whether the optimizer clips at all
    # whether Keras' own train step hands the apply method each replica's own gradients under a strategy
    # (the method sums them, or none does), not gradients already summed
    sums_in_apply: bool

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer

    def scale(self, loss: Tensor) -> Any:
        raise NotImplementedError

    def loss_scale(self) -> Any:
        """The loss scale in force (1.0 without loss scaling): what ``scale`` multiplies a loss by.

        Read through ``scale`` itself: the LossScaleOptimizers of each Keras name it differently.
        """
        return self.scale(tf.ones([]))

    def unscale(self, grads: List[Any]) -> List[Any]:
        raise NotImplementedError

    def transform(self, pairs: Pairs, aggregated: Sequence[int], clipped: Sequence[int]) -> List[Any]:
        """The unscaled gradients of ``pairs`` summed across replicas (those at ``aggregated``) and
        clipped (those at ``clipped``), in the order this Keras does both."""
        raise NotImplementedError

    def aggregate(self, pairs: Pairs) -> List[Any]:
        """Cross-replica sum (an identity outside a distribution strategy)."""
        raise NotImplementedError

    def clip(self, pairs: Pairs) -> List[Any]:
        """``pairs`` hold every trainable variable the optimizer updates (a global norm needs them all)."""
        raise NotImplementedError

    def build(self, variables: List[Variable]) -> None:
        """Create the optimizer's variables for ``variables`` as its apply does, outside the traced step."""
        raise NotImplementedError

    def state(self) -> List[Any]:
        """Every variable the optimizer's apply writes: iterations, slots, loss scale and its counter."""
        raise NotImplementedError

    def unscale_in_apply(self, grads: List[Any]) -> List[Any]:
        raise NotImplementedError

    def applied(self, pairs: Pairs, clip: bool, aggregate: bool) -> List[Any]:
        """What the optimizer applies when the step hands it ``pairs`` (gradients not None): unscaled
        (Keras 3 divides in ``apply``; Keras 2 is handed unscaled gradients), aggregated unless the
        step said not to, and clipped over ``pairs`` unless ``clip`` is False."""
        grads = self.unscale_in_apply([g for g, _ in pairs])
        every = range(len(pairs))
        clipped = every if clip and self.clips and self.clips_in_apply else ()
        return self.transform(
            [(g, v) for g, (_, v) in zip(grads, pairs)], every if aggregate else (), clipped
        )

    def intercepted(
        self, record: Callable[[Pairs, bool], Tuple[List[Any], Callable[[Any], Any]]]
    ) -> Callable[..., Any]:
        """The optimizer's ``apply_method`` calling ``record(pairs, aggregate)`` with what it is handed
        (gradients not None; whether the call sums across replicas) before it applies them. ``record``
        returns what the update must run after (graph mode: reads of the weights before it) and
        ``after(result)``, called on what the method returns, and returned in its place."""
        original = getattr(self.optimizer, self.apply_method)
        keras3 = self.apply_method == "apply"

        def apply(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            if keras3:  # apply(grads, trainable_variables=None)
                variables = args[0] if args else kwargs.get("trainable_variables")
                variables = self.optimizer._trainable_variables if variables is None else variables
                pairs = list(zip(grads_and_vars, variables))
            else:  # apply_gradients(grads_and_vars, name=None, experimental_aggregate_gradients=True)
                grads_and_vars = pairs = list(grads_and_vars)
            # Keras 2 steps that sum across replicas themselves say so (OptimizerV2 / optimizer.Optimizer).
            first, after = record(
                [(g, v) for g, v in pairs if g is not None], versions.apply_call_sums(kwargs)
            )
            with tf.control_dependencies(first):
                return after(original(grads_and_vars, *args, **kwargs))

        return apply

    def gradients(
        self,
        scaled_loss: Tensor,
        variables: Sequence[Any],
        trainable: Sequence[Any],
        gradient: Gradient,
        clip: bool,
        tensors: Sequence[Any] = (),
        sparse: bool = False,
    ) -> List[Optional[Any]]:
        """What the training step hands to the update, for ``variables`` then ``tensors``; None where
        unconnected.

        ``scaled_loss`` is ``self.scale(loss)``, computed where ``gradient`` sees it (inside the tape).
        Variables the optimizer does not update (non-trainable ones) come unscaled and aggregated,
        unclipped; graph tensors (activations, inputs) come unscaled only: they belong to this replica.
        ``tf.IndexedSlices`` (embedding gradients) stay sparse with ``sparse``, else become dense.
        """
        wanted = {id(v) for v in variables}
        wrt = list(variables)
        if clip and self.clips and variables:  # the global norm of what is returned needs them all
            wrt += [v for v in trainable if id(v) not in wanted]
        grads = self.unscale(list(gradient(scaled_loss, wrt + list(tensors))))
        tensor_grads, grads = grads[len(wrt) :], grads[: len(wrt)]

        present = [i for i, g in enumerate(grads) if g is not None]
        trainable_ids = {id(v) for v in trainable}
        # Only what the optimizer updates is clipped; every gradient is summed across replicas.
        updated = (
            [k for k, i in enumerate(present) if id(wrt[i]) in trainable_ids] if clip and self.clips else []
        )
        transformed = self.transform([(grads[i], wrt[i]) for i in present], range(len(present)), updated)
        for i, g in zip(present, transformed):
            grads[i] = g
        grads = grads[: len(variables)] + tensor_grads
        return grads if sparse else [None if g is None else tf.convert_to_tensor(g) for g in grads]


def _on(stage: Callable[[Pairs], List[Any]], pairs: Pairs, indices: Sequence[int]) -> Pairs:
    """``pairs`` with the gradients at ``indices`` replaced by what ``stage`` makes of them together."""
    indices = list(indices)
    if not indices:
        return pairs
    pairs = list(pairs)
    for i, g in zip(indices, stage([pairs[i] for i in indices])):
        pairs[i] = (g, pairs[i][1])
    return pairs


class Keras2Steps(Steps):
    apply_method = "apply_gradients"  # minimize calls it

    def __init__(self, optimizer: Any):
        super().__init__(optimizer)
        # LossScaleOptimizer (experimental, legacy and V3) all have these two methods.
        self.scales = hasattr(optimizer, "get_scaled_loss") and hasattr(optimizer, "get_unscaled_gradients")
        inner = versions.loss_scale_inner(optimizer)
        self.inner = inner if self.scales and inner is not None else optimizer
        self.clips = versions.keras2_clips(self.inner)
        # Where apply_gradients does not clip, only get_gradients and the library's own train step do:
        # a custom step's apply_gradients then applies its gradients unclipped.
        self.clips_in_apply = versions.has_transform_gradients(
            self.inner
        ) or versions.has_aggregate_gradients(self.inner)
        # TF 2.2-2.3's train step sums across replicas itself, then calls apply_gradients.
        self.sums_in_apply = versions.has_transform_unaggregated_gradients(
            self.inner
        ) or versions.has_aggregate_gradients(self.inner)

    def scale(self, loss: Tensor) -> Any:
        return self.optimizer.get_scaled_loss(loss) if self.scales else loss

    def unscale_in_apply(self, grads: List[Any]) -> List[Any]:
        return grads  # minimize and the LossScaleOptimizer API unscale before apply_gradients

    def build(self, variables: List[Variable]) -> None:
        inner = self.inner
        with tf.init_scope():
            if versions.has_create_all_weights(inner):
                inner._create_all_weights(variables)
            elif versions.has_create_slots(inner):
                _ = inner.iterations
                inner._create_hypers()
                inner._create_slots(variables)
            else:  # optimizer.Optimizer (2.11+): builds once, for the variables of its first apply
                inner.build(variables)

    def state(self) -> List[Any]:
        found = versions.optimizer_variables(self.inner)
        # A LossScaleOptimizer's scale and good-step counter: its own attributes (V3) or its state's.
        holders = [self.optimizer, versions.loss_scale_state(self.optimizer)] if self.scales else []
        for holder in filter(None, holders):
            found += [v for v in vars(holder).values() if isinstance(v, tf.Variable)]
        return found

    def unscale(self, grads: List[Any]) -> List[Any]:
        return list(self.optimizer.get_unscaled_gradients(grads)) if self.scales else grads

    def transform(self, pairs: Pairs, aggregated: Sequence[int], clipped: Sequence[int]) -> List[Any]:
        """``apply_gradients``' order: the cross-replica sum, then clipping."""
        pairs = _on(self.aggregate, pairs, aggregated)
        pairs = _on(self.clip, pairs, clipped)
        return [g for g, _ in pairs]

    def aggregate(self, pairs: Pairs) -> List[Any]:
        inner = self.inner
        if not tf.distribute.has_strategy():  # one replica: the sum over replicas is the gradient itself
            return [g for g, _ in pairs]
        if versions.has_aggregate_gradients(inner):
            return [g for g, _ in inner.aggregate_gradients(pairs)]
        if versions.has_transform_unaggregated_gradients(inner):
            pairs = inner._transform_unaggregated_gradients(pairs)
        if not versions.has_aggregate_grad(inner):
            return [g for g, _ in pairs]
        return versions.aggregated_gradients(inner._aggregate_gradients(pairs))

    def clip(self, pairs: Pairs) -> List[Any]:
        inner, grads = self.inner, [g for g, _ in pairs]
        if versions.has_transform_gradients(inner):
            return [g for g, _ in inner._transform_gradients(list(pairs))]
        if versions.has_clip_gradients(inner):
            return list(inner._clip_gradients(grads))
        if versions.is_standalone_keras_optimizer(inner):
            return _standalone_keras_clip(inner, grads)
        # OptimizerV2.get_gradients of TF 1.x-2.1: per-tensor clipnorm, then clipvalue (set only where given).
        if hasattr(inner, "clipnorm"):
            grads = [tf.clip_by_norm(g, inner.clipnorm) for g in grads]
        if hasattr(inner, "clipvalue"):
            grads = [tf.clip_by_value(g, -inner.clipvalue, inner.clipvalue) for g in grads]
        return grads


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


class Keras3Steps(Steps):
    apply_method = "apply"  # apply_gradients calls it
    clips_in_apply = True
    sums_in_apply = True

    def __init__(self, optimizer: Any):
        super().__init__(optimizer)
        self.inner = keras3_optimizer.inner(optimizer)
        self.all_reduce = versions.sums_across_replicas(self.inner)
        self.clips = keras3_optimizer.clips(optimizer)

    def scale(self, loss: Tensor) -> Any:
        return self.optimizer.scale_loss(loss)

    def unscale_in_apply(self, grads: List[Any]) -> List[Any]:
        return self.unscale(grads)  # apply divides by the scales whatever the step did

    def build(self, variables: List[Variable]) -> None:
        if not self.optimizer.built:
            with tf.init_scope():
                self.optimizer.build(variables)
            self.optimizer.built = True

    def state(self) -> List[Any]:
        return list(self.optimizer.variables)  # a LossScaleOptimizer's include its inner optimizer's

    def unscale(self, grads: List[Any]) -> List[Any]:
        for scale in keras3_optimizer.loss_scales(self.optimizer):
            grads = [None if g is None else tf.convert_to_tensor(g) / tf.cast(scale, g.dtype) for g in grads]
        return grads

    def transform(self, pairs: Pairs, aggregated: Sequence[int], clipped: Sequence[int]) -> List[Any]:
        """``BaseOptimizer.apply``'s order: clipping, then the cross-replica sum."""
        pairs = _on(self.clip, pairs, clipped)
        pairs = _on(self.aggregate, pairs, aggregated)
        return [g for g, _ in pairs]

    def clip(self, pairs: Pairs) -> List[Any]:
        return list(self.inner._clip_gradients([g for g, _ in pairs]))

    def aggregate(self, pairs: Pairs) -> List[Any]:
        if not self.all_reduce or not tf.distribute.has_strategy():  # no sum over replicas, or one replica
            return [g for g, _ in pairs]
        return [g for g, _ in self.inner._all_reduce_sum_gradients(pairs)]
