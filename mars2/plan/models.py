"""Model shapes for planning: a config.json (local folder first, else the shipped copy) → a model on the
``meta`` device (no memory, no weights) → parameter counts and the numbers the memory formulas need."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).resolve().parent / "model_configs"

# Public parameter counts (model cards) of the models the presets name; the plan prints the deviation.
PUBLIC_PARAMS: dict[str, float] = {
    "Qwen3-8B": 8.2e9,
    "Qwen3-14B": 14.8e9,
    "Qwen3-32B": 32.8e9,
    "AReaL-boba-2-8B": 8.2e9,  # fine-tunes of the Qwen3 models above: same architecture
    "AReaL-boba-2-14B": 14.8e9,
    "AReaL-boba-2-32B": 32.8e9,
    "smollm2-135m-instruct": 135e6,  # HuggingFaceTB/SmolLM2-135M-Instruct (agents=smollm2_cpu)
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelConfigNotFound(LookupError):
    """Neither the model folder nor the shipped configs hold a config.json for this model."""


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about one model."""

    name: str  # the model folder's last path component, or "tiny:<arch>"
    source: str  # where the config came from: a local config.json path, "shipped:<file>", or "tiny"
    architecture: str
    params: int  # total parameters, tied embeddings counted once
    largest_layer: int  # parameters of the largest single module (DeepSpeed's ZeRO-3 estimator input)
    largest_layer_name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tied_embeddings: bool

    @property
    def public_params(self) -> float | None:
        return PUBLIC_PARAMS.get(self.name)


def shipped_models() -> list[str]:
    """Names of the shipped configs (``mars2/plan/model_configs/<name>.json``)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


def load_model_config(model: str) -> tuple[dict[str, Any], str]:
    """(config.json dict, where it came from) for a model path: ``<model>/config.json`` when that exists,
    else the shipped ``model_configs/<basename>.json``."""
    local = Path(model) / "config.json"
    if local.is_file():
        return json.loads(local.read_text()), str(local)
    name = os.path.basename(os.path.normpath(model))
    shipped = SHIPPED_DIR / f"{name}.json"
    if shipped.is_file():
        return json.loads(shipped.read_text()), f"shipped:{shipped.name}"
    raise ModelConfigNotFound(
        f"no config.json for model {model!r}: the folder does not exist here and {name!r} is not one of the "
        f"shipped configs ({', '.join(shipped_models())}). Put the model folder (or just its config.json) at "
        f"that path, or add mars2/plan/model_configs/{name}.json with the model's public config.json values.")


def tiny_config_dict(tiny: Any) -> dict[str, Any]:
    """config.json-style dict of a ``model: tiny`` agent (mirrors :func:`mars2.models.tiny.build_tiny_model`)."""
    return {
        "model_type": tiny.arch,
        "vocab_size": tiny.vocab_size,
        "hidden_size": tiny.hidden_size,
        "num_hidden_layers": tiny.num_layers,
        "num_attention_heads": tiny.num_heads,
        "num_key_value_heads": tiny.num_kv_heads,
        "intermediate_size": tiny.intermediate_size,
        "max_position_embeddings": tiny.max_position_embeddings,
        "tie_word_embeddings": True,
    }


def hf_config(config: dict[str, Any]):
    """A transformers config object from a config.json-style dict."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "_name_or_path")}
    if "model_type" not in config:
        raise ValueError("config.json has no model_type")
    return AutoConfig.for_model(config["model_type"], **kwargs)


def build_meta_model(config: dict[str, Any]):
    """``AutoModelForCausalLM.from_config`` on the ``meta`` device: shapes only, no memory, no weights."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = hf_config(config)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf), hf


def count_parameters(config: dict[str, Any]) -> tuple[int, int]:
    """(total parameters, parameters of the largest module) of the causal LM a config.json describes.

    Shared (tied) parameters are counted once; the largest module is DeepSpeed's definition in
    ``deepspeed.runtime.zero.stage3.model_to_params`` (parameters owned directly by one module).
    """
    model, _ = build_meta_model(config)
    total, (largest, _) = _count(model)
    return total, largest


def _count(model) -> tuple[int, tuple[int, str]]:
    # DeepSpeed's own model_to_params dedupes by data_ptr(), which is 0 for every meta tensor: dedupe by id.
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = (0, "")
    for name, module in model.named_modules():
        n = sum(p.numel() for p in module.parameters(recurse=False))
        if n > largest[0]:
            largest = (n, name)
    return total, largest


def model_shape(model: str, tiny: Any = None) -> ModelShape:
    """Shape of an agent's model: ``model="tiny"`` uses the agent's ``tiny`` block, anything else a config.json."""
    if model == "tiny":
        config, source = tiny_config_dict(tiny), "tiny"
        name = f"tiny:{tiny.arch}"
    else:
        config, source = load_model_config(model)
        name = os.path.basename(os.path.normpath(model))
    meta, hf = build_meta_model(config)
    total, (largest, largest_name) = _count(meta)
    heads = int(hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return ModelShape(
        name=name, source=source, architecture=type(meta).__name__, params=total, largest_layer=largest,
        largest_layer_name=largest_name, hidden_size=int(hf.hidden_size),
        intermediate_size=int(hf.intermediate_size), num_layers=int(hf.num_hidden_layers), num_heads=heads,
        num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
        vocab_size=int(hf.vocab_size), max_position_embeddings=int(hf.max_position_embeddings),
        tied_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )
