"""One worker of the MultiWorkerMirroredStrategy test: its half of the batch in, its gradients out.

Run by test_distribute with TF_CONFIG set; argv: the npz with weights and data, this worker's
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

flavour = os.environ.get("COMPATGRAD_KERAS", "tf.keras")
keras = (
    tf.keras
    if flavour == "tf.keras"
    else importlib.import_module("keras" if flavour == "keras3" else flavour)
)
inputs_path, index, output_paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
arrays = np.load(inputs_path)
with strategy.scope():
    model = keras.Sequential(
        [keras.layers.Dense(8, activation="tanh", input_shape=(5,)), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(learning_rate=1.0), "mse")
model.set_weights([arrays[f"w{i}"] for i in range(4)])
half = len(arrays["x"]) // 2
rows = slice(index * half, (index + 1) * half)
grads = get_gradients(
    model, arrays["x"][rows], arrays["y"][rows], sample_weight=arrays["sample_weight"][rows]
)
np.savez(output_paths[index], *grads)
# A worker that leaves while another still reads its last collective's data aborts that one
# ("Socket closed", seen on TF 2.7): wait until every worker has its result.
deadline = time.time() + 120
while not all(os.path.exists(path) for path in output_paths) and time.time() < deadline:
    time.sleep(0.05)
# TF 2.6's collective executor threads abort the interpreter's normal exit about one time in five
# ("terminate called without an active exception"), after the result is written: skip the teardown.
sys.stdout.flush()
os._exit(0)
