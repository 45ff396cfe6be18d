"""Error texts and verdict fields a test produces: traceback tails, one-line exceptions, the verdict of a test
process killed by a signal, the status record a script child leaves."""

import json
import signal

PROGRAM_NAME = "solution.py"  # the file name a program is compiled under: its traceback starts at its first frame
TRACEBACK_FRAMES = 12
STDERR_TAIL = 4096


def format_error(exc, program_path=PROGRAM_NAME):
    """The last frames of ``exc``'s traceback, from the program's first frame on."""
    import traceback

    start = exc.__traceback__
    while start is not None and start.tb_frame.f_code.co_filename != program_path:
        start = start.tb_next
    if start is None:
        start = exc.__traceback__
    frames = []
    node = start
    depth = 0
    while node is not None:
        frames.append(node)
        if len(frames) > TRACEBACK_FRAMES:
            frames.pop(0)
        depth += 1
        node = node.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames[0] if frames else None, chain=False))
    except BaseException:
        text = f"{type(exc).__name__}"
    if depth > len(frames):
        text = f"({depth - len(frames)} earlier frames omitted)\n{text}"
    return text[-STDERR_TAIL:]


def parse_record(data):
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def exception_only(exc):
    import traceback

    try:
        return "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except BaseException:
        return type(exc).__name__


def join_text(*parts):
    return "\n".join(p.strip() for p in parts if p and p.strip())


def signal_verdict(sig, cpu, limits, err=""):
    """Status fields for a test process killed by ``sig`` after ``cpu`` seconds of CPU."""
    if sig in (signal.SIGXCPU, signal.SIGPROF) or (sig == signal.SIGKILL and cpu >= limits["time_s"]):
        return {"status": "TLE", "error": f"CPU time limit ({limits['time_s']:g} s)"}
    if sig == signal.SIGXFSZ:
        return {"status": "OLE", "error": f"output limit ({limits['output_bytes']} bytes) exceeded"}
    return {"status": "SIGNAL", "signal": sig, "error": join_text(f"killed by signal {signame(sig)}", err)}


def signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
