"""transformers' per-layer KV cache, which :class:`mars2.backends.continuous.SlackLayer` subclasses: its keys and
values live in buffers with slack instead of being concatenated each step, so every method of ``DynamicLayer`` that
moves keys or values must be overridden or refused there. ``METHODS`` lists the methods of the version this was written
for; a method transformers adds is one that SlackLayer has not looked at (a test compares)."""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicLayer

from mars2.shims import check_version

PACKAGE, WRITTEN_FOR = "transformers", "5.23."
METHODS = ("batch_repeat_interleave", "batch_select_indices", "crop", "get_mask_sizes", "get_max_length",
           "get_seq_length", "is_compileable", "is_croppable", "is_sliding", "lazy_initialization", "offload",
           "prefetch", "reorder_cache", "reset", "supports_early_init", "update")

check_version(PACKAGE, WRITTEN_FOR)

__all__ = ["Cache", "DynamicLayer", "METHODS"]
