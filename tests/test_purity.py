"""mars2/ is a pure library: it never imports Prefect, MLflow or Hydra (nor OmegaConf); the code that runs inside
the grading sandbox imports the standard library only."""

import ast
import os
import json
import subprocess
import sys

from tests.paths import ROOT

FORBIDDEN = ("prefect", "mlflow", "hydra", "omegaconf")
PROGRESS_BARS = ("tqdm",)  # the library reports progress through callbacks; the pipeline draws the display
LIB = ROOT / "mars2"


def test_no_forbidden_import_statement_in_mars2():
    offenders = []
    for path in LIB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(LIB)}: {n}" for n in names
                          if n.split(".")[0] in FORBIDDEN + PROGRESS_BARS]
    assert offenders == []


def test_importing_every_mars2_module_loads_no_orchestration_package():
    modules = sorted(
        ".".join(p.relative_to(LIB.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in LIB.rglob("*.py")
    )
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted({{k.split('.')[0] for k in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=LIB.parent)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert len(modules) > 10


def test_sandbox_side_code_imports_the_standard_library_only():
    """The sandbox mounts only mars2/sandbox and starts ``_entry.py`` with ``python -I -S``: the entry script and the
    ``runner`` package may import the standard library, each other, and LiveCodeBench's harness next to them."""
    sandbox = LIB / "sandbox"
    allowed = set(sys.stdlib_module_names) | {"runner", "lcb_reference", "numpy"}  # numpy: optional, as in LCB
    offenders = []
    for path in [sandbox / "_entry.py", *sorted((sandbox / "runner").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.relative_to(LIB)}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert offenders == []


def test_importing_tasks_or_pipeline_changes_nothing_in_the_process():
    """Entry points call pipeline.runtime.configure_process() themselves; importing the package sets no environment
    variable and no warning filter."""
    code = ("import os, warnings, numpy, pandas; env = dict(os.environ); filters = list(warnings.filters); "
            "import tasks, tasks.rollout, pipeline, stagekit.stage, "
            "stagekit.runners; print(dict(os.environ) == env and list(warnings.filters) == filters)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HF_", "TRANSFORMERS_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=ROOT)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_tasks_holds_the_stages_and_nothing_else():
    """``tasks/`` is the stage table: one module per stage task the dispatcher knows; what a stage is built with lives
    in stagekit/ (below), what wires them into flows in pipeline/ (above)."""
    from pipeline.dispatch import ALL

    modules = {p.stem for p in (ROOT / "tasks").glob("*.py")} - {"__init__"}
    assert modules == {fn.__module__.removeprefix("tasks.") for fn in ALL.values()}
