"""Per-call cost of compatgrad next to a hand-written compiled step and the naive recipe.

    python -m benchmarks [--mode eager|graph|import] [--processes 3] [--rounds 8] [--calls 20]
                         [--graph-calls 1000]

Without ``--mode`` it runs every mode this TensorFlow has, each in ``--processes`` fresh processes
(graph mode has to be switched on before anything is built), and sums up compat / hand-written
per workload as the median over the processes. Within a process compatgrad and the hand-written
step take turns call by call, the naive recipe's calls follow, round after round, with garbage
collection off inside a round (as timeit).
``COMPATGRAD_KERAS`` picks the flavour as in the tests (tf.keras, keras, tf_keras, keras3). Per
workload it prints the median time per call and its spread (the interquartile range over rounds),
compatgrad / hand-written (target <= 1.10) and naive / compatgrad (each the median over rounds of
the ratio within the round), and the largest difference between compatgrad's and the hand-written
gradients. Then: graph ops added and calls per second over 1,000 graph calls (100 for the naive
recipe), eager traces over batch sizes 128, 100, 64, 128, and the time ``import compatgrad`` adds
to ``import tensorflow``.
"""

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

OPTIONAL = ("matplotlib", "tqdm", "scipy", "pandas", "jax", "torch", "keras", "tf_keras", "h5py")


class Workload(NamedTuple):
    name: str
    model: Any
    x: Any
    y: Any
    params: List[Any]  # weights, or layer outputs
    outputs: bool  # params are layer outputs


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("eager", "graph", "import"))
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per mode")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per process")
    parser.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    parser.add_argument("--graph-calls", type=int, default=1000, help="0: no graph growth, traces")
    args = parser.parse_args(argv)
    if args.mode == "import":
        return import_time()
    if args.mode:
        return run_mode(args.mode, args.rounds, args.calls, args.graph_calls)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    failed = 0
    for mode in ("eager", "graph"):
        per_process: List[Dict[str, float]] = []
        for process in range(args.processes):
            graph_calls = args.graph_calls if process == 0 else 0  # growth and traces once
            command = [
                sys.executable,
                "-m",
                "benchmarks",
                "--mode",
                mode,
                "--rounds",
                str(args.rounds),
                "--calls",
                str(args.calls),
                "--graph-calls",
                str(graph_calls),
            ]
            sys.stdout.flush()
            run = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
            print(run.stdout, end="")
            failed |= run.returncode
            per_process += [
                json.loads(line[len(RATIOS) :]) for line in run.stdout.splitlines() if line.startswith(RATIOS)
            ]
            if not per_process:  # a mode this TensorFlow does not have
                break
        if per_process:
            print_summary(mode, per_process)
    sys.stdout.flush()
    failed |= import_time()
    return 1 if failed else 0


def run_mode(mode: str, rounds: int, calls: int, graph_calls: int) -> int:
    import tensorflow as tf

    tf1 = not hasattr(tf, "function") or tf.__version__.startswith("1.")
    flavour = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
    keras = (
        tf.keras
        if flavour == "tf.keras"
        else importlib.import_module("keras" if flavour == "keras3" else flavour)
    )
    keras3 = keras.Model.__module__.endswith(".models.model")
    print(
        "\n== {} mode: TF {}, {} {}".format(
            mode, tf.__version__, flavour, keras.__version__ if hasattr(keras, "__version__") else ""
        )
    )
    if mode == "eager" and tf1:
        print("skipped: TF 1.x has no eager training step")
        return 0
    if mode == "graph" and keras3:
        print("skipped: Keras 3 does not train in graph mode")
        return 0
    if mode == "graph" and not tf1:
        tf.compat.v1.disable_eager_execution()
        # A session run fixes a while_v2 loop's outputs: gradients built later (the naive recipe's,
        # or train_on_batch's after a predict) fail on an LSTM unless the loop outputs them all.
        tf.compat.v1.experimental.output_all_intermediates(True)

    from compatgrad import get_gradients, gradient_function, layer_outputs, symbolic_gradients

    workloads = build_workloads(keras, mode == "graph", np.random.RandomState(0), layer_outputs)
    baselines = workloads
    if mode == "graph":
        # On one model, whichever gradient of a TF 2 while loop is built second runs slower (1.5-2x):
        # the baselines get their own copy of each model, with the same weights and data.
        baselines = build_workloads(keras, True, np.random.RandomState(0), layer_outputs)
        for ours, theirs in zip(workloads, baselines):
            theirs.model.set_weights(ours.model.get_weights())
    rows = []
    hand_written = []  # per workload: (hand, naive)
    for workload, baseline in zip(workloads, baselines):
        compat = lambda w=workload: get_gradients(w.model, w.x, w.y, w.params, verbose=0)  # noqa: E731
        if mode == "eager":
            hand, naive = eager_baselines(tf, keras3, workload)
        else:
            hand, naive = graph_baselines(keras.backend, baseline)
        hand_written.append((hand, naive))
        difference = max(float(np.max(np.abs(a - b))) for a, b in zip(compat(), hand()))
        # The naive graph recipe grows the graph on every call, and slows down to seconds per call.
        counts = {"compatgrad": calls, "hand-written": calls, "naive": 1 if mode == "graph" else calls}
        timings = interleaved({"compatgrad": compat, "hand-written": hand, "naive": naive}, rounds, counts)
        rows.append((workload.name, timings, difference))
    mlp, (hand, naive) = workloads[0], hand_written[0]
    fn = gradient_function(mlp.model, mlp.params)
    flat = [mlp.x, mlp.y, 0] if mode == "graph" else [mlp.x, mlp.y]  # as legacy code feeds K.function
    rows.append(same_step_row(FLAT_LIST, lambda: fn(flat), hand, naive, rounds, calls))
    if mode == "eager":
        symbolic = tf.function(lambda x, y: symbolic_gradients(mlp.model, x, y, mlp.params))
        compat = lambda: [g.numpy() for g in symbolic(mlp.x, mlp.y)]  # noqa: E731
        rows.append(same_step_row(SYMBOLIC, compat, hand, naive, rounds, calls))
    rows.append(dataset_row(tf, keras, mode == "graph", get_gradients, rounds))
    print_table(
        rows, "tf.function + GradientTape" if mode == "eager" else "K.function built once", rounds, calls
    )
    print(
        RATIOS
        + json.dumps({name: paired(timings, "compatgrad", "hand-written") for name, timings, _ in rows})
    )
    mismatched = [name for name, _, difference in rows if difference > 1e-4]
    if mismatched:  # then the timings compare different computations
        print("MISMATCH: compatgrad and the hand-written step disagree on " + ", ".join(mismatched))
    if graph_calls and mode == "graph":
        graph_growth(
            get_gradients, graph_baselines(keras.backend, baselines[0])[1], workloads[0], graph_calls
        )
    elif graph_calls:
        traces(tf, get_gradients, workloads[0].model, np.random.RandomState(1))
    return 1 if mismatched else 0


RATIOS = "compat/hand per workload: "
DATASET = "dataset 20,000 x 784, batch 128"
TARGETS = {DATASET: 1.20}  # every other workload: 1.10
FLAT_LIST = "MLP, gradient_function([x, y])"
SYMBOLIC = "MLP, symbolic_gradients in tf.function"


def same_step_row(
    name: str, compat: Callable, hand: Callable, naive: Callable, rounds: int, calls: int
) -> Tuple[str, Dict[str, List[float]], float]:
    """Another front door to the MLP's step, next to the MLP's hand-written step and naive recipe."""
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(compat(), hand()))
    counts = {"compatgrad": calls, "hand-written": calls, "naive": 1}
    timings = interleaved({"compatgrad": compat, "hand-written": hand, "naive": naive}, rounds, counts)
    return name, timings, difference


def dataset_row(tf: Any, keras: Any, graph: bool, get_gradients: Callable, rounds: int) -> tuple:
    """The MLP's gradient over a whole tf.data.Dataset next to a hand-written loop over it.

    Eager: 20,000 examples from arrays, and the hand-written loop is one tf.function that iterates
    over the dataset and adds up the size-weighted batch gradients in the graph. Graph mode: as
    many examples drawn batch by batch in the graph, and the hand-written recipe (a Keras model's
    placeholders allow no loop in the graph) fetches each batch from a one-shot iterator and feeds
    it to one K.function over the gradients, adding them up in numpy. Three epochs a round each.
    """
    rng = np.random.RandomState(2)
    optimizers = getattr(keras.optimizers, "legacy", None) if graph else None
    inputs = keras.layers.Input((784,))
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Dense(256, activation="relu")(inputs)))
    sgd = (
        getattr(optimizers, "SGD", None) or keras.optimizers.SGD
    )  # graph mode trains with the legacy optimizers
    model.compile(sgd(learning_rate=0.1), keras.losses.CategoricalCrossentropy(from_logits=True))
    if graph:  # arrays would become a 62 MB constant that every one-shot iterator serializes again
        dataset = tf.data.Dataset.range(157).map(generated_batch)
    else:
        x, y = rng.randn(20000, 784).astype("float32"), np.eye(10, dtype="float32")[rng.randint(0, 10, 20000)]
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
    hand = (
        graph_dataset_baseline(tf, keras.backend, model, dataset)
        if graph
        else eager_dataset_baseline(tf, model, dataset)
    )
    compat = lambda: get_gradients(model, dataset, verbose=0)  # noqa: E731
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(compat(), hand()))
    timings = interleaved(
        {"compatgrad": compat, "hand-written": hand}, rounds, {"compatgrad": 3, "hand-written": 3}
    )
    timings["naive"] = timings["hand-written"]  # no naive recipe for datasets: the column reads 1
    return DATASET, timings, difference


def generated_batch(index: Any) -> Tuple[Any, Any]:
    """Batch ``index`` of 20,000 examples in batches of 128 (the last has 32), drawn in the graph."""
    import tensorflow as tf

    size = tf.where(index < 156, 128, 32)
    seed = tf.stack([index, tf.constant(0, tf.int64)])
    x = tf.random.stateless_normal(tf.stack([size, 784]), seed=seed)
    labels = tf.random.stateless_uniform(tf.stack([size]), seed=seed + 1, maxval=10, dtype=tf.int32)
    return x, tf.one_hot(labels, 10)


def eager_dataset_baseline(tf: Any, model: Any, dataset: Any) -> Callable:
    params = list(model.trainable_weights)

    def loss_of(x: Any, y: Any) -> Any:
        y_pred = model(x, training=False)
        if hasattr(model, "compute_loss"):
            return model.compute_loss(x=x, y=y, y_pred=y_pred)
        return model.compiled_loss(y, y_pred, regularization_losses=model.losses)

    # Over an iterator: autograph loops over a dataset itself by Dataset.reduce, which runs the body
    # on tf.data's threads, slower (0.73 on TF 2.21 Keras 3) than the while loop it makes of this.
    @tf.function
    def over(iterator: Any) -> List[Any]:
        sums = tuple(tf.zeros_like(p) for p in params)  # a tuple: autograph would stack a list
        examples = tf.constant(0.0)
        for x, y in iterator:
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            size = tf.cast(tf.shape(x)[0], tf.float32)
            sums = tuple(s + size * g for s, g in zip(sums, tape.gradient(loss, params)))
            examples += size
        return [s / examples for s in sums]

    return lambda: [g.numpy() for g in over(iter(dataset))]


def graph_dataset_baseline(tf: Any, K: Any, model: Any, dataset: Any) -> Callable:
    phase = K.symbolic_learning_phase() if hasattr(K, "symbolic_learning_phase") else K.learning_phase()
    feeds = list(model._feed_inputs) + list(model._feed_targets) + [phase]
    function = K.function(feeds, model.optimizer.get_gradients(model.total_loss, model.trainable_weights))

    def over() -> List[Any]:
        next_element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        session = (getattr(K, "get_session", None) or tf.compat.v1.keras.backend.get_session)()
        sums, examples = None, 0
        while True:
            try:
                x, y = session.run(next_element)
            except tf.errors.OutOfRangeError:
                break
            grads = [len(x) * np.asarray(g, np.float64) for g in function([x, y, 0])]
            sums = grads if sums is None else [s + g for s, g in zip(sums, grads)]
            examples += len(x)
        return [(s / examples).astype("float32") for s in sums]

    return over


def print_summary(mode: str, per_process: List[Dict[str, float]]) -> None:
    """compat / hand-written per workload: the median over processes, and each process's figure.

    A process's figure moves between processes more than within one (memory layout, the machine's
    load): the median over fresh processes is what the target is checked on.
    """
    print(
        f"\n== {mode} mode over {len(per_process)} processes: "
        "compat/hand, the median over processes (each process's figure)"
    )
    missed = []
    for name in per_process[0]:
        figures = [ratios[name] for ratios in per_process]
        median = float(np.median(figures))
        missed += [name] if median > TARGETS.get(name, 1.10) else []
        print("{:<40} {:>6.3f} ({})".format(name, median, ", ".join(f"{f:.3f}" for f in figures)))
    print(
        "target compatgrad / hand-written <= 1.10 (the dataset: 1.20): met on {} of {} workloads{}".format(
            len(per_process[0]) - len(missed),
            len(per_process[0]),
            "; missed on " + ", ".join(missed) if missed else "",
        )
    )


def build_workloads(keras: Any, graph: bool, rng: Any, layer_outputs: Callable) -> List[Workload]:
    layers = keras.layers
    optimizers = getattr(keras.optimizers, "legacy", None) if graph else None
    sgd = (
        getattr(optimizers, "SGD", None) or keras.optimizers.SGD
    )  # graph mode trains with the legacy optimizers

    def compiled(inputs: Any, outputs: Any, loss: Any) -> Any:
        model = keras.Model(inputs, outputs)
        model.compile(sgd(learning_rate=0.1), loss)
        return model

    def one_hot(n: int, classes: int) -> Any:
        return np.eye(classes, dtype="float32")[rng.randint(0, classes, size=n)]

    inputs = layers.Input((784,))
    # Logits: Keras computes a crossentropy on a softmax output from its logits, which leaves the
    # softmax output itself without a gradient.
    crossentropy = keras.losses.CategoricalCrossentropy(from_logits=True)
    mlp = compiled(inputs, layers.Dense(10)(layers.Dense(256, activation="relu")(inputs)), crossentropy)
    mlp_x, mlp_y = rng.randn(128, 784).astype("float32"), one_hot(128, 10)

    inputs = layers.Input((32, 32, 3))
    hidden = layers.MaxPooling2D()(layers.Conv2D(16, 3, activation="relu")(inputs))
    hidden = layers.GlobalAveragePooling2D()(layers.Conv2D(32, 3, activation="relu")(hidden))
    conv = compiled(inputs, layers.Dense(10)(hidden), crossentropy)

    inputs = layers.Input((20, 16))
    lstm = compiled(
        inputs, layers.Dense(1)(layers.LSTM(32)(layers.LSTM(32, return_sequences=True)(inputs))), "mse"
    )

    return [
        Workload("MLP 784-256-10, batch 128", mlp, mlp_x, mlp_y, list(mlp.trainable_weights), False),
        Workload(
            "conv 32x32x3, batch 64",
            conv,
            rng.randn(64, 32, 32, 3).astype("float32"),
            one_hot(64, 10),
            list(conv.trainable_weights),
            False,
        ),
        Workload(
            "2-layer LSTM 20x16, batch 64",
            lstm,
            rng.randn(64, 20, 16).astype("float32"),
            rng.randn(64, 1).astype("float32"),
            list(lstm.trainable_weights),
            False,
        ),
        Workload("MLP layer outputs, batch 128", mlp, mlp_x, mlp_y, layer_outputs(mlp, [1, 2]), True),
    ]


def eager_baselines(tf: Any, keras3: bool, workload: Workload) -> Tuple[Callable, Callable]:
    """The hand-written limit (a tf.function) and the naive recipe (the same, uncompiled)."""
    model, params = workload.model, workload.params
    forward = type(model)(model.inputs, params + [model.outputs[0]]) if workload.outputs else model

    def loss_of(x: Any, y: Any, y_pred: Any) -> Any:
        if keras3:
            return model.compute_loss(x=x, y=y, y_pred=y_pred)
        if hasattr(model, "compute_loss"):
            return model.compute_loss(x, y, y_pred, None)
        return model.compiled_loss(y, y_pred, regularization_losses=model.losses)

    def step(x: Any, y: Any) -> List[Any]:
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)  # the compiled loss takes tensors
        with tf.GradientTape() as tape:
            if workload.outputs:
                *activations, y_pred = forward(x, training=False)
            else:
                y_pred = forward(x, training=False)
            loss = loss_of(x, y, y_pred)
        return tape.gradient(loss, activations if workload.outputs else params)

    compiled = tf.function(step)
    return (
        lambda: [g.numpy() for g in compiled(workload.x, workload.y)],
        lambda: [g.numpy() for g in step(workload.x, workload.y)],
    )


def graph_baselines(K: Any, workload: Workload) -> Tuple[Callable, Callable]:
    """One K.function over total_loss built by hand, and the recipe that builds it on every call."""
    model = workload.model
    phase = K.symbolic_learning_phase() if hasattr(K, "symbolic_learning_phase") else K.learning_phase()
    feeds = list(model._feed_inputs) + list(model._feed_targets) + [phase]
    values = [workload.x, workload.y, 0]

    def gradients() -> List[Any]:
        if workload.outputs:
            return K.gradients(model.total_loss, workload.params)
        return model.optimizer.get_gradients(model.total_loss, workload.params)

    function = K.function(feeds, gradients())
    return lambda: function(values), lambda: K.function(feeds, gradients())(values)


def interleaved(variants: Dict[str, Callable], rounds: int, calls: Dict[str, int]) -> Dict[str, List[float]]:
    """Seconds per call of each variant, one figure per round: the median of its ``calls[name]`` calls.

    The first two variants (compatgrad and the hand-written step) take turns call by call, in an
    order that alternates, so each runs as often after itself as after the other, under the same
    conditions (the caches the previous call left, a burst of load from elsewhere): their ratio
    within a round is fair. The rest (the naive recipe) run their calls after them. Each call is
    timed alone.
    """
    names = list(variants)
    for name in names:  # trace, build, warm the caches
        variants[name]()
        variants[name]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        each: Dict[str, List[float]] = {name: [] for name in names}
        pair = names[:2]
        turns = [
            (name, turn)
            for turn in range(calls[pair[0]])
            for name in (pair if (round_ + turn) % 2 else pair[::-1])
        ]
        turns += [(name, turn) for name in names[2:] for turn in range(calls[name])]
        gc.collect()  # as timeit: no collection inside the timed calls
        gc.disable()
        for name, _ in turns:
            start = time.perf_counter()
            variants[name]()
            each[name].append(time.perf_counter() - start)
        gc.enable()
        for name in names:
            times[name].append(float(np.median(each[name])))
    return times


def spread(values: List[float]) -> Tuple[float, float]:
    """Median and interquartile range."""
    low, median, high = np.percentile(values, [25, 50, 75])
    return float(median), float(high - low)


def print_table(rows: list, limit: str, rounds: int, calls: int) -> None:
    print(
        f"median ms per call (interquartile range), {rounds} rounds x {calls} calls (naive graph: 1); "
        f"hand-written = {limit}"
    )
    print(
        "compat/hand: the median over rounds of the ratio within a round "
        "(its interquartile range over rounds)"
    )
    header = "{:<40} {:>16} {:>16} {:>16} {:>20} {:>13} {:>9}".format(
        "workload", "compatgrad", "hand-written", "naive", "compat/hand", "naive/compat", "max diff"
    )
    print(header)
    print("-" * len(header))
    for name, timings, difference in rows:
        compat, hand, naive = (spread(timings[k]) for k in ("compatgrad", "hand-written", "naive"))
        cells = [f"{m * 1e3:.3f} ({s * 1e3:.3f})" for m, s in (compat, hand, naive)]
        low, high = np.percentile(ratios(timings, "compatgrad", "hand-written"), [25, 75])
        ratio = "{:.3f} ({:.2f}-{:.2f})".format(paired(timings, "compatgrad", "hand-written"), low, high)
        print(
            "{:<40} {:>16} {:>16} {:>16} {:>20} {:>13.2f} {:>9.1e}".format(
                name, *cells, ratio, paired(timings, "naive", "compatgrad"), difference
            )
        )


def ratios(timings: Dict[str, List[float]], numerator: str, denominator: str) -> List[float]:
    return [a / b for a, b in zip(timings[numerator], timings[denominator])]


def paired(timings: Dict[str, List[float]], numerator: str, denominator: str) -> float:
    """The median over rounds of the ratio within a round: the machine's drift between rounds cancels."""
    return float(np.median(ratios(timings, numerator, denominator)))


def graph_growth(get_gradients: Callable, naive: Callable, workload: Workload, calls: int) -> None:
    """Ops added and calls per second at the start and the end; the naive recipe over a tenth of the calls."""
    graph = workload.model.total_loss.graph
    compat = lambda: get_gradients(workload.model, workload.x, workload.y, workload.params)  # noqa: E731
    for label, call, count in (("compatgrad", compat, calls), ("naive", naive, max(1, calls // 10))):
        call()
        ops = len(graph.get_operations())
        window = max(1, count // 10)
        rates = []
        for start in range(0, count, window):
            began = time.perf_counter()
            for _ in range(min(window, count - start)):
                call()
            rates.append(min(window, count - start) / (time.perf_counter() - began))
        print(
            f"{label} over {count} graph calls (MLP): ops added {len(graph.get_operations()) - ops}, "
            f"calls/s over the first {window} {rates[0]:.1f}, over the last {window} {rates[-1]:.1f}"
        )


def traces(tf: Any, get_gradients: Callable, model: Any, rng: Any) -> None:
    from compatgrad import _cache

    def count(function: Any) -> int:
        return (getattr(function, "experimental_get_tracing_count", None) or function._get_tracing_count)()

    hand = tf.function(lambda x: model(x, training=False))
    sizes = (128, 100, 64, 128)
    for size in sizes:
        x = rng.randn(size, 784).astype("float32")
        get_gradients(model, x, np.eye(10, dtype="float32")[rng.randint(0, 10, size=size)], verbose=0)
        hand(x)
    steps = [function for function in _cache.built(model) if hasattr(function, "get_concrete_function")]
    print(
        "traces over batch sizes {}: compatgrad {} (target <= 2), a default tf.function {}".format(
            ", ".join(map(str, sizes)), max(count(f) for f in steps), count(hand)
        )
    )


def import_time(repeats: int = 5) -> int:
    """Fresh processes: import tensorflow, then time import compatgrad and list what it imported."""
    probe = (
        "import sys, time, tensorflow; before = set(sys.modules); start = time.perf_counter(); "
        "import compatgrad; print(time.perf_counter() - start); "
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    seconds, added = [], set()
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", probe], stdout=subprocess.PIPE, check=True, text=True
        ).stdout.split("\n")
        seconds.append(float(out[0]))
        added |= set(out[1].split())
    optional = sorted(added & set(OPTIONAL))
    print(
        "\n== import: compatgrad adds {:.1f} ms to import tensorflow (median of {}; target < 50 ms); "
        "optional dependencies imported: {}".format(
            float(np.median(seconds)) * 1e3, repeats, ", ".join(optional) or "none"
        )
    )
    return 1 if optional else 0


if __name__ == "__main__":
    sys.exit(main())
