"""Per-agent policy update (``engine``), checkpoints, warm-start and the multi-process launch.

The names below load ``engine`` (torch, DeepSpeed) on first use, so that importing ``mars2.train.checkpoints``
(path bookkeeping a fully cached flow run still does) costs no torch import.
"""

from importlib import import_module

__all__ = ["Sample", "UpdateHParams", "update_agent", "update_hparams", "warmup_cosine"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(import_module("mars2.train.update"), name)
    raise AttributeError(f"module 'mars2.train' has no attribute {name!r}")
