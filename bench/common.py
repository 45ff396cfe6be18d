"""What the benches share: worker environments and the models they build (random weights, no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_path() -> str:
    """PYTHONPATH of the workers: this checkout first, then whatever the caller had (e.g. wheels unpacked elsewhere)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def qwen3_config(vocab: int, hidden: int, layers: int, tied: bool = False):
    """A Qwen3-architecture config of width ``hidden`` and depth ``layers``: 64-dim heads, half as many KV heads,
    MLP 3 × hidden."""
    from transformers import Qwen3Config

    heads = max(1, hidden // 64)
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                       max_position_embeddings=65536, tie_word_embeddings=tied, rope_theta=1e6)


def shipped_config(model: str, **overrides):
    """The transformers config of ``model`` (a shipped name such as ``Qwen3-1.7B``, or a folder holding a
    config.json; :func:`mars2.plan.models.load_model_config`), with ``overrides`` applied."""
    from mars2.plan.models import hf_config, load_model_config

    config, _ = load_model_config(model)
    return hf_config({**config, **overrides})
