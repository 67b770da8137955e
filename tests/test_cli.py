"""The command line, run as a user runs it: a subprocess."""
import subprocess
import sys

import pytest

import kit


@pytest.mark.skipif(kit.GRAPH and not kit.TF1, reason="check starts its own graph-mode subprocess from an eager run")
def test_check_passes_on_the_embedded_models():
    result = subprocess.run([sys.executable, "-m", "compatgrad", "check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["flavour", "mode", "case", "max"]
    assert " 0 failed" in lines[-1] and not lines[-1].startswith("0 passed"), lines[-1]
    expected_modes = {"graph"} if kit.TF1 else {"eager"}
    assert expected_modes <= {line.split()[1] for line in lines[1:-1]}
