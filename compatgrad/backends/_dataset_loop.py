"""A whole ``tf.data.Dataset``, eagerly: the batches of a chunk summed in one ``tf.function`` call.

As Keras' ``steps_per_execution`` runs several train steps a call, one Python round trip a chunk
instead of one a batch: batch gradients never leave the graph. Each is weighted by its batch's
size (1 for SUM-reduced losses) and added to sums in the variable's dtype, at least float32 (a
float64 sum would double the memory traffic of the sum, a fifth of a small model's step, for
digits a float32 gradient does not have), which the next chunk takes in: memory stays one batch
plus one set of sums. The progress bar moves once a chunk.
"""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from .. import versions
from .._cache import cached
from .._types import Model, Tensor, Variable
from ..arguments import output_names, per_output
from ..data import Sums
from . import Step

# Batches per call: the call costs a few hundred microseconds, a fiftieth of 16 small batches,
# and the progress bar still moves every second or so on a slow model.
CHUNK = 16


def sums(
    model: Model,
    step: Step,
    variables: Sequence[Any],
    dataset: Any,
    steps: Optional[int],
    summed: bool,
    progress: Any,
) -> Sums:
    """The running sums over the dataset's batches (the first ``steps``) through the compiled ``step``."""
    chunk = cached(
        model,
        ("dataset chunk", id(step), summed),
        (step,),
        lambda: Chunk(step, summed, output_names(model)),
    )
    iterator = iter(dataset)
    totals = [tf.zeros(v.shape, _sum_dtype(v)) for v in variables]
    loss, examples, loss_scale = tf.zeros([], tf.float64), tf.zeros([], tf.int64), tf.ones([], tf.float64)
    done = 0
    while steps is None or done < steps:
        size = CHUNK if steps is None else min(CHUNK, steps - done)
        totals, loss, examples, loss_scale, count = chunk.run(
            iterator,
            tf.constant(size),
            totals,
            loss,
            examples,
            loss_scale,
        )
        done += int(count)
        if progress is not None and int(count):
            progress.update(done)
        if int(count) < size:  # the dataset ended
            break
    grads = [None if i in chunk.unconnected else t.numpy() for i, t in enumerate(totals)]
    return Sums(grads, float(loss), int(examples), done, float(loss_scale))


class Chunk:
    """``run(iterator, size, totals, loss, examples, loss_scale)``: up to ``size`` more batches added
    to the sums; returns the new sums and how many batches there were."""

    def __init__(self, step: Step, summed: bool, outputs: List[str]):
        self.step, self.summed, self.outputs = step, summed, outputs
        self.unconnected: List[int] = []  # variables without a gradient, known once traced
        self.run = tf.function(self._run)

    def _run(
        self, iterator: Any, size: Any, totals: List[Any], loss: Tensor, examples: Any, loss_scale: Any
    ) -> Tuple[List[Tensor], Tensor, Tensor, Tensor, Tensor]:
        count = tf.constant(0)
        for _ in tf.range(size):
            element = _next_as_optional(iterator)
            if not element.has_value():
                break
            x, y, *rest = element.get_value()
            sample_weight = per_output(rest[0], self.outputs) if rest else None
            data = (x, y) if sample_weight is None else (x, y, sample_weight)
            grads, batch_loss, loss_scale = self.step(*data)
            batch_size = tf.shape(tf.nest.flatten(x)[0], out_type=tf.int64)[0]
            weight = tf.constant(1.0, tf.float64) if self.summed else tf.cast(batch_size, tf.float64)
            self.unconnected[:] = [i for i, g in enumerate(grads) if g is None]
            totals = [
                t if g is None else t + tf.cast(weight, t.dtype) * tf.cast(g, t.dtype)
                for t, g in zip(totals, grads)
            ]
            loss += weight * tf.cast(batch_loss, tf.float64)
            examples += batch_size
            loss_scale = tf.cast(loss_scale, tf.float64)
            count += 1
        return totals, loss, examples, loss_scale, count


def _sum_dtype(variable: Variable) -> Any:
    dtype = tf.as_dtype(variable.dtype)
    return tf.float64 if dtype == tf.float64 else tf.float32


def _next_as_optional(iterator: Any) -> Any:
    """The iterator's next element as a ``tf.experimental.Optional``."""
    if versions.has_get_next_as_optional(iterator):
        return iterator.get_next_as_optional()
    return tf.data.experimental.get_next_as_optional(iterator)
