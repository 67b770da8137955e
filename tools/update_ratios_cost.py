"""What ``GradientLogger``'s update ratios cost the step, by the cadence they are taken at.

    PYTHONPATH=. python tools/update_ratios_cost.py [--width 2048] [--batch 128] [--pairs 80]

A ReLU MLP of two hidden layers of ``--width`` (inputs as wide, 10 outputs; 8.4 million weights at
2048), trained by SGD on one batch of ``--batch``, eagerly. Per logger (``GradientLogger()``: ratios
every 10 steps; ``update_ratios_every=1``; ``None``), ``benchmarks.callback``'s paired measure: Keras'
own train function and the tapped one with the logger's batch hook, called in turn; it prints the
median over pairs of their difference over the median own step. The README cites it for the default
cadence (why not every step) on a model larger than the benchmark's.
"""

import argparse

import numpy as np

from benchmarks.callback import paired
from benchmarks.speed import Workload
from compatgrad.callbacks import GradientLogger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=80)
    args = parser.parse_args()
    import tensorflow as tf

    keras = tf.keras
    layers = [keras.layers.Dense(args.width, activation="relu", input_shape=(args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.SGD(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(0)
    workload = Workload(
        f"MLP {args.width}x2, batch {args.batch}",
        model,
        rng.rand(args.batch, args.width).astype("float32"),
        rng.randint(0, 10, args.batch),
        list(model.trainable_weights),
        False,
    )
    loggers = {
        "GradientLogger() (update ratios every 10)": lambda: [GradientLogger()],
        "update_ratios_every=1": lambda: [GradientLogger(update_ratios_every=1)],
        "update_ratios_every=None": lambda: [GradientLogger(update_ratios_every=None)],
    }
    for name, ratio in paired(tf, keras, workload, loggers, args.pairs, graph=False).items():
        print(f"width {args.width}, batch {args.batch}, {name}: {ratio - 1:+.1%} a step")


if __name__ == "__main__":
    main()
