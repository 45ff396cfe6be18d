"""Checkpoints from outside the current flow run (flows/evaluate.py): trained weights of an earlier run, or any
HF model folder, as a record shaped like an ``agents`` record (``weights``: :class:`AgentWeights` per weight owner).

The record's key holds a fingerprint of every file of each checkpoint (:func:`mars2.io.file_fingerprint` with
mtimes: sha256 of small files; size, both ends and mtime of weight shards from 64 MiB up), so evaluating a changed
checkpoint runs again and evaluating the same files twice comes from cache, wherever the folder sits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mars2.io import folder_fingerprints
from stagekit.checkpoint_checks import require_checkpoints
from stagekit.stage import StageContext, StageDeclaration, StageRecord, current_parameters, run_declared, stage_task

DECLARATION = StageDeclaration(
    name="checkpoints", label="checkpoints",
    modules=("mars2.io", "tasks.checkpoints", "stagekit.checkpoint_checks", "stagekit.runners"))


def checkpoint_hashes(checkpoints: dict[str, str], owners: list[str]) -> dict[str, dict[str, str]]:
    """Fingerprint of every file of each checkpoint folder (folders we do not own: large files add their mtime),
    after :func:`stagekit.checkpoint_checks.require_checkpoints`."""
    require_checkpoints(checkpoints, owners)
    return {owner: folder_fingerprints(Path(folder), with_mtime=True) for owner, folder in sorted(checkpoints.items())}


@stage_task(DECLARATION)
def import_checkpoints(ctx: StageContext, checkpoints: dict[str, str], hashes: dict[str, dict[str, str]],
                       agents: StageRecord) -> StageRecord:
    """``agents`` with the given owners' weights replaced by the checkpoint folders (tokenizers unchanged)."""

    def produce(out: Path) -> dict:
        from mars2.io import atomic_write_json

        weights = {o: agents.weights_of(o) for o in agents.weights}
        weights |= {o: dataclasses.replace(weights[o], model_dir=str(Path(p).resolve()), optimizer_dir=None, buffer=None)
                    for o, p in checkpoints.items()}
        atomic_write_json(out / "checkpoints.json", {"model_dirs": {o: w.model_dir for o, w in weights.items()},
                                                     "fingerprints": hashes})
        return {"weights": weights}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)
