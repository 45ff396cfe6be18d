"""bench/gpu_checks.sh, what a lent GPU session runs, rehearsed on the CPU."""

import os
import re
import subprocess

from tests.paths import ROOT


def test_the_prepared_gpu_checks_run_the_engine_step_profile_of_the_decode_thread(tmp_path):
    """bench/gpu_checks.sh (what a lent GPU session runs) on the CPU with the small model: every row decodes exactly
    32 tokens (1 from the prefill, 31 in decode steps), the host table has the decode thread's matrix products, and
    the log lands in $OUT with the check's exit status."""
    out = subprocess.run(["bash", "bench/gpu_checks.sh", "step"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "WHEELS": "0", "DEVICE": "cpu",
                                           "MODEL": "", "ROWS": "4", "OUT": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "step.log").read_text()
    assert re.search(r"forward passes: 31 decode steps \+ 1 prefill\(s\)", log)
    assert "aten::mm" in log or "aten::addmm" in log
    assert re.search(r"^== step: exit 0 after \d+ s$", log, re.M)
