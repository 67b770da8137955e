"""One worker of the MultiWorkerMirroredStrategy tests. ``gradients``: its half of the batch in, its
gradients out. ``fit``: fit on the whole data with a GradientLogger, out: per step, the gradient it
logged and how far the step moved the weights.

Run by test_distribute with TF_CONFIG set; argv: the job, the npz with weights and data, this worker's
index, then every worker's npz to write, in index order. The strategy is created first, before any
other TensorFlow call.
"""

import importlib
import os
import sys
import time

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

from compatgrad import get_gradients  # noqa: E402
from compatgrad.callbacks import AnyKerasCallback, GradientLogger  # noqa: E402

flavour = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
keras = (
    tf.keras
    if flavour == "tf.keras"
    else importlib.import_module("keras" if flavour == "keras3" else flavour)
)
job, inputs_path, index, output_paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
arrays = np.load(inputs_path)
with strategy.scope():
    model = keras.Sequential(
        [keras.layers.Dense(8, activation="tanh", input_shape=(5,)), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(learning_rate=1.0), "mse")
model.set_weights([arrays[f"w{i}"] for i in range(4)])


class Moved(AnyKerasCallback):
    """How far each step moved the weights (SGD(1.0): the gradient it applied)."""

    def on_train_batch_begin(self, batch, logs=None):
        self.before = [w.numpy() for w in self.model.trainable_weights]

    def on_train_batch_end(self, batch, logs=None):
        after = [w.numpy() for w in self.model.trainable_weights]
        results[f"moved{batch + 1}"] = [b - a for b, a in zip(self.before, after)]


results = {}
if job == "gradients":
    half = len(arrays["x"]) // 2
    rows = slice(index * half, (index + 1) * half)
    grads = get_gradients(
        model, arrays["x"][rows], arrays["y"][rows], sample_weight=arrays["sample_weight"][rows]
    )
    np.savez(output_paths[index], *grads)
else:

    def logged(step, grads):
        results[f"logged{step}"] = grads

    model.fit(
        arrays["x"],
        arrays["y"],
        batch_size=8,
        shuffle=False,
        verbose=0,
        callbacks=[Moved(), GradientLogger(on_gradients=logged)],
    )
    np.savez(
        output_paths[index],
        **{f"{key}_{i}": array for key, values in results.items() for i, array in enumerate(values)},
    )
# A worker that leaves while another still reads its last collective's data aborts that one
# ("Socket closed", seen on TF 2.7): wait until every worker has its result.
deadline = time.time() + 120
while not all(os.path.exists(path) for path in output_paths) and time.time() < deadline:
    time.sleep(0.05)
# TF 2.6's collective executor threads abort the interpreter's normal exit about one time in five
# ("terminate called without an active exception"), after the result is written: skip the teardown.
sys.stdout.flush()
os._exit(0)
