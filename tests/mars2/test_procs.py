"""Processes the pipeline started are signalled only while their pids are still theirs (mars2.procs).

A reaped child's pid may be reused at once (``pid_max`` 32768 here, thousands of sandbox processes a minute), so a
``killpg`` after the reap can reach a stranger's process group: two full-suite runs lost another test's process this
way. The rule: a group is signalled while its leader is unreaped, and reaped after."""

import os
import signal
import subprocess
import sys

import pytest

from mars2.backends import SamplingParams
from mars2.backends.engine import EngineClient, EngineSpec
from mars2.data.schema import TestCase as Case
from mars2.procs import exit_code, kill_group, wait_exit
from mars2.sandbox import grade_program
from mars2.sandbox.pool import SandboxPool


@pytest.fixture
def signals_only_unreaped(monkeypatch):
    """os.killpg / os.kill that record each target and whether it was still an unreaped child of this process (or
    no child of ours at all) when signalled."""
    sent = []
    real_killpg, real_kill = os.killpg, os.kill

    def unreaped(pid: int) -> bool:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return True
        except ChildProcessError:  # reaped by us, or never ours: only the former is a mistake
            return pid not in reaped

    reaped = set()
    real_wait = subprocess.Popen._try_wait

    def try_wait(self, flags):
        result = real_wait(self, flags)
        if result[0] == self.pid:
            reaped.add(self.pid)
        return result

    monkeypatch.setattr(subprocess.Popen, "_try_wait", try_wait)
    monkeypatch.setattr(os, "killpg", lambda pid, sig: (sent.append((pid, unreaped(pid))), real_killpg(pid, sig)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: (sent.append((pid, unreaped(pid) if sig else True)),
                                                      real_kill(pid, sig)))
    return sent


def test_exit_code_and_wait_exit_leave_the_child_unreaped():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], start_new_session=True)
    assert wait_exit(proc, 30) == 3
    assert exit_code(proc) == 3 and proc.returncode is None  # a zombie: its pid is still reserved
    os.killpg(proc.pid, 0)  # its group id still names its group
    assert kill_group(proc) == 3 and proc.returncode == 3


def test_wait_exit_gives_none_for_a_running_child_and_the_signal_for_a_killed_one():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert wait_exit(proc, 0.2) is None and exit_code(proc) is None
    finally:
        assert kill_group(proc) == -signal.SIGKILL


def test_an_engine_closed_after_it_exited_is_not_signalled_by_a_pid_that_may_be_reused(tiny_model_dir,
                                                                                      signals_only_unreaped):
    engine = EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1"))
    engine.close()  # a polite shutdown: the engine exits by itself, then its group is killed and it is reaped
    assert signals_only_unreaped and all(ok for _, ok in signals_only_unreaped), signals_only_unreaped


def test_a_sandbox_slot_closed_after_its_zygote_exited_is_not_signalled_by_a_reused_pid(signals_only_unreaped):
    pool = SandboxPool(1)
    assert grade_program("print(int(input()) + 1)", [Case("1\n", "2")], pool=pool).all_passed
    pool.close()  # the zygote is asked to exit, then its group is killed and it is reaped
    assert signals_only_unreaped and all(ok for _, ok in signals_only_unreaped), signals_only_unreaped


def test_a_stage_attached_to_a_node_service_that_died_does_not_signal_its_reused_pid(tiny_model_dir, tmp_path,
                                                                                      monkeypatch):
    """A node service another stage started dies and its parent reaps it before this stage's reader notices: the
    reader's clean-up must not send SIGKILL to the process group its pid may name by now."""
    service_dir = tmp_path / "engines" / "run-1" / "node-a"
    spec = EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1")
    first = EngineClient(spec, service_dir=service_dir)
    pid = first.pid
    first.close()  # disconnect only: the service lives on, a child of this process
    second = EngineClient(spec, service_dir=service_dir)
    try:
        assert second.pid == pid and second.starts == 0
        second.restarts_left = 0  # no restart: the reader only cleans up
        sent = []
        real_killpg = os.killpg
        monkeypatch.setattr(os, "killpg", lambda p, sig: (sent.append(p), real_killpg(p, sig)))
        with second._lock:  # the reader waits here, after the connection broke, until the service is reaped
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        with pytest.raises(Exception, match="crashed"):
            second.generate(["x"], SamplingParams(max_new_tokens=2))
        assert pid not in sent, "a reaped service's pid was signalled"
    finally:
        second.close()
        (service_dir.parent / "STOP").write_text("")


@pytest.mark.parametrize("field", ["boot_id", "pidns"])
def test_a_record_from_another_host_or_container_with_this_nodes_name_is_not_local(tiny_model_dir, tmp_path, field,
                                                                                   monkeypatch):
    """Two hosts (another kernel boot id) or two containers of one host (another pid namespace) given one node name:
    the record's pid is not a process here, so it is never opened or signalled, however alive a local process with
    that pid is."""
    import json

    from mars2.backends import engine as engine_module

    service_dir = tmp_path / "engines" / "run-1" / "node-a"
    spec = EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1")
    first = EngineClient(spec, service_dir=service_dir)
    try:
        first.close()  # disconnect: the record stays, the service lives on
        record_path = service_dir / "qwen_tiny.json"
        record = json.loads(record_path.read_text())
        assert record["boot_id"] == engine_module.boot_id() and record["pidns"] == engine_module.pid_namespace()
        record[field] = "elsewhere"
        record_path.write_text(json.dumps(record))
        opened = []
        real_open = os.pidfd_open
        monkeypatch.setattr(os, "pidfd_open", lambda pid, *a: (opened.append(pid), real_open(pid, *a))[1])
        second = EngineClient(spec, service_dir=service_dir)  # attaches over the socket, as to another node's
        try:
            assert second.pid == record["pid"] and not second._local and opened == []
        finally:
            second.close()
    finally:
        (service_dir.parent / "STOP").write_text("")
