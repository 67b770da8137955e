"""GradientLogger against the training step: what it logs at step k is what train_on_batch applies to
batch k from the same weights (a twin model stepped in lockstep with SGD(1.0): w0 - w1; unclipped, a
hand-written GradientTape), fit trains bit for bit as without it, TensorBoard's own reader reads back
what it wrote, and what it cannot tap is refused before anything changes."""

import logging

import numpy as np
import pytest

import kit
from compatgrad import errors
from compatgrad.callbacks import AnyKerasCallback, GradientLogger

kit.TENSORFLOW.needed_by_module()

keras, tf = kit.keras, kit.tf
layers = keras.layers
TOL = 1e-5
BATCH, STEPS = 8, 5  # steps per epoch


def classifier(optimizer):
    inputs = layers.Input(shape=(4,))
    hidden = layers.Dense(6, activation="tanh", name="hidden")(inputs)
    # float32 outputs under mixed_float16, as its guide has it (TF 2.0's graph-mode loss scale cannot
    # multiply a float16 loss by its float32 scale)
    head = layers.Dense(3, activation="softmax", name="head", dtype="float32")
    model = keras.Model(inputs, head(hidden))
    model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


def checked_classifier(optimizer):
    """``classifier`` whose step raises on NaN inputs."""
    inputs = layers.Input(shape=(4,))
    checked = layers.Lambda(lambda t: tf.debugging.check_numerics(t, "inputs"))(inputs)
    hidden = layers.Dense(6, activation="tanh", name="hidden")(checked)
    model = keras.Model(inputs, layers.Dense(3, activation="softmax", name="head")(hidden))
    model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


def twins(make_optimizer, model=classifier):
    """Two models with the same weights, each with its own optimizer made alike."""
    first, second = model(make_optimizer()), model(make_optimizer())
    second.set_weights(first.get_weights())
    return first, second


def data(rng):
    return rng.randn(BATCH * STEPS, 4).astype("float32"), rng.randint(0, 3, size=(BATCH * STEPS,))


def fit(model, x, y, *callbacks, epochs=2):
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))


def batch(x, y, step):
    """The batch fit trains on at ``step`` (from 1; no shuffling)."""
    start = (step - 1) % STEPS * BATCH
    return x[start : start + BATCH], y[start : start + BATCH]


class Collect:
    """An on_gradients function keeping every step's gradients."""

    def __init__(self):
        self.grads = {}

    def __call__(self, step, grads):
        self.grads[step] = grads


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
@pytest.mark.parametrize("name", list(kit.OPTIMIZERS))
def test_logs_what_each_step_applies(rng, name):
    model, twin = twins(lambda: kit.sgd(name, clipnorm=0.3))
    x, y = data(rng)
    collect = Collect()
    logger = GradientLogger(on_gradients=collect)
    fit(model, x, y, logger)

    assert sorted(collect.grads) == list(range(1, 2 * STEPS + 1))
    for step, entry in zip(range(1, 2 * STEPS + 1), logger.history):
        xb, yb = batch(x, y, step)
        applied = kit.train_step_delta(twin, xb, yb)  # SGD(1.0): w0 - w1 is the gradient applied
        assert kit.parity_difference(collect.grads[step], applied) < TOL
        assert entry["step"] == step
        norms = [np.linalg.norm(g) for g in applied]
        assert list(entry["norms"].values()) == pytest.approx(norms, rel=1e-5)
        assert entry["global_norm"] == pytest.approx(np.linalg.norm(norms), rel=1e-5)
        assert set(entry["layer_norms"]) == {"hidden", "head"}
    # clipnorm clips each weight's gradient to norm 0.3 (standalone Keras: all of them together): some
    # were, else clipping went untested
    norms = [[np.linalg.norm(g) for g in grads] for grads in collect.grads.values()]
    clipped = [np.linalg.norm(n) if kit.FLAVOUR == "keras" else max(n) for n in norms]
    assert any(norm == pytest.approx(0.3) for norm in clipped)
    assert kit.max_difference(kit.values(model.weights), kit.values(twin.weights)) < TOL


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
@kit.UNCLIPPED_IN_APPLY.needed
def test_clip_false_logs_the_gradients_before_clipping(rng):
    model, twin = twins(lambda: kit.sgd(clipnorm=0.3))
    x, y = data(rng)
    collect = Collect()
    fit(model, x, y, GradientLogger(on_gradients=collect, clip=False), epochs=1)

    larger = 0
    for step in range(1, STEPS + 1):
        xb, yb = batch(x, y, step)
        unclipped = kit.reference_gradients(twin, xb, yb, twin.trainable_weights, training=0)
        assert kit.max_difference(collect.grads[step], unclipped) < TOL
        norms = [np.linalg.norm(g) for g in unclipped]
        larger += (np.linalg.norm(norms) if kit.FLAVOUR == "keras" else max(norms)) > 0.3 + 1e-4
        kit.train(twin, xb, yb)
    assert larger  # some step's gradient was clipped, so clip=False made a difference


@kit.UPDATES_READ_IN_THE_STEP.needed
@pytest.mark.parametrize("every", [1, 2])
def test_update_ratios_are_how_far_each_step_moved_the_weights(rng, every):
    """Every step, or every other (the steps between take none: the step tells from its count)."""
    model, twin = twins(lambda: kit.sgd(learning_rate=0.1, momentum=0.9))
    x, y = data(rng)
    logger = GradientLogger(update_ratios_every=every)
    fit(model, x, y, logger, epochs=1)

    assert [entry["step"] for entry in logger.history] == list(range(1, STEPS + 1))
    for step, entry in zip(range(1, STEPS + 1), logger.history):
        before = kit.values(twin.trainable_weights)
        kit.train(twin, *batch(x, y, step))
        after = kit.values(twin.trainable_weights)
        ratios = [
            np.linalg.norm(a - b) / np.linalg.norm(b) if np.any(b) else 0.0 for a, b in zip(after, before)
        ]
        expected = pytest.approx(ratios, rel=1e-4) if step % every == 0 else []
        assert list(entry["update_ratios"].values()) == expected


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
@pytest.mark.parametrize(
    "clipping",
    [{}, pytest.param({"clipnorm": 0.5}, id="clipnorm", marks=kit.UNTOUCHED_CLIPNORM_GRAPH.needed)],
    ids=["", "clipnorm"],
)
def test_training_is_bit_identical(rng, clipping):
    """Before, with and after the logger: momenta from a fit without it go on through one with it."""
    logged, plain = twins(lambda: kit.sgd(learning_rate=0.1, momentum=0.9, **clipping))
    x, y = data(rng)
    for loggers in ([], [GradientLogger(every=2)], []):
        fit(logged, x, y, *loggers, epochs=1)
        fit(plain, x, y, epochs=1)

    state = [kit.optimizer_variables(model.optimizer) for model in (logged, plain)]
    assert len(state[0]) == len(state[1]) > 1  # the momenta too
    for a, b in zip(kit.values(logged.weights + state[0]), kit.values(plain.weights + state[1])):
        assert np.array_equal(a, b)


class LogKeys(AnyKerasCallback):
    """The keys of the logs Keras hands the callbacks after each step."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def on_train_batch_end(self, batch, logs=None):
        self.seen |= set(logs or {})


def test_every_and_the_model_after_fit(rng):
    model = classifier(kit.sgd(learning_rate=0.1, momentum=0.9))
    x, y = data(rng)
    logger, keys = GradientLogger(every=2), LogKeys()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[logger, keys])

    assert [entry["step"] for entry in logger.history] == list(range(2, 2 * STEPS + 1, 2))
    # What the tapped step hands the logger stays out of the logs of fit, and of its callbacks.
    assert "loss" in keys.seen and "loss" in history.history
    assert not [key for key in keys.seen | set(history.history) if "compatgrad" in key]
    assert "train_step" not in vars(model)
    assert not {"apply", "apply_gradients", "get_updates"} & set(vars(model.optimizer))  # unwrapped
    before = kit.values(model.trainable_weights)
    model.train_on_batch(x[:BATCH], y[:BATCH])  # trains as before, nothing logged outside fit
    assert kit.max_difference(before, kit.values(model.trainable_weights)) > 0
    assert len(logger.history) == STEPS


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
def test_every_logs_what_those_steps_apply(rng):
    """Between logged steps the step computes nothing (it tells from the optimizer's count)."""
    model, twin = twins(kit.sgd)
    x, y = data(rng)
    collect = Collect()
    logger = GradientLogger(every=3, on_gradients=collect, update_ratios_every=6)
    fit(model, x, y, logger)

    logged = list(range(3, 2 * STEPS + 1, 3))
    assert [entry["step"] for entry in logger.history] == sorted(collect.grads) == logged
    entries = iter(logger.history)
    for step in range(1, 2 * STEPS + 1):
        before = kit.values(twin.trainable_weights)
        applied = kit.train_step_delta(twin, *batch(x, y, step))  # SGD(1.0): the update too
        if step not in logged:
            continue
        entry = next(entries)
        assert kit.parity_difference(collect.grads[step], applied) < TOL
        norms = [np.linalg.norm(g) for g in applied]
        assert list(entry["norms"].values()) == pytest.approx(norms, rel=1e-5)
        ratios = [n / np.linalg.norm(b) if np.any(b) else 0.0 for n, b in zip(norms, before)]
        if kit.UPDATES_READ_IN_THE_STEP.missing or step % 6:
            assert entry["update_ratios"] == {}
        else:
            assert list(entry["update_ratios"].values()) == pytest.approx(ratios, rel=1e-4)


@pytest.mark.skipif(kit.GRAPH, reason="graph mode's compile takes none of these")
@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"jit_compile": True}, id="jit_compile", marks=kit.JIT_COMPILE.needed),
        pytest.param({"run_eagerly": True}, id="run_eagerly"),
        pytest.param(
            {"steps_per_execution": 2},
            id="steps_per_execution",
            marks=[kit.STEPS_PER_EXECUTION.needed, kit.AN_EPOCHS_LAST_EXECUTION_CUT_SHORT.needed],
        ),
    ],
)
def test_every_under_xla_run_eagerly_and_several_steps_an_execution(rng, options):
    """With executions of 2 steps, each epoch's last is cut short (5 batches): the steps logged are
    still those whose count is a multiple of ``every``, wherever they fall in an execution."""
    model, twin = twins(kit.sgd)
    model.compile(kit.sgd(), "sparse_categorical_crossentropy", **options)
    x, y = data(rng)
    collect = Collect()
    logger = GradientLogger(every=2, on_gradients=collect)
    fit(model, x, y, logger)

    steps = [entry["step"] for entry in logger.history]
    assert steps == sorted(collect.grads) == list(range(2, 2 * STEPS + 1, 2))
    for step in range(1, 2 * STEPS + 1):
        applied = kit.train_step_delta(twin, *batch(x, y, step))
        if step in collect.grads:
            assert kit.parity_difference(collect.grads[step], applied) < TOL, step


@pytest.mark.skipif(kit.GRAPH, reason="graph mode's compile takes no steps_per_execution")
@kit.STEPS_PER_EXECUTION.needed
@kit.AN_EPOCHS_LAST_EXECUTION_CUT_SHORT.needed
def test_several_steps_an_execution_under_a_fit_of_the_models_own(rng):
    """A model class whose own fit calls Keras' is logged as Keras' fit numbers its batches (an
    execution's last, or in Keras 3.3-3.9 its first)."""

    class OwnFit(keras.Model):
        def fit(self, *args, **kwargs):
            return super().fit(*args, **kwargs)

    plain = classifier(kit.sgd())
    model = OwnFit(plain.inputs, plain.outputs)
    model.compile(kit.sgd(), "sparse_categorical_crossentropy", steps_per_execution=2)
    logger = GradientLogger(every=2)
    fit(model, *data(rng), logger)

    assert [entry["step"] for entry in logger.history] == list(range(2, 2 * STEPS + 1, 2))


def test_tensorboard_reads_back_the_scalars_and_histograms(rng, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    model = classifier(kit.sgd(learning_rate=0.1))
    x, y = data(rng)
    logger = GradientLogger(log_dir=str(tmp_path), histograms_every=2)
    fit(model, x, y, logger, epochs=1)

    events = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={"tensors": 0, "scalars": 0, "histograms": 0}
    )  # all
    events.Reload()
    scalars, histograms = events.Tags()["scalars"], events.Tags()["histograms"]  # TF 1 Summary protos
    assert {"gradients/global_norm", "layer_gradient_norms/hidden", "layer_gradient_norms/head"} <= set(
        scalars
    )
    norms = [(e.step, e.value) for e in events.Scalars("gradients/global_norm")]
    assert [step for step, _ in norms] == list(range(1, STEPS + 1))
    expected = [entry["global_norm"] for entry in logger.history]
    assert [value for _, value in norms] == pytest.approx(expected, rel=1e-6)
    weights = [tag for tag in histograms if tag.startswith("gradients/") and tag != "gradients/global_norm"]
    assert len(weights) == len(model.trainable_weights)
    assert [e.step for e in events.Histograms(weights[0])] == [2, 4]


@kit.RACE_FREE_STEP.needed  # compared with a twin's train_on_batch
def test_histograms_are_of_what_their_steps_apply(rng):
    """Every other step: the gradients are copied out on those steps only (the step tells from its count)."""
    model, twin = twins(kit.sgd)
    x, y = data(rng)
    logger = GradientLogger(histograms_every=2)
    fit(model, x, y, logger, epochs=1)

    names = list(logger.history[0]["norms"])
    for step, entry in zip(range(1, STEPS + 1), logger.history):
        applied = kit.train_step_delta(twin, *batch(x, y, step))
        assert ("histograms" in entry) == (step % 2 == 0)
        for name, grad in zip(names, applied):
            if step % 2 == 0:
                counts, edges = entry["histograms"][name]
                expected_counts, expected_edges = np.histogram(grad, bins=30)
                assert np.allclose(edges, expected_edges, rtol=1e-4, atol=1e-7)
                assert counts.sum() == grad.size and np.abs(counts - expected_counts).sum() <= 2


class OwnStep(keras.Model):
    """A train_step of its own: the compiled loss times 2, applied through the optimizer."""

    def train_step(self, data):
        x, y = data[:2]  # Keras 3's train_on_batch adds a sample_weight of None
        with tf.GradientTape() as tape:
            prediction = self(x, training=True)
            if hasattr(self, "compute_loss"):
                loss = self.compute_loss(x=x, y=y, y_pred=prediction)
            else:
                loss = self.compiled_loss(y, prediction)
            loss = 2.0 * loss
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def own_step_classifier(optimizer):
    inputs = layers.Input(shape=(4,))
    model = OwnStep(inputs, layers.Dense(3, activation="softmax")(layers.Dense(6, activation="tanh")(inputs)))
    model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


@pytest.mark.skipif(kit.GRAPH, reason="graph mode never calls train_step")
def test_a_custom_train_step_logs_what_it_applies(rng):
    model, twin = twins(kit.sgd, own_step_classifier)
    x, y = data(rng)
    collect = Collect()
    fit(model, x, y, GradientLogger(on_gradients=collect), epochs=1)

    for step in range(1, STEPS + 1):
        xb, yb = batch(x, y, step)
        assert kit.parity_difference(collect.grads[step], kit.train_step_delta(twin, xb, yb)) < TOL


def test_alerts_are_logged_once_per_layer_and_kept_in_history(rng, caplog):
    model = classifier(kit.sgd(learning_rate=0.1))
    x, y = data(rng)
    logger = GradientLogger(exploding=1e-9)  # every gradient is "exploding"
    with caplog.at_level(logging.WARNING, logger="compatgrad"):
        fit(model, x, y, logger, epochs=1)

    assert all({a["layer"] for a in entry["alerts"]} == {"hidden", "head"} for entry in logger.history)
    warnings = [r.getMessage() for r in caplog.records if r.name == "compatgrad"]
    assert len(warnings) == 2 and all("exploding" in w for w in warnings)


def test_a_model_built_by_its_first_step_is_logged_from_that_step(rng):
    model = keras.Sequential([layers.Dense(6, activation="tanh"), layers.Dense(3, activation="softmax")])
    model.compile(kit.sgd(), "sparse_categorical_crossentropy")
    x, y = data(rng)
    collect = Collect()
    logger = GradientLogger(on_gradients=collect)
    fit(model, x, y, logger, epochs=1)

    assert len(logger.history) == STEPS
    for entry in logger.history:  # every weight, from the first step on
        grads = collect.grads[entry["step"]]
        assert [np.shape(g) for g in grads] == [tuple(w.shape) for w in model.trainable_weights]
        assert list(entry["norms"].values()) == pytest.approx([np.linalg.norm(g) for g in grads], rel=1e-5)


def test_a_train_function_set_from_outside_is_refused_and_kept(rng):
    model = classifier(kit.sgd())
    x, y = data(rng)

    def own_train_function(iterator):
        return {}

    model.train_function = own_train_function
    with pytest.raises(errors.UnsupportedModelError, match="model.train_function"):
        fit(model, x, y, GradientLogger())
    assert model.train_function is own_train_function
    assert not {"apply", "apply_gradients", "get_updates"} & set(vars(model.optimizer))


class Moved(AnyKerasCallback):
    """How far each step fit runs moved the weights the model reads (SGD(1.0): what it applied)."""

    def __init__(self):
        super().__init__()
        self.deltas = {}

    def on_train_batch_begin(self, batch, logs=None):
        self.before = kit.values(self.model.trainable_weights)

    def on_train_batch_end(self, batch, logs=None):
        after = kit.values(self.model.trainable_weights)
        self.deltas[batch + 1] = [before - now for before, now in zip(self.before, after)]


@pytest.mark.skipif(kit.GRAPH, reason="distribution strategies: eager training steps only")
@kit.MODEL_KNOWS_ITS_STRATEGY.needed
@pytest.mark.parametrize(
    "clipping",
    [{}, pytest.param({"clipnorm": 0.3}, id="clipnorm", marks=kit.CLIPPING_UNDER_A_STRATEGY.needed)],
    ids=["", "clipnorm"],
)
def test_under_a_mirrored_strategy_logs_what_the_step_applies(rng, clipping):
    """Each replica keeps what it applies; the logger reads the first's, whose weights the model reads:
    the cross-replica gradient, or where Keras 3.0-3.4 sums nothing across replicas, the first's own."""
    assert_logs_the_steps(rng, lambda: kit.sgd(**clipping))


@kit.MIXED_PRECISION.needed
@pytest.mark.parametrize(
    "mirrored",
    [
        pytest.param(False, id="one device"),
        pytest.param(
            True,
            id="mirrored",
            marks=[
                pytest.mark.skipif(kit.GRAPH, reason="distribution strategies: eager training steps only"),
                kit.MODEL_KNOWS_ITS_STRATEGY.needed,
                kit.LOSS_SCALE_LOGGED_UNDER_A_STRATEGY.needed,
            ],
        ),
    ],
)
def test_with_loss_scaling(rng, mixed_float16, mirrored):
    """The loss scale compile wraps the optimizer in under mixed_float16: what each step applies, unscaled."""
    assert_logs_the_steps(rng, kit.sgd, mirrored)


def assert_logs_the_steps(rng, make_optimizer, mirrored=True):
    """What each step applied is logged, and the weights train as a twin's without the logger."""
    strategy = kit.mirrored() if mirrored else kit.tf.distribute.get_strategy()
    with strategy.scope():  # the optimizer too: some Keras take the strategy as they are made
        model, twin = twins(make_optimizer)
    x, y = data(rng)
    collect, moved = Collect(), Moved()
    fit(model, x, y, moved, GradientLogger(on_gradients=collect), epochs=1)
    fit(twin, x, y, epochs=1)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), twin.get_weights()))

    # A step whose scaled gradients overflow applies nothing: the optimizer does not count it,
    # and the logger, which labels an entry with that count, makes none for it.
    applied = [
        moved.deltas[step] for step in sorted(moved.deltas) if any(np.any(d) for d in moved.deltas[step])
    ]
    logged = [collect.grads[step] for step in sorted(collect.grads)]
    assert len(logged) == len(applied) >= STEPS - 1
    for step, (grads, delta) in enumerate(zip(logged, applied), 1):
        assert kit.parity_difference(grads, delta) < TOL, step


@pytest.mark.skipif(not kit.GRAPH, reason="graph mode's replicated steps")
@kit.MODEL_KNOWS_ITS_STRATEGY.needed
def test_a_strategy_in_graph_mode_is_refused(rng):
    with kit.tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = classifier(kit.sgd())
    x, y = data(rng)
    with pytest.raises(errors.UnsupportedModelError, match="graph mode"):
        fit(model, x, y, GradientLogger())
    assert not {"apply", "apply_gradients", "get_updates"} & set(vars(model.optimizer))


class RaiseAt(AnyKerasCallback):
    """A callback raising after a given batch (as a Ctrl-C between steps does)."""

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt


def nan_at(x, row):
    x = x.copy()
    x[row] = np.nan
    return x


@pytest.mark.parametrize("where", ["between steps", "in the step"])
def test_a_fit_that_raises_leaves_the_model_as_it_was(rng, where):
    """Keras calls no on_train_end then: the tap goes when the step raises, or at the next fit's step."""
    model, twin = twins(lambda: kit.sgd(learning_rate=0.1, momentum=0.9), model=checked_classifier)
    x, y = data(rng)
    if where == "between steps":
        raising, first = (KeyboardInterrupt, x), [RaiseAt(batch=2)]
    else:
        raising, first = (tf.errors.InvalidArgumentError, nan_at(x, 2 * BATCH)), []
    logger = GradientLogger()
    for trained, loggers in ((model, [logger]), (twin, [])):
        with pytest.raises(raising[0]):
            fit(trained, raising[1], y, *first, *loggers, epochs=1)
    model.evaluate(x, y, verbose=0, callbacks=[logger])  # an evaluate of its own: the tap goes after
    assert not {"apply", "apply_gradients", "get_updates"} & set(vars(model.optimizer))
    fit(model, x, y)
    fit(twin, x, y)

    assert not {"apply", "apply_gradients", "get_updates"} & set(vars(model.optimizer))
    assert "train_step" not in vars(model)
    assert getattr(model.train_function, "compatgrad_tap", None) is None
    assert not hasattr(type(model.train_function), "compatgrad_tap")
    if kit.RACE_FREE_STEP.missing:  # the twins' steps vary from run to run
        return
    for a, b in zip(kit.values(model.weights), kit.values(twin.weights)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"every": 0}, "every"),
        ({"histograms_every": 1.5}, "histograms_every"),
        ({"update_ratios_every": 0}, "update_ratios_every"),
        ({"on_gradients": 3}, "on_gradients"),
    ],
)
def test_bad_arguments_name_themselves(arguments, name):
    with pytest.raises(errors.InvalidArgumentError, match=name):
        GradientLogger(**arguments)


def linear_model(features):
    model = keras.Sequential(
        [layers.Dense(1, use_bias=False, kernel_initializer="zeros", input_shape=(features,))]
    )
    model.compile(kit.sgd(learning_rate=1e-7), "mse")
    return model


@pytest.mark.parametrize(
    "replicas",
    [
        pytest.param(1, id="one device"),
        pytest.param(
            2,
            id="mirrored",
            marks=[
                pytest.mark.skipif(kit.GRAPH, reason="distribution strategies: eager training steps only"),
                kit.MODEL_KNOWS_ITS_STRATEGY.needed,
                kit.NOISE_SCALE_UNDER_A_STRATEGY.needed,
            ],
        ),
    ],
)
def test_noise_scale_recovers_b_simple_on_a_known_problem(rng, replicas):
    """A linear model held at w = 0 (a learning rate of 1e-7): each example's gradient of (x.w - y)^2 is
    -2 y x there, so |G|^2 and tr(Sigma) over the data are a closed form, and B_simple their ratio.
    Mirrored: each replica's own gradient of 16 examples is a small batch (fit splits 32 in two)."""
    features, examples, batch_size = 8, 4096, 16 * replicas
    x = rng.randn(examples, features).astype("float32")
    y = (x @ (0.3 * rng.randn(features)) + rng.randn(examples)).astype("float32")[:, None]
    if replicas == 1:
        model = linear_model(features)
    else:
        with kit.mirrored().scope():
            model = linear_model(features)
    per_example = -2.0 * y.astype(np.float64) * x
    mean = per_example.mean(axis=0)
    expected = per_example.var(axis=0).sum() / (mean @ mean)

    logger = GradientLogger(
        every=64, noise_scale_batch_size=batch_size, noise_scale_window=8, noise_scale_smoothing=0.98
    )
    model.fit(x, y, batch_size=batch_size, epochs=8, verbose=0, callbacks=[logger])
    assert logger.noise.estimate == pytest.approx(expected, rel=0.1)
    assert logger.history[-1]["noise_scale"] == logger.noise.estimate


def test_the_command_line_summarizes_a_logged_run(rng, tmp_path, capsys):
    from compatgrad import cli

    model = classifier(kit.sgd(learning_rate=0.1))
    x, y = data(rng)
    logger = GradientLogger(log_dir=str(tmp_path))
    fit(model, x, y, logger, epochs=1)

    assert cli.main(["tensorboard", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    norms = [entry["global_norm"] for entry in logger.history]
    assert out[0] == f"steps 1-{STEPS} ({STEPS} logged)"
    assert out[1] == (
        f"global norm: first {norms[0]:.4g}, last {norms[-1]:.4g}, min {min(norms):.4g}, max {max(norms):.4g}"
    )
    last = logger.history[-1]["layer_norms"]
    assert out[2] == f"layer norms, last: head {last['head']:.4g}, hidden {last['hidden']:.4g}"
    assert cli.main(["tensorboard", str(tmp_path / "nothing")]) == 2  # one line on stderr
    assert "no TensorBoard event files" in capsys.readouterr().err
