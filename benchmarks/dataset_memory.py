"""Peak memory of whole-dataset gradients stays flat in the dataset's length.

    python benchmarks/dataset_memory.py [--batches 10 100 1000]

Each measurement runs in a fresh process (peak RSS only grows) on an MLP 784-256-10 fed batches
of 128 generated on the fly by tf.data, so the data itself is never held. It prints the peak RSS
of compatgrad over the dataset next to the naive way (collect every batch, then one call on the
concatenation) and the ratio of each peak to the one at the smallest length.
"""

import argparse
import os
import resource
import subprocess
import sys

BATCH, FEATURES, CLASSES = 128, 784, 10


def measure(method: str, batches: int) -> float:
    import numpy as np
    import tensorflow as tf

    import compatgrad

    keras = tf.keras
    model = keras.Sequential(
        [keras.layers.Dense(256, activation="relu", input_shape=(FEATURES,)), keras.layers.Dense(CLASSES)]
    )
    model.compile(keras.optimizers.SGD(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def batch(index):
        generator = tf.random.stateless_normal
        x = generator((BATCH, FEATURES), seed=tf.stack([index, 0]))
        y = tf.random.stateless_uniform((BATCH,), seed=tf.stack([index, 1]), maxval=CLASSES, dtype=tf.int32)
        return x, y

    dataset = tf.data.Dataset.range(batches).map(batch)
    if method == "compatgrad":
        compatgrad.get_gradients(model, dataset, verbose=0)
    else:  # naive: hold every batch, then one call
        xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
        compatgrad.get_gradients(model, np.concatenate(xs), np.concatenate(ys))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kilobytes on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.child[0], int(args.child[1])))
        return
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    print("{:<11} {:>8} {:>14} {:>10}".format("method", "batches", "peak RSS (MB)", "vs first"))
    for method in ("compatgrad", "naive"):
        first = None
        for batches in args.batches:
            output = subprocess.run(
                [sys.executable, __file__, "--child", method, str(batches)],
                env=env,
                check=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            ).stdout.decode()
            peak = float(output.strip().splitlines()[-1])
            first = first or peak
            print(f"{method:<11} {batches:>8} {peak:>14.0f} {peak / first:>10.2f}")


if __name__ == "__main__":
    main()
