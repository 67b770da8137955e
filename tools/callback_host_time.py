"""The host's part of a step with ``GradientLogger``: its ``on_train_batch_end`` timed inside ``fit``.

    PYTHONPATH=. python tools/callback_host_time.py eager|graph

An MLP 784-256-10 (batches of 128, 200 a epoch, two epochs a fit, three fits a logger) as in
``benchmarks.callback``, whose figures on this 2-core VM are as noisy as the targets: this one is the
figure that holds from run to run. It prints microseconds a call of the hook (the mean over a fit).
Run it on two commits to compare them (the README's table of 2026-12-07).
"""

import sys
import time
from typing import Any, Dict, List

import numpy as np

from compatgrad.callbacks import GradientLogger


class TimedLogger(GradientLogger):
    """A ``GradientLogger`` timing its own batch hook."""

    spent: List[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(batch, logs)
        TimedLogger.spent.append(time.perf_counter() - start)


def main(mode: str) -> None:
    import tensorflow as tf

    if mode == "graph":
        tf.compat.v1.disable_eager_execution()
    keras = tf.keras
    optimizer = keras.optimizers.legacy.SGD if mode == "graph" else keras.optimizers.SGD
    model = keras.Sequential(
        [keras.layers.Dense(256, activation="relu", input_shape=(784,)), keras.layers.Dense(10)]
    )
    model.compile(optimizer(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(0)
    x, y = rng.rand(128 * 200, 784).astype("float32"), rng.randint(0, 10, 128 * 200)
    variants: Dict[str, Dict[str, Any]] = {
        "norms every step, no update ratios": {"update_ratios_every": None},
        "GradientLogger() (update ratios every 10)": {},
        "norms every 10 steps": {"every": 10, "update_ratios_every": None},
        "+ TensorBoard, histograms every 100": {"histograms_every": 100, "log_dir": "/tmp/host-time-logs"},
    }
    for name, arguments in variants.items():
        means = []
        for _ in range(3):
            TimedLogger.spent = []
            model.fit(
                x, y, batch_size=128, epochs=2, shuffle=False, verbose=0, callbacks=[TimedLogger(**arguments)]
            )
            means.append(np.mean(TimedLogger.spent) * 1e6)
        print(f"{mode} {name}: " + ", ".join(f"{m:.0f}" for m in means) + " us a step")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "eager")
