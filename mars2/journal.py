"""A stage's journal: the units of work it has finished (a search tree, a problem's evaluation, a chunk of graded
programs), kept on disk as they finish so that a killed stage, run again with the same key, keeps them and runs only
the rest (docs/engines.md, "Resuming a stage").

The journal of a stage folder ``<root>/artifacts/<stage>/<key[:16]>`` is ``<key[:16]>.journal`` beside it, and holds
its stage key in ``KEY``: a journal is read only by a run of the same key (same code version, same narrowed config,
same inputs), never by another. Each unit is one shard, ``<part>/<sha256(unit)[:32]>.<sha256(bytes)[:16]>.parquet``,
written atomically (temp file + rename) with its unit id in the Parquet metadata. A shard whose bytes do not match
the digest in its name, that does not read, or that names another unit is deleted and its unit redone. The journal is
removed once the stage's folder is complete.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mars2.io import atomic_path, atomic_write_text, sha256_bytes

log = logging.getLogger(__name__)

SUFFIX = ".journal"
CHUNK = 512  # rows per shard of a chunked phase (grading): a chunk's slowest program idles the other slots once
KEY = "KEY"
UNIT = b"mars2.unit"


def journal_dir(stage_folder: str | Path) -> Path:
    """The journal beside a stage's folder."""
    stage_folder = Path(stage_folder)
    return stage_folder.with_name(stage_folder.name + SUFFIX)


class Journal:
    """The finished units of one stage key. ``finished(part)`` reads what earlier runs kept; ``write(part, unit,
    rows)`` keeps a unit as soon as it is done; ``close()`` drops the journal once the stage's folder is complete."""

    def __init__(self, folder: str | Path, key: str):
        self.folder, self.key = Path(folder), key
        if (self.folder / KEY).exists() and self._stored_key() != key:
            log.warning("journal %s belongs to another stage key; it is discarded, not read", self.folder)
            shutil.rmtree(self.folder, ignore_errors=True)
        if not (self.folder / KEY).exists():
            atomic_write_text(self.folder / KEY, key)

    def _stored_key(self) -> str | None:
        try:
            return (self.folder / KEY).read_text()
        except OSError:
            return None

    def finished(self, part: str) -> dict[str, pd.DataFrame]:
        """The units of ``part`` an earlier run of this key finished, by unit id. Shards that fail their check are
        deleted with a warning: their units are redone."""
        return {unit: table.to_pandas() for unit, table in self.finished_tables(part).items()}

    def finished_tables(self, part: str) -> dict[str, pa.Table]:
        """:meth:`finished` as Arrow tables (as written, without the unit's metadata)."""
        units: dict[str, pa.Table] = {}
        for shard in sorted((self.folder / part).glob("*.parquet")):
            unit, rows = self._read(shard)
            if unit is None:
                continue
            if unit in units:  # a unit kept twice (two runs of the key at once): one of them is enough
                shard.unlink(missing_ok=True)
                continue
            units[unit] = rows
        return units

    def _read(self, shard: Path) -> tuple[str | None, pa.Table | None]:
        name_digest, _, content_digest = shard.name.removesuffix(".parquet").partition(".")
        try:
            data = shard.read_bytes()
            if sha256_bytes(data)[:16] != content_digest:
                raise ValueError("its bytes do not match the digest in its name")
            table = pq.read_table(io.BytesIO(data))
            unit = (table.schema.metadata or {}).get(UNIT, b"").decode()
            if sha256_bytes(unit.encode())[:32] != name_digest:
                raise ValueError("it names another unit")
            kept = {k: v for k, v in table.schema.metadata.items() if k != UNIT}
            return unit, table.replace_schema_metadata(kept or None)
        except (OSError, ValueError, pa.ArrowException) as e:
            log.warning("journal shard %s is corrupt (%s): deleted, its unit runs again", shard, e)
            with contextlib.suppress(OSError):
                shard.unlink()
            return None, None

    def write(self, part: str, unit: str, rows: pd.DataFrame) -> None:
        """Keep ``rows`` as unit ``unit`` of ``part`` (atomically: a kill leaves the shard whole or absent)."""
        self.write_table(part, unit, pa.Table.from_pandas(rows.reset_index(drop=True), preserve_index=False))

    def write_table(self, part: str, unit: str, table: pa.Table) -> None:
        """:meth:`write` of an Arrow table."""
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), UNIT: unit.encode()})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        data = buffer.getvalue()
        name = f"{sha256_bytes(unit.encode())[:32]}.{sha256_bytes(data)[:16]}.parquet"
        # no fsync (it stalled the search's scheduler 10-20 ms a tree): a killed process's writes stay in the page
        # cache, and what a machine crash tears fails the digest check and is redone
        with atomic_path(self.folder / part / name) as tmp:
            tmp.write_bytes(data)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def in_chunks(journal: Journal, part: str, rows: pd.DataFrame,
              work: Callable[[pd.DataFrame, Callable[[int, int], None]], pd.DataFrame],
              progress: Callable[[int, int], None] | None = None, size: int = CHUNK) -> tuple[pd.DataFrame, int]:
    """``work(rows[a:b], progress)`` for each chunk of ``size`` rows, each result kept in ``journal`` under ``part``
    (unit ``"a:b"``) as it is done; a chunk an earlier run of the key kept is not worked again. Returns (the results
    in order, as the journal holds them; the chunks resumed). ``progress`` is told ``(rows done, rows in all)``."""
    n = len(rows)
    units = [f"{a}:{min(a + size, n)}" for a in range(0, n, size)]
    kept = journal.finished(part)
    done = sum(_length(u) for u in units if u in kept)
    for unit in units:
        if unit in kept:
            continue
        a, b = map(int, unit.split(":"))

        def told(d: int, _total: int, offset: int = done) -> None:
            if progress is not None:
                progress(offset + d, n)

        journal.write(part, unit, work(rows.iloc[a:b], told))
        done += b - a
    results = journal.finished(part)
    table = pd.concat([results[u] for u in units], ignore_index=True) if units else work(rows, lambda *_: None)
    return table, sum(u in kept for u in units)


def _length(unit: str) -> int:
    a, b = map(int, unit.split(":"))
    return b - a


def kept_or_made(journal: Journal | None, part: str, unit: str, make: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """Unit ``unit`` of ``part`` as an earlier run of the key kept it, else ``make()`` kept now and read back (so a
    resumed run and an uninterrupted one hand on the same table); without a journal, ``make()``."""
    if journal is None:
        return make()
    if unit not in journal.finished(part):
        journal.write(part, unit, make())
    return journal.finished(part)[unit]
