"""Checkpoints from outside the current flow run (flows/evaluate.py): trained weights of an earlier run, or any
HF model folder, as a record shaped like an ``agents`` record (``meta.model_dirs`` per weight owner).

The record's key holds the sha256 of every file of each checkpoint, so evaluating a changed checkpoint runs
again and evaluating the same files twice comes from cache, wherever the folder sits.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from mars2.config import ConfigError
from mars2.io import sha256_file
from tasks.weights import model_dir, tokenizer_dir
from tasks.stage import StageContext, StageRecord, cache_key_fn, current_parameters, run_stage

STAGE = "checkpoints"
MODULES = ("mars2.io", "tasks.checkpoints", "tasks.weights")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be evaluated: unknown agent, missing folder, no weights in it."""

    label = "checkpoint error"


def checkpoint_hashes(checkpoints: dict[str, str], owners: list[str]) -> dict[str, dict[str, str]]:
    """sha256 of every file of each checkpoint folder; raises :class:`CheckpointError` with what to fix."""
    unknown = sorted(set(checkpoints) - set(owners))
    if unknown:
        raise CheckpointError(f"eval.checkpoints names {unknown}, which own no weights in this preset; "
                              f"weight owners: {owners}")
    out = {}
    for owner, folder in sorted(checkpoints.items()):
        path = Path(folder)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint of {owner!r} not found: {folder} is not a folder (give the `model/` "
                                  "folder of an update stage, or an HF model folder)")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise CheckpointError(f"checkpoint of {owner!r}: {folder} holds no *.safetensors or *.bin weights")
        out[owner] = {str(f.relative_to(path)): sha256_file(f) for f in sorted(path.rglob("*")) if f.is_file()}
    return out


@task(name=STAGE, cache_key_fn=cache_key_fn(STAGE, MODULES), persist_result=True)
def import_checkpoints(ctx: StageContext, checkpoints: dict[str, str], hashes: dict[str, dict[str, str]],
                       agents: StageRecord) -> StageRecord:
    """``agents`` with the given owners' weights replaced by the checkpoint folders (tokenizers unchanged)."""

    def produce(out: Path) -> dict:
        from mars2.io import atomic_write_json

        model_dirs = {o: model_dir(agents, o) for o in agents.meta["model_dirs"]}
        model_dirs |= {o: str(Path(p).resolve()) for o, p in checkpoints.items()}
        tokenizer_dirs = {o: tokenizer_dir(agents, o) for o in agents.meta["tokenizer_dirs"]}
        atomic_write_json(out / "checkpoints.json", {"model_dirs": model_dirs, "sha256": hashes})
        return {"meta": {"model_dirs": model_dirs, "tokenizer_dirs": tokenizer_dirs}}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)
