import os
import subprocess
import sys

from tests.paths import ROOT


def run_bench(*args: str) -> str:
    """Run ``python <args>`` (a bench script at tiny shapes) from the repository root; return its stdout."""
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
