"""The run folder under stress: a full disk is named on the first line, and flows started at once on a fresh folder
do not race for its Prefect database. (Altered artefacts: tests/stagekit/test_stage_cache.py and
tests/flows/test_train_cycle.py.)"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.cli import no_space_left
from tests.paths import ROOT



def test_no_space_left_is_found_anywhere_in_the_chain(tmp_path):
    target = tmp_path / "artifacts" / "verdicts.parquet"
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        except OSError as e:
            raise RuntimeError("the stage failed") from e
    except RuntimeError as wrapped:
        message = no_space_left(wrapped, tmp_path)
    assert message.startswith("no space left on /") and f"writing {target}" in message
    mlflow_style = RuntimeError("(sqlite3.OperationalError) database or disk is full [SQL: INSERT INTO metrics ...]")
    assert f"the run folder {tmp_path}" in no_space_left(mlflow_style, tmp_path)
    assert no_space_left(RuntimeError("ConnectError: connection refused"), tmp_path) is None


def _flow_with_home(home: str, *prefix: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    env["MARS2_HOME"] = home
    return subprocess.run([*prefix, sys.executable, "flows/train_cycle.py", "agents=tiny_cpu", "data=toy"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def _flow_on_a_private_mount(tmp_path, options: str) -> tuple[Path, subprocess.CompletedProcess]:
    """The flow's command with its run folder on a tmpfs mounted with ``options`` in a private mount namespace
    (nothing outside sees it); skips where the machine cannot do that."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    home = tmp_path / "home"
    home.mkdir()
    mount = f"mount -t tmpfs -o {options} tmpfs {home}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a filesystem here: {probe.stderr.strip()}")
    return home, _flow_with_home(str(home), "unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh")


def _refusal(stderr: str) -> str:
    """The command's output after the lines that say what it starts (its first line, the temporary server's)."""
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("mars2 train cycle: "), stderr[-2000:]
    rest = [ln for ln in lines[1:] if not ln.startswith("mars2: starting a temporary Prefect server")]
    return "\n".join(rest)


def test_a_full_run_folder_is_refused_on_the_first_line(tmp_path):
    """The flow's command on a run folder in an 8 MiB filesystem: refused right after it says what it starts."""
    home, proc = _flow_on_a_private_mount(tmp_path, "size=8m")
    assert proc.returncode != 0
    first = _refusal(proc.stderr).splitlines()[0]
    assert first.startswith(f"mars2: no space left on {home}"), proc.stderr[-2000:]
    assert "MiB free" in first and "Traceback" not in proc.stderr


def test_a_run_folder_that_is_not_a_folder_is_refused_in_one_paragraph(tmp_path):
    (tmp_path / "a-file").write_text("")
    proc = _flow_with_home(str(tmp_path / "a-file" / "runs"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert _refusal(proc.stderr).startswith("mars2: the run folder cannot be used: Not a directory")
    assert "MARS2_HOME" in proc.stderr


def test_a_read_only_run_folder_is_refused_in_one_paragraph(tmp_path):
    """A read-only filesystem, which refuses even root."""
    _, proc = _flow_on_a_private_mount(tmp_path, "ro")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert _refusal(proc.stderr).startswith("mars2: the run folder cannot be used: Read-only file system")


SERVER = textwrap.dedent("""
    import sys
    sys.argv = ["flow"]
    from pipeline.runtime import configure_process
    configure_process(temporary_server=True)
    from pipeline import runtime
    print(runtime.temporary_server_url())
    """)


def test_a_flow_starts_its_server_only_once_another_flows_server_answers(tmp_path):
    """Flows started at once on one fresh run folder used to migrate its new Prefect database at the same time (the
    second server died with code 3). Here the test holds the start lock, as a flow whose server is starting does: the
    flow must not launch its server until the lock is free, then start it and get an answer."""
    import fcntl
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    env["MARS2_HOME"] = str(tmp_path)  # Prefect's home, database and lock go under it, as for a user
    (tmp_path / "prefect").mkdir()
    lock = os.open(tmp_path / "prefect" / "temporary-server.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)
    proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 5  # a flow launches its server at its first line (~1 s here)
        while time.monotonic() < deadline:
            assert not list((tmp_path / "prefect").glob("temporary-server*.log")), "launched while another started"
            assert proc.poll() is None
            time.sleep(0.1)
    finally:
        os.close(lock)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and out.strip().startswith("http://127.0.0.1:"), err[-2000:]
    assert not list((tmp_path / "prefect").glob("temporary-server-*.log"))  # stopped cleanly: its log removed
