"""Functional return values as typed JSON: what Python's ``==`` against a JSON value depends on, and nothing a
program could use to fake a pass. Encoded in the test process; :func:`mars2.sandbox.matching.decode_value` decodes
and compares in the grader."""

import json

_dumps = json.dumps  # bound once: a program patching json in its own process does not break our records
MAX_VALUE_DEPTH = 500


class _Opaque(Exception):
    pass


def encode_value(value, depth=0):
    """``value`` as JSON-able data that keeps what Python's ``==`` against a JSON value depends on.

    Plain JSON types stay as they are (``True`` stays distinct from ``1``, as JSON keeps it; the
    grader's ``==`` still equates them, as LiveCodeBench's does). Special cases become one-key
    objects: ``{"$int": hex}`` (|x| >= 2**53), ``{"$tuple": [...]}`` (a tuple inside the value: never
    equal to a JSON list, as in LiveCodeBench), ``{"$dict": [[k, v], ...]}`` (every dict, keys typed),
    ``{"$decimal": str}``, ``{"$fraction": [hex, hex]}``, ``{"$complex": [re, im]}``, and
    ``{"$other": type name}`` for anything else (sets, arbitrary objects, too deep): never equal.
    Subclasses of int/float/str/list/tuple/dict are reduced to their base value, so an overridden
    ``__eq__`` cannot fake a pass. NumPy scalars become the Python scalar they equal.
    """
    if depth > MAX_VALUE_DEPTH:
        raise _Opaque("nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -(1 << 53) < value < (1 << 53) else {"$int": hex(value)}
    if kind is list:
        return [encode_value(v, depth + 1) for v in value]
    if kind is tuple:
        return {"$tuple": [encode_value(v, depth + 1) for v in value]}
    if kind is dict:
        return {"$dict": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(value)]}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return encode_value(int.__int__(value), depth)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode_value(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"$dict": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(value)]}
    module = getattr(kind, "__module__", "")
    if module == "decimal" and kind.__name__ == "Decimal":
        return {"$decimal": value.__class__.__str__(value)}
    if module == "fractions" and kind.__name__ == "Fraction":
        return {"$fraction": [hex(int.__int__(value.numerator)), hex(int.__int__(value.denominator))]}
    if kind is complex:
        return {"$complex": [value.real, value.imag]}
    if module == "numpy" and getattr(value, "shape", None) == () and hasattr(value, "item"):
        item = value.item()
        if type(item).__module__ != "numpy":
            return encode_value(item, depth + 1)
    return {"$other": kind.__name__}


def encode_value_bytes(value):
    try:
        data = encode_value(value)
    except (_Opaque, RecursionError):
        data = {"$other": "too deep"}
    try:
        return _dumps(data).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b'{"$other": "unencodable"}'
