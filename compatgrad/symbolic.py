"""``symbolic_gradients``: the training step's gradients as tensors, for code that runs in a graph.

Eager flavours (tf.keras 2.2+, tf_keras, Keras 3): inside a ``tf.function``, such as a custom
``train_step`` under ``fit`` (``jit_compile`` included), the cached step of ``get_gradients`` is
called as a function of the caller's tensors, so its ops join the caller's graph. Graph mode: the
gradients are tensors of the model's graph, fed through its own feeds and learning phase, as the
tensors of ``optimizer.get_gradients(total_loss, params)`` were.

Either way the gradients are those of the compiled loss as the default training step takes them
(loss scaling undone, aggregation, clipping), not of a custom ``train_step``: that is the code
calling this.
"""

from typing import Any, Optional, Sequence, cast

from . import arguments, sources, versions
from ._types import Model, Tensor
from .api import as_output, handle_unconnected, zeros_shape
from .backends import EagerEngine, Request, engine_for, require_tensorflow
from .detect import flavour_of
from .errors import InvalidArgumentError, UnsupportedModelError


def symbolic_gradients(
    model: Model,
    x: Any = None,
    y: Any = None,
    params: Optional[Sequence[Any]] = None,
    sample_weight: Any = None,
    training: bool = False,
    *,
    clip: bool = True,
    unconnected: str = "raise",
    as_dict: bool = False,
    sparse: bool = False,
) -> Any:
    """The gradients ``get_gradients`` returns, as tensors: one per param (``params`` as there,
    default ``model.trainable_weights``), or ``{name: tensor}`` with ``as_dict=True``.

    Eager flavours take ``x``, ``y`` and ``sample_weight`` as the training step does (tensors inside
    a ``tf.function``) and ``training`` as the learning phase. In graph mode ``x``, ``y`` and
    ``sample_weight`` stay None and ``training`` False: the tensors are fed through the model's
    feeds and ``K.learning_phase()``, as a ``K.function`` over them is.
    """
    flavour = flavour_of(model)
    require_tensorflow(flavour.root, "symbolic_gradients")
    import tensorflow as tf

    from .backends import _distribute

    arguments.check_compiled(model, False, losses_listed=flavour.name != "keras3")
    unconnected = arguments.check_unconnected(unconnected)
    eager = tf.executing_eagerly() or versions.executing_eagerly_outside_functions()
    engine = engine_for(model, flavour, eager)
    if not model.built:
        raise InvalidArgumentError(
            "model", "a built model (train or call it once first)", "a model not built yet"
        )
    if _distribute.strategy_of(model) is not None:
        raise UnsupportedModelError(
            "model: symbolic_gradients under a distribution strategy is not supported yet; "
            "use get_gradients outside the step"
        )
    wanted = sources.resolve(model, params)
    request = Request(wanted.variables, wanted.tensors, bool(training), bool(clip), None, bool(sparse))
    if eager:
        if x is None:
            raise InvalidArgumentError("x", "the batch's inputs (tensors inside a tf.function)", "None")
        sample_weight = arguments.per_output(sample_weight, arguments.output_names(model))
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        step = cast(EagerEngine, engine).traced_step(model, flavour, request, len(data))
        grads = list(step(*data)[0])
    else:
        for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise InvalidArgumentError(
                    name, "None in graph mode (feed the model's placeholders instead)", type(value).__name__
                )
        if training:
            raise InvalidArgumentError("training", "False in graph mode (feed K.learning_phase() 1)", True)
        from .backends import graph

        grads = list(graph.symbolic(model, flavour, request)[0])

    grads = handle_unconnected(
        model,
        flavour,
        wanted,
        wanted.arrange(grads),
        unconnected,
        lambda name, param: _zeros(name, param, x, eager),
    )
    return as_output(wanted, grads, as_dict)


def _zeros(name: str, param: Any, x: Any, eager: bool) -> Tensor:
    """Zeros for an unconnected param: a variable's shape, or a graph tensor's with this batch's size."""
    import tensorflow as tf

    if not eager:  # graph mode: a variable, or a tensor of the graph the zeros go into
        return tf.zeros_like(param)
    batch = tf.shape(tf.nest.flatten(x)[0])[0]
    return tf.zeros(zeros_shape(name, param, batch), dtype=param.dtype)
