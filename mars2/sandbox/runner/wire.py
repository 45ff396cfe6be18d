"""The frame protocol: one message is ``<header length><payload length>`` (two little-endian u32), a JSON
header, then the raw payload.

Spoken between the grader and a slot's zygote (:class:`mars2.sandbox.pool.Slot` <-> the zygote's stdin and
stdout pipes) and between the zygote and a test process serving several tests (descriptors 3 and 4).
"""

import json
import os
import struct

FRAME = struct.Struct("<II")
_dumps = json.dumps  # bound once: a program patching json in its own process does not break our records
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 30


def read_exact(fd, n):
    chunks = []
    while n:
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            raise EOFError("control pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    """One frame from ``fd`` (blocking); ``ValueError`` for a header over ``MAX_HEADER`` or a payload over
    ``MAX_PAYLOAD``, ``EOFError`` when the pipe closes."""
    hlen, plen = FRAME.unpack(read_exact(fd, FRAME.size))
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise ValueError("oversized frame")
    header = json.loads(read_exact(fd, hlen).decode("utf-8"))
    payload = read_exact(fd, plen) if plen else b""
    return header, payload


def encode_frame(header, payload=b""):
    """The bytes of one frame."""
    data = _dumps(header).encode("utf-8")
    return FRAME.pack(len(data), len(payload)) + data + payload


def write_frame(fd, header, payload=b""):
    """Write one frame whole; the payload goes from where it is (no copy of a large output)."""
    data = _dumps(header).encode("utf-8")
    for part in (FRAME.pack(len(data), len(payload)) + data, payload):
        view = memoryview(part)
        while view:
            try:
                n = os.write(fd, view)
            except InterruptedError:
                continue
            view = view[n:]


def take_frame(buf):
    """The first whole frame in ``buf`` (a ``bytearray``), removed from it, as ``(header, payload)``; None
    while it is still incomplete."""
    if len(buf) < FRAME.size:
        return None
    hlen, plen = FRAME.unpack_from(buf)
    total = FRAME.size + hlen + plen
    if len(buf) < total:
        return None
    header = json.loads(bytes(buf[FRAME.size:FRAME.size + hlen]))
    payload = bytes(buf[FRAME.size + hlen:total])
    del buf[:total]
    return header, payload
