"""The code that runs inside a worker slot's sandbox: the zygote and the confined test processes it forks.

Standard library only, and importable from the one directory a sandbox mounts (``mars2/sandbox``, seen as
``/sandbox`` inside bubblewrap): the entry script ``mars2/sandbox/_entry.py`` imports this package as
``runner`` there; the grader imports it as ``mars2.sandbox.runner`` (:mod:`.wire` for the frame protocol,
tests for single pieces). Modules import one another relatively, so both names work.

* :mod:`.wire` -- length-prefixed JSON frames (grader <-> zygote <-> test process) and their size limits
* :mod:`.zygote` -- the serve loop: a program, its tests, fork-per-program, wait, collect, clean up
* :mod:`.confine` -- a test process's confinement (rlimits, uid, no-new-privs, Landlock, seccomp) and the kernel probe
* :mod:`.seccomp` / :mod:`.landlock` -- the seccomp BPF policy and Landlock rulesets, through ctypes (:mod:`.libc`)
* :mod:`.script_parity` -- ``parity=script``: a program run as a real script, state put back between tests
* :mod:`.lcb_parity` -- ``parity=lcb``: LiveCodeBench's own ``run_test`` loop, premade ``mock_open()``s
* :mod:`.values` -- functional return values as typed JSON (decoded by :mod:`mars2.sandbox.matching`)
* :mod:`.mounts` -- the mount helper: a fresh tmpfs per program, sized to its quotas (bwrap level)
* :mod:`.errors`, :mod:`.files`, :mod:`.procs` -- error texts and verdict fields, descriptor and scratch-dir
  helpers, process bookkeeping
"""
