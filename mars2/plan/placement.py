"""The plan's placement made the runtime's: which GPUs each weight owner's engines and update use.

:func:`mars2.plan.plan` assigns every CUDA agent a span of GPUs (``AgentPlan.update_spans``; its vLLM engines use the
same span, a transformers engine its first GPU). :func:`place` writes those GPUs into ``AgentConfig.gpu_ids`` at the
flow's entry; the stages start each engine and update with ``CUDA_VISIBLE_DEVICES`` = exactly those GPUs
(:func:`visible_devices`), so two owners never land on the same devices.

One tree search generates with every agent's engines at once, from the process running the rollout, and engines are
reached through node-local sockets: a run whose plan puts agents on more than one node is refused
(:func:`require_one_node`) with the one-node layout that fits, rather than failing at an engine's start.
"""

from __future__ import annotations

from dataclasses import replace

from mars2.config import RunConfig
from mars2.plan.planner import ClusterPlan, PlanRefused


def owner_gpus(cp: ClusterPlan) -> dict[str, list[int]]:
    """Weight owner → the GPU indices (on its node) the plan gives its update and vLLM engines; CPU agents: []."""
    return {a.name: [g for s in a.update_spans for g in range(s.first, s.last + 1)] for a in cp.agents}


def require_one_node(cp: ClusterPlan) -> None:
    """:class:`~mars2.plan.PlanRefused` unless every agent's GPUs are on one node (see the module docstring)."""
    nodes = {a.name: sorted({s.node for s in a.update_spans}) for a in cp.agents if a.update_spans}
    if len({n for ns in nodes.values() for n in ns}) <= 1:
        return
    where = ", ".join(f"{name} on node{'/node'.join(map(str, ns))}" for name, ns in nodes.items())
    gpus = sum(a.gpus for a in cp.agents)
    per = max(1, cp.cluster.gpus_per_node // max(1, len(nodes)))
    fix = " ".join(f"agents.members.{i}.gpus={per}" for i, a in enumerate(cp.agents) if a.update_spans)
    raise PlanRefused(
        f"agents={cp.preset}: the plan places {where}, but the agents of one tree search must share a node: the rollout "
        f"generates with every agent's engines at once from one process, and engines are reached through node-local "
        f"sockets (engines on other nodes are not supported; docs/plan.md, 'Placement'). The {gpus} GPUs asked for do "
        f"not fit one node of {cp.cluster.gpus_per_node}. Run on one node, e.g. plan.node_per_agent=false {fix} "
        "(python flows/plan.py with the same overrides shows whether it fits).")


def place(run: RunConfig, cp: ClusterPlan) -> RunConfig:
    """``run`` with each CUDA member's ``gpu_ids`` set to its owner's GPUs in ``cp`` (a role sharing weights takes its
    owner's). A member whose ``gpu_ids`` were given must match the plan's (:class:`~mars2.plan.PlanRefused`)."""
    require_one_node(cp)
    gpus = owner_gpus(cp)
    members = []
    for m in run.agents.members:
        ids = gpus.get(m.owner, []) if m.device.startswith("cuda") else []
        if ids and m.device.startswith("cuda:") and m.device != f"cuda:{ids[0]}":
            raise PlanRefused(f"agent {m.name!r}: device {m.device!r} names a GPU but the plan places it on GPUs {ids}; "
                              "write device: cuda (the plan's placement picks the GPUs)")
        if m.gpu_ids and list(m.gpu_ids) != ids:
            raise PlanRefused(f"agent {m.name!r}: gpu_ids={list(m.gpu_ids)} but the plan places it on GPUs {ids}; "
                              "leave agents.members.N.gpu_ids unset (the plan sets it) or change the plan "
                              "(plan.node_per_agent, agents.members.N.gpus)")
        members.append(replace(m, gpu_ids=ids))
    return replace(run, agents=replace(run.agents, members=members))


__all__ = ["owner_gpus", "place", "require_one_node"]
