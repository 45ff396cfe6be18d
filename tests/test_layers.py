"""The project's packages are layers, each importing only those below it, and no module imports itself round a circle:
``mars2`` (the library) < ``stagekit`` (what a stage is built with) < ``tasks`` (the stages) < ``pipeline`` (what wires
them into flows) < ``flows`` (the entry points). Every import counts, also one inside a function. And the tests mirror
the code: each test file's path names what it checks (``tests/affected.py``)."""

import ast
from pathlib import Path

import pytest

from tests import affected
from tests.paths import ROOT

LAYERS = ("mars2", "stagekit", "tasks", "pipeline", "flows")


def project_modules() -> dict[str, Path]:
    """Module name -> file, for every module of the layers (the sandbox's stdlib-only runner package aside: it runs
    alone inside the sandbox and imports its siblings by their bare names)."""
    modules = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[:3] == ("mars2", "sandbox", "runner"):
                continue
            modules[".".join(parts).removesuffix(".__init__")] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` counts as a.b.c where that is a module, else
    a.b; a relative import is resolved against the module's package)."""
    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {t for t in map(owner, targets) if t and t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(project_modules())


def test_no_layer_imports_one_above_it(graph):
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if rank[b.split(".")[0]] > rank[a.split(".")[0]])
    assert upward == []


def test_no_module_imports_itself_round_a_circle(graph):
    assert circles(graph) == []


def test_the_checks_see_an_arrow_up_and_a_circle():
    """The two checks on a made-up graph: what they must find."""
    made_up = {"mars2.a": {"mars2.b"}, "mars2.b": {"mars2.a", "tasks.x"}, "tasks.x": set()}
    assert circles(made_up) == [["mars2.a", "mars2.b"]]
    real = import_graph(project_modules())
    assert "stagekit.stage" in real["tasks.rollout"] and "mars2.config" in real["mars2.sandbox.pool"]


def test_every_layers_warnings_reach_the_prefect_runs_logs(tmp_path):
    """A stage's warning (a stale stage folder in stagekit, the grading stage's in tasks) reaches the run's Prefect
    logs only from the loggers ``PREFECT_LOGGING_EXTRA_LOGGERS`` names: every layer below the flows."""
    import os
    import subprocess
    import sys

    code = ("import os; from pipeline.runtime import configure_process; configure_process(); "
            "print(os.environ['PREFECT_LOGGING_EXTRA_LOGGERS'])")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"} | {"MARS2_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert set(out.stdout.split()[-1].split(",")) == set(LAYERS) - {"flows"}, out.stderr


def test_each_test_file_names_the_code_it_checks():
    unnamed = [f.relative_to(ROOT).as_posix() for f in affected.test_files()
               if affected.code_of(f) is None and not (f.parent == affected.TESTS and f.name in affected.REPO_WIDE)]
    assert not unnamed, f"rename or move each to tests/<folder>/test_<module>[_<topic>].py: {unnamed}"
    assert len(affected.test_files()) > 60


def test_a_change_finds_its_tests_by_its_path():
    wide = {Path("tests/test_layers.py"), Path("tests/test_purity.py")}
    search = set(affected.tests_of("mars2/search/ab_mcts.py")) - wide
    assert search == {Path("tests/mars2/search/test_ab_mcts.py"),
                      Path("tests/mars2/search/test_ab_mcts_vs_treequest.py")}
    assert Path("tests/flows/test_train_cycle_resume.py") in affected.tests_of("flows/train_cycle.py")
    assert Path("tests/flows/test_train_cycle_reuse.py") in affected.tests_of("flows/train_cycle.py")
    assert Path("tests/flows/test_study.py") not in affected.tests_of("flows/train_cycle.py")
    assert set(affected.tests_of("conf/agents/known_team.yaml")) - wide == {Path("tests/conf/test_agents.py")}
    assert set(affected.tests_of("docker-compose.yml")) - wide == {Path("tests/test_docker_compose.py")}
    # a module without a test file of its own: the tests of the deepest mirrored folder that has some
    zygote = set(affected.tests_of("mars2/sandbox/runner/zygote.py")) - wide
    assert Path("tests/mars2/sandbox/test_pool_hostile.py") in zygote
    assert all(t.parent == Path("tests/mars2/sandbox") for t in zygote)
    assert affected.tests_of("tests/mars2/rl/test_losses.py") == [Path("tests/mars2/rl/test_losses.py")]
    assert affected.tests_of("tests/conftest.py") == affected.tests_of("pyproject.toml") == [Path("tests")]
    assert affected.tests_of("docs/sandbox.md") == sorted(wide)


def test_the_mirror_rule_refuses_a_test_file_that_names_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(affected, "TESTS", tmp_path / "tests")
    monkeypatch.setattr(affected, "ROOT", tmp_path)
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("")
    for name in ("test_model.py", "test_model_topic.py", "test_modelling.py", "test_other.py"):
        (tmp_path / "tests" / "pkg" / name).write_text("")
    named = {f.name: affected.code_of(f) for f in affected.test_files()}
    assert named == {"test_model.py": Path("pkg/model.py"), "test_model_topic.py": Path("pkg/model.py"),
                     "test_modelling.py": None, "test_other.py": None}
