"""Which tests check a change: the tests mirror the code, so a path names its tests.

The rule (``code_of``): ``tests/<D>/test_<N>.py`` checks ``<D>/<M>``, the module ``<M>.py``, the package or folder
``<M>/``, or another file whose name without its suffix is ``<M>`` (``-`` read as ``_``), where ``<N>`` is ``<M>`` or
``<M>_<topic>`` (the longest such ``<M>`` that exists). ``tests/flows/test_train_cycle_resume.py`` checks
``flows/train_cycle.py``; ``tests/conf/test_agents.py`` checks ``conf/agents/``; ``tests/test_docker_compose.py``
checks ``docker-compose.yml``. ``REPO_WIDE`` tests check the whole tree (layers, purity) and run for every change.

``tests_of(path)``: the test files whose code is the path or a folder holding it; where there are none, every test in
the deepest mirrored folder that has tests (``mars2/sandbox/runner/zygote.py`` → ``tests/mars2/sandbox/``). A test
file is its own test; the tests' shared helpers and the project's build files are checked by the whole suite.

    python -m pytest -q $(python -m tests.affected)            # what the working tree changed against HEAD
    python -m pytest -q $(python -m tests.affected --base main)  # what a branch changed
    python -m tests.affected mars2/search/ab_mcts.py           # a path's tests
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

TESTS = ROOT / "tests"
REPO_WIDE = ("test_layers.py", "test_purity.py")
WHOLE_SUITE = ("pyproject.toml", ".ci/run")  # a change here can change any test's outcome


def test_files() -> list[Path]:
    """Every test file under tests/ (the fixtures hold data, not tests)."""
    return sorted(p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def _stem(path: Path) -> str:
    return path.name.split(".")[0].replace("-", "_") if path.is_file() else path.name


def code_of(test_file: Path) -> Path | None:
    """The file or folder (relative to the repository root) that ``test_file`` checks; None for a ``REPO_WIDE`` test or
    a test file that names nothing (the test in tests/test_layers.py says which)."""
    if test_file.name in REPO_WIDE and test_file.parent == TESTS:
        return None
    folder = ROOT / test_file.parent.relative_to(TESTS)
    name = test_file.stem.removeprefix("test_")
    if not folder.is_dir():
        return None
    by_stem = {_stem(p): p for p in folder.iterdir() if not p.name.startswith((".", "__"))}
    for stem in sorted(by_stem, key=len, reverse=True):
        if name == stem or name.startswith(stem + "_"):
            return by_stem[stem].relative_to(ROOT)
    return None


def tests_of(path: str | Path) -> list[Path]:
    """The test files (relative to the repository root) that check a change to ``path`` (relative to the root), with
    the ``REPO_WIDE`` ones; ``[tests]`` where the change can change any test."""
    path = Path(path)
    if path.parts[:1] == ("tests",):
        if path.name.startswith("test_") and path.suffix == ".py":
            return [path]
        if "fixtures" not in path.parts:
            return [Path("tests")]
    if path.as_posix() in WHOLE_SUITE:
        return [Path("tests")]
    mapped = {f: code_of(f) for f in test_files()}
    own = [f for f, code in mapped.items() if code is not None and (code == path or code in path.parents)]
    if not own:
        for folder in path.parents:
            if folder == Path("."):
                break
            own = [f for f in mapped if f.parent == TESTS / folder]
            if own:
                break
    return sorted({f.relative_to(ROOT) for f in own} | {Path("tests") / name for name in REPO_WIDE})


def changed_paths(base: str) -> list[str]:
    """Paths changed against ``base`` (committed, staged, unstaged) and untracked files, relative to the root."""
    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if line]
    return sorted(set(git("diff", "--name-only", base)) | set(git("ls-files", "--others", "--exclude-standard")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="changed paths (default: what git says changed against --base)")
    parser.add_argument("--base", default="HEAD", help="the commit the change is measured against (default HEAD)")
    args = parser.parse_args(argv)
    paths = args.paths or changed_paths(args.base)
    found = sorted({t for p in paths for t in tests_of(p)})
    print("\n".join(t.as_posix() for t in (found if Path("tests") not in found else [Path("tests")])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
