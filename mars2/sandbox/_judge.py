"""Entry script of a judge process: ``python -I -S -B -X utf8 _judge.py`` (started by
:class:`mars2.sandbox.pool.Judge`).

It judges one program's test runs at a time (:mod:`mars2.sandbox.judging`), read as frames
(:mod:`mars2.sandbox.runner.wire`) on stdin: ``load`` (payload: the program's tests as JSON, and ``memory_mb``), then
``judge`` per run (header: its index, status and error; payload: its output), each answered on stdout with
``{"status", "detail"}`` (or ``{"error"}`` when judging itself failed). Standard library only: this folder's
modules, not the ``mars2`` package.
"""

import json
import os
import sys
import traceback


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import judging
    from runner.wire import read_frame, write_frame

    tests, memory_mb, failed = [], 0, None
    while True:
        try:
            header, payload = read_frame(0)
        except EOFError:
            return
        try:
            if header["op"] == "load":  # not answered: a failure is the answer to the program's judgments
                tests, memory_mb, failed = [], 0, None
                load = json.loads(payload)
                tests, memory_mb = judging.load_tests(load["tests"]), load["memory_mb"]
                continue
            if failed is not None:
                raise RuntimeError(f"loading the program's tests failed: {failed}")
            status, detail = judging.judge_run(tests[header["index"]], header["status"], payload, header["error"],
                                               memory_mb)
            reply = {"status": status, "detail": detail}
        except Exception as exc:  # a bug of ours, or no memory for a comparison: the grader raises it
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
            if header.get("op") == "load":
                failed = error
                continue
            reply = {"error": error}
        write_frame(1, reply)


if __name__ == "__main__":
    main()
