"""The sandbox levels the hostile and adversarial suites run at, and a pool for each."""

from __future__ import annotations

from mars2.sandbox import SandboxPool

# process-shared-uid: the process level as a grader that is not root gets it (tests run as the grader's own uid,
# no tmpfs per program), rehearsed here whatever our own uid
LEVELS = ["bwrap", "process", "process-shared-uid"]


def sandbox_pool(level: str, **options) -> SandboxPool:
    """A one-slot pool at ``level`` (one of :data:`LEVELS`), with :class:`SandboxPool`'s keyword ``options``."""
    if level != "process-shared-uid":
        return SandboxPool(1, level, **options)
    p = SandboxPool(1, "process", **options)
    p.probe.update(process_dedicated_uid=False, private_mounts=False)
    return p


def rank_sum_p(higher: list[float], lower: list[float]) -> float:
    """The exact one-sided p-value of the rank-sum (Mann-Whitney) test that ``higher``'s values tend to exceed
    ``lower``'s: the share of the ways to split the pooled values into groups of these sizes whose first group's
    rank sum (mid-ranks for ties) is at least the observed one."""
    from itertools import combinations

    pooled = sorted(higher + lower)
    rank = {}
    for v in set(pooled):
        first = pooled.index(v)
        rank[v] = first + (pooled.count(v) + 1) / 2
    ranks = [rank[v] for v in higher + lower]
    observed = sum(ranks[: len(higher)])
    sums = [sum(c) for c in combinations(ranks, len(higher))]
    return sum(s >= observed - 1e-9 for s in sums) / len(sums)
