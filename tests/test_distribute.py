"""tf.distribute: the cross-replica gradient the step applies, equal to one device's on the same batch."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import kit
from compatgrad import errors, get_gradients, layer_outputs

kit.TENSORFLOW.needed_by_module()
pytestmark = pytest.mark.skipif(kit.GRAPH, reason="distribution strategies: eager training steps only")
layers = kit.keras.layers
TOL = 1e-5


def model_on(strategy=None, **optimizer_kwargs):
    def build():
        inputs = layers.Input(shape=(5,))
        hidden = layers.Dense(8, activation="tanh", name="hidden")(inputs)
        model = kit.keras.Model(inputs, layers.Dense(1)(hidden))
        model.compile(kit.sgd(**optimizer_kwargs), "mse")
        return model

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def data(rng, n=32):
    return (
        rng.randn(n, 5).astype("float32"),
        rng.randn(n, 1).astype("float32"),
        rng.uniform(0, 2, size=n).astype("float32"),
    )


def replicas_combine():
    """How the step combines the replicas' gradients, told by the Keras version (not by compatgrad's code):
    "mean" (Keras 2, Keras 3 >= 3.8: summed, each replica's loss divided by the replica count),
    "sum" (Keras 3.5-3.7: summed, every replica has all of the loss), "own" (Keras 3.0-3.4: the
    all-reduce runs inside merge_call, where it does nothing, so each replica applies its own)."""
    if not kit.KERAS3:
        return "mean"
    version = tuple(int(part) for part in kit.keras.__version__.split(".")[:2])
    return "own" if version < (3, 5) else "sum" if version < (3, 8) else "mean"


@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unweighted"])
@pytest.mark.parametrize(
    "optimizer_kwargs",
    [
        pytest.param({}, id="plain"),
        pytest.param({"clipnorm": 0.05}, id="clipnorm", marks=kit.CLIPPING_UNDER_A_STRATEGY.needed),
    ],
)
def test_mirrored_equals_one_device_and_its_own_step(optimizer_kwargs, weighted, rng):
    x, y, weights = data(rng)
    weights = weights if weighted else None
    strategy = kit.mirrored()
    distributed = model_on(strategy, **optimizer_kwargs)
    single = model_on(**optimizer_kwargs)
    single.set_weights(distributed.get_weights())
    assert distributed.distribute_strategy.num_replicas_in_sync == 2
    params = list(distributed.trainable_weights) + layer_outputs(distributed, ["hidden"])
    grads = get_gradients(distributed, x, y, params, sample_weight=weights)
    reference = get_gradients(
        single,
        x,
        y,
        list(single.trainable_weights) + layer_outputs(single, ["hidden"]),
        sample_weight=weights,
    )
    # Keras 3 gives both replicas the whole batch: summed with all of the loss on each, twice one device's.
    factor = 2 if replicas_combine() == "sum" else 1
    assert (
        kit.max_difference(grads[4:], reference[4:]) <= TOL
    )  # the activations' gradients are each replica's
    if kit.KERAS3 and optimizer_kwargs and replicas_combine() == "mean":
        # Keras 3 clips each replica's half of the gradient before the sum: not one device's clipped gradient.
        assert kit.max_difference(grads[:4], reference[:4]) > 1e-3
    else:
        assert kit.max_difference(grads[:4], [factor * r for r in reference[:4]]) <= TOL
    assert (
        kit.parity_difference(grads[:4], kit.train_step_delta(distributed, x, y, sample_weight=weights))
        <= TOL
    )


@kit.REPLICAS_AVERAGED.needed
def test_distributed_dataset_gives_the_same_gradient(rng):
    x, y, weights = data(rng)
    strategy = kit.mirrored()
    distributed, single = model_on(strategy), model_on()
    single.set_weights(distributed.get_weights())
    dataset = strategy.experimental_distribute_dataset(
        kit.tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(16)
    )
    grads = get_gradients(distributed, dataset, verbose=0)
    assert kit.max_difference(grads, get_gradients(single, x, y, sample_weight=weights)) <= TOL
    assert kit.parity_difference(grads, kit.train_step_delta(single, x, y, sample_weight=weights)) <= TOL


# Outputs in the order of their names: Keras 3.6 matches a loss dict to list outputs in sorted key order.
INPUTS, OUTPUTS = ("left", "right"), ("label", "score")


def two_in_two_out_on(strategy, keyed):
    """Two named inputs, two named outputs (3-class softmax, regression), weighted losses: as lists, or
    keyed by output name (dict of losses and loss weights; x and y then come as dicts too)."""
    with strategy.scope():
        left, right = layers.Input(shape=(5,), name="left"), layers.Input(shape=(3,), name="right")
        hidden = layers.Dense(8, activation="tanh", name="hidden")(layers.Concatenate()([left, right]))
        label = layers.Dense(3, activation="softmax", name="label")(hidden)
        model = kit.keras.Model([left, right], [label, layers.Dense(1, name="score")(hidden)])
        losses, loss_weights = ["sparse_categorical_crossentropy", "mse"], [0.5, 1.0]
        if keyed:
            losses, loss_weights = dict(zip(OUTPUTS, losses)), dict(zip(OUTPUTS, loss_weights))
        model.compile(kit.sgd(), losses, loss_weights=loss_weights)
    return model


def two_in_two_out_data(rng, keyed, n=32):
    """x, y, per-output sample weights: lists in input / output order, or dicts keyed by name."""
    x = [rng.randn(n, 5).astype("float32"), rng.randn(n, 3).astype("float32")]
    y = [rng.randint(0, 3, size=(n, 1)), rng.randn(n, 1).astype("float32")]
    weights = [rng.uniform(0, 2, size=n).astype("float32") for _ in range(2)]
    if keyed:
        return dict(zip(INPUTS, x)), dict(zip(OUTPUTS, y)), dict(zip(OUTPUTS, weights))
    return x, y, weights


STRATEGIES = {"mirrored": kit.mirrored, "one_device": lambda: kit.tf.distribute.OneDeviceStrategy("/cpu:0")}


@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unweighted"])
@pytest.mark.parametrize("keyed", [False, True], ids=["lists", "dicts"])
@pytest.mark.parametrize("strategy_name", sorted(STRATEGIES))
def test_multi_input_multi_output_under_strategy(strategy_name, keyed, weighted, rng):
    """Keras 3.6+ builds a CompileLoss of several losses (a loss tracker per output) before the step;
    built inside the replica step instead, its distributed variables broke the traced function."""
    x, y, weights = two_in_two_out_data(rng, keyed)
    weights = weights if weighted else None
    strategy = STRATEGIES[strategy_name]()
    distributed = two_in_two_out_on(strategy, keyed)
    single = two_in_two_out_on(kit.tf.distribute.get_strategy(), keyed)
    single.set_weights(distributed.get_weights())
    params = list(distributed.trainable_weights) + layer_outputs(distributed, ["hidden"])
    grads = get_gradients(distributed, x, y, params, sample_weight=weights)  # before any train_on_batch
    single_params = list(single.trainable_weights) + layer_outputs(single, ["hidden"])
    reference = get_gradients(single, x, y, single_params, sample_weight=weights)
    assert kit.max_difference(grads, get_gradients(distributed, x, y, params, sample_weight=weights)) == 0.0
    factor = strategy.num_replicas_in_sync if replicas_combine() == "sum" else 1
    assert kit.max_difference(grads[6:], reference[6:]) <= TOL  # activations' gradients: each replica's
    assert kit.max_difference(grads[:6], [factor * r for r in reference[:6]]) <= TOL
    # Keras 3.15 train_on_batch takes per-output weights as a list only (a dict: "KeyError: 0").
    oracle_weights = list(weights.values()) if isinstance(weights, dict) else weights
    delta = kit.train_step_delta(distributed, x, y, sample_weight=oracle_weights)
    assert kit.parity_difference(grads[:6], delta) <= TOL


@kit.REPLICAS_AVERAGED.needed
@pytest.mark.parametrize("keyed", [False, True], ids=["lists", "dicts"])
def test_multi_input_multi_output_distributed_dataset(keyed, rng):
    """The CompileLoss built from a distributed batch: from one replica's part of it."""
    x, y, _ = two_in_two_out_data(rng, keyed)
    strategy = kit.mirrored()
    distributed = two_in_two_out_on(strategy, keyed)
    single = two_in_two_out_on(kit.tf.distribute.get_strategy(), keyed)
    single.set_weights(distributed.get_weights())
    slices = (x, y) if keyed else (tuple(x), tuple(y))  # tf.data would stack lists into one tensor
    dataset = kit.tf.data.Dataset.from_tensor_slices(slices).batch(16)
    grads = get_gradients(distributed, strategy.experimental_distribute_dataset(dataset), verbose=0)
    assert kit.max_difference(grads, get_gradients(single, x, y)) <= TOL
    assert kit.parity_difference(grads, kit.train_step_delta(single, x, y)) <= TOL


def test_unsupported_strategy_is_refused(rng):
    x, y, _ = data(rng, 8)
    model = model_on(kit.tf.distribute.experimental.CentralStorageStrategy())
    with pytest.raises(
        errors.UnsupportedModelError, match="CentralStorageStrategy, which compatgrad does not support"
    ):
        get_gradients(model, x, y)


PARAMETER_SERVER = """
import importlib, os
import numpy as np
import tensorflow as tf
import compatgrad

flavour = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
package = "keras" if flavour == "keras3" else flavour
keras = tf.keras if flavour == "tf.keras" else importlib.import_module(package)
cluster = tf.train.ClusterSpec({{"worker": ["127.0.0.1:{}"], "ps": ["127.0.0.1:{}"]}})
servers = [
    tf.distribute.Server(cluster, job_name=job, task_index=0, protocol="grpc", start=True)
    for job in ("worker", "ps")
]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
with tf.distribute.experimental.ParameterServerStrategy(resolver).scope():
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model.compile(keras.optimizers.SGD(1.0), "mse")
try:
    compatgrad.get_gradients(model, np.ones((4, 3), "float32"), np.ones((4, 1), "float32"))
except compatgrad.errors.UnsupportedModelError as error:
    print("refused:", error)
"""


@pytest.mark.skipif(
    not hasattr(kit.tf.distribute, "MultiWorkerMirroredStrategy"),
    reason="ParameterServerStrategy V2 arrived in TF 2.4",
)
def test_parameter_server_strategy_is_refused():
    """In a subprocess: connecting to the in-process cluster changes the eager context for good."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-c", PARAMETER_SERVER.format(*free_ports(2))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=240,
    )
    output = result.stdout.decode(errors="replace")
    assert result.returncode == 0 and "refused: model: built under ParameterServerStrategy" in output, output[
        -3000:
    ]


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(job, tmp_path, arrays):
    """Two MultiWorkerMirroredStrategy workers on loopback running ``job`` (tests/mwms_worker.py) on
    ``arrays``; what each wrote."""
    np.savez(str(tmp_path / "inputs.npz"), **arrays)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mwms_worker.py")
    results = [str(tmp_path / f"results{i}.npz") for i in range(2)]
    processes = []
    for index in range(2):
        env = dict(
            os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        )
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(worker)), env.get("PYTHONPATH", "")]
        )
        command = [sys.executable, worker, job, str(tmp_path / "inputs.npz"), str(index)] + results
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outputs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert all(p.returncode == 0 for p in processes), "\n".join(o[-3000:] for o in outputs)
    return [np.load(path) for path in results]


MULTI_WORKER = pytest.mark.skipif(
    not hasattr(kit.tf.distribute, "MultiWorkerMirroredStrategy"),
    reason="MultiWorkerMirroredStrategy is experimental before TF 2.4",
)


@MULTI_WORKER
def test_multi_worker_mirrored_on_loopback(rng, tmp_path):
    x, y, weights = data(rng)
    single = model_on()
    arrays = {"x": x, "y": y, "sample_weight": weights}
    arrays.update((f"w{i}", w) for i, w in enumerate(single.get_weights()))
    results = run_workers("gradients", tmp_path, arrays)
    if replicas_combine() == "mean":
        expected = [kit.train_step_delta(single, x, y, sample_weight=weights)] * 2
    else:  # each worker's own half, or the sum of both halves' gradients
        halves = []
        for rows in (slice(0, 16), slice(16, 32)):
            half = model_on()
            half.set_weights(single.get_weights())
            halves.append(kit.train_step_delta(half, x[rows], y[rows], sample_weight=weights[rows]))
        expected = halves if replicas_combine() == "own" else [[a + b for a, b in zip(*halves)]] * 2
    for index in range(2):
        grads = [results[index][f"arr_{i}"] for i in range(4)]
        assert kit.parity_difference(grads, expected[index]) <= TOL


@MULTI_WORKER
@kit.FIT_UNDER_MULTI_WORKER_MIRRORED.needed
def test_gradient_logger_multi_worker_mirrored_on_loopback(rng, tmp_path):
    """Each worker logs what its step applied: how far its weights moved (SGD(1.0))."""
    x, y, _ = data(rng)
    arrays = {"x": x, "y": y, "sample_weight": np.ones(len(x), "float32")}
    arrays.update((f"w{i}", w) for i, w in enumerate(model_on().get_weights()))
    for result in run_workers("fit", tmp_path, arrays):
        firsts = [key for key in result.files if key.startswith("logged") and key.endswith("_0")]
        steps = sorted(int(key[len("logged") : -len("_0")]) for key in firsts)
        assert steps == list(range(1, len(x) // 8 + 1))
        for step in steps:
            logged = [result[f"logged{step}_{i}"] for i in range(4)]
            assert kit.parity_difference(logged, [result[f"moved{step}_{i}"] for i in range(4)]) <= TOL
