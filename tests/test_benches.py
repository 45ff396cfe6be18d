"""The rollout-path benches run at tiny shapes on CPU and print what their docstrings promise."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_kv_cache_bench_gives_the_same_logits_with_both_caches():
    stdout = run_bench("bench/kv_cache.py", "--rows", "3", "--widths", "8,40", "--steps", "20", "--hidden", "64",
                       "--repeats", "1")
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$", stdout, re.M)
    assert [int(r[0]) for r in rows] == [8, 40]
    assert all(float(r[4]) < 1e-4 for r in rows)  # the in-place cache decodes exactly what concatenation does


def test_rollout_bench_prints_both_throughputs_the_engine_split_and_engine_starts():
    stdout = run_bench("bench/rollout.py", "--problems", "4", "--max-nodes", "2", "--max-new-tokens", "8",
                       "--repeats", "1")
    ratio = float(re.search(r"ratio search/raw = (\d+\.\d\d)", stdout).group(1))
    run = float(re.search(r"^run 1: .*\(search/raw (\d+\.\d\d)\)$", stdout, re.M).group(1))
    assert re.search(rf"^search/raw of each run: {run:.2f} \(median {run:.2f}\)$", stdout, re.M)
    assert ratio == run  # one run: the ratio of the medians is that run's own
    assert len(re.findall(r"decode thread's CPU per run: prefills +\d+\.\d\d core-s", stdout)) == 2
    assert "engine starts: 2" in stdout


def test_rollout_bench_without_the_wave_schedule_still_gives_the_ratio():
    stdout = run_bench("bench/rollout.py", "--problems", "4", "--max-nodes", "2", "--max-new-tokens", "8",
                       "--repeats", "1", "--skip-wave")
    assert re.search(r"ratio search/raw = \d+\.\d\d$", stdout, re.M) and "wave search" not in stdout
    assert re.search(r"^run 1: search [\d.]+ tok/s \([\d.]+ s\)$", stdout, re.M)  # before the raw run


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


def test_refine_skill_probe_prints_fresh_and_refine_shares():
    stdout = run_bench("bench/refine_skill.py", "--hidden", "32", "--layers", "1", "--steps", "2",
                       "--n-problems", "48", "--copy-steps", "1", "--rename")
    assert re.search(r"^copy curriculum: 1 steps, loss [\d.]+ -> [\d.]+$", stdout, re.M)
    fresh = re.search(r"^fresh:  true reading ([\d.]+)%, another reading ([\d.]+)% \((\d+) programs\)$", stdout, re.M)
    refine = re.search(r"^refine: true reading ([\d.]+)%, parent copied ([\d.]+)% \((\d+) wrong-reading parents\)$",
                       stdout, re.M)
    assert fresh and refine
    held_out = int(fresh.group(3)) // 4  # 4 programs for each of about a quarter of 48 problems (the hash split)
    assert int(fresh.group(3)) == 4 * held_out and int(refine.group(3)) >= held_out > 5
