"""pipeline/stages.py: every stage declared once (its tasks/<stage>.py ``DECLARATION``), and what the pipeline derives
from the declarations: the dispatched tasks, the per-cycle table, the stage names the config may use."""

import pytest

from mars2.config import ConfigError, OrchestrationConfig
from pipeline import stages
from pipeline.report import cycle_table
from stagekit.stage import Column, StageDeclaration, percent


def test_every_task_is_declared_once_under_its_own_name():
    from pipeline.dispatch import ALL

    assert [stages.declaration_of(t).name for t in stages.TASKS] == [t.name for t in stages.TASKS]
    assert len(set(stages.DECLARATIONS)) == len(stages.TASKS) == len(ALL)
    assert len({d.label for d in stages.DECLARATIONS.values()}) == len(stages.TASKS)
    assert stages.DECLARATIONS["evaluation"].label == "eval" and stages.DECLARATIONS["update"].per_owner
    assert {n for n, d in stages.DECLARATIONS.items() if d.generates} == {"rollout", "evaluation"}
    assert {n for n, d in stages.DECLARATIONS.items() if d.facts} == {"data", "agents"}


ROWS = [{"cycle": -1, "stage": "eval", "metrics": {"team/pass_at_1": 0.25}},
        {"cycle": 0, "stage": "rollout", "metrics": {"n_problems": 2, "n_nodes": 8, "cross_agent_refine_share": 0.5}},
        {"cycle": 0, "stage": "grading", "metrics": {"pass_rate": 0.125, "refine_pass_rate": 0.0}},
        {"cycle": 0, "stage": "advantage", "metrics": {"flat_tree_share": 0.5, "advantage_abs_mean": 0.4}},
        {"cycle": 0, "stage": "update/a", "metrics": {"loss": 0.5, "kl": 0.001}},
        {"cycle": 0, "stage": "update/b", "metrics": {"skipped": 1.0}},
        {"cycle": 0, "stage": "eval", "metrics": {"team/pass_at_1": 0.5}}]


def test_the_per_cycle_table_is_the_declared_columns_in_the_order_stages_run():
    table = cycle_table(ROWS).frame
    assert list(table.columns) == ["cycle", "trees", "nodes", "x-agent", "pass", "refine", "flat", "|Â|", "a", "b",
                                   "Pass@1"]
    assert table.to_dict("records") == [
        {"cycle": "before", "trees": "0", "nodes": "0", "x-agent": "-", "pass": "-", "refine": "-", "flat": "-",
         "|Â|": "-", "a": "-", "b": "-", "Pass@1": "25.0%"},
        {"cycle": "0", "trees": "2", "nodes": "8", "x-agent": "50.0%", "pass": "12.5%", "refine": "0.0%",
         "flat": "50.0%", "|Â|": "0.400", "a": "0.5 / 0.001", "b": "buffered", "Pass@1": "50.0%"}]


def test_a_new_stage_is_one_declaration_away_from_the_table_and_the_config(monkeypatch):
    """A stage added (here a made-up ``critique`` stage between grading and advantage) shows its declared column in
    the per-cycle table and its name is accepted where the config names stages; before its declaration it is not."""
    with pytest.raises(ConfigError, match="unknown stage"):
        stages.check_stage_names(OrchestrationConfig(mode="pools", pools={"critique": "cpu"}))
    names = list(stages.DECLARATIONS)
    critique = StageDeclaration(name="critique", label="critique", modules=("tasks.critique",),
                                columns=(Column("critiqued", "critiqued_share", percent, "nodes a critic read"),))
    at = names.index("advantage")
    monkeypatch.setattr(stages, "DECLARATIONS", {n: stages.DECLARATIONS[n] for n in names[:at]}
                        | {"critique": critique} | {n: stages.DECLARATIONS[n] for n in names[at:]})
    import pipeline.report

    monkeypatch.setattr(pipeline.report, "DECLARATIONS", stages.DECLARATIONS)
    rows = [*ROWS, {"cycle": 0, "stage": "critique", "metrics": {"critiqued_share": 0.75}}]
    table = cycle_table(rows)
    assert list(table.frame.columns).index("critiqued") == list(table.frame.columns).index("refine") + 1
    assert table.frame["critiqued"].tolist() == ["-", "75.0%"] and "critiqued: nodes a critic read" in table.caption
    stages.check_stage_names(OrchestrationConfig(mode="pools", pools={"critique": "cpu"}), fail_at="critique")


def test_a_run_on_several_nodes_keeps_the_generating_and_owner_stages_off_the_flows_process():
    on_nodes = dict(mode="pools", node_pools=["n0", "n1"])
    stages.check_stage_names(OrchestrationConfig(**on_nodes, pools={"rollout": "gpu", "evaluation": "gpu",
                                                                     "update": "gpu"}))
    with pytest.raises(ConfigError, match=r"\['evaluation'\] would run in the flow's own process"):
        stages.check_stage_names(OrchestrationConfig(**on_nodes, pools={"rollout": "gpu", "update": "gpu"}))
    with pytest.raises(ConfigError, match=r"\['update'\] would run in the flow's own process"):
        stages.check_stage_names(OrchestrationConfig(**on_nodes, pools={"rollout": "gpu", "evaluation": "gpu"}))
