"""A sweep point's re-run through the real CLI: what it does not change comes back from cache (per stage, at the key
level: tests/stagekit/test_stage_keys.py). Its own module, so that pytest-xdist runs it beside the long e2e sequence."""

import pytest

from tests.flows.test_train_cycle import _latest_run_id, _run, _stage_table

pytestmark = pytest.mark.slow


def test_an_ablation_of_the_training_search_or_the_lr_reuses_data_agents_and_the_held_out_evaluation(tmp_path):
    """The before-training evaluation reads eval.* for its trees and none of the agents' training fields, so a sweep
    point that changes only the training search and an agent's lr reuses it (per stage:
    tests/stagekit/test_stage_keys.py)."""
    first = _run(tmp_path, "train.cycles=1")
    assert first.returncode == 0, first.stderr[-3000:]
    second = _run(tmp_path, "train.cycles=1", "search.max_nodes=3", "agents.members.0.optimizer.lr=0.01")
    assert second.returncode == 0, second.stderr[-3000:]
    table = _stage_table(tmp_path, _latest_run_id(tmp_path))
    status = {(r.stage, r.cycle): r.status for r in table.itertuples()}
    assert status[("data", 0)] == status[("agents", 0)] == status[("eval", -1)] == "cached", status
    assert status[("rollout", 0)] == status[("update/qwen_tiny", 0)] == status[("eval", 0)] == "ran", status
