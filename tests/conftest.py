import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


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
def run_flow_cli(tmp_path):
    """Run ``flows/<script> <overrides>`` in a fresh run folder (``tmp_path``), offline, with no tracking/API server
    from the environment; returns the completed process."""
    import subprocess

    def run(script: str, *overrides: str, timeout: int = 900):
        env = {**os.environ, "MARS2_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("PREFECT_API_URL", None)
        root = Path(__file__).resolve().parents[1]
        return subprocess.run([sys.executable, f"flows/{script}", *overrides], cwd=root, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run
