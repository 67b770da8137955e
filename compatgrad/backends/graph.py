"""Graph engine: the gradients of ``model.total_loss``, run in the model's session as ``K.function`` does.

For standalone Keras 2.2/2.3, tf.keras on TF 1.x, and tf.keras / tf_keras v1 models built after
``tf.compat.v1.disable_eager_execution()``. Inputs go through the model's own
``_standardize_user_data`` (so class weights, dict inputs and sample weights mean what they
mean to ``train_on_batch``), and the function is fed exactly the model's feed lists.
"""

import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from tensorflow.core.protobuf import config_pb2

from .. import _paths, versions
from .._cache import cached
from .._types import Model, ModelRef
from ..arguments import Batch
from ..arrays import SparseGradient, is_sparse, static_shape
from ..detect import Flavour
from ..errors import InvalidArgumentError, ModeError, UnsupportedModelError
from . import Request, Result, StepOutput
from ._forward import loss_inputs
from ._steps import Keras2Steps


def gradients(model: Model, flavour: Flavour, request: Request, batch: Batch) -> Result:
    training, class_weight = request.training, request.class_weight
    # Before anything below touches the model: a weighted batch adds sample-weight feeds.
    if not versions.has_get_updates(model.optimizer):
        raise ModeError(
            "model.optimizer: graph mode trains through get_updates, which only the legacy optimizers have; "
            "compile with tf.keras.optimizers.legacy.{0} (got {1}.{0})".format(
                type(model.optimizer).__name__,
                type(model.optimizer).__module__,
            )
        )
    plain = flavour.name != "keras" and class_weight is None and batch.sample_weight is None
    fitting = _fitting_arrays(model, batch) if plain else None
    sample_weights: List[Any]
    if fitting:
        xs, ys, sample_weights = fitting[0], fitting[1], []
    else:
        xs, ys, sample_weights = _standardize(model, batch, class_weight)
    weighted = any(w is not None for w in sample_weights or [])
    if weighted and versions.training_endpoints(model) is not None:
        _add_sample_weight_feeds(model, flavour, sample_weights)

    feeds = list(model._feed_inputs) + list(model._feed_targets)
    values = list(xs) + list(ys)
    if weighted:
        feeds += model._feed_sample_weights
        endpoints = versions.training_endpoints(model) or []
        if len(endpoints) == len(sample_weights):  # TF 1.14 gives an output weighted None no placeholder
            sample_weights = [w for e, w in zip(endpoints, sample_weights) if e.sample_weight is not None]
        values += list(sample_weights)
    if len(feeds) != len(values):  # a positional mismatch would feed arrays into the wrong placeholders
        raise UnsupportedModelError(
            f"model: {len(feeds)} feeds but {len(values)} values after standardization; "
            "please report this model"
        )

    key = ("graph", *request.key(), tuple(map(id, feeds)))
    state = (model.total_loss, model.optimizer)
    kinds, run, phased = cached(
        model, key, state, lambda: _build(weakref.ref(model), flavour, feeds, request)
    )
    loss, loss_scale, *fetched = run(values + [training] if phased else values)
    return Result(_unpack(kinds, fetched), loss, loss_scale)


def build(model: Model, flavour: Flavour, batch: Batch) -> None:
    """Build the model (a subclassed one also compiles its loss) as train_on_batch does: by
    standardizing the batch."""
    _standardize(model, batch, None)


def _build(
    model_ref: ModelRef, flavour: Flavour, feeds: List[Any], request: Request
) -> Tuple[List[Optional[str]], "SessionRun", bool]:
    """(per gradient: None, "dense" or "sparse"; a ``SessionRun`` fetching loss, loss scale and the
    gradients; whether it is fed the learning phase after ``feeds``).

    A sparse gradient is fetched as its three parts: a session callable fetches tensors only.
    """
    model = model_ref()
    K = _paths.load(flavour.root, "backend")
    grads, loss, loss_scale = symbolic(model, flavour, request)
    with loss.graph.as_default():
        # The learning phase, read once as the model's train function reads it when built (looking
        # it up costs as much as the rest of a call): standalone Keras' learning_phase(), which
        # set_learning_phase may have fixed to an int; tf.keras' placeholder of the graph.
        phase = K.learning_phase() if flavour.name == "keras" else K.symbolic_learning_phase()
        phased = not isinstance(phase, int)
        kinds = [None if g is None else "sparse" if is_sparse(g) else "dense" for g in grads]
        fetches = [loss, loss_scale]
        for g in grads:
            if g is not None:
                fetches += [g.values, g.indices, g.dense_shape] if is_sparse(g) else [g]
        return kinds, SessionRun(K.get_session, feeds + [phase] if phased else feeds, fetches), phased


def symbolic(model: Model, flavour: Flavour, request: Request) -> StepOutput:
    """The gradients of ``total_loss`` for ``request`` as the training step takes them (scaled,
    unscaled, aggregated, clipped), the loss and the loss scale: tensors of the model's graph, fed
    through its feeds and learning phase. Made once per (request, compiled state)."""
    key = ("graph symbolic", *request.key())
    state = (model.total_loss, model.optimizer)
    return cached(model, key, state, lambda: _symbolic(weakref.ref(model), flavour, request))


def _symbolic(model_ref: ModelRef, flavour: Flavour, request: Request) -> StepOutput:
    model = model_ref()
    K = _paths.load(flavour.root, "backend")
    loss = model.total_loss
    with loss.graph.as_default():
        steps = Keras2Steps(model.optimizer)
        grads = steps.gradients(
            steps.scale(loss),
            request.variables,
            model.trainable_weights,
            K.gradients,
            request.clip,
            list(request.tensors) + (loss_inputs(model.outputs) if request.output_grads else []),
            request.sparse,
        )
        return grads, loss, steps.loss_scale()


class SessionRun:
    """What ``K.function`` runs, without what it redoes on every call.

    K.function flattens, converts and compares its inputs and packs its outputs again each call,
    which costs a fifth of a small model's step (TF 1.15: 270 of 1,500 us). This makes the same
    session callable from the same feeds and fetches, once per session: the session
    ``K.get_session()`` returns, as K.function takes it each call (the default session, else
    Keras' own, with new variables initialized). Feeds given None are left out, so their
    placeholders take their defaults, as K.function leaves them.
    """

    def __init__(self, get_session: Any, feeds: List[Any], fetches: List[Any]):
        self.get_session = get_session
        self.feeds = [feed.name for feed in feeds]
        self.dtypes = [feed.dtype.as_numpy_dtype for feed in feeds]
        self.fetches = [fetch.name for fetch in fetches]
        self.session: Any = None
        self.callables: Dict[Tuple[int, ...], Any] = {}  # by the positions fed None

    def __call__(self, values: List[Any]) -> List[np.ndarray]:
        session = self.get_session()
        if session is not self.session:
            self.session, self.callables = session, {}
        skipped = tuple(i for i, value in enumerate(values) if value is None)
        run = self.callables.get(skipped)
        if run is None:
            options = config_pb2.CallableOptions()
            options.feed.extend(name for i, name in enumerate(self.feeds) if i not in skipped)
            options.fetch.extend(self.fetches)
            run = self.callables[skipped] = session._make_callable_from_options(options)
        return run(
            *(np.asarray(value, dtype) for value, dtype in zip(values, self.dtypes) if value is not None)
        )


def _unpack(kinds: List[Optional[str]], fetched: List[Any]) -> List[Any]:
    values = iter(fetched)
    grads: List[Any] = []
    for kind in kinds:
        if kind == "sparse":
            grads.append(SparseGradient.from_parts(next(values), next(values), next(values)))
        else:
            grads.append(np.asarray(next(values)) if kind else None)
    return grads


def _fitting_arrays(model: Model, batch: Batch) -> Optional[Tuple[List[np.ndarray], List[np.ndarray]]]:
    """(xs, ys) when they are arrays of the inputs' dtypes and shapes and the outputs' shapes.

    tf.keras' (and tf_keras') standardization passes such arrays through unchanged, with no
    sample weights when none came, so they skip it: it costs as much as a small model's step. Anything else
    (other shapes, which it may expand or refuse, dicts, lists of values) goes through it.
    """
    xs = batch.x if isinstance(batch.x, list) else [batch.x]
    ys = batch.y if isinstance(batch.y, list) else [batch.y]
    inputs, spec = cached(model, ("feed spec",), (model.total_loss,), lambda: _feed_spec(model))
    if len(xs) != inputs or len(xs) + len(ys) != len(spec):
        return None
    for array, (dtype, shape) in zip(xs + ys, spec):
        if type(array) is not np.ndarray or array.dtype != dtype or array.ndim != len(shape):
            return None
        if any(d is not None and d != n for d, n in zip(shape, array.shape)):
            return None
    return xs, ys


def _feed_spec(model: Model) -> Tuple[int, List[Tuple[np.dtype, Tuple[Optional[int], ...]]]]:
    """(the number of inputs, per input then target: the dtype and shape its array must have, None
    where any size fits); no entries where targets and outputs do not pair up. Once per compile."""
    inputs, targets, outputs = model._feed_inputs, model._feed_targets, model.outputs
    if len(targets) != len(outputs):
        return len(inputs), []
    # An input's array has its placeholder's dtype and shape; a target's, its output's shape.
    pairs = list(zip(inputs, inputs)) + list(zip(targets, outputs))
    return len(inputs), [
        (placeholder.dtype.as_numpy_dtype, static_shape(like)) for placeholder, like in pairs
    ]


def _standardize(
    model: Model, batch: Batch, class_weight: Optional[Dict[Any, float]]
) -> Tuple[List[Any], List[Any], List[Any]]:
    """The model's own input standardization; it resets the sample-weight modes, so put them back."""
    endpoints = versions.training_endpoints(model) or []
    modes = [e.sample_weight_mode for e in endpoints]
    try:
        xs, ys, sample_weights = model._standardize_user_data(
            batch.x, batch.y, sample_weight=batch.sample_weight, class_weight=class_weight
        )
    except ValueError as error:
        raise InvalidArgumentError("x, y, sample_weight", "data this model accepts", str(error)) from error
    finally:
        for endpoint, mode in zip(endpoints, modes):
            endpoint.sample_weight_mode = mode
    return xs, ys, sample_weights


def _add_sample_weight_feeds(model: Model, flavour: Flavour, sample_weights: List[Any]) -> None:
    """Give the loss sample-weight placeholders, as ``train_on_batch`` does on its first weighted batch.

    The model keeps them afterwards (unweighted calls leave them at their default of 1). Its
    train and test functions were built without them and would be fed out of place, so the ones
    Keras built are dropped for Keras to rebuild, exactly as Keras does when it recompiles the
    loss itself. A function installed by hand (see ``_installed_by_hand``) is never dropped: where
    it would go stale, this raises before anything changes.
    """
    # Keras' rule for a weighted batch: _update_sample_weight_modes gives every output a mode, and
    # an output without its placeholder then mismatches, so _recompile_weights_loss_and_weighted_metrics
    # recompiles. Read here before anything changes.
    endpoints = model._training_endpoints
    recompiles = getattr(model, "_is_compiled", True) and any(e.sample_weight is None for e in endpoints)
    names = ("train_function", "test_function")
    by_hand = [name for name in names if _installed_by_hand(model, flavour, name)] if recompiles else []
    if recompiles and by_hand:
        name = by_hand[0]
        raise UnsupportedModelError(
            f"model.{name}: expected None or the function Keras built, "
            f"got {_describe(getattr(model, name))} installed by hand; this weighted batch would give "
            "the model sample-weight feeds and recompile its loss, leaving that function stale (built on "
            "the old loss, fed out of place). Pass sample_weight to get_gradients (or train_on_batch) "
            f"once before installing {name}, or call get_gradients without sample_weight"
        )
    model._update_sample_weight_modes(sample_weights=sample_weights)
    if model._recompile_weights_loss_and_weighted_metrics():
        for name in names:
            if name not in by_hand:
                setattr(model, name, None)


def _installed_by_hand(model: Model, flavour: Flavour, name: str) -> bool:
    """Whether ``model.<name>`` (train_function, test_function) is something other than what Keras built.

    Keras' ``_make_train_function`` / ``_make_test_function`` build it as ``K.function(feeds,
    [total_loss] + metrics, updates=..., name="train_function")`` (resp. "test_function"). Told
    from its structure, never a version: an instance of the class that the model's own backend
    module's ``function`` makes (GraphExecutionFunction), whose first output is the model's current
    ``total_loss`` and whose name is the attribute's (or None: TF 1.x's ``K.function`` drops the
    name). Anything else is the user's: a Python function or callable object (wrapping Keras' own or
    not), a K.function of the user's under another name or over another loss. None (nothing built
    yet) is not. A K.function of the user's over ``total_loss`` itself, unnamed or named as Keras
    names it, cannot be told from Keras' own and is dropped as Keras' own would be.
    """
    function = getattr(model, name, None)
    if function is None:
        return False
    cls = type(function)
    backend = _paths.load(flavour.root, "backend")
    outputs = getattr(function, "outputs", None)
    return not (
        getattr(backend, cls.__name__, None) is cls
        and getattr(function, "name", None) in (None, name)
        and isinstance(outputs, list)
        and len(outputs) > 0
        and outputs[0] is model.total_loss
    )


def _describe(function: Any) -> str:
    qualname = getattr(function, "__qualname__", None)
    if qualname:
        return f"a {type(function).__name__} {qualname}"  # "a function train.<locals>.adversarial"
    name = getattr(function, "name", None)
    return "a {}{}".format(type(function).__name__, f" named {name!r}" if name else "")
