"""bench/kv_cache.py at tiny shapes on CPU prints what its docstring promises."""

import re

from tests.bench import run_bench


def test_kv_cache_bench_gives_the_same_logits_with_both_caches():
    stdout = run_bench("bench/kv_cache.py", "--rows", "3", "--widths", "8,40", "--steps", "20", "--hidden", "64",
                       "--repeats", "1")
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$", stdout, re.M)
    assert [int(r[0]) for r in rows] == [8, 40]
    assert all(float(r[4]) < 1e-4 for r in rows)  # the in-place cache decodes exactly what concatenation does
