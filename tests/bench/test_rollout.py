"""bench/rollout.py at tiny shapes on CPU prints what its docstring promises."""

import re

from tests.bench import run_bench


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
