"""Checkpoints from outside the current flow run (``eval.checkpoints``, ``eval.from_run``): what makes one unusable,
checked by the command line before Prefect, MLflow and torch load, and again by the flow (a deployment's worker
sees its own filesystem)."""

from __future__ import annotations

from pathlib import Path

from mars2.config import ConfigError, RunConfig


class CheckpointError(ConfigError):
    """A checkpoint that cannot be evaluated: unknown agent, missing folder, no weights in it."""

    label = "checkpoint error"


def require_checkpoints(checkpoints: dict[str, str], owners: list[str]) -> None:
    """Raise :class:`CheckpointError` with what to fix unless every key of ``checkpoints`` is a weight owner and
    every folder holds ``*.safetensors`` or ``*.bin`` weights."""
    unknown = sorted(set(checkpoints) - set(owners))
    if unknown:
        raise CheckpointError(f"eval.checkpoints names {unknown}, which own no weights in this preset; "
                              f"weight owners: {owners}")
    for owner, folder in sorted(checkpoints.items()):
        path = Path(folder)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint of {owner!r} not found: {folder} is not a folder (give the `model/` "
                                  "folder of an update stage, or an HF model folder)")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise CheckpointError(f"checkpoint of {owner!r}: {folder} holds no *.safetensors or *.bin weights")


def require_given_checkpoints(cfg: RunConfig) -> None:
    """:func:`require_checkpoints` for ``eval.checkpoints`` (``eval.from_run``'s need the MLflow store)."""
    require_checkpoints(dict(cfg.eval.checkpoints), [m.name for m in cfg.agents.owners])
