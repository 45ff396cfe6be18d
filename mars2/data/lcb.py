"""LiveCodeBench ``code_generation_lite`` rows → :class:`~mars2.data.schema.Problem`.

A row is a flat mapping of strings (see ``shared/data/lcb_v5_public/README.md``)::

    question_title, question_content, platform, question_id, contest_id, contest_date,
    starter_code, difficulty, public_test_cases, private_test_cases, metadata

``public_test_cases`` is a JSON list of ``{"input", "output", "testtype"}``. ``private_test_cases`` is the
same JSON list, or that JSON text pickled, zlib-compressed and base64-encoded. Unpickling untrusted data
can execute code, so the pickle step here uses an unpickler that refuses to load *any* class or function:
a pickled ``str`` needs none, and anything else is rejected before it can run.

Every malformed row raises :class:`ProblemRowError` naming the row's ``question_id`` and the field;
:func:`load_problems` collects those rows as ``rejected`` entries instead of dropping them.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import pickle
import zlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from os import PathLike
from typing import Any

from mars2.data.schema import TEST_TYPES, Problem, ProblemRowError, TestCase

__all__ = [
    "MALFORMED_KEY",
    "LINE_KEY",
    "MAX_DECOMPRESSED_BYTES",
    "decode_private_tests",
    "duplicate_error",
    "problem_from_lcb_row",
    "load_problems",
    "read_jsonl_rows",
]

#: Key of the placeholder row that :func:`read_jsonl_rows` yields for a line that is not a JSON object.
MALFORMED_KEY = "__malformed__"
#: Key under which :func:`read_jsonl_rows` records the 1-based line number of each row it yields.
LINE_KEY = "__line__"
#: Upper bound on the zlib-decompressed size of ``private_test_cases`` (a guard against zip bombs).
#: The largest LiveCodeBench hidden-test blobs are tens of MB.
MAX_DECOMPRESSED_BYTES = 1 << 30

_REQUIRED_FIELDS = ("question_id", "question_content", "public_test_cases", "private_test_cases")
_OPTIONAL_FIELDS = {
    "question_title": "",
    "platform": "",
    "contest_id": "",
    "contest_date": "",
    "starter_code": "",
    "difficulty": "",
    "metadata": "{}",
}


class _NoClassUnpickler(pickle.Unpickler):
    """An unpickler that cannot import anything: every global/class lookup is refused.

    Calls in a pickle (``REDUCE``, ``NEWOBJ``, ``INST``, ``OBJ``, extension codes) all need a callable that
    only :meth:`find_class` can supply, and ``persistent_load`` is left undefined (it raises), so a payload
    can build only plain containers and scalars, never run code.
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from untrusted pickle")


def _safe_unpickle(data: bytes) -> Any:
    return _NoClassUnpickler(io.BytesIO(data)).load()


def _bounded_decompress(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError(f"decompressed data exceeds {limit} bytes")
    out += d.flush()
    if len(out) > limit:
        raise ValueError(f"decompressed data exceeds {limit} bytes")
    if not d.eof:
        raise ValueError("truncated zlib stream")
    return out


def decode_private_tests(text: str, *, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> list[Any]:
    """Decode a ``private_test_cases`` value to the JSON list it holds.

    Accepts plain JSON (a list) or base64 → zlib → pickle(str) → JSON. Raises ``ValueError`` (or a
    subclass) when the value is neither; never executes code from the pickle.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string, got {type(text).__name__}")
    stripped = text.strip()
    if stripped.startswith("["):
        decoded: Any = json.loads(stripped)
    else:
        try:
            raw = base64.b64decode(stripped.encode("ascii"))
        except (UnicodeEncodeError, ValueError) as e:
            raise ValueError(f"neither JSON nor base64 ({e})") from None
        try:
            blob = _bounded_decompress(raw, max_bytes)
        except zlib.error as e:
            raise ValueError(f"base64 payload is not zlib data ({e})") from None
        try:
            inner = _safe_unpickle(blob)
        except Exception as e:  # any unpickling failure, including refused globals
            raise ValueError(f"pickle payload rejected ({type(e).__name__}: {e})") from None
        if not isinstance(inner, str):
            raise ValueError(f"pickle payload is a {type(inner).__name__}, expected str")
        decoded = json.loads(inner)
    if not isinstance(decoded, list):
        raise ValueError(f"expected a JSON list of tests, got {type(decoded).__name__}")
    return decoded


def _err(qid: str, field: str, msg: str) -> ProblemRowError:
    return ProblemRowError(f"problem row {qid!r}: field {field!r}: {msg}")


def _parse_tests(qid: str, field: str, items: list[Any]) -> tuple[TestCase, ...]:
    tests = []
    for k, t in enumerate(items):
        if not isinstance(t, dict):
            raise _err(qid, field, f"test {k} is a {type(t).__name__}, expected an object")
        for key in ("input", "output", "testtype"):
            if key not in t:
                raise _err(qid, field, f"test {k} has no {key!r}")
            if not isinstance(t[key], str):
                raise _err(qid, field, f"test {k}: {key!r} is a {type(t[key]).__name__}, expected a string")
        for key in ("input", "output"):
            try:
                t[key].encode("utf-8", "surrogateescape")
            except UnicodeEncodeError as e:
                raise _err(qid, field, f"test {k}: {key!r} holds a lone surrogate {t[key][e.start]!r} at character "
                                       f"{e.start}, which is not text") from None
        tt = t["testtype"]
        if tt not in TEST_TYPES:
            raise _err(qid, field, f"test {k}: unknown testtype {tt!r} (expected one of {TEST_TYPES})")
        if tt == "functional":
            try:
                for line in t["input"].split("\n"):
                    if line.strip():
                        json.loads(line)
                json.loads(t["output"])
            except (ValueError, RecursionError) as e:
                raise _err(qid, field, f"functional test {k} is not one JSON value per line ({e})") from None
        tests.append(TestCase(input=t["input"], output=t["output"], testtype=tt))
    return tuple(tests)


def problem_from_lcb_row(row: dict[str, Any]) -> Problem:
    """Convert one ``code_generation_lite`` row to a :class:`Problem`.

    ``statement`` is ``question_content``; ``public_tests`` / ``hidden_tests`` are the decoded
    ``public_test_cases`` / ``private_test_cases``; ``testtype`` is the (single) type of all its tests;
    ``func_name`` comes from the ``metadata`` JSON (required for functional problems). ``meta`` keeps
    ``contest_id`` and the parsed ``metadata``. An empty hidden list is allowed when public tests exist
    (the offline LCB copy ships no hidden tests). Raises :class:`ProblemRowError` naming the
    ``question_id`` and the field for any malformed row.
    """
    if not isinstance(row, dict):
        raise ProblemRowError(f"problem row is a {type(row).__name__}, expected an object")
    raw_qid = row.get("question_id")
    qid = raw_qid if isinstance(raw_qid, str) and raw_qid else "?"
    if MALFORMED_KEY in row:
        where = f" at line {row[LINE_KEY]}" if LINE_KEY in row else ""
        detail = row.get("__error__", "not a JSON object")
        raise ProblemRowError(f"problem row{where}: field '<line>': malformed JSONL line ({detail})")
    fields = _row_fields(qid, row)
    public, hidden, testtype = _row_tests(qid, row)
    func_name, metadata = _row_metadata(qid, fields["metadata"], testtype)

    date = fields["contest_date"]
    if date:
        try:
            datetime.fromisoformat(date)
        except ValueError:
            raise _err(qid, "contest_date", f"not an ISO date: {date!r}") from None

    try:
        return Problem(
            id=row["question_id"],
            title=fields["question_title"],
            statement=row["question_content"],
            public_tests=public,
            hidden_tests=hidden,
            testtype=testtype,
            func_name=func_name,
            starter_code=fields["starter_code"],
            platform=fields["platform"],
            contest_date=date,
            difficulty=fields["difficulty"],
            meta={"contest_id": fields["contest_id"], "metadata": metadata},
        )
    except ProblemRowError as e:
        raise _err(qid, "metadata", str(e)) from None


def _row_fields(qid: str, row: dict[str, Any]) -> dict[str, str]:
    """The row's optional string fields (their defaults where absent or null), after checking its required ones."""
    for f in _REQUIRED_FIELDS:
        if f not in row:
            raise _err(qid, f, "missing field")
        if not isinstance(row[f], str):
            raise _err(qid, f, f"expected a string, got {type(row[f]).__name__}")
    if not row["question_id"].strip():
        raise _err(qid, "question_id", "empty question_id")
    fields: dict[str, str] = {}
    for f, default in _OPTIONAL_FIELDS.items():
        v = row.get(f, default)
        if v is None:
            v = default
        if not isinstance(v, str):
            raise _err(qid, f, f"expected a string, got {type(v).__name__}")
        fields[f] = v
    return fields


def _row_tests(qid: str, row: dict[str, Any]) -> tuple[tuple[TestCase, ...], tuple[TestCase, ...], str]:
    """(public tests, hidden tests, their one test type); at least one test in all."""
    try:
        public_raw = json.loads(row["public_test_cases"])
    except (ValueError, RecursionError) as e:
        raise _err(qid, "public_test_cases", f"not valid JSON ({e})") from None
    if not isinstance(public_raw, list):
        raise _err(qid, "public_test_cases", f"expected a JSON list, got {type(public_raw).__name__}")
    try:
        hidden_raw = decode_private_tests(row["private_test_cases"])
    except (ValueError, RecursionError, MemoryError) as e:
        raise _err(qid, "private_test_cases", f"cannot decode ({e})") from None
    public = _parse_tests(qid, "public_test_cases", public_raw)
    hidden = _parse_tests(qid, "private_test_cases", hidden_raw)
    if not public and not hidden:
        raise _err(qid, "public_test_cases", "no tests: public and private test lists are both empty")
    types = {t.testtype for t in public + hidden}
    if len(types) != 1:
        raise _err(qid, "public_test_cases", f"mixed test types {sorted(types)} in one problem")
    return public, hidden, types.pop()


def _row_metadata(qid: str, text: str, testtype: str) -> tuple[str | None, dict[str, Any]]:
    """(func_name, the parsed ``metadata`` JSON): a functional problem must name its function, others have none."""
    try:
        metadata = json.loads(text or "{}")
    except (ValueError, RecursionError) as e:
        raise _err(qid, "metadata", f"not valid JSON ({e})") from None
    if not isinstance(metadata, dict):
        raise _err(qid, "metadata", f"expected a JSON object, got {type(metadata).__name__}")
    func_name = metadata.get("func_name")
    if testtype != "functional":
        return None, metadata
    if not isinstance(func_name, str) or not func_name.strip():
        raise _err(qid, "metadata", "functional problem without a func_name")
    return func_name.strip(), metadata


def duplicate_error(qid: str, first: tuple[str, Any], source: str) -> ProblemRowError:
    """The reject reason of a second row with id ``qid``; ``first`` is ``(source, line)`` of the kept one."""
    where = f"line {first[1]}" if first[0] == source else f"line {first[1]} of {first[0]}"
    return ProblemRowError(f"problem row {qid!r}: field 'question_id': duplicate of the row at {where}")


def load_problems(rows: Iterable[dict[str, Any]], *, source: str, seen: dict[str, tuple[str, Any]] | None = None
                  ) -> tuple[list[Problem], list[dict[str, Any]]]:
    """Convert many rows; return ``(problems, rejected)`` — nothing is silently dropped.

    Each rejected entry is ``{"source": source, "line": n, "question_id": qid_or_None, "error": message}``.
    ``line`` is the row's 1-based line in its JSONL file when it came from :func:`read_jsonl_rows`,
    otherwise its 1-based position in ``rows``. A ``question_id`` seen before is rejected as a duplicate
    (the first occurrence is kept); pass the same ``seen`` dict (id → (source, line)) to several calls to
    find duplicates across files.
    """
    problems: list[Problem] = []
    rejected: list[dict[str, Any]] = []
    seen = {} if seen is None else seen
    for pos, row in enumerate(rows, start=1):
        line = row.get(LINE_KEY, pos) if isinstance(row, dict) else pos
        qid = row.get("question_id") if isinstance(row, dict) else None
        qid = qid if isinstance(qid, str) else None
        try:
            p = problem_from_lcb_row(row)
            if p.id in seen:
                raise duplicate_error(p.id, seen[p.id], source)
        except ProblemRowError as e:
            rejected.append({"source": source, "line": line, "question_id": qid, "error": str(e)})
            continue
        seen[p.id] = (source, line)
        problems.append(p)
    return problems, rejected


def read_jsonl_rows(path: str | PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the rows of a JSONL file (``.gz`` too), one per non-blank line, each tagged with ``LINE_KEY`` (1-based).

    A line that is not valid UTF-8 JSON, or not a JSON object, becomes
    ``{MALFORMED_KEY: line_text, "__error__": reason, LINE_KEY: n}``, which :func:`load_problems`
    rejects with a clear error, so one bad line never aborts a load. Blank lines are skipped.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield {MALFORMED_KEY: raw.decode("utf-8", "replace").rstrip("\r\n"), "__error__": f"not UTF-8 ({e})", LINE_KEY: n}
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError) as e:
                yield {MALFORMED_KEY: text.rstrip("\r\n"), "__error__": f"not valid JSON ({e})", LINE_KEY: n}
                continue
            if not isinstance(obj, dict):
                yield {MALFORMED_KEY: text.rstrip("\r\n"), "__error__": f"a JSON {type(obj).__name__}, not an object", LINE_KEY: n}
                continue
            obj[LINE_KEY] = n
            yield obj
