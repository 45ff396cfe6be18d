"""mars2.rl.reward.hidden_test_verdicts on tables read back from Parquet (where a missing program is NaN, not None)."""

from __future__ import annotations

import pandas as pd

from mars2.config import GradingConfig
from mars2.data.lcb import load_problems
from mars2.data.toy import toy_benchmark, toy_reference_solutions
from mars2.io import write_parquet
from mars2.rl.reward import hidden_test_verdicts


def test_missing_code_read_back_as_nan_is_no_code(tmp_path):
    problems, _ = load_problems(toy_benchmark(2, seed=0), source="toy")
    ref = toy_reference_solutions(2, 0)[problems[0].id]
    rows = pd.DataFrame({"problem_id": [problems[0].id, problems[0].id, problems[1].id], "node_id": [0, 1, 0],
                         "agent": ["a", "a", "b"], "code": [ref, None, "print("]})
    write_parquet(tmp_path / "nodes.parquet", rows)
    back = pd.read_parquet(tmp_path / "nodes.parquet")
    assert isinstance(back["code"].iloc[1], float)  # the case this guards: NaN, not None
    verdicts = hidden_test_verdicts(back, {p.id: p for p in problems}, GradingConfig(workers=1, isolation="process"))
    assert verdicts["status"].tolist() == ["AC", "NO_CODE", "CE"]
    assert verdicts["reward"].tolist() == [1.0, 0.0, 0.0]
