"""stagekit/progress.py: one transient display per stage, drawn only on a terminal."""

import io

from rich.console import Console

from stagekit.progress import stage_progress


def test_a_stage_draws_one_display_with_count_rate_and_phase_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with stage_progress("eval c0", "programs", console) as advance:
        advance(1, 3, phase="generate")
        advance(3, 3, phase="hidden tests")
    drawn = out.getvalue()
    assert "eval c0: hidden tests" in drawn and "3/3" in drawn and "programs" in drawn


def test_nothing_is_drawn_where_the_console_is_not_a_terminal_and_lines_are_off():
    out = io.StringIO()
    with stage_progress("rollout c0", "nodes", Console(file=out, force_terminal=False), every_s=0) as advance:
        advance(5, 10)
    assert out.getvalue() == ""


def test_off_a_terminal_a_long_stage_prints_a_plain_line_every_few_seconds():
    """Under nohup, sbatch or ``> log`` a long stage must not look like a hang: one plain line per interval with
    done/total, the rate and the time left; nothing while the stage is shorter than one interval."""
    import re
    import time

    out = io.StringIO()
    with stage_progress("rollout c0", "nodes", Console(file=out, force_terminal=False, width=80),
                        every_s=0.2) as advance:
        for done in range(0, 11):
            advance(done, 20)
            time.sleep(0.05)
        advance(12, 20, phase="hidden tests")
        time.sleep(0.25)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and "\x1b" not in out.getvalue()  # plain text, no escape codes, one line each
    pattern = r"^rollout c0(: hidden tests)?: (\d+)/20 nodes, (\d+\.\d) nodes/s, \d+ s elapsed, ETA \d+ s$"
    assert all(re.match(pattern, line) for line in lines), lines
    first = re.match(pattern, lines[0])
    assert 2 <= int(first.group(2)) <= 10 and 5 < float(first.group(3)) < 40  # about 20 nodes/s so far
    assert lines[-1].startswith("rollout c0: hidden tests: 12/20")
    out = io.StringIO()
    with stage_progress("grading c0", "programs", Console(file=out, force_terminal=False), every_s=5) as advance:
        advance(3, 3)
    assert out.getvalue() == ""


def test_a_plain_line_before_the_first_item_or_without_a_total_shows_no_unknowns():
    from stagekit.progress import PlainLines

    lines = PlainLines("update/a c0", "samples", Console(file=io.StringIO()))
    assert lines.line().startswith("update/a c0: no samples done yet, ")
    lines.update(0, 24, None)
    assert lines.line().startswith("update/a c0: 0/24 samples, ") and "ETA" not in lines.line()
    lines.update(5, 0, None)
    assert lines.line().startswith("update/a c0: 5 samples so far, ") and "?" not in lines.line()
    lines.update(6, 24, None)
    assert "6/24 samples" in lines.line() and "ETA " in lines.line()


def test_the_summary_shows_held_out_numbers_before_and_after_training():
    import re

    from rich.console import Console

    from pipeline.report import cycle_table, evaluation_table

    before = {"qwen_tiny/pass_at_1": 0.25, "team/pass_at_1": 0.25, "team/pass_at_1_mcts": 0.5, "n_problems": 4}
    after = {"qwen_tiny/pass_at_1": 0.5, "team/pass_at_1": 0.5, "team/pass_at_1_mcts": 0.75, "n_problems": 4}
    console = Console(width=120, record=True)
    console.print(evaluation_table(after, before))
    console.print(evaluation_table(after))
    rows = [{"cycle": -1, "stage": "eval", "metrics": before},
            {"cycle": 0, "stage": "rollout", "metrics": {"n_problems": 2, "n_nodes": 8, "cross_agent_refine_share": 0.375}},
            {"cycle": 0, "stage": "grading", "metrics": {"pass_rate": 0.125, "refine_pass_rate": 0.0625}},
            {"cycle": 0, "stage": "eval", "metrics": after}]
    console.print(cycle_table(rows))
    text = console.export_text()
    assert "before → after" in text
    assert "25.0 → 50.0" in text and "50.0 → 75.0" in text  # agent and team Pass@1, team Pass@1(MCTS)
    first, second = text.split("held-out evaluation")[1:3]
    assert "→" in first and "→" not in second.split("per cycle")[0]  # without a "before", plain numbers
    lines = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    assert [c[1].strip() for c in lines if c[1].strip() in ("before", "0")] == ["before", "0"]
    # pass rate, refine pass rate, cross-agent share
    assert any("12.5%" in line and "37.5%" in line and "6.2%" in line for line in text.splitlines())
    # the same tables as markdown (the Prefect artifact, summary.md): every row has the header's cells, |Â| escaped
    for table in (cycle_table(rows), evaluation_table(after, before)):
        lines = [line for line in table.markdown().splitlines() if line.startswith("|")]
        cells = {len(re.split(r"(?<!\\)\|", line)) for line in lines}
        assert len(lines) >= 3 and len(cells) == 1, table.markdown()
    assert "\\|Â\\|" in cycle_table(rows).markdown()


def test_an_unchanged_held_out_table_says_what_the_cycles_did_change():
    from pipeline.report import unchanged_note

    before = {"team/pass_at_1": 0.344}
    rows = [{"cycle": -1, "stage": "eval", "metrics": before},
            {"cycle": 0, "stage": "rollout", "metrics": {"cross_agent_refine_share": 0.421}},
            {"cycle": 0, "stage": "grading", "metrics": {"pass_rate": 0.266, "refine_pass_rate": 0.0}},
            {"cycle": 1, "stage": "rollout", "metrics": {"cross_agent_refine_share": 0.439}},
            {"cycle": 1, "stage": "grading", "metrics": {"pass_rate": 0.242, "refine_pass_rate": 0.05}}]
    note = unchanged_note(rows, {"team/pass_at_1": 0.344}, before)
    assert note == ("held-out Pass@1 did not move in 2 cycles; what did: rollouts passing 26.6% → 24.2%, "
                    "refinements passing 0.0% → 5.0%, cross-agent refinements 42.1% → 43.9%")
    assert unchanged_note(rows, {"team/pass_at_1": 0.375}, before) == ""  # it moved
    assert unchanged_note(rows, {"team/pass_at_1": 0.344}, None) == ""  # no "before"


def test_the_closing_line_says_whether_the_run_shows_the_method_from_its_four_signs():
    from pipeline.report import method_verdict

    before = {"team/pass_at_1": 0.344, "team/pass_at_1_mcts": 0.156}
    rows = [{"cycle": -1, "stage": "eval", "metrics": before},
            {"cycle": 0, "stage": "grading", "metrics": {"refine_pass_rate": 0.0, "cross_refine_pass_rate": 0.0}},
            {"cycle": 1, "stage": "grading", "metrics": {"refine_pass_rate": 0.0, "cross_refine_pass_rate": 0.0}}]
    toy = method_verdict(rows, {"team/pass_at_1": 0.344, "team/pass_at_1_mcts": 0.188}, before)
    assert toy == ("**This run does not show the method's mechanism**: the team tree does not beat one sample "
                   "(Pass@1(MCTS) 18.8% vs Pass@1 34.4%); refinements pass at most 0.0% in a cycle; cross-agent "
                   "refinements pass at most 0.0%; held-out Pass@1(MCTS) 15.6% → 18.8% (it needs all four: RESULTS.md, "
                   "\"The refine gate\").")
    rows[2]["metrics"] = {"refine_pass_rate": 0.31, "cross_refine_pass_rate": 0.12}
    works = method_verdict(rows, {"team/pass_at_1": 0.344, "team/pass_at_1_mcts": 0.5}, before)
    assert works.startswith("**This run shows the method at work**: the team tree beats one sample")
    # each sign alone can fail it: a falling tree, no passing cross-agent refinement
    assert "does not show" in method_verdict(rows, {"team/pass_at_1": 0.1, "team/pass_at_1_mcts": 0.15}, before)
    rows[2]["metrics"]["cross_refine_pass_rate"] = 0.0
    assert "does not show" in method_verdict(rows, {"team/pass_at_1": 0.344, "team/pass_at_1_mcts": 0.5}, before)
    assert method_verdict(rows[:1], {"team/pass_at_1": 0.3, "team/pass_at_1_mcts": 0.5}, before) == ""  # no rollout


def test_a_warning_during_a_live_display_prints_above_it_not_into_it():
    import io
    import logging

    from rich.console import Console

    from stagekit.progress import stage_progress

    beside = io.StringIO()
    handler = logging.StreamHandler(beside)  # the console handler a process has (Prefect's, on stderr)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        out = io.StringIO()
        with stage_progress("grading c0", "programs", Console(file=out, force_terminal=True, width=100)) as advance:
            advance(1, 4)
            logging.getLogger("mars2.sandbox.isolation").warning("SANDBOX: weaker than bwrap")
            logging.getLogger("mars2.sandbox.isolation").info("not shown: below the console's level")
            advance(4, 4)
        logging.getLogger("mars2").warning("after the display: the usual handler")
    finally:
        logging.getLogger().removeHandler(handler)
    assert "SANDBOX: weaker than bwrap" in out.getvalue() and "not shown" not in out.getvalue()
    assert beside.getvalue() == "after the display: the usual handler\n"
