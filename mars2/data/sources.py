"""From a data config to validated train/eval problem lists, a rejects table and a summary.

:func:`build_dataset` is the whole dataset-prep computation (the Prefect task in ``tasks/data.py`` only
writes its result to files): load the source, keep every bad record as a reject (or stop at the first
rejects when ``reject_fatal``), apply the contest-date window, split train/eval, drop from train any
problem whose statement is also in eval, and summarise. :func:`input_files` lists the files the result
depends on (the stage's cache key hashes their contents).

``data`` is any object with the fields of :class:`mars2.config.DataConfig`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mars2.data.deepcoder import load_deepcoder
from mars2.data.files import data_files, read_rows
from mars2.data.known_answer import (known_answer_benchmark, known_answer_reference_solutions,
                                      known_answer_wrong_readings)
from mars2.data.humaneval import humaneval_file, humaneval_reference_solutions, load_humaneval
from mars2.data.lcb import load_problems, read_jsonl_rows
from mars2.data.schema import Problem
from mars2.data.splits import (contest_datetime, drop_train_duplicates, filter_by_date, read_id_list, split_by_date,
                               split_by_ids)
from mars2.data.tables import split_by_hash
from mars2.data.toy import toy_benchmark, toy_reference_solutions
from mars2.io import sha256_file, sha256_json

__all__ = [
    "REJECT_COLUMNS",
    "SOURCES",
    "SPLITS",
    "Dataset",
    "DatasetRejectsError",
    "build_dataset",
    "canonical_source",
    "content_hash",
    "input_files",
    "summarize",
    "summary_metrics",
]

SOURCES = ("toy", "known_answer", "lcb", "deepcoder", "humaneval")
#: The generated sources: problems and reference solutions come from ``(n_problems, seed)``, no file.
GENERATED = {"toy": (toy_benchmark, toy_reference_solutions),
             "known_answer": (known_answer_benchmark, known_answer_reference_solutions)}
#: Old names still accepted for ``data.source``.
SOURCE_ALIASES = {"lcb_jsonl": "lcb"}
SPLITS = ("hash", "date", "ids", "source")
REJECT_COLUMNS = ["source", "line", "question_id", "error"]
_SHOWN_REJECTS = 5


class DatasetRejectsError(ValueError):
    """Rows were rejected and ``data.reject_fatal`` is set; the message lists them."""


@dataclass
class Dataset:
    train: list[Problem]
    eval: list[Problem]
    rejected: list[dict[str, Any]]
    summary: dict[str, Any]
    reference_solutions: dict[str, str] | None = None
    wrong_readings: dict[str, list[str]] | None = None
    """data=known_answer: per problem, the programs of its other readings (right algorithm, wrong detail)."""
    dropped: dict[str, int] = field(default_factory=dict)


def canonical_source(name: str) -> str:
    source = SOURCE_ALIASES.get(name, name)
    if source not in SOURCES:
        raise ValueError(f"data.source={name!r} is unknown; allowed: {', '.join(SOURCES)}")
    return source


def _source_files(data: Any) -> list[Path]:
    source = canonical_source(data.source)
    if source in GENERATED:
        return []
    if source == "humaneval":
        return [Path(data.path) if data.path else humaneval_file()]
    if not data.path:
        raise ValueError(f"data.source={source} needs data.path (a file or a folder of data files)")
    return data_files(data.path, release=data.release if source == "lcb" else None)


EVAL_SIDE_FIELDS = {"source": "eval_source", "path": "eval_path", "release": "eval_release",
                    "start_date": "eval_start_date", "end_date": "eval_end_date"}


def eval_side(data: Any) -> SimpleNamespace:
    """``split=source``: the held-out problems come from their own source (``data.eval_source``, ``eval_path``,
    ``eval_release``, ``eval_start_date``, ``eval_end_date``), e.g. train on DeepCoder records, evaluate on LCB v6."""
    return SimpleNamespace(**{k: getattr(data, v) for k, v in EVAL_SIDE_FIELDS.items()}, n_problems=data.n_problems,
                           seed=data.seed, split="hash", eval_fraction=0.5, split_date=None, eval_ids_file=None,
                           reject_fatal=data.reject_fatal)


def input_files(data: Any) -> list[Path]:
    """Every file the dataset depends on: the source files, the eval source's (``split=source``) and the eval id
    list (``split=ids``)."""
    files = _source_files(data)
    if data.split == "ids" and data.eval_ids_file:
        files.append(Path(data.eval_ids_file))
    if data.split == "source":
        files += _source_files(eval_side(data))
    return files


def _load(data: Any) -> tuple[list[Problem], list[dict[str, Any]], dict[str, str] | None, list[Path]]:
    source = canonical_source(data.source)
    files = _source_files(data)
    if source in GENERATED:
        rows_of, references_of = GENERATED[source]
        problems, rejected = load_problems(rows_of(data.n_problems, data.seed), source=source)
        return problems, rejected, references_of(data.n_problems, data.seed), files
    if source == "humaneval":
        problems, rejected = load_humaneval(files[0])
        return problems, rejected, humaneval_reference_solutions(read_jsonl_rows(files[0])), files
    problems, rejected = [], []
    seen: dict[str, tuple[str, Any]] = {}  # shared: an id repeated in a later file is rejected too
    loader = load_problems if source == "lcb" else load_deepcoder
    for f in files:
        good, bad = loader(read_rows(f), source=str(f), seen=seen)
        problems += good
        rejected += bad
    return problems, rejected, None, files


def _raise_rejects(rejected: Sequence[dict[str, Any]], n_good: int) -> None:
    shown = "\n".join(f"  {r['source']}:{r['line']}: {r['error']}" for r in rejected[:_SHOWN_REJECTS])
    more = f"\n  ... and {len(rejected) - _SHOWN_REJECTS} more" if len(rejected) > _SHOWN_REJECTS else ""
    raise DatasetRejectsError(
        f"data: {len(rejected)} row(s) rejected ({n_good} good) and data.reject_fatal=true:\n{shown}{more}\n"
        "Fix or remove these rows, or set data.reject_fatal=false to go on without them "
        "(they are then listed in rejected.parquet).")


def _split(problems: list[Problem], data: Any) -> tuple[list[str], list[str], list[str]]:
    ids = [p.id for p in problems]
    if data.split == "hash":
        train, held_out = split_by_hash(ids, data.eval_fraction, data.seed)
        return train, held_out, []
    if data.split == "date":
        train, held_out = split_by_date(problems, data.split_date)
        return train, held_out, []
    if data.split == "ids":
        if not data.eval_ids_file:
            raise ValueError("split=ids needs data.eval_ids_file (one problem id per line, or a JSON list)")
        return split_by_ids(ids, read_id_list(data.eval_ids_file))
    raise ValueError(f"data.split={data.split!r} is unknown; allowed: {', '.join(SPLITS)}")


def _load_window(data: Any) -> tuple[list[Problem], list[dict[str, Any]], dict[str, str] | None, list[Path],
                                     dict[str, int]]:
    """Load one source and keep its contest-date window; ``window`` counts loaded, outside_window, undated."""
    problems, rejected, refs, files = _load(data)
    if rejected and data.reject_fatal:
        _raise_rejects(rejected, len(problems))
    if not problems:
        raise ValueError(f"data: no valid problem in {data.source} {data.path or ''} ({len(rejected)} rejected)")
    loaded = len(problems)
    problems, window = filter_by_date(problems, data.start_date, data.end_date)
    if not problems:
        raise ValueError(f"data: none of the {loaded} problems of {data.source} {data.path or ''} lies in the window "
                         f"{data.start_date}..{data.end_date} ({window['undated']} have no contest date)")
    return problems, rejected, refs, files, {"loaded": loaded, **window}


def build_dataset(data: Any) -> Dataset:
    """Load, validate, select, split and summarise (see the module docstring).

    Raises :class:`DatasetRejectsError` when rows were rejected and ``data.reject_fatal`` is set, and
    ``ValueError`` when nothing is left to train or evaluate on.
    """
    problems, rejected, refs, files, window = _load_window(data)
    loaded = window["loaded"]
    missing: list[str] = []
    if data.split == "source":  # held-out problems from their own source; every main-source problem may train
        side = eval_side(data)
        held_out, eval_rejected, _, eval_files, eval_window = _load_window(side)
        rejected, files, loaded = rejected + eval_rejected, files + eval_files, loaded + eval_window["loaded"]
        for k in ("outside_window", "undated"):
            window[k] += eval_window[k]
        train_candidates = problems
        clash = sorted({p.id for p in problems} & {p.id for p in held_out})
        if clash:
            raise ValueError(f"data: {len(clash)} problem id(s) occur in both data.source and data.eval_source "
                             f"(e.g. {clash[:3]}); ids must tell train and eval problems apart")
        problems = problems + held_out
    else:
        train_ids, eval_ids, missing = _split(problems, data)
        by_id = {p.id: p for p in problems}
        held_out = [by_id[i] for i in eval_ids]
        train_candidates = [by_id[i] for i in train_ids]
    train, duplicates = drop_train_duplicates(train_candidates, held_out)
    if not train or not held_out:
        raise ValueError(f"data: the {data.split} split left {len(train)} train and {len(held_out)} eval problems; "
                         "both sides need at least one")
    dropped = {"outside_window": window["outside_window"], "undated": window["undated"],
               "train_duplicates_of_eval": len(duplicates)}
    summary = summarize(train, held_out, rejected, files=files, dropped=dropped, loaded=loaded)
    summary["source"] = canonical_source(data.source)
    summary["release"] = data.release
    summary["window"] = {"start_date": data.start_date, "end_date": data.end_date}
    if data.split == "source":
        side = eval_side(data)
        summary["eval_source"] = {"source": canonical_source(side.source), "path": side.path, "release": side.release,
                                  "window": {"start_date": side.start_date, "end_date": side.end_date}}
    summary["split"] = {"kind": data.split, "eval_fraction": data.eval_fraction if data.split == "hash" else None,
                        "split_date": data.split_date if data.split == "date" else None,
                        "eval_ids_missing": missing, "train_duplicates_of_eval": duplicates}
    kept = {p.id for p in problems}
    if refs is not None:
        refs = {k: v for k, v in refs.items() if k in kept}
    wrong = None
    if canonical_source(data.source) == "known_answer":
        wrong = {k: v for k, v in known_answer_wrong_readings(data.n_problems, data.seed).items() if k in kept}
    return Dataset(train=train, eval=held_out, rejected=rejected, summary=summary, reference_solutions=refs,
                   wrong_readings=wrong, dropped=dropped)


def content_hash(problems: Sequence[Problem]) -> str:
    """sha256 of the problems' rows in id order (independent of file formats and load order)."""
    return sha256_json([p.to_row() for p in sorted(problems, key=lambda p: p.id)])


def _dates(problems: Sequence[Problem]) -> dict[str, str | None]:
    dated = sorted((d, p.contest_date) for p in problems if (d := contest_datetime(p.contest_date)) is not None)
    return {"min": dated[0][1] if dated else None, "max": dated[-1][1] if dated else None,
            "n_undated": len(problems) - len(dated)}


def _counts(problems: Sequence[Problem]) -> dict[str, Any]:
    return {
        "n": len(problems),
        "platform": dict(sorted(Counter(p.platform or "unknown" for p in problems).items())),
        "difficulty": dict(sorted(Counter(p.difficulty or "unknown" for p in problems).items())),
        "testtype": dict(sorted(Counter(p.testtype for p in problems).items())),
        "tests": {"public": sum(len(p.public_tests) for p in problems),
                  "hidden": sum(len(p.hidden_tests) for p in problems),
                  "problems_without_hidden": sum(not p.hidden_tests for p in problems)},
        "contest_date": _dates(problems),
        "content_hash": content_hash(problems),
    }


def summarize(train: Sequence[Problem], held_out: Sequence[Problem], rejected: Sequence[dict[str, Any]], *,
              files: Sequence[Path] = (), dropped: dict[str, int] | None = None, loaded: int | None = None
              ) -> dict[str, Any]:
    """The dataset summary written as ``summary.json``: counts by platform, difficulty, test type, date range
    and content hash, for all kept problems and per split, plus the input files' sha256 and the rejects."""
    both = list(train) + list(held_out)
    return {
        **_counts(both),
        "n_loaded": loaded if loaded is not None else len(both),
        "n_train": len(train),
        "n_eval": len(held_out),
        "n_rejected": len(rejected),
        "rejected_by_file": dict(sorted(Counter(str(r["source"]) for r in rejected).items())),
        "dropped": dict(dropped or {}),
        "train": _counts(train),
        "eval": _counts(held_out),
        "files": [{"path": str(f), "sha256": sha256_file(f)} for f in files],
    }


def _metric_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in str(text)) or "unknown"


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The numeric part of a summary as flat MLflow metric names (``platform/atcoder``, ``eval/n``, ...)."""
    out: dict[str, float] = {k: float(summary[k]) for k in ("n_loaded", "n_train", "n_eval", "n_rejected")}
    out["n_problems"] = float(summary["n"])
    for k, v in summary["dropped"].items():
        out[f"dropped/{_metric_name(k)}"] = float(v)
    for scope, block in (("", summary), ("train/", summary["train"]), ("eval/", summary["eval"])):
        for group in ("platform", "difficulty", "testtype"):
            for k, v in block[group].items():
                out[f"{scope}{group}/{_metric_name(k)}"] = float(v)
        for k, v in block["tests"].items():
            out[f"{scope}tests/{k}"] = float(v)
        out[f"{scope}n_undated"] = float(block["contest_date"]["n_undated"])
    return out
