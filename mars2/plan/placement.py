"""The plan's placement made the runtime's: which node and GPUs each weight owner's engines and update use.

:func:`mars2.plan.plan` assigns every CUDA agent a number of GPUs, a span of them on one node
(``AgentPlan.update_spans``; its vLLM engines use the same span, a transformers engine its first GPU) and its engines'
tensor-parallel size. :func:`place` writes them into ``AgentConfig.gpus``, ``node``, ``gpu_ids`` and
``tensor_parallel_size`` at the flow's entry; the stages start each engine and update on that node's work pool
(``orchestration.node_pools``) with ``CUDA_VISIBLE_DEVICES`` = exactly those GPUs (:func:`visible_devices`), so two
owners never land on the same devices.

One tree search generates with every agent's engine at once. Engines on other nodes than the generating stage's are
node services reached over TCP, which needs a work pool per node: the plan only uses the nodes the run reaches
(:func:`mars2.plan.planner.reachable_nodes`), and :func:`require_placeable` refuses a plan made for other pools.
"""

from __future__ import annotations

from dataclasses import replace

from mars2.config import RunConfig
from mars2.plan.planner import ClusterPlan, PlanRefused


def owner_gpus(cp: ClusterPlan) -> dict[str, list[int]]:
    """Weight owner → the GPU indices (on its node) the plan gives its update and vLLM engines; CPU agents: []."""
    return {a.name: [g for s in a.update_spans for g in range(s.first, s.last + 1)] for a in cp.agents}


def owner_nodes(cp: ClusterPlan) -> dict[str, int]:
    """Weight owner → the node the plan places its GPUs on (CUDA agents only)."""
    return {a.name: a.update_spans[0].node for a in cp.agents if a.update_spans}


def require_placeable(cp: ClusterPlan, node_pools: list[str] | tuple[str, ...] = ()) -> None:
    """:class:`~mars2.plan.PlanRefused` unless each agent's GPUs are on one node and every node the plan uses beyond
    node 0 has a work pool in ``node_pools``. :func:`mars2.plan.plan` only returns such layouts (it plans on the
    nodes the run reaches); this guards a plan made for other pools than the run's."""
    nodes = {a.name: sorted({s.node for s in a.update_spans}) for a in cp.agents if a.update_spans}
    split = [name for name, ns in nodes.items() if len(ns) > 1]
    if split:
        raise PlanRefused(f"agents={cp.preset}: the plan spreads agent(s) {split} over several nodes, but one agent's "
                          f"update and engine run on one node of {cp.cluster.gpus_per_node} GPUs: lower their "
                          "agents.members.N.gpus")
    used = max((n for ns in nodes.values() for n in ns), default=0)
    if used >= max(1, len(node_pools)):
        raise PlanRefused(f"agents={cp.preset}: the plan places an agent on node{used}, but the run names a work pool "
                          f"for {max(1, len(node_pools))} node(s) (orchestration.node_pools={list(node_pools)}): the "
                          "rollout reaches an engine on another node through a service that node's pool starts "
                          "(docs/plan.md, 'Placement'); plan with the run's own orchestration settings")


def place(run: RunConfig, cp: ClusterPlan) -> RunConfig:
    """``run`` with each CUDA member's ``gpus``, ``node``, ``gpu_ids`` and (vLLM) ``tensor_parallel_size`` set to its
    owner's in ``cp`` (a role sharing weights takes its owner's), and ``plan.node_per_agent`` to the layout's: the run
    uses the layout the plan chose, and planning it again gives the same (the plan already rules out a layout with
    fewer GPUs than an owner's ``update_procs``). A member whose ``node`` or ``gpu_ids`` were given must match the
    plan's, and every CUDA owner must have GPUs in the plan (:class:`~mars2.plan.PlanRefused`)."""
    require_placeable(cp, run.orchestration.node_pools)
    unplaced = [a.name for a in cp.agents if a.device == "cuda" and not a.update_spans]
    if unplaced:  # a plan that does not fit is refused first (require_fit); this holds for place() on its own
        raise PlanRefused(f"no GPUs for {unplaced}: {cp.refusal()}")
    gpus, nodes = owner_gpus(cp), owner_nodes(cp)
    planned = {a.name: a for a in cp.agents}
    members = []
    for m in run.agents.members:
        a = planned.get(m.owner)
        if a is not None and a.device == "cuda":
            m = replace(m, gpus=a.gpus, tensor_parallel_size=a.rollout.tp if a.rollout.backend == "vllm" else None)
        ids = gpus.get(m.owner, []) if m.device.startswith("cuda") else []
        node = nodes.get(m.owner, m.node) if m.device.startswith("cuda") else m.node
        if m.node is not None and m.node != node:
            raise PlanRefused(f"agent {m.name!r}: node={m.node} but the plan places it on node {node}; leave "
                              "agents.members.N.node unset (the plan sets it) or change the plan")
        if ids and m.device.startswith("cuda:") and m.device != f"cuda:{ids[0]}":
            raise PlanRefused(f"agent {m.name!r}: device {m.device!r} names a GPU but the plan places it on GPUs {ids}; "
                              "write device: cuda (the plan's placement picks the GPUs)")
        if m.gpu_ids and list(m.gpu_ids) != ids:
            raise PlanRefused(f"agent {m.name!r}: gpu_ids={list(m.gpu_ids)} but the plan places it on GPUs {ids}; "
                              "leave agents.members.N.gpu_ids unset (the plan sets it) or change the plan "
                              "(plan.node_per_agent, agents.members.N.gpus)")
        members.append(replace(m, gpu_ids=ids, node=node))
    return replace(run, agents=replace(run.agents, members=members),
                   plan=replace(run.plan, node_per_agent=cp.node_per_agent))  # planning the placed run again: same


__all__ = ["owner_gpus", "owner_nodes", "place", "require_placeable"]
