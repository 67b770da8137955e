"""The command line, run as a user runs it: a subprocess."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import kit
from compatgrad import cli, errors, get_gradients


@pytest.mark.skipif(
    kit.GRAPH and not kit.TF1, reason="check starts its own graph-mode subprocess from an eager run"
)
def test_check_passes_on_the_embedded_models():
    result = subprocess.run(
        [sys.executable, "-m", "compatgrad", "check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["flavour", "mode", "case", "max"]
    assert " 0 failed" in lines[-1] and not lines[-1].startswith("0 passed"), lines[-1]
    expected_modes = {"graph"} if kit.TF1 else {"eager"}
    assert expected_modes <= {line.split()[1] for line in lines[1:-1]}


def run(*args, timeout=300):
    """The command in a subprocess, as a user runs it: (exit code, stdout, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "compatgrad"] + list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stdout, result.stderr


def run_here(capsys, *args):
    """The command in this process (no TensorFlow start-up, this cell's mode): (exit code, stdout, stderr).

    A fresh Keras session for each, as a new process has (graph mode would rename reloaded variables).
    """
    kit.backend.clear_session()
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


eager_cli = pytest.mark.skipif(
    kit.GRAPH and not kit.TF1, reason="the command line runs eagerly here; this run is in graph mode"
)


@eager_cli
def test_doctor_reports_this_environment():
    code, out, err = run("doctor", "--json")
    assert code == 0, err[-3000:]
    info = json.loads(out)
    assert info["tensorflow"] == (kit.tf and kit.tf.__version__)
    assert info["default mode"] == ("graph" if kit.TF1 else "eager")
    flavour = "keras3" if kit.KERAS3 else kit.FLAVOUR
    expected = {"jax": "keras3_jax", "torch": "keras3_torch"}.get(
        kit.BACKEND, "keras3" if kit.KERAS3 else None
    )
    assert info["keras"][flavour]["compatgrad backend"] == (
        expected or ("graph" if kit.TF1 or flavour == "keras" else "keras2")
    )


def saved_model(tmp_path, rng):
    inputs = kit.keras.layers.Input(shape=(5,), name="features")
    hidden = kit.keras.layers.Dense(4, activation="tanh", name="hidden")(inputs)
    model = kit.keras.Model(inputs, kit.keras.layers.Dense(1, name="head")(hidden))
    model.compile(kit.sgd(), "mse")
    path = str(tmp_path / ("model.keras" if kit.KERAS3 else "model.h5"))
    model.save(path)
    kit.backend.clear_session()  # graph mode: the loaded model's variables get the same names again
    x, y = rng.randn(20, 5).astype("float32"), rng.randn(20, 1).astype("float32")
    np.savez(str(tmp_path / "data.npz"), x=x, y=y)
    return path, str(tmp_path / "data.npz"), x, y


def png_size(path):
    with open(path, "rb") as png:
        header = png.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


@eager_cli
def test_grads_writes_what_the_api_returns_and_a_plot(tmp_path, rng):
    model_path, data_path, x, y = saved_model(tmp_path, rng)
    out, plot = str(tmp_path / "grads.npz"), str(tmp_path / "norms.png")
    code, stdout, err = run("grads", model_path, data_path, "--out", out, "--plot", plot)
    assert code == 0, err[-3000:]
    assert stdout.splitlines()[0].split()[:3] == ["name", "shape", "L2"] and len(stdout.splitlines()) == 5
    expected = get_gradients(kit.keras.models.load_model(model_path), x, y, as_dict=True)
    written = np.load(out)
    assert list(written.files) == list(expected)
    assert kit.max_difference([written[k] for k in expected], list(expected.values())) <= 1e-6
    assert png_size(plot) == (800, 450)


def test_grads_in_batches_equals_the_whole_data(tmp_path, rng, capsys):
    model_path, data_path, _, _ = saved_model(tmp_path, rng)
    # Layer outputs and inputs: where the cell has them (kit.FEATURES_BUILT_ON_TENSORFLOW).
    for params in ["weights"] + ([] if kit.FEATURES_BUILT_ON_TENSORFLOW.missing else ["outputs", "inputs"]):
        whole, batched = str(tmp_path / "whole.npz"), str(tmp_path / "batched.npz")
        assert run_here(capsys, "grads", model_path, data_path, "--params", params, "--out", whole)[0] == 0
        code, out, err = run_here(
            capsys, "grads", model_path, data_path, "--params", params, "--batch-size", "7", "--out", batched
        )
        assert code == 0 and "3/3" in out, err
        a, b = np.load(whole), np.load(batched)
        assert list(a.files) == list(b.files) and a.files
        assert kit.max_difference([a[k] for k in a.files], [b[k] for k in a.files]) <= 1e-6, params


def test_grads_noise_scale_recovers_b_simple_on_a_known_problem(tmp_path, rng, capsys):
    """A linear model at w = 0: each example's gradient of (x.w - y)^2 is -2 y x, so |G|^2 and
    tr(Sigma) over the data are a closed form, and B_simple their ratio."""
    features, examples, batch_size = 8, 2048, 16
    x = rng.randn(examples, features).astype("float32")
    y = (x @ (0.3 * rng.randn(features)) + rng.randn(examples)).astype("float32")[:, None]
    model = kit.keras.Sequential(
        [kit.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", input_shape=(features,))]
    )
    model.compile(kit.sgd(), "mse")
    model_path = str(tmp_path / ("model.keras" if kit.KERAS3 else "model.h5"))
    model.save(model_path)
    np.savez(str(tmp_path / "data.npz"), x=x, y=y)
    per_example = -2.0 * y.astype(np.float64) * x
    mean = per_example.mean(axis=0)
    expected = per_example.var(axis=0).sum() / (mean @ mean)

    code, out, err = run_here(
        capsys, "grads", model_path, str(tmp_path / "data.npz"), "--noise-scale", str(batch_size)
    )
    assert code == 0, err
    line = out.strip().splitlines()[-1]
    assert line.startswith("gradient noise scale B_simple ") and f"over {examples // batch_size}:" in line
    assert float(line.split()[4]) == pytest.approx(expected, rel=0.1)
    code, _, err = run_here(
        capsys, "grads", model_path, str(tmp_path / "data.npz"), "--noise-scale", str(examples)
    )
    assert code == 2 and "--noise-scale: expected a batch size from 1 to half" in err


def test_grads_bad_input_is_one_line_and_exit_2(tmp_path, rng, capsys):
    model_path, data_path, x, y = saved_model(tmp_path, rng)
    np.savez(str(tmp_path / "wrong_keys.npz"), z=x, y=y)
    np.savez(str(tmp_path / "wrong_shape.npz"), x=x[:, :3], y=y)
    import h5py

    with h5py.File(str(tmp_path / "not_a_model.h5"), "w") as h5:
        h5.attrs["keras_version"] = "9.9.9"
    cases = [
        ((str(tmp_path / "missing.h5"), data_path), "MODEL: expected an existing"),
        ((model_path, str(tmp_path / "wrong_keys.npz")), "DATA: expected key x"),
        ((model_path, str(tmp_path / "wrong_shape.npz")), "compatgrad grads: error:"),
        ((model_path, data_path, "--layers", "nope"), "--layers: expected layer names among"),
        ((str(tmp_path / "not_a_model.h5"), data_path), "it was written by Keras 9.9.9"),
    ]
    for args, message in cases:
        code, _, err = run_here(capsys, "grads", *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(errors.InvalidArgumentError):
        cli.main(["--debug", "grads", str(tmp_path / "missing.h5"), data_path])
