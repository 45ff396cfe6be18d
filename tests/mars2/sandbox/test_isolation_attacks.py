"""Attacks on the sandbox: every one must end in a non-pass verdict, leave no process behind, and leave the
grader and the host unharmed, at both isolation levels (``bwrap``, and ``process`` forced).

Each attack program is bounded by itself (a capped number of forks/threads/bytes, short sleeps) and by small
limits given here, so that even a broken sandbox could not take the test machine down. The programs print the
expected output only if their attack worked, so a pass would mean a hole.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import textwrap
import threading
import time

import pytest

from mars2.config import GradingConfig
from mars2.data.schema import TestCase as Case
from mars2.sandbox import SandboxPool, grade_program, probe_isolation
from tests.sandboxes import LEVELS, sandbox_pool
from tests.paths import ROOT

pytestmark = pytest.mark.timeout(90)

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_TESTS = [Case("1 2\n", "3"), Case("10 -4\n", "6")]
ATTACKED = "ATTACK-SUCCEEDED"


@pytest.fixture(scope="module", params=LEVELS)
def pool(request):
    if request.param == "bwrap" and not probe_isolation().get("bwrap"):
        pytest.skip("bubblewrap cannot run here")
    p = sandbox_pool(request.param)
    assert grade_program(ADD, ADD_TESTS, pool=p).all_passed  # start the slot
    yield p
    p.close()


def leftovers(pool: SandboxPool, wait_s: float = 3.0) -> list[int]:
    """Processes of graded programs still alive in the slot (polled: the zygote cleans up asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = pool.slots[0].sandbox_pids()
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def attack(pool: SandboxPool, code: str, *, expected: str = ATTACKED, inp: str = "", **settings):
    """Grade ``code`` (which prints ``expected`` only if its attack worked; ``settings``: GradingConfig fields);
    check the aftermath."""
    starts = pool.slots[0].starts
    v = grade_program(textwrap.dedent(code), [Case(inp, expected)], grading=GradingConfig(**settings), pool=pool)
    assert not v.all_passed, v
    assert leftovers(pool) == [], "a process of the graded program outlived its verdict"
    assert grade_program(ADD, ADD_TESTS, pool=pool).all_passed, "the grader no longer works"
    return v, pool.slots[0].starts - starts


def test_infinite_loop(pool):
    v, restarts = attack(pool, "while True:\n    pass\n", time_limit_s=0.5)
    assert v.status == "TLE" and restarts == 0


def test_sleep_past_the_limit(pool):
    start = time.monotonic()
    v, _ = attack(pool, "import time\ntime.sleep(20)\nprint('ATTACK-SUCCEEDED')\n", time_limit_s=0.5)
    assert v.status == "TLE" and time.monotonic() - start < 10


def test_fork_bomb_is_capped_and_does_not_starve_the_next_program(pool):
    code = """
    import os, time
    made = 0
    for _ in range(800):                     # bounded: at most 800 children, each forking at most 3 more
        try:
            pid = os.fork()
        except OSError:
            continue
        if pid == 0:
            for _ in range(3):
                try:
                    if os.fork() == 0:
                        time.sleep(2)
                        os._exit(0)
                except OSError:
                    pass
            time.sleep(2)
            os._exit(0)
        made += 1
    if made >= 500:
        print("ATTACK-SUCCEEDED")
    """
    v, restarts = attack(pool, code, time_limit_s=2)
    assert restarts == 0
    # right after a capped bomb, a program that needs threads must not fail with "can't start new thread"
    threads = textwrap.dedent(
        """
        import threading
        out = []
        ts = [threading.Thread(target=out.append, args=(i,)) for i in range(16)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(len(out))
        """
    )
    assert grade_program(threads, [Case("", "16")], pool=pool).all_passed


def test_memory_bomb(pool):
    code = """
    blocks = []
    for _ in range(80):                      # bounded: 8 GB at most
        blocks.append(b"x" * (100 << 20))
    print("ATTACK-SUCCEEDED")
    """
    v, _ = attack(pool, code, memory_mb=256, time_limit_s=5)
    assert v.status in ("MLE", "RE")


def test_ten_gigabyte_file_write(pool):
    code = """
    chunk = b"x" * (1 << 20)
    with open("big.bin", "wb") as f:
        for _ in range(10 * 1024):           # 10 GiB
            f.write(chunk)
    print("ATTACK-SUCCEEDED")
    """
    v, _ = attack(pool, code, time_limit_s=2)
    assert v.status == "RE" and "limit" in v.detail


def test_writes_and_deletes_outside_the_scratch_dir(pool, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    victim.chmod(0o666)
    tmp_path.chmod(0o777)
    targets = [str(tmp_path / "created.txt"), "/tmp/mars2-attack.txt", "/usr/mars2-attack.txt",
               str(ROOT / "mars2-attack.txt"), "../escaped.txt", "/root/mars2-attack"]
    code = f"""
    import os, shutil
    done = 0
    for path in {targets!r}:
        try:
            open(path, "w").write("x")
            done += 1
        except OSError:
            pass
    for path in ({str(victim)!r}, "/usr/bin/env"):
        try:
            os.remove(path)
            done += 1
        except OSError:
            pass
    try:
        shutil.rmtree({str(tmp_path)!r})
        done += 1
    except OSError:
        pass
    if done:
        print("ATTACK-SUCCEEDED")
    """
    attack(pool, code)
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]
    for path in targets[1:4]:
        assert not os.path.exists(path)
    assert os.path.exists("/usr/bin/env")


def test_orphan_daemon_is_killed_with_the_verdict(pool):
    code = """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:                   # the daemon answers after its parent has exited
            time.sleep(0.3)
            os.write(1, b"ATTACK-SUCCEEDED\\n")
            time.sleep(30)
        os._exit(0)
    """
    v, _ = attack(pool, code, time_limit_s=1)
    forks = pool.level == "bwrap" or pool.probe.get("process_dedicated_uid")
    assert v.status == ("WA" if forks else "RE")  # without a dedicated uid the process level refuses fork()


def test_env_secret_of_the_parent_is_not_readable(monkeypatch):
    secret = "S3CRET-in-the-grader-env-71f0"
    monkeypatch.setenv("MARS2_ATTACK_SECRET", secret)
    fresh = SandboxPool(1)  # started after the secret is set, so it could inherit it
    try:
        code = f"""
        import os
        found = any({secret!r} in v for v in os.environ.values())
        for pid in os.listdir("/proc"):
            try:
                found |= {secret!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read()
            except OSError:
                pass
        if found:
            print({secret!r})
        """
        v = grade_program(textwrap.dedent(code), [Case("", secret)], pool=fresh)
        assert v.status == "WA", v
    finally:
        fresh.close()


def test_no_network_not_even_to_a_local_listener(pool):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    tcp.settimeout(0.2)
    port = tcp.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0mars2-attack-{os.getpid()}"
    abstract.bind(name)
    abstract.listen(1)
    abstract.settimeout(0.2)
    code = f"""
    import socket
    ok = 0
    for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_UNIX, {name!r})):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(1)
            s.connect(address)
            s.sendall(b"hello")
            ok += 1
        except OSError:
            pass
    if ok:
        print("ATTACK-SUCCEEDED")
    """
    try:
        attack(pool, code, time_limit_s=2)
        for server in (tcp, abstract):
            with pytest.raises(OSError):  # socket.timeout: nobody connected
                server.accept()
    finally:
        tcp.close()
        abstract.close()


def test_killing_the_parent(pool):
    code = """
    import os, signal
    os.kill(os.getppid(), signal.SIGKILL)
    print("ATTACK-SUCCEEDED")
    """
    v, restarts = attack(pool, code)
    assert v.status == "RE" and restarts == 0


def test_faking_a_pass(pool, tmp_path):
    expected = "EXPECTED-OUTPUT-5d1e"
    attempts = {
        "exit early": "import os\nos._exit(0)\n",
        "forged status record": "import os\nos.write(3, b'{\"status\": \"ok\"}')\nos._exit(0)\n",
        "patch print and builtins": "import builtins, sys\nbuiltins.print = lambda *a, **k: None\n"
                                    "sys.stdout.write = lambda s: len(s)\nbuiltins.input = lambda: ''\nprint('x')\n",
        "expected output files": "for p in ('expected.txt', 'output.txt', '../expected', '/tmp/expected'):\n"
                                 "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n",
        "search memory and frames": textwrap.dedent(
            """
            import gc, sys
            needle = "".join(reversed(["5d1e", "OUTPUT-", "EXPECTED-"]))   # never a literal in this source
            def has(o):                      # a string or bytes holding the expected output
                if o is needle:
                    return False
                if isinstance(o, bytes):
                    return needle.encode() in o
                return isinstance(o, str) and needle in o
            def items(o):
                if isinstance(o, dict):
                    return list(o.keys()) + list(o.values())
                return list(o) if isinstance(o, (list, tuple, set, frozenset)) else []
            hit = any(has(x) for o in gc.get_objects() for x in items(o))
            frame = sys._getframe().f_back
            while frame:
                hit |= any(has(v) for v in items(frame.f_locals) + items(frame.f_globals))
                frame = frame.f_back
            if hit:
                print(needle)
            """),
    }
    for name, code in attempts.items():
        v = grade_program(code, [Case("some input", expected)], pool=pool)
        assert v.status in ("WA", "RE"), (name, v)
    functional = "class Solution:\n    def f(self, x):\n        class Any:\n            def __eq__(self, o):\n" \
                 "                return True\n        import json\n        json.dumps = lambda *a, **k: 'broken'\n" \
                 "        return Any()\n"
    v = grade_program(functional, [Case("1", f'"{expected}"', "functional")], func_name="f", pool=pool)
    assert v.status in ("WA", "RE"), v
    assert leftovers(pool) == []


def test_a_gigabyte_of_stdout(pool):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = """
    import sys
    block = "y" * (1 << 20)
    for _ in range(1024):                    # 1 GiB
        sys.stdout.write(block)
    print("ATTACK-SUCCEEDED")
    """
    v, _ = attack(pool, code, time_limit_s=3)
    assert v.status == "RE" and "output limit" in v.detail
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"the grader's memory grew by {grown_mb:.0f} MB"


def test_thread_bomb(pool):
    code = """
    import threading, time
    started = 0
    for _ in range(5000):                    # bounded
        try:
            threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
            started += 1
        except (RuntimeError, MemoryError):
            break
    if started >= 2000:
        print("ATTACK-SUCCEEDED")
    """
    v, restarts = attack(pool, code, time_limit_s=3)
    assert restarts == 0


def test_kill_everything_reaches_nothing_outside_the_sandbox(pool):
    probe = probe_isolation()
    if pool.level != "bwrap" or not probe.get("pid_namespace"):
        pytest.skip("os.kill(-1, SIGKILL) is only run where a pid namespace protects the test machine")
    sentinels = [subprocess.Popen(["sleep", "60"])]
    uid = pool.slots[0].lease.uid if pool.slots[0].lease is not None else None
    if uid is not None:  # a process of the very uid the programs run as, outside the sandbox
        sentinels.append(subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.setresuid(uid, uid, uid)))
    helper_alive = threading.Event()
    helper = threading.Thread(target=lambda: (time.sleep(0.5), helper_alive.set()))
    helper.start()
    try:
        code = """
        import os, signal, time
        os.kill(-1, signal.SIGKILL)
        time.sleep(0.2)
        """
        v, restarts = attack(pool, code, time_limit_s=2)
        assert restarts == 0
        helper.join()
        assert helper_alive.is_set()
        assert all(s.poll() is None for s in sentinels), "kill(-1) reached a process outside the sandbox"
    finally:
        for s in sentinels:
            s.kill()
            s.wait()


def test_lcb_parity_is_sandboxed_too(pool):
    """The same confinement applies when the program runs under LiveCodeBench's own harness code."""
    code = """
    import socket
    try:
        socket.create_connection(("127.0.0.1", 22), timeout=1)
        print("ATTACK-SUCCEEDED")
    except OSError:
        pass
    while True:
        pass
    """
    v, _ = attack(pool, code, time_limit_s=1, parity="lcb")
    assert v.status == "TLE"
    g = grade_program("import os\nos.kill(os.getppid(), 9)\nprint(1)", [Case("", "1")],
                      grading=GradingConfig(parity="lcb"), pool=pool)
    assert not g.all_passed  # LiveCodeBench's guard sets os.kill to None


def test_breaking_the_runner_between_tests_only_fails_the_program(pool):
    """A test that sabotages what the runner needs for the next test cannot raise a sandbox fault."""
    code = """
    import json, os, resource, signal, sys
    print(input())
    sys.stdout.flush()
    resource.setrlimit = resource.getrusage = None
    os.memfd_create = os.dup2 = None
    json.loads = json.dumps = None
    signal.setitimer = None
    """
    tests = [Case("1", "1"), Case("2", "2"), Case("3", "3")]
    for parity in ("script", "lcb"):
        v = grade_program(textwrap.dedent(code), tests, grading=GradingConfig(parity=parity), pool=pool)
        assert v.status in ("AC", "RE", "WA"), v  # a verdict, not an exception
    assert leftovers(pool) == []
    assert grade_program(ADD, ADD_TESTS, pool=pool).all_passed
