"""``fit`` with ``GradientLogger`` next to ``fit`` without it.

    python -m benchmarks.callback [--mode eager|graph] [--processes 3] [--rounds 5]

Without ``--mode`` it runs each mode this TensorFlow has, in ``--processes`` fresh processes. Per
workload (MLP 784-256-10, batches of 128, 80 a epoch; conv 32x32x3, batches of 64, 40 a epoch), one
model trains in turns: ``fit`` of 2 epochs without a logger, with a logger tapping every step
(norms; update ratios every 10 steps, the default), the norms alone every step, every step with
update ratios every step too, every 10 steps, and every step writing all of it to TensorBoard with
histograms every 100 steps. A fit's figure is its second epoch (the first traces the train function:
the logger's is traced again at each ``fit``), timed by a callback; a round's ratio is with / without,
a process's the median over rounds, the figure the median over processes. Targets (issue 19): norms
every step <= 1.05, histograms every 100 steps (and all of it written to TensorBoard) <= 1.10.
COMPATGRAD_KERAS picks the flavour as in the tests.

A second row a workload ("step and hook, paired") times what a logger adds to a step without ``fit``
around it: Keras' own train function and the tapped one followed by the logger's batch hook, called in
turn on one batch (``--paired-steps`` pairs a logger), the median over pairs of their difference over
the median of Keras' own step. Fits vary from one to the next by as much as the targets on a 2-core VM
(and a fit with a logger traces its step again); calls in turn share their conditions. Keras' fit loop
is left out of both, so this ratio is the higher of the two for the same cost.
"""

import argparse
import gc
import json
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from compatgrad.callbacks import AnyKerasCallback

from .per_example import in_processes, load, print_summary

RATIOS = "callback ratios: "
TARGETS = "targets: norms every step <= 1.05, histograms every 100 steps <= 1.10"


class EpochTimer(AnyKerasCallback):
    """The duration of each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.durations: List[float] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        # What tracing the train function left (each fit with a logger traces it again) is collected
        # now, not by a collection that would fall in the epoch timed.
        gc.collect()
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.durations.append(time.perf_counter() - self.start)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.callback", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--mode", choices=("eager", "graph"))
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per mode")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per process")
    parser.add_argument("--paired-steps", type=int, default=1000, help="pairs a logger")
    args = parser.parse_args(argv)
    if args.mode:
        return run_mode(args.mode, args.rounds, args.paired_steps)
    failed = 0
    for mode in ("eager", "graph"):
        paired_steps = ["--paired-steps", str(args.paired_steps)]
        returncode, per_process = in_processes("benchmarks.callback", mode, args, RATIOS, paired_steps)
        failed |= returncode
        if per_process:
            print_summary(f"fit with GradientLogger, {mode} mode", TARGETS, per_process)
    return failed


def run_mode(mode: str, rounds: int, paired_steps: int) -> int:
    tf, keras = load(mode)
    keras3 = keras.Model.__module__.endswith(".models.model")
    print(
        f"\n== fit with GradientLogger, {mode} mode: TF {tf.__version__}, {getattr(keras, '__version__', '')}"
    )
    if (mode == "eager" and tf.__version__.startswith("1.")) or (mode == "graph" and keras3):
        print("skipped: this TensorFlow and Keras do not train in this mode")
        return 0
    from compatgrad.callbacks import GradientLogger

    from .speed import build_workloads

    rng = np.random.RandomState(0)
    log_dir = tempfile.mkdtemp(prefix="compatgrad-bench-")  # TensorBoard's event files, left for a look
    figures: Dict[str, Dict[str, float]] = {}
    for workload, steps in zip(build_workloads(keras, mode == "graph", rng, lambda *a: [])[:2], (80, 40)):
        x = np.concatenate([workload.x] * steps)
        y = np.concatenate([workload.y] * steps)
        variants = {
            "without": lambda: [],
            "norms every step": lambda: [GradientLogger()],
            "norms alone": lambda: [GradientLogger(update_ratios_every=None)],
            "and update ratios": lambda: [GradientLogger(update_ratios_every=1)],
            "norms every 10": lambda: [GradientLogger(every=10)],
            "histograms every 100": lambda: [GradientLogger(histograms_every=100, log_dir=log_dir)],
        }
        seconds: Dict[str, List[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, loggers in variants.items():
                timer = EpochTimer()
                workload.model.fit(
                    x,
                    y,
                    batch_size=len(workload.x),
                    epochs=2,
                    shuffle=False,
                    verbose=0,
                    callbacks=[timer] + loggers(),
                )
                seconds[name].append(timer.durations[1])
        row = {
            name: float(np.median(np.array(seconds[name]) / np.array(seconds["without"])))
            for name in variants
            if name != "without"
        }
        figures[workload.name] = row
        epoch = ", ".join(f"{name} {np.median(s) * 1e3:.0f}" for name, s in seconds.items())
        print(
            f"{workload.name:<28} ms per epoch: {epoch}; " + ", ".join(f"{k} {v:.3f}" for k, v in row.items())
        )
        loggers = {name: make for name, make in variants.items() if name != "without"}
        pairs = paired(tf, keras, workload, loggers, paired_steps, graph=mode == "graph")
        figures[f"{workload.name}, step and hook, paired"] = pairs
        print(f"{workload.name:<28} paired: " + ", ".join(f"{k} {v:.3f}" for k, v in pairs.items()))
    print(RATIOS + json.dumps(figures))
    return 0


def paired(
    tf: Any,
    keras: Any,
    workload: Any,
    loggers: Dict[str, Callable[[], List[Any]]],
    steps: int,
    graph: bool,
) -> Dict[str, float]:
    """Per logger: Keras' own train function and the tapped one with the logger's batch hook, called in
    turn ``steps`` times on one batch (eagerly an iterator over it, in graph mode the values ``fit``
    feeds its ``K.function``); the median over pairs of (tapped and hook - own) over the median own
    step, plus 1."""
    model = workload.model
    if graph:
        x, y, sample_weights = model._standardize_user_data(workload.x, workload.y)
        feed = list(x) + list(y or []) + list(sample_weights or [])
        if not isinstance(keras.backend.learning_phase(), int):
            feed.append(True)  # as fit feeds it: the learning phase

        def call(function: Any) -> None:
            function(feed)

    else:
        iterator = iter(tf.data.Dataset.from_tensors((workload.x, workload.y)).repeat())

        def call(function: Any) -> None:
            function(iterator)

    ratios: Dict[str, float] = {}
    for name, make in loggers.items():
        model.train_function = None
        if graph:
            model._make_train_function()
        else:
            model.make_train_function()
        own = model.train_function
        if graph:
            model.train_function = None  # the logger taps a K.function of its own making in place
        (logger,) = make()
        logger.set_model(model)  # as fit starts: the tapped train function in place of Keras' own
        logger.on_train_begin()
        tapped = model.train_function
        own_seconds, differences = [], []
        for step in range(steps + 50):  # the first 50: the tapped step traced, both warm
            start = time.perf_counter()
            call(own)
            middle = time.perf_counter()
            call(tapped)
            logger.on_train_batch_end(step)
            end = time.perf_counter()
            if step == 50:
                gc.collect()
                gc.disable()
            if step >= 50:
                own_seconds.append(middle - start)
                differences.append((end - middle) - (middle - start))
        gc.enable()
        logger.on_train_end()
        ratios[name] = 1.0 + float(np.median(differences) / np.median(own_seconds))
    return ratios


if __name__ == "__main__":
    sys.exit(main())
