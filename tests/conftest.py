import numpy as np
import pytest

import kit  # noqa: F401  (switches graph mode on before any model is built)


def pytest_report_header(config):
    return "compatgrad cell: TF {} / {} / {} mode".format(kit.tf.__version__, kit.FLAVOUR, kit.MODE)


def pytest_terminal_summary(terminalreporter):
    if kit.PARITY_DIFFERENCES:
        float32 = [d for d in kit.PARITY_DIFFERENCES if "mixed" not in d[1]]
        worst = max(float32 or kit.PARITY_DIFFERENCES)
        terminalreporter.write_line("parity: {} comparisons with train_on_batch ({} mode), largest float32 difference {:.3g} in {}".format(
            len(kit.PARITY_DIFFERENCES), kit.MODE, worst[0], worst[1]))


@pytest.fixture(autouse=True)
def fresh_graph():
    """Each test starts with fresh Keras names and seeds; graph mode keeps one session per test."""
    kit.backend.clear_session()
    np.random.seed(0)
    kit.tf.random.set_seed(0) if hasattr(kit.tf.random, "set_seed") else kit.tf.compat.v1.set_random_seed(0)
    yield


@pytest.fixture
def rng():
    return np.random.RandomState(0)


@pytest.fixture
def mixed_float16():
    if not kit.set_mixed_precision("mixed_float16"):
        pytest.skip("this Keras has no mixed precision policy")
    yield
    kit.set_mixed_precision(None)  # back to the default, which follows floatx
