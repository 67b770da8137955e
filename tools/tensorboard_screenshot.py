"""The README's TensorBoard screenshot: the gradients ``GradientLogger`` logs as a tiny conv net trains.

    apt-get install -y chromium                  # Debian's headless Chromium, /usr/bin/chromium
    TF_CPP_MIN_LOG_LEVEL=2 .tox/py311-tf215/bin/python tools/tensorboard_screenshot.py \\
        [--out docs/tensorboard.png] [--port 6123] [--chromium /usr/bin/chromium] [--log-dir DIR]

Trains a small conv net on random data (3 epochs, 100 steps each) with
``compatgrad.callbacks.GradientLogger(log_dir=<tmpdir>, histograms_every=20, update_ratios_every=1)``,
starts TensorBoard on that log dir, takes a screenshot of its Scalars dashboard (``PAGE``) filtered to
the gradient tags with headless Chromium, writes it to ``--out`` and stops TensorBoard. Needs TensorFlow
with TensorBoard (the ``py311-tf215`` tox env has both) and Chromium; run from the repository root so
that the working copy's ``compatgrad`` is the one imported.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working copy

# The dashboard shown: Scalars, 3 x 3 cards at 1500 x 1000 pixels: the global norm, each layer's norm and
# each kernel's update ratio (tagFilter: global_norm|layer_gradient_norms|update_ratios/.*kernel).
PAGE = "#scalars&tagFilter=global_norm%7Clayer_gradient_norms%7Cupdate_ratios%2F.*kernel&_smoothingWeight=0.6"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these, Chromium's connections (to TensorBoard on localhost too) are refused here.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
# TensorBoard's command line, run by ``python -c``: TensorBoard 2.15 (py311-tf215's) imports pkg_resources,
# which setuptools 81 and later no longer ship; where it is missing, a stand-in with the two functions
# TensorBoard calls (its plugins' entry points, and versions of the Rust data server it then never starts:
# ``--load_fast=false``).
TENSORBOARD = """
import sys, types
try:
    import pkg_resources
except ImportError:
    from importlib.metadata import entry_points

    def iter_entry_points(group):
        found = entry_points()
        found = found.select(group=group) if hasattr(found, "select") else found.get(group, [])
        return [types.SimpleNamespace(resolve=point.load) for point in found]

    def parse_version(version):
        from packaging.version import Version
        return Version(version)

    stub = types.ModuleType("pkg_resources")
    stub.iter_entry_points, stub.parse_version = iter_entry_points, parse_version
    sys.modules["pkg_resources"] = stub
from tensorboard.main import run_main
sys.argv[0] = "tensorboard"
run_main()
"""


def train(log_dir: str, epochs: int = 3, steps: int = 100, batch_size: int = 32) -> None:
    """A tiny conv net on random 16x16 images, 10 classes, logged by ``GradientLogger`` into ``log_dir``."""
    import numpy as np
    import tensorflow as tf

    from compatgrad.callbacks import GradientLogger

    tf.keras.utils.set_random_seed(0)  # the same curves every run
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch_size, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, size=steps * batch_size)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(16, 16, 3)),
            tf.keras.layers.Conv2D(8, 3, activation="relu", name="conv1"),
            tf.keras.layers.MaxPooling2D(name="pool"),
            tf.keras.layers.Conv2D(16, 3, activation="relu", name="conv2"),
            tf.keras.layers.Flatten(name="flatten"),
            tf.keras.layers.Dense(32, activation="relu", name="dense"),
            tf.keras.layers.Dense(10, name="logits"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    logger = GradientLogger(log_dir=log_dir, histograms_every=20, update_ratios_every=1)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=[logger], verbose=2)


def wait_for(url: str, text: str, timeout: float = 60.0) -> None:
    """Until ``url`` answers HTTP 200 with ``text`` in its body, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and text in response.read().decode("utf-8", "replace"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {text!r} at {url} in {timeout:.0f} s")
        time.sleep(0.5)


def screenshot(chromium: str, url: str, out: str, width: int, height: int, budget_ms: int) -> None:
    """``url`` as headless Chromium renders it after ``budget_ms`` of virtual time, into ``out`` (PNG)."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={os.path.abspath(out)}",
            url,
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/tensorboard.png", help="where the PNG goes")
    parser.add_argument("--port", type=int, default=6123, help="TensorBoard's port on 127.0.0.1")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium's executable")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--budget-ms", type=int, default=20000, help="Chromium's --virtual-time-budget")
    parser.add_argument("--log-dir", help="log into (and keep) this folder, not a temporary one")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="compatgrad-tb-") as tmp:
        log_dir = os.path.abspath(args.log_dir or os.path.join(tmp, "logs"))
        train(os.path.join(log_dir, "conv_net"))  # the run's name in TensorBoard
        base = f"http://127.0.0.1:{args.port}/"
        tensorboard = subprocess.Popen(
            # From the log dir's folder: the page shows the log dir as "logs", not the temporary path.
            [sys.executable, "-c", TENSORBOARD, "--logdir", os.path.basename(log_dir)]
            + ["--port", str(args.port), "--host", "127.0.0.1", "--load_fast", "false"],
            cwd=os.path.dirname(log_dir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Up, and done loading the scalars: the page then shows them all as it opens.
            wait_for(base + "data/plugin/scalars/tags", "gradients/global_norm")
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            screenshot(args.chromium, base + PAGE, args.out, args.width, args.height, args.budget_ms)
        finally:
            tensorboard.terminate()
            tensorboard.wait(timeout=30)
    print(f"{args.out}: {os.path.getsize(args.out)} bytes, {base + PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
