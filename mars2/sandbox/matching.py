"""Output comparison, done in the grader's process (never in the sandboxed child).

Semantics follow LiveCodeBench's ``lcb_runner/evaluation/testing_util.py``:

* stdin tests (:func:`stdout_matches`): strip the whole text, split on ``"\\n"``, strip each line;
  the line counts must match; each pair of lines must be equal as strings, or both must split into
  whitespace-separated tokens that all parse as :class:`decimal.Decimal` and are equal as lists
  (so ``"1.0"`` equals ``"1.00"`` and ``"1e2"`` equals ``"100"``, but ``"0.1"`` does not equal
  ``"0.1000000001"``: no tolerance).
* functional tests (:func:`value_matches`): ``actual == expected`` between the returned value
  (a top-level tuple already turned into a list by the child, as LiveCodeBench does; nested tuples
  stay tuples and so never equal a JSON list) and the parsed expected JSON value. The child sends
  the value as typed JSON (see :func:`mars2.sandbox.runner.values.encode_value`), decoded here by
  :func:`decode_value`.
"""

from __future__ import annotations

import decimal
import itertools
import json
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

TRUNCATE_CHARS = 200
MAX_FRACTION_HEX_DIGITS = 20_000
_TOKEN = re.compile(r"\S+")


def truncate(text: str, limit: int = TRUNCATE_CHARS) -> str:
    """``text`` if short, else its head and tail around a ``...(truncated)...`` marker."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...(truncated)...{text[-half:]}"


def stripped_lines(text: str) -> list[str]:
    """LiveCodeBench's normalisation: whole text stripped, split on newlines, each line stripped."""
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (decimal.InvalidOperation, ValueError):
        return None


def lines_equal(actual: str, expected: str) -> bool:
    """Two stripped lines match: equal strings, or equal lists of Decimal numbers (token counts compared first, so a
    line of millions of tokens is not parsed against a short one)."""
    if actual == expected:
        return True
    wanted = len(expected.split())
    if sum(1 for _ in itertools.islice(_TOKEN.finditer(actual), wanted + 1)) != wanted:
        return False
    actual_numbers = _decimals(actual)
    if actual_numbers is None:
        return False
    expected_numbers = _decimals(expected)
    if expected_numbers is None:
        return False
    try:
        return actual_numbers == expected_numbers
    except decimal.InvalidOperation:
        return False


def stdout_matches(actual: str, expected: str) -> tuple[bool, str]:
    """Compare a program's stdout with the expected output; returns ``(ok, reason)``.

    ``reason`` is ``""`` when ``ok``, else a short description of the first difference. Line counts are compared
    before any line is split out (a 16 MiB output of short lines would otherwise cost the grader ~1 GB).
    """
    actual_count, expected_count = actual.strip().count("\n") + 1, expected.strip().count("\n") + 1
    if actual_count != expected_count:
        return False, f"output has {actual_count} lines, expected {expected_count}"
    actual_lines = stripped_lines(actual)
    expected_lines = stripped_lines(expected)
    if len(actual_lines) != len(expected_lines):
        return False, f"output has {len(actual_lines)} lines, expected {len(expected_lines)}"
    for index, (got, want) in enumerate(zip(actual_lines, expected_lines), start=1):
        if not lines_equal(got, want):
            return False, f"line {index} differs: expected {truncate(want, 80)!r}, got {truncate(got, 80)!r}"
    return True, ""


class Opaque:
    """A returned value with no JSON counterpart (a set, an arbitrary object): equal to nothing."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{self.kind}>"


class MalformedValue(ValueError):
    """The sandbox sent a return value that is not valid typed JSON (a program writing junk)."""


def _decode_tag(obj: dict[str, Any], budget: list[int]) -> Any:
    if len(obj) != 1:
        raise MalformedValue("tagged object with more than one key")
    ((tag, data),) = obj.items()
    if tag == "$int":
        return int(data, 16)
    if tag == "$tuple":
        return tuple(data)
    if tag == "$dict":
        # an expected value is parsed JSON, whose objects have text keys: a dict with any other key equals nothing,
        # and building it would let crafted keys (ints of one hash) make the grader's insertions quadratic
        if not all(type(pair[0]) is str for pair in data):
            return Opaque("dict with keys that are not text")
        return {key: value for key, value in data}
    if tag == "$decimal":
        return Decimal(data)
    if tag == "$fraction":
        # normalising is a gcd per fraction: the digits of all fractions of one value share one budget, so neither
        # one huge fraction nor many large ones can make the grader spend hours (or minutes per test) on it
        digits = len(data[0]) + len(data[1])
        if digits > budget[0]:
            return Opaque("Fraction (too large to compare)")
        budget[0] -= digits
        return Fraction(int(data[0], 16), int(data[1], 16))
    if tag == "$complex":
        return complex(data[0], data[1])
    if tag == "$other":
        return Opaque(str(data))
    raise MalformedValue(f"unknown tag {tag!r}")


def decode_value(data: bytes) -> Any:
    """Inverse of the child's ``runner.values.encode_value``; raises :class:`MalformedValue` on anything else.
    Text keys hash with this process's random seed, so no program can make them collide; any other key makes its
    dict :class:`Opaque`."""
    try:
        budget = [MAX_FRACTION_HEX_DIGITS]  # fraction digits this value may still hold (_decode_tag)
        return json.loads(data.decode("utf-8", "surrogatepass"), object_hook=lambda obj: _decode_tag(obj, budget))
    except MalformedValue:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, ZeroDivisionError, ArithmeticError) as e:
        raise MalformedValue(str(e)) from None


def show_value(value: Any, limit: int = TRUNCATE_CHARS) -> str:
    """A short human-readable form of a decoded value (for verdict details)."""
    try:
        if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
            text = json.dumps(value, default=repr)
        else:
            text = repr(value)
    except (ValueError, TypeError, RecursionError):
        text = repr(type(value))
    return truncate(text, limit)


def value_too_large(encoded: bytes, expected_json: str) -> bool:
    """Whether a return value, as typed JSON, is too large to equal the expected value's JSON text: its encoding
    costs at most a few times the plain JSON's (``$dict`` pairs, ``$int`` hex, ``$tuple`` tags), so a value over 16
    times that, plus 4 KiB, is a wrong answer without being parsed (16 MiB of ``[[],[],...]`` is ~400 MB decoded)."""
    return len(encoded) > 16 * len(expected_json.encode("utf-8", "surrogatepass")) + 4096


def value_matches(actual: Any, expected: Any) -> bool:
    """Functional tests: plain ``==`` between the returned value and the parsed expected JSON."""
    try:
        return bool(actual == expected)
    except (RecursionError, ArithmeticError, TypeError, ValueError):
        return False
