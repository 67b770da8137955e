"""Keras 3 on JAX or PyTorch: compatgrad's per-call cost next to the step Keras' guide for that
backend writes by hand.

    KERAS_BACKEND=jax|torch python -m benchmarks [--processes 3] [--rounds 8] [--calls 20]

The workloads are ``speed``'s (MLP, conv, LSTM; not the layer outputs, whose hand-written steps
differ by framework). Each hand-written step returns numpy arrays, as ``get_gradients`` does:
- JAX: ``model.stateless_call`` and the compiled loss object under ``jax.value_and_grad``, jitted,
  called with the variables' values; the naive recipe is the same, not jitted (one call a round).
- PyTorch: the model and its ``compute_loss`` (as ``speed``'s TensorFlow steps) under
  ``torch.autograd.grad``; the naive recipe is the trainer's own, ``backward()`` and the variables'
  ``.grad`` (then ``zero_grad``).
Each process prints ``speed``'s table; the summary is the median of compat / hand over fresh processes
(target <= 1.10).

Host time: on a GPU a step this small is mostly the host's Python (issue 20: 0.14 ms for the jitted MLP
gradient on an H200), so each process also times both on a model whose computation is negligible (Dense
4 -> 1, batch 2); compat - hand there is what the front door adds a call, whatever the device (target:
tens of microseconds, < 100).
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from . import speed

HOST = "host microseconds compatgrad adds a call: "  # a worker's line the summary reads


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-process", action="store_true", help="one process's run (the workers)")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per process")
    parser.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    args = parser.parse_args(argv)
    if args.in_process:
        return run(args.rounds, args.calls)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    failed, per_process, host = 0, [], []  # host: microseconds per process
    for _ in range(args.processes):
        command = [sys.executable, "-m", "benchmarks.keras3_speed", "--in-process"]
        command += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
        sys.stdout.flush()
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        print(result.stdout, end="")
        failed |= result.returncode
        lines = result.stdout.splitlines()
        per_process += [
            json.loads(line[len(speed.RATIOS) :]) for line in lines if line.startswith(speed.RATIOS)
        ]
        host += [float(line[len(HOST) :]) for line in lines if line.startswith(HOST)]
    if per_process:
        speed.print_summary(os.environ["KERAS_BACKEND"], per_process)
    if host:
        print(
            "host time compatgrad adds a call (Dense 4 -> 1, batch 2): {:.0f} us, the median over processes "
            "({}); target < 100 us".format(np.median(host), ", ".join(f"{us:.0f}" for us in host))
        )
    return 1 if failed or not per_process else 0


def run(rounds: int, calls: int) -> int:
    import keras

    from compatgrad import get_gradients, layer_outputs

    backend = keras.config.backend()
    baselines, recipe = BACKENDS[backend]
    module = importlib.import_module(backend)  # the framework's package is named as the backend
    print(f"\n== Keras {keras.__version__} on {backend} {module.__version__} ({_device(module)})")
    workloads = [
        w
        for w in speed.build_workloads(keras, False, np.random.RandomState(0), layer_outputs)
        if not w.outputs
    ]
    rows = []
    for workload in workloads:
        compat = lambda w=workload: get_gradients(w.model, w.x, w.y, w.params, verbose=0)  # noqa: E731
        hand, naive = baselines(module, keras, workload)
        difference = max(float(np.max(np.abs(a - b))) for a, b in zip(compat(), hand()))
        # Op by op, JAX is 10-300 times slower (the LSTM: seconds a call): one naive call a round.
        counts = {"compatgrad": calls, "hand-written": calls, "naive": 1 if backend == "jax" else calls}
        timings = speed.interleaved(
            {"compatgrad": compat, "hand-written": hand, "naive": naive}, rounds, counts
        )
        rows.append((workload.name, timings, difference))
    speed.print_table(rows, recipe, rounds, calls)
    print(
        speed.RATIOS
        + json.dumps({name: speed.paired(t, "compatgrad", "hand-written") for name, t, _ in rows})
    )
    print(HOST + f"{_host_microseconds(module, keras, baselines, rounds, calls):.1f}")
    mismatched = [name for name, _, difference in rows if difference > 1e-4]
    if mismatched:  # then the timings compare different computations
        print("MISMATCH: compatgrad and the hand-written step disagree on " + ", ".join(mismatched))
    return 1 if mismatched else 0


def _host_microseconds(module: Any, keras: Any, baselines: Callable, rounds: int, calls: int) -> float:
    """compat - hand, in microseconds a call, on a model whose computation is negligible: the median over
    rounds of the difference within a round."""
    from compatgrad import get_gradients

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(learning_rate=0.1), "mse")
    x, y = np.ones((2, 4), "float32"), np.ones((2, 1), "float32")
    workload = speed.Workload("Dense 4 -> 1, batch 2", model, x, y, list(model.trainable_weights), False)
    hand, _ = baselines(module, keras, workload)
    compat = lambda: get_gradients(model, x, y, verbose=0)  # noqa: E731
    counts = {"compatgrad": calls * 10, "hand-written": calls * 10}  # 10 times the calls: they are short
    timings = speed.interleaved({"compatgrad": compat, "hand-written": hand}, rounds, counts)
    return float(np.median(np.subtract(timings["compatgrad"], timings["hand-written"]))) * 1e6


def _device(module: Any) -> str:
    if module.__name__ == "jax":
        return module.devices()[0].platform
    return "cuda" if module.cuda.is_available() else "cpu"


def jax_baselines(jax: Any, keras: Any, workload: speed.Workload) -> Tuple[Callable, Callable]:
    """The hand-written step, jitted and not."""
    model = workload.model
    loss_object = keras.losses.get(model.loss)

    def loss(trainable: List[Any], non_trainable: List[Any], x: Any, y: Any) -> Any:
        y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return keras.ops.mean(loss_object(y, y_pred))  # a loss function ("mse") gives one per example

    def call(step: Callable) -> List[np.ndarray]:
        _, grads = step(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            workload.x,
            workload.y,
        )
        return [np.array(g) for g in grads]

    step = jax.value_and_grad(loss)
    compiled = jax.jit(step)
    return lambda: call(compiled), lambda: call(step)


def torch_baselines(torch: Any, keras: Any, workload: speed.Workload) -> Tuple[Callable, Callable]:
    """The hand-written step (``torch.autograd.grad`` of the model's compiled loss, as ``speed``'s
    TensorFlow steps take it), and the trainer's ``backward()`` and ``.grad``."""
    model = workload.model
    weights = [v.value for v in model.trainable_variables]

    def loss() -> Any:
        return model.compute_loss(x=workload.x, y=workload.y, y_pred=model(workload.x, training=False))

    def hand() -> List[np.ndarray]:
        return [g.detach().cpu().numpy() for g in torch.autograd.grad(loss(), weights)]

    def naive() -> List[np.ndarray]:
        loss().backward()
        grads = [w.grad.detach().cpu().numpy() for w in weights]
        model.zero_grad()
        return grads

    return hand, naive


# Keras 3's backend -> (its baselines, the hand-written recipe's name).
BACKENDS = {
    "jax": (jax_baselines, "jax.jit(jax.value_and_grad(stateless_call + loss))"),
    "torch": (torch_baselines, "torch.autograd.grad(model + compute_loss)"),
}


if __name__ == "__main__":
    sys.exit(main())
