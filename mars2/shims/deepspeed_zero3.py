"""DeepSpeed ZeRO-3's module-level references to a model, dropped so that a destroyed engine's memory is freed.

DeepSpeed 0.19 keeps two: the forward-module stack (``parameter_offload.FWD_MODULE_STACK``: the root module is pushed
when ZeRO-3 is set up and never popped, and recomputed forwards leave submodules on it) and the parameter
coordinator's class-level ``lru_cache`` of parameters to release (the name-mangled ``__params_to_release``, wrapped by
DeepSpeed's NVTX decorator around the cache), keyed on the coordinator and the submodules.
"""

from __future__ import annotations

from mars2.shims import check_version

PACKAGE, WRITTEN_FOR = "deepspeed", "0.19."


def params_to_release_caches() -> list:
    """The ``lru_cache`` objects behind ``PartitionedParameterCoordinator.__params_to_release`` (per class)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    fn = PartitionedParameterCoordinator._PartitionedParameterCoordinator__params_to_release
    return [f for f in (fn, *(c.cell_contents for c in fn.__closure__ or ())) if hasattr(f, "cache_clear")]


def drop_zero3_references(module) -> None:
    """Remove ``module`` and its submodules from the forward-module stack and clear the release cache (the cache is
    per class: other live engines only recompute their entries)."""
    from deepspeed.runtime.zero import parameter_offload

    check_version(PACKAGE, WRITTEN_FOR)
    ours = {id(m) for m in module.modules()}
    parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK if id(m) not in ours]
    for cache in params_to_release_caches():
        cache.cache_clear()
