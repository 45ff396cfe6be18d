import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from pipeline.runtime import configure_process  # noqa: E402
from tests.flowenv import flow_env, stop_server  # noqa: E402
from tests.paths import FIXTURES, ROOT  # noqa: E402

configure_process()  # what every entry point does first (tests import stages without one)


@pytest.fixture(scope="session", autouse=True)
def shared_prefect_home(tmp_path_factory):
    """One Prefect home per test process, inherited by every flow a test starts: the embedded server migrates a
    fresh SQLite database once (~9 s on 2 cores), not once per run folder. Stage caches are the stage folders in each
    run folder, never here, so tests still share nothing but run history."""
    home = tmp_path_factory.getbasetemp() / "prefect-home"
    home.mkdir(exist_ok=True)
    previous = os.environ.get("PREFECT_HOME")
    os.environ["PREFECT_HOME"] = str(home)
    yield home
    stop_server()
    if previous is None:
        os.environ.pop("PREFECT_HOME", None)
    else:
        os.environ["PREFECT_HOME"] = previous


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from mars2.data import toy_benchmark, toy_reference_solutions
    from mars2.models.tiny import train_tokenizer

    rows = toy_benchmark(40, 0)
    texts = [r["question_content"] for r in rows] + list(toy_reference_solutions(40, 0).values())
    return train_tokenizer(texts, 384)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A saved tiny Qwen2-style model + tokenizer folder."""
    from mars2.models.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("tiny_model")
    model = build_tiny_model("qwen2", vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=2, num_heads=4,
                             num_kv_heads=2, intermediate_size=64, max_position_embeddings=1024,
                             pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id, seed=0)
    model.save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def paper_data(monkeypatch) -> list[str]:
    """The real-model presets' data (DeepCoder records + LCB v6) pointed at the small fixture copies; returns the
    override the fixture's three LCB release files need."""
    fixtures = FIXTURES
    monkeypatch.setenv("MARS2_DEEPCODER_PATH", str(fixtures / "deepcoder" / "train.jsonl"))
    monkeypatch.setenv("MARS2_LCB_PATH", str(fixtures / "lcb"))
    return ["data.eval_release=release_v3"]


@pytest.fixture
def run_flow_cli(tmp_path):
    """Run ``flows/<script> <overrides>`` in a fresh run folder (``tmp_path``), offline, reporting to the tests'
    Prefect server (``flowenv.py``); returns the completed process."""
    import subprocess

    def run(script: str, *overrides: str, timeout: int = 900):
        env = flow_env(tmp_path)
        return subprocess.run([sys.executable, f"flows/{script}", *overrides], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run


# Under the README's `-n 2 --dist loadfile`, xdist hands whole files to the two workers, by default the files with the
# most tests first: a file of one long test then started last and ran alone at the end. Here the files go out longest
# first (file times measured with --durations=0, the README's group and the slow group's interleaved), the rest in
# collection order.
LONGEST_FIRST = ("flows/test_deploy.py", "flows/test_train_cycle_resume.py", "flows/test_evaluate.py",
                 "mars2/backends/test_engine.py", "flows/test_train_cycle.py", "mars2/sandbox/test_pool_hostile.py",
                 "mars2/train/test_update.py", "flows/test_train_cycle_paradigms.py", "flows/test_study.py",
                 "stagekit/test_engines_on_nodes.py", "mars2/train/test_update_scale.py", "mars2/plan/test_planner.py",
                 "flows/test_train_cycle_reuse.py", "bench/test_refine_skill.py", "bench/test_rollout.py",
                 "mars2/sandbox/test_lcb_reference.py", "pipeline/test_tracking.py", "pipeline/test_config.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # Each worker's torch (and the flows it starts) gets its share of the cores: two 2-thread OpenMP pools on 2
    # cores spin against each other (the learning check took >16 min beside another flow, 7.4 min with 1 thread).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).resolve().parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(rank)))
