"""Atomic, content-addressed file I/O for stage artefacts.

Every write goes to a temporary sibling first and is renamed into place, so a crash never leaves a
half-written artefact where a later run would trust it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


LARGE_FILE_BYTES = 64 << 20  # files from this size up get a sampled fingerprint instead of a full sha256
EDGE_BYTES = 1 << 20  # how much of each end of a large file the fingerprint reads


def file_fingerprint(path: str | Path, *, with_mtime: bool = False, large: int = LARGE_FILE_BYTES) -> str:
    """Content fingerprint of a file that reads at most ``2 * EDGE_BYTES`` bytes of it.

    Below ``large`` bytes it is the file's sha256 (hex). From ``large`` up it is
    ``fp:<size>:sha256(first EDGE_BYTES ‖ last EDGE_BYTES)``, and with ``with_mtime`` also ``:<mtime_ns>``: a
    multi-GB weight shard is keyed without reading it. An edit that keeps the size and both ends is not seen;
    ``with_mtime`` (for folders written outside the pipeline) catches it unless the mtime is restored too.
    """
    path = Path(path)
    st = path.stat()
    if st.st_size < max(large, 2 * EDGE_BYTES):
        return sha256_file(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        f.seek(st.st_size - EDGE_BYTES)
        h.update(f.read(EDGE_BYTES))
    digest = f"fp:{st.st_size}:{h.hexdigest()}"
    return f"{digest}:{st.st_mtime_ns}" if with_mtime else digest


def folder_fingerprints(folder: str | Path, *, with_mtime: bool = False) -> dict[str, str]:
    """:func:`file_fingerprint` of every file under ``folder``, by path relative to it (sorted)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_fingerprint(p, with_mtime=with_mtime)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def sha256_json(obj: Any) -> str:
    """Digest of a JSON-able object, independent of dict order."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode())


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """A temporary sibling of ``path`` to write into; renamed onto ``path`` when the block ends, deleted if it fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def write_parquet(path: str | Path, df: pd.DataFrame) -> Path:
    """Write a DataFrame as Parquet atomically."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    return Path(path)


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``final``; on success rename it to ``final``.

    If ``final`` already exists the new folder is discarded (content-addressed: same name, same content),
    so finished artefacts are never rewritten. On error the temporary folder is removed.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
