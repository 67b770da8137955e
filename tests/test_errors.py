"""Bad input: a compatgrad error naming the argument, expected vs got, and an untouched model."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kit
from compatgrad import errors, get_gradients

layers = kit.keras.layers


def compiled(n_inputs=1, n_outputs=1, optimizer=None):
    inputs = [layers.Input(shape=(3,), name=f"in{i}") for i in range(n_inputs)]
    merged = inputs[0] if n_inputs == 1 else layers.Concatenate()(inputs)
    outputs = [layers.Dense(1, name=f"out{i}")(merged) for i in range(n_outputs)]
    model = kit.keras.Model(inputs if n_inputs > 1 else inputs[0], outputs if n_outputs > 1 else outputs[0])
    model.compile(optimizer or kit.sgd(), "mse")
    return model


def snapshot(model):
    return (
        kit.values(model.weights),
        getattr(model, "train_function", None),
        getattr(model, "total_loss", None),
    )


def assert_untouched(model, before):
    weights, train_function, total_loss = snapshot(model)
    assert kit.max_difference(weights, before[0]) == 0.0
    assert train_function is before[1] and total_loss is before[2]


X, Y = np.ones((4, 3), "float32"), np.ones((4, 1), "float32")


def raises(error, match, model, *args, **kwargs):
    before = snapshot(model)
    with pytest.raises(error, match=match) as caught:
        get_gradients(model, *args, **kwargs)
    assert isinstance(caught.value, errors.CompatgradError)
    assert_untouched(model, before)
    return caught.value


def test_uncompiled_model():
    model = kit.keras.Sequential([layers.Dense(1, input_shape=(3,))])
    with pytest.raises(errors.NotCompiledError, match="compile"):
        get_gradients(model, X, Y)


@kit.COMPILE_WITHOUT_A_LOSS.needed
def test_model_without_a_loss():
    model = kit.keras.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile(kit.sgd())
    with pytest.raises(errors.NotCompiledError, match="loss"):
        get_gradients(model, X, Y)


def test_batch_sizes_disagree():
    error = raises(errors.InvalidArgumentError, "batch size", compiled(), X, np.ones((5, 1), "float32"))
    assert "x has 4" in str(error) and "y has 5" in str(error)


def test_wrong_number_of_inputs_and_targets():
    model = compiled(n_inputs=2, n_outputs=2)
    raises(errors.InvalidArgumentError, r"^x: expected 2 arrays", model, X, [Y, Y])
    raises(errors.InvalidArgumentError, r"^x: expected 2 arrays.*got 3", model, [X, X, X], [Y, Y])
    raises(errors.InvalidArgumentError, r"^y: expected 2 arrays.*got 3", model, [X, X], [Y, Y, Y])
    raises(errors.InvalidArgumentError, r"^y: expected keys among", model, [X, X], {"out0": Y, "nope": Y})


def test_param_not_in_model():
    model, other = compiled(), compiled()
    error = raises(
        errors.InvalidArgumentError,
        r"^params\[1\]: expected a variable of this model",
        model,
        X,
        Y,
        [model.trainable_weights[0], other.trainable_weights[1]],
    )
    assert other.trainable_weights[1].name in str(error)
    raises(errors.InvalidTypeError, "^params: expected a list", model, X, Y, model.trainable_weights[0])


def test_sample_weight_of_the_wrong_shape():
    model = compiled()
    raises(
        errors.InvalidArgumentError,
        r"^sample_weight: expected shape \(batch,\)",
        model,
        X,
        Y,
        sample_weight=np.ones((4, 2, 2)),
    )
    raises(errors.InvalidArgumentError, "sample_weight has 3", model, X, Y, sample_weight=np.ones(3))
    raises(
        errors.InvalidArgumentError,
        "^sample_weight: expected one entry per model output",
        model,
        X,
        Y,
        sample_weight=[np.ones(4)] * 2,
    )


@pytest.mark.skipif(not kit.GRAPH, reason="eager tensors are values: eager mode takes them (test_parity)")
def test_symbolic_tensors_in_graph_mode():
    model = compiled()
    raises(
        errors.InvalidTypeError, "^x: expected a numpy array .*got a symbolic", model, kit.ops.constant(X), Y
    )
    raises(
        errors.InvalidTypeError, r"^y: expected a numpy array .*got a symbolic", model, X, kit.ops.constant(Y)
    )


@pytest.mark.parametrize("phase", [2, -1, "1", 0.5, None])
def test_learning_phase_not_0_or_1(phase):
    raises(
        errors.InvalidArgumentError,
        "^learning_phase: expected 0 .* or 1",
        compiled(),
        X,
        Y,
        learning_phase=phase,
    )


def test_unconnected_option_checked():
    raises(
        errors.InvalidArgumentError,
        "^unconnected: expected 'raise', 'zero' or 'skip'",
        compiled(),
        X,
        Y,
        unconnected="ignore",
    )


def test_unknown_model_type():
    with pytest.raises(errors.UnsupportedModelError, match="expected a compiled Keras model"):
        get_gradients(object(), X, Y)


def new_optimizer_class():
    """An SGD without get_updates: the default from TF 2.11, optimizers.experimental in 2.9-2.10;
    else None."""
    optimizers = kit.keras.optimizers
    for cls in (optimizers.SGD, getattr(getattr(optimizers, "experimental", None), "SGD", None)):
        if cls is not None and not hasattr(cls, "get_updates"):
            return cls
    return None


@pytest.mark.skipif(
    not kit.GRAPH or kit.FLAVOUR == "keras" or new_optimizer_class() is None,
    reason="only where graph mode exists next to the new (2.9+) optimizers",
)
def test_new_optimizer_in_graph_mode():
    model = compiled(optimizer=new_optimizer_class()(learning_rate=1.0))  # Keras takes it: compatgrad refuses
    raises(errors.ModeError, "legacy", model, X, Y)
    raises(
        errors.ModeError, "legacy", model, X, Y, sample_weight=np.ones(4, "float32")
    )  # before the weights' feeds are added


@pytest.mark.skipif(
    kit.GRAPH or hasattr(kit.keras.Model, "train_step"),
    reason="only eager Keras without train_step (TF 2.0-2.1), whose step compatgrad cannot match",
)
def test_eager_keras_with_no_train_step_is_refused():
    model = compiled()
    raises(errors.UnsupportedModelError, "no train_step.*disable_eager_execution", model, X, Y)


@kit.TENSORFLOW.needed
@pytest.mark.skipif(kit.GRAPH, reason="needs a model built eagerly")
def test_model_used_after_eager_was_disabled():
    script = textwrap.dedent("""
        import numpy as np, kit
        from compatgrad import get_gradients, errors
        model = kit.keras.Sequential([kit.keras.layers.Dense(1, input_shape=(3,))])
        model.compile(kit.sgd(), "mse")
        kit.tf.compat.v1.disable_eager_execution()
        try:
            get_gradients(model, np.ones((2, 3)), np.ones((2, 1)))
        except errors.ModeError as error:
            print("ModeError:", error)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=300)
    expected = (
        "Keras 3 cannot train in graph mode"
        if kit.KERAS3
        else "built in eager mode, but eager execution is disabled now"
    )
    assert "ModeError: model: " + expected in result.stdout.decode(), result.stderr.decode()[-2000:]


# Graph-mode tf.keras / tf_keras models get their sample-weight feeds on the first weighted batch, which
# recompiles the loss; standalone Keras compiles its feeds up front, eager models have no such functions.
needs_weight_feeds = pytest.mark.skipif(
    not kit.GRAPH or kit.FLAVOUR == "keras",
    reason="only where a weighted batch adds sample-weight feeds (tf.keras, tf_keras graph)",
)


# Small enough that SGD(1.0) keeps the weights near 1 over a few steps: w0 - w1 stays exact to 1e-5.
XS, YS, W = X / 10, Y / 10, np.arange(1, 5, dtype="float32") / 4


def install_by_hand(model, name, sample_weight=None):
    """What adversarial training code does: wrap the function Keras built in a Python function of its own.
    Returns the hook and the list it appends each call's number of inputs to."""
    if name == "train_function":
        kit.train(model, XS, YS, sample_weight=sample_weight)
    else:
        model.test_on_batch(XS, YS, sample_weight=sample_weight)
    keras_function, calls = getattr(model, name), []

    def hooked(inputs):
        calls.append(len(inputs))
        return keras_function(inputs)

    setattr(model, name, hooked)
    return hooked, calls


@needs_weight_feeds
@pytest.mark.parametrize("name", ["train_function", "test_function"])
def test_function_installed_by_hand_is_kept_and_a_weighted_call_refused(name):
    model = compiled()
    hooked, calls = install_by_hand(model, name)
    modes = [e.sample_weight_mode for e in model._training_endpoints]
    expected = (
        rf"^model\.{name}: expected None or the function Keras built, "
        r"got a function .*hooked installed by hand.*without sample_weight$"
    )
    raises(errors.UnsupportedModelError, expected, model, XS, YS, sample_weight=W)
    assert getattr(model, name) is hooked
    assert model._feed_sample_weights == []
    assert [e.sample_weight_mode for e in model._training_endpoints] == modes

    grads = get_gradients(model, XS, YS)  # unweighted: nothing goes stale
    assert getattr(model, name) is hooked
    if name == "train_function":
        assert kit.parity_difference(grads, kit.train_step_delta(model, XS, YS)) <= 1e-5
        assert len(calls) == 1 and model.train_function is hooked  # train_on_batch ran the hook


@needs_weight_feeds
def test_functions_keras_built_are_dropped_for_keras_to_rebuild():
    model = compiled()
    kit.train(model, XS, YS)
    model.test_on_batch(XS, YS)
    grads = get_gradients(model, XS, YS, sample_weight=W)
    assert model.train_function is None and model.test_function is None
    assert len(model._feed_sample_weights) == 1
    assert kit.parity_difference(grads, kit.train_step_delta(model, XS, YS, sample_weight=W)) <= 1e-5


@needs_weight_feeds
def test_function_installed_after_the_weight_feeds_is_kept_on_weighted_calls():
    """The way out the error names: a hook installed once the model has its sample-weight feeds stays."""
    model = compiled()
    get_gradients(model, XS, YS, sample_weight=W)
    hooked, calls = install_by_hand(model, "train_function", sample_weight=W)
    grads = get_gradients(model, XS, YS, sample_weight=W)
    assert model.train_function is hooked
    assert kit.parity_difference(grads, kit.train_step_delta(model, XS, YS, sample_weight=W)) <= 1e-5
    assert len(calls) == 1 and model.train_function is hooked


def _features_built_on_tensorflow():
    from compatgrad import apply_gradients, symbolic_gradients
    from compatgrad.callbacks import GradientLogger

    return {
        "symbolic_gradients": lambda model: symbolic_gradients(model, X, Y),
        "GradientLogger": lambda model: model.fit(X, Y, callbacks=[GradientLogger()], verbose=0),
        "apply_gradients": lambda model: apply_gradients(
            model.optimizer, get_gradients(model, X, Y), model.trainable_weights
        ),
    }


@kit.FEATURES_BUILT_ON_TENSORFLOW.needed
@pytest.mark.skipif(kit.GRAPH, reason="called eagerly (symbolic_gradients takes no batch in graph mode)")
@pytest.mark.parametrize("feature", sorted(_features_built_on_tensorflow()))
def test_features_built_on_tensorflow_run_there_only(feature):
    """Where they run, they run on this model; on another backend each raises before touching it."""
    model = compiled()
    _features_built_on_tensorflow()[feature](model)


@pytest.mark.skipif(kit.BACKEND == "tensorflow", reason="TensorFlow's custom steps run: test_custom_step")
def test_a_model_that_overrides_train_step_is_refused_off_tensorflow():
    class OwnStep(kit.keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inputs = layers.Input(shape=(3,))
    model = OwnStep(inputs, layers.Dense(1)(inputs))
    model.compile(kit.sgd(), "mse")
    raises(
        errors.UnsupportedModelError, "^model: OwnStep overrides train_step, which compatgrad", model, X, Y
    )
