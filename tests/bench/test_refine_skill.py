"""bench/refine_skill.py at tiny shapes on CPU prints what its docstring promises."""

import re

from tests.bench import run_bench


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
