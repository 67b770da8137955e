"""Per-example gradients next to a hand-written ``tf.vectorized_map`` and a loop of batch-of-one calls.

    python -m benchmarks.per_example [--mode eager|graph|memory] [--processes 3] [--rounds 5]

Without ``--mode`` it runs each mode this TensorFlow has in ``--processes`` fresh processes, then the
memory run. Per workload (MLP 784-256-10 batch 128, conv 32x32x3 batch 64, 2-layer LSTM batch 64):
``per_example_gradients`` against the hand-written limit (eager: one ``tf.function`` of
``tf.vectorized_map`` over a ``GradientTape`` of one example's share of the compiled loss; graph: the
same ``tf.vectorized_map`` over ``tf.gradients``, built once into the model's graph and run by one
``K.function``), against a Python loop of batch-of-one ``get_gradients`` calls, and on the MLP
``norms_only=True`` against materializing. compatgrad and the hand-written limit take turns call by
call; a figure is the median over rounds of the ratio within a round, then the median over
processes. Memory: the peak RSS of per-example norms streamed over 1,000 and 10,000 examples of a
dataset (MLP, batches of 128, ``chunk_size=32``), each in a fresh process.
COMPATGRAD_KERAS picks the flavour as in the tests.
"""

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .speed import build_workloads, interleaved, paired

RATIOS = "per-example ratios: "
TARGETS = "targets: compat/hand <= 1.3, loop/compat >= 20, materialized/norms (MLP) >= 3"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.per_example", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--mode", choices=("eager", "graph", "memory"))
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per mode")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per process")
    parser.add_argument("--examples", type=int, default=0, help=argparse.SUPPRESS)  # a memory child
    args = parser.parse_args(argv)
    if args.mode == "memory" and args.examples:
        print(stream_norms(args.examples))
        return 0
    if args.mode == "memory":
        return memory()
    if args.mode:
        return run_mode(args.mode, args.rounds)
    failed = 0
    for mode in ("eager", "graph"):
        returncode, per_process = in_processes("benchmarks.per_example", mode, args, RATIOS)
        failed |= returncode
        if per_process:
            print_summary(f"per-example gradients, {mode} mode", TARGETS, per_process)
    return failed | memory()


def in_processes(
    module: str, mode: str, args: Any, marker: str, extra: Sequence[str] = ()
) -> Tuple[int, List[Dict[str, Any]]]:
    """``module --mode mode --rounds args.rounds *extra`` in ``args.processes`` fresh processes, their
    output printed: (any return code, each process's figures, from its line starting with ``marker``)."""
    failed, per_process = 0, []
    for _ in range(args.processes):
        run = child(["--mode", mode, "--rounds", str(args.rounds), *extra], module)
        print(run.stdout, end="")
        failed |= run.returncode
        per_process += [
            json.loads(line[len(marker) :]) for line in run.stdout.splitlines() if line.startswith(marker)
        ]
        if not per_process:  # a mode this TensorFlow does not have
            break
    return failed, per_process


def child(arguments: List[str], module: str = "benchmarks.per_example") -> Any:
    """``python -m module arguments`` in a fresh process, this checkout first on its path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    sys.stdout.flush()
    command = [sys.executable, "-m", module] + arguments
    return subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)


def load(mode: str) -> Any:
    """TensorFlow and the flavour's Keras, graph mode switched on before anything is built."""
    import tensorflow as tf

    flavour = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
    keras = (
        tf.keras
        if flavour == "tf.keras"
        else importlib.import_module("keras" if flavour == "keras3" else flavour)
    )
    if mode == "graph" and not tf.__version__.startswith("1."):
        tf.compat.v1.disable_eager_execution()
        # As in speed.py: a session run fixes a while_v2 loop's outputs, and the LSTM's gradients
        # built after one (the hand-written recipe ran first) fail unless the loop outputs them all.
        tf.compat.v1.experimental.output_all_intermediates(True)
    return tf, keras


def run_mode(mode: str, rounds: int) -> int:
    tf, keras = load(mode)
    tf1 = tf.__version__.startswith("1.")
    keras3 = keras.Model.__module__.endswith(".models.model")
    print(
        f"\n== per-example gradients, {mode} mode: TF {tf.__version__}, {getattr(keras, '__version__', '')}"
    )
    if (mode == "eager" and tf1) or (mode == "graph" and keras3):
        print("skipped: this TensorFlow and Keras do not train in this mode")
        return 0

    from compatgrad import get_gradients, layer_outputs, per_example_gradients

    workloads = build_workloads(keras, mode == "graph", np.random.RandomState(0), layer_outputs)[:3]
    figures: Dict[str, Dict[str, float]] = {}
    differences = []
    for workload in workloads:
        model, x, y = workload.model, workload.x, workload.y
        compat = partial(per_example_gradients, model, x, y, verbose=0)
        hand = (eager_vectorized if mode == "eager" else graph_vectorized)(tf, keras, model, x, y)
        loop = partial(batches_of_one, get_gradients, model, x, y)
        # interleaved alternates the first two call by call: compatgrad and the hand-written limit
        variants = {"compatgrad": compat, "loop": loop}
        if hand is not None:
            variants = {"compatgrad": compat, "hand-written": hand, "loop": loop}
            differences.append(max(float(np.max(np.abs(a - b))) for a, b in zip(compat(), hand())))
        timings = interleaved(variants, rounds, {"compatgrad": 3, "hand-written": 3, "loop": 1})
        row = {"loop/compat": paired(timings, "loop", "compatgrad")}
        if hand is not None:
            row["compat/hand"] = paired(timings, "compatgrad", "hand-written")
        if workload is workloads[0]:
            norms = partial(per_example_gradients, model, x, y, norms_only=True, verbose=0)
            pair = interleaved({"norms": norms, "gradients": compat}, rounds, {"norms": 3, "gradients": 3})
            timings.update(pair)
            row["materialized/norms"] = paired(timings, "gradients", "norms")
        figures[workload.name] = row
        milliseconds = ", ".join(f"{name} {np.median(t) * 1e3:.1f}" for name, t in timings.items())
        ratios = ", ".join(f"{name} {value:.2f}" for name, value in row.items())
        ran = sorted(set(compat(return_info=True)[1].paths.values()))  # vectorized, loop
        print(f"{workload.name:<32} ms per call: {milliseconds}; {ratios}; compatgrad ran {'+'.join(ran)}")
    print(RATIOS + json.dumps(figures))
    if differences and max(differences) > 1e-4:  # then the timings compare different computations
        print(f"MISMATCH: compatgrad and the hand-written vectorized_map differ by {max(differences):.1e}")
        return 1
    return 0


def batches_of_one(get_gradients: Callable, model: Any, x: Any, y: Any) -> List[Any]:
    """The naive recipe: the step's gradient on each example alone."""
    return [get_gradients(model, x[i : i + 1], y[i : i + 1], verbose=0) for i in range(len(x))]


def example_loss(tf: Any, model: Any, x: Any, y: Any, size: int, graph: bool) -> Any:
    """One example's share of the step's loss: the compiled loss on it alone over the batch size
    (these models' losses are means over the batch, with no sample weights or regularization)."""
    y_pred = model(x[None], training=False)
    if graph:
        loss = tf.reduce_mean(model.loss_functions[0](y[None], y_pred))
    elif hasattr(model, "compute_loss"):
        loss = model.compute_loss(x=x[None], y=y[None], y_pred=y_pred)
    else:
        loss = model.compiled_loss(y[None], y_pred)
    return loss / size


def eager_vectorized(tf: Any, keras: Any, model: Any, x: Any, y: Any) -> Optional[Callable[[], List[Any]]]:
    params = list(model.trainable_weights)
    watched = [getattr(p, "value", p) if not isinstance(p, tf.Variable) else p for p in params]

    def one(example: Any) -> List[Any]:
        with tf.GradientTape() as tape:
            tape.watch(watched)
            loss = example_loss(tf, model, example[0], example[1], len(x), graph=False)
        return tape.gradient(loss, watched)

    function = tf.function(lambda x, y: tf.vectorized_map(one, (x, y)))
    try:
        function(x, y)
    except Exception as error:  # noqa: BLE001 -- a release whose vectorized_map fails on this model
        print(f"hand-written vectorized_map fails here: {type(error).__name__}")
        return None
    return lambda: [g.numpy() for g in function(x, y)]


def graph_vectorized(tf: Any, keras: Any, model: Any, x: Any, y: Any) -> Optional[Callable[[], List[Any]]]:
    params = list(model.trainable_weights)
    with model.outputs[0].graph.as_default():
        x_feed = tf.compat.v1.placeholder(tf.float32, (None,) + x.shape[1:])
        y_feed = tf.compat.v1.placeholder(tf.float32, (None,) + y.shape[1:])

        def one(example: Any) -> List[Any]:
            loss = example_loss(tf, model, example[0], example[1], len(x), graph=True)
            return tf.compat.v1.gradients(loss, params)

        try:
            grads = tf.vectorized_map(one, (x_feed, y_feed))
        except Exception as error:  # noqa: BLE001 -- a release whose vectorized_map fails on this model
            print(f"hand-written vectorized_map fails here: {type(error).__name__}")
            return None
        function = keras.backend.function([x_feed, y_feed], grads)
    try:
        function([x, y])
    except tf.errors.OpError as error:  # built, but fails on its values (TF 1.15's LSTM loops)
        print(f"hand-written vectorized_map fails here: {type(error).__name__}")
        return None
    return lambda: function([x, y])


def print_summary(title: str, targets: str, per_process: List[Dict[str, Dict[str, float]]]) -> None:
    print(f"\n== {title} over {len(per_process)} processes: the median (each process's)")
    print(targets)
    for workload, row in per_process[0].items():
        cells = []
        for name in row:
            values = [figures[workload][name] for figures in per_process]
            cells.append(f"{name} {np.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})")
        print(f"{workload:<32} " + "; ".join(cells))


def stream_norms(examples: int) -> float:
    """Per-example norms over a generated dataset; this process's peak RSS in MB."""
    tf, keras = load("eager")

    from compatgrad import per_example_gradients

    model = keras.Sequential(
        [keras.layers.Input((784,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(keras.optimizers.SGD(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def batch(index: Any) -> Any:
        x = tf.random.stateless_normal((128, 784), seed=tf.stack([index, 0]))
        y = tf.random.stateless_uniform((128,), seed=tf.stack([index, 1]), maxval=10, dtype=tf.int32)
        return x, y

    dataset = tf.data.Dataset.range(examples // 128).map(batch)
    norms = per_example_gradients(model, dataset, norms_only=True, chunk_size=32, verbose=0)
    assert norms.shape == (examples // 128 * 128,)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kilobytes on Linux


def memory() -> int:
    import tensorflow as tf

    if tf.__version__.startswith("1."):
        print("\n== per-example norms memory: skipped (no eager mode in TF 1.x)")
        return 0
    print("\n== per-example norms over a dataset (MLP 784-256-10, batch 128, chunk_size 32), fresh processes")
    for examples in (1000, 10000):
        run = child(["--mode", "memory", "--examples", str(examples)])
        if run.returncode:
            print(run.stdout)
            return 1
        peak = float(run.stdout.strip().splitlines()[-1])
        gradients = (examples // 128 * 128) * (784 * 256 + 256 + 2570) * 4 / 2**20
        print(
            f"{examples:>6} examples: peak RSS {peak:.0f} MB "
            f"(their gradients, materialized: {gradients:.0f} MB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
