"""mars2/rl/rloo.py: the leave-one-out estimator, the worked example of adding an advantage estimator
(docs/algorithm.md §11): its values by hand, and the run's config naming it reaches the advantage stage's table."""

import pandas as pd
import pytest

from mars2.config import ConfigError, TrainConfig
from mars2.rl.rloo import rloo_estimator
from mars2.rl.tables import tree_advantages
from pipeline.config import load_cfg, resolve


def test_each_node_is_measured_against_the_mean_of_the_others():
    reward, adv = rloo_estimator([-1, 0, 0, -1], [1, 0, 1, 0], [0.0, 0.0, 0.5, 0.0])
    assert reward == [1.0, 0.0, 0.5, 0.0]  # the overlong penalty comes off the reward first
    assert adv == pytest.approx([1 - 0.5 / 3, 0 - 1.5 / 3, 0.5 - 1.0 / 3, 0 - 1.5 / 3])
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)
    assert rloo_estimator([-1], [1], [0.0]) == ([1.0], [0.0])  # no one to compare with
    assert rloo_estimator([-1, -1], [1, 1], [0.0, 0.0])[1] == [0.0, 0.0]


def test_train_advantage_rloo_reaches_the_advantage_table():
    nodes = pd.DataFrame({"problem_id": ["p"] * 3, "node_id": [0, 1, 2], "parent": [-1, 0, -1],
                          "response_len": [10, 10, 10]})
    verdicts = pd.DataFrame({"problem_id": ["p"] * 3, "node_id": [0, 1, 2], "reward": [1.0, 0.0, 0.0]})
    out = tree_advantages(nodes, verdicts, TrainConfig(advantage="rloo", overlong_buffer=0), max_len=100)
    assert out["advantage"].tolist() == pytest.approx([1.0, -0.5, -0.5])
    assert resolve(load_cfg(["train.advantage=rloo"]), cuda_available=False).train.advantage == "rloo"
    with pytest.raises(ConfigError, match="advantage"):
        resolve(load_cfg(["train.advantage=ppo"]), cuda_available=False)
