"""Entry script of a worker slot's zygote: ``python -I -S -B -X utf8 _entry.py CONFIG_JSON``, or ``--probe``.

Started by :class:`mars2.sandbox.pool.Slot` inside the slot's sandbox (bubblewrap, or a plain process at the
weaker isolation level), and by :func:`mars2.sandbox.isolation.probe_isolation` with ``--probe``. The zygote
itself is the :mod:`mars2.sandbox.runner` package next to this file (standard library only), imported here as
``runner``; see :mod:`mars2.sandbox.runner.zygote`.
"""

import json
import os
import sys


def import_runner():
    """The ``runner`` package next to this script. ``-I`` keeps this directory off ``sys.path``; it is there only
    while the package is imported, so the path programs see is the zygote's own (site directories first, this
    directory last, for LiveCodeBench's harness)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.append(here)
    try:
        from runner import confine, zygote
    finally:
        sys.path.remove(here)
    return confine, zygote


def main(argv):
    confine, zygote = import_runner()
    if len(argv) > 1 and argv[1] == "--probe":
        sys.stdout.write(json.dumps(confine.probe()) + "\n")
        sys.stdout.flush()
        return
    cfg = json.loads(argv[1])
    os.umask(0o077)
    slot_zygote = zygote.Zygote(cfg)
    if os.environ.get("MARS2_SANDBOX_PROFILE"):  # development aid: profile the zygote, stats to stderr
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(slot_zygote.serve)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
        return
    slot_zygote.serve()


if __name__ == "__main__":
    main(sys.argv)
