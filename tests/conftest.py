import importlib
import os
import subprocess

import numpy as np
import pytest

import kit  # noqa: F401  (switches graph mode on before any model is built)


def pytest_report_header(config):
    return [
        f"compatgrad cell: {_framework()} / {kit.FLAVOUR} / {kit.MODE} mode",
        "missing here (kit.CAPABILITIES): {}".format(", ".join(kit.missing_capabilities()) or "none"),
    ]


def pytest_terminal_summary(terminalreporter):
    if kit.PARITY_DIFFERENCES:
        float32 = [d for d in kit.PARITY_DIFFERENCES if "mixed" not in d[1]]
        worst = max(float32 or kit.PARITY_DIFFERENCES)
        terminalreporter.write_line(
            f"parity: {len(kit.PARITY_DIFFERENCES)} comparisons with train_on_batch ({kit.MODE} mode), "
            f"largest float32 difference {worst[0]:.3g} in {worst[1]}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """An expected failure's comparisons are what the cell declares it cannot match: not parity figures."""
    outcome = yield
    if call.when == "call" and hasattr(outcome.get_result(), "wasxfail"):
        kit.PARITY_DIFFERENCES[:] = [d for d in kit.PARITY_DIFFERENCES if d[1] != item.nodeid]


@pytest.fixture(scope="session", autouse=True)
def cell_properties(record_testsuite_property):
    """What tools/compat_table.py reads from the JUnit XML of a run (tox writes it to .tox/results)."""
    properties = {
        "tensorflow": "" if kit.tf is None else kit.tf.__version__,
        "backend": kit.BACKEND,
        "flavour": kit.FLAVOUR,
        "keras": _keras_version(),
        "mode": kit.MODE,
        "train_step": hasattr(kit.keras.Model, "train_step"),
        "commit": _commit(),
    }
    for name, value in properties.items():
        record_testsuite_property(name, value)
    yield
    float32 = [d for d, test in kit.PARITY_DIFFERENCES if "mixed" not in test]
    record_testsuite_property("parity_comparisons", len(kit.PARITY_DIFFERENCES))
    record_testsuite_property("largest_parity_difference", max(float32) if float32 else "")
    per_test = {}  # the largest difference of each test function, over its parameters
    for difference, test in kit.PARITY_DIFFERENCES:
        name = test.split("[")[0]
        per_test[name] = max(difference, per_test.get(name, 0.0))
    for name, difference in sorted(per_test.items()):
        record_testsuite_property("parity " + name, f"{difference:.2g}")


def _framework():
    if kit.tf is None:
        return f"{kit.BACKEND} {importlib.import_module(kit.BACKEND).__version__}"
    return f"TF {kit.tf.__version__}"


def _keras_version():
    version = getattr(kit.keras, "__version__", None)  # None for tf.keras 2.13-2.15 and tf_keras
    if version:
        return version
    try:
        from importlib.metadata import version as distribution_version  # Python >= 3.8

        return distribution_version("tf-keras" if kit.FLAVOUR == "tf_keras" else "keras")
    except ImportError:  # Python 3.7, or tf.keras of a TF that ships no keras package (PackageNotFoundError)
        return ""


def _commit():
    """The commit under test, "-dirty" when the work tree differs from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.check_output(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, stderr=subprocess.DEVNULL
        )
        dirty = subprocess.check_output(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, stderr=subprocess.DEVNULL
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.decode().strip() + ("-dirty" if dirty.strip() else "")


@pytest.fixture(autouse=True)
def fresh_graph():
    """Each test starts with fresh Keras names and seeds; graph mode keeps one session per test."""
    kit.backend.clear_session()
    np.random.seed(0)
    if kit.tf is None:
        kit.keras.utils.set_random_seed(0)  # Keras 3's global seed generator (initializers, Dropout)
    elif hasattr(kit.tf.random, "set_seed"):
        kit.tf.random.set_seed(0)
    else:  # TF 1.x
        kit.tf.compat.v1.set_random_seed(0)
    yield


@pytest.fixture
def rng():
    return np.random.RandomState(0)


@pytest.fixture
def mixed_float16():
    """The mixed_float16 policy; tests that use it are marked kit.MIXED_PRECISION.needed."""
    kit.set_mixed_precision("mixed_float16")
    yield
    kit.set_mixed_precision(None)  # back to the default, which follows floatx
