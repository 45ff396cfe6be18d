"""What a stage is built with, below ``tasks/``: its cache key, folder and record (:mod:`stagekit.stage`), its
progress display, the engines and agent runners of a generating stage, and the checks of checkpoints from outside a
run. ``pipeline/`` (above ``tasks/``) wires the stages into flows.

Importing this package changes nothing in the process.
"""
