"""What ``GradientLogger``'s update ratios cost the step, by the cadence they are taken at.

    PYTHONPATH=. python tools/update_ratios_cost.py [--width 2048] [--batch 128] [--pairs 100]

A ReLU MLP of two hidden layers of ``--width`` (inputs as wide, 10 outputs; 8.4 million weights at
2048), trained by SGD on one batch of ``--batch``. Per logger (``GradientLogger()``: ratios every 10
steps; ``update_ratios_every=1``; ``None``), Keras' own train function and the tapped one are called
in turn on one iterator; it prints the median over pairs of (tapped - own), in microseconds and over
the median own step. The logger's batch hook is not called: this is the step's part alone. The README
cites it for the default cadence (why not every step) on a model larger than the benchmark's.
"""

import argparse
import time
from typing import Any, Dict

import numpy as np

from compatgrad.callbacks import GradientLogger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=100)
    args = parser.parse_args()
    import tensorflow as tf

    keras = tf.keras
    layers = [keras.layers.Dense(args.width, activation="relu", input_shape=(args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.SGD(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(0)
    x, y = rng.rand(args.batch, args.width).astype("float32"), rng.randint(0, 10, args.batch)
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    model.make_train_function()
    own = model.train_function
    loggers: Dict[str, Dict[str, Any]] = {
        "GradientLogger() (update ratios every 10)": {},
        "update_ratios_every=1": {"update_ratios_every": 1},
        "update_ratios_every=None": {"update_ratios_every": None},
    }
    for name, arguments in loggers.items():
        logger = GradientLogger(**arguments)
        logger.set_model(model)  # as fit starts: the tapped train function in place of Keras' own
        logger.on_train_begin()
        tapped = model.train_function
        own_seconds, differences = [], []
        for pair in range(args.pairs + 10):  # the first 10: the tapped step traced, both warm
            start = time.perf_counter()
            own(iterator)
            middle = time.perf_counter()
            tapped(iterator)
            end = time.perf_counter()
            logger._tap.stepped()  # the logger heard of the step (its hook is left out)
            if pair >= 10:
                own_seconds.append(middle - start)
                differences.append((end - middle) - (middle - start))
        logger.on_train_end()
        difference, step = np.median(differences), np.median(own_seconds)
        print(
            f"width {args.width}, batch {args.batch}, {name}: own step {step * 1e3:.1f} ms, "
            f"tapped - own {difference * 1e6:+.0f} us ({difference / step:+.1%})"
        )


if __name__ == "__main__":
    main()
