"""tasks/progress.py: one transient display per stage, drawn only on a terminal."""

import io

from rich.console import Console

from tasks.progress import stage_progress


def test_a_stage_draws_one_display_with_count_rate_and_phase_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with stage_progress("eval c0", "programs", console) as advance:
        advance(1, 3, phase="generate")
        advance(3, 3, phase="hidden tests")
    drawn = out.getvalue()
    assert "eval c0: hidden tests" in drawn and "3/3" in drawn and "programs" in drawn


def test_nothing_is_drawn_where_the_console_is_not_a_terminal():
    out = io.StringIO()
    with stage_progress("rollout c0", "nodes", Console(file=out, force_terminal=False)) as advance:
        advance(5, 10)
    assert out.getvalue() == ""
