"""Problem tables (Parquet, one row per problem) and the train/eval split."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pandas as pd

from mars2.data.schema import Problem


def problems_to_frame(problems: Sequence[Problem]) -> pd.DataFrame:
    return pd.DataFrame([p.to_row() for p in problems], columns=list(Problem.__dataclass_fields__))


def problems_from_frame(df: pd.DataFrame) -> list[Problem]:
    return [Problem.from_row(row) for row in df.to_dict(orient="records")]


def split_by_hash(ids: Sequence[str], eval_fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic split: a problem is held out iff sha256(seed:id) falls in the first ``eval_fraction``.

    Stable when problems are added or removed (a problem's side depends only on its own id), and the two
    sides are disjoint by construction, so no eval problem can leak into training.
    """
    train, held_out = [], []
    for pid in ids:
        u = int(hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest()[:12], 16) / 16**12
        (held_out if u < eval_fraction else train).append(pid)
    return train, held_out


def cycle_subset(ids: Sequence[str], cycle: int, size: int | None, rotate: bool = True) -> list[str]:
    """The ``size`` problems used in ``cycle``: consecutive windows that wrap around, so every problem is visited;
    ``rotate=False``: the first window in every cycle."""
    ids = list(ids)
    if size is None or size >= len(ids):
        return ids
    start = (cycle * size) % len(ids) if rotate else 0
    return [ids[(start + i) % len(ids)] for i in range(size)]
