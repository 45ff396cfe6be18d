"""Resource plan of a run: per agent, parameters, update memory per GPU (DeepSpeed's ZeRO estimators), vLLM
KV-cache budget at the configured lengths, GPUs needed, and where rollout and update run (docs/plan.md).

:func:`plan` never raises for a config that does not fit: it returns a :class:`ClusterPlan` with
``fits=False`` and the reasons; :func:`require_fit` turns that into :class:`PlanRefused`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mars2.backends.base import cache_columns
from mars2.config import AgentConfig, ConfigError, PlanConfig, RunConfig, TrainConfig, fixed_tp
from mars2.plan.memory import (
    GB,
    ZERO_OPTIONS,
    KVBudget,
    ModelStates,
    activation_bytes,
    kv_bytes_per_token,
    reference_model_bytes,
    vllm_kv_budget,
    zero_model_states,
)
from mars2.plan.models import DTYPE_BYTES, ModelShape, model_shape


class PlanRefused(ConfigError):
    """The configured agents cannot fit the cluster; ``str(e)`` is a complete, user-facing paragraph."""

    label = "plan refused"


@dataclass(frozen=True)
class Span:
    """A contiguous range of GPUs on one node."""

    node: int
    first: int
    last: int

    def __str__(self) -> str:
        gpus = f"GPU{self.first}" if self.first == self.last else f"GPU{self.first}-{self.last}"
        return f"node{self.node}:{gpus}"


@dataclass(frozen=True)
class DeepSpeedProfile:
    name: str
    stage: int
    offload_optimizer: bool
    offload_param: bool
    gradient_checkpointing: bool
    bf16: bool

    @property
    def label(self) -> str:
        extra = "+opt→cpu" if self.offload_optimizer and not self.offload_param else ""
        extra = "+all→cpu" if self.offload_param else extra
        return f"ZeRO-{self.stage}{extra}"


@dataclass
class UpdateMemory:
    """Per GPU during the policy update (host memory per node for ``cpu_bytes``).

    The update runs in two phases that never share memory (``mars2.train.update.update_agent``): the frozen reference
    model scores every micro-batch and is freed, then the policy is built and trained. The peak is the larger."""

    states: ModelStates  # parameters, gradients, optimizer states (DeepSpeed's estimator or the ZeRO-0 formula)
    reference_bytes: int  # frozen reference model: partitioned like the policy under ZeRO-3, whole otherwise
    activation_bytes: int  # estimate × plan.activation_overhead (training phase)
    reserved_bytes: int  # plan.reserved_gb

    @property
    def training_bytes(self) -> int:
        return self.states.gpu_bytes + self.activation_bytes + self.reserved_bytes

    @property
    def reference_phase_bytes(self) -> int:
        """Reference weights plus a forward-only pass (at most the training activations)."""
        return self.reference_bytes + self.activation_bytes + self.reserved_bytes

    @property
    def gpu_bytes(self) -> int:
        return max(self.training_bytes, self.reference_phase_bytes)

    @property
    def cpu_bytes(self) -> int:
        return self.states.cpu_bytes


@dataclass
class RolloutPlan:
    backend: str  # vllm | transformers
    tp: int  # tensor-parallel size of one engine (vllm: backend.tensor_parallel_size, as load_backend starts it)
    weights_per_gpu_bytes: int
    kv: KVBudget | None  # per GPU of one engine (vllm; transformers on GPU: the memory left after the weights)
    max_model_len: int | None
    spans: list[Span] = field(default_factory=list)
    replicas: int = 1  # vLLM engines of this agent (backend.data_parallel_size, default gpus // tp)


@dataclass
class AgentPlan:
    name: str
    roles: list[str]  # agents generating with these weights (homogeneous multi-role: several)
    model: str
    shape: ModelShape
    device: str  # cuda | cpu
    dtype: str
    profile: DeepSpeedProfile
    gpus: int  # configured (cuda agents with gpus=0 are planned as 1)
    gpus_min: int | None  # fewest GPUs on which what the plan fits fits with this profile (None: none does)
    weights_bytes: int
    update: UpdateMemory
    zero_options: dict[str, int]  # per-GPU model states at ``gpus`` for each ZeRO option (DeepSpeed's estimators)
    rollout: RolloutPlan
    update_spans: list[Span] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why it does not fit (empty: fits)
    warnings: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.reasons


@dataclass
class ClusterPlan:
    cluster: PlanConfig
    preset: str
    agents: list[AgentPlan]
    node_host_bytes: dict[int, int]  # host memory the agents placed on a node need at once
    used_gpus: int
    gpu_memory_utilization: float  # vLLM's share of each GPU (backend.gpu_memory_utilization)
    reasons: list[str] = field(default_factory=list)  # cluster-level (host memory, not enough GPUs)
    node_per_agent: bool = False  # the layout's: each agent on nodes of its own (else packed)
    chosen: str = ""  # one line: the layout and tensor-parallel sizes :func:`plan` chose, and why ("": no GPU agent)
    updates: bool = True  # the plan fits the update too (training); else only the engines (evaluation, the gate)

    @property
    def total_gpus(self) -> int:
        return self.cluster.nodes * self.cluster.gpus_per_node

    @property
    def fits(self) -> bool:
        return not self.reasons and all(a.fits for a in self.agents)

    def refusal(self) -> str:
        """One paragraph: which agents do not fit, why, and what to change."""
        c = self.cluster
        parts = [f"agent {a.name!r}: " + "; ".join(a.reasons) for a in self.agents if a.reasons] + self.reasons
        change = ("Change the agents' gpus/deepspeed profile (agents.members.N.gpus=..., "
                  "agents.members.N.deepspeed=zero3_bf16_offload), lower train.micro_batch, shorten "
                  "search.max_new_tokens / plan.prompt_tokens, " if self.updates else
                  "Change the agents' gpus (agents.members.N.gpus=...), shorten search.max_new_tokens / "
                  "plan.prompt_tokens / backend.max_model_len, ")
        return (f"agents={self.preset} cannot fit {c.nodes} node(s) x {c.gpus_per_node} {c.gpu_name} "
                f"({c.gpu_memory_gb:g} GB per GPU, {c.cpu_memory_gb:g} GB host memory per node)"
                f"{'' if self.updates else ' even without an update'}. " + ". ".join(parts)
                + f". {change}or describe a larger cluster (plan.nodes=..., plan.gpu_memory_gb=...).")


def deepspeed_profile(cfg: RunConfig, member: AgentConfig) -> DeepSpeedProfile:
    """The agent's profile (``member.deepspeed`` or the run's default ``deepspeed`` group), as the update uses it."""
    prof: dict[str, Any] = cfg.deepspeed_profiles.get(member.deepspeed, {}) if member.deepspeed else cfg.deepspeed
    default = next((k for k, v in cfg.deepspeed_profiles.items() if v == cfg.deepspeed), "deepspeed group")
    return profile_of(member.deepspeed or f"{default} (run default)", prof)


def profile_of(name: str, prof: dict[str, Any]) -> DeepSpeedProfile:
    """What the planner reads of a DeepSpeed config ``prof`` (a conf/deepspeed profile)."""
    zero = prof.get("zero_optimization") or {}
    return DeepSpeedProfile(
        name=name, stage=int(zero.get("stage", 0)),
        offload_optimizer=_offloaded(zero.get("offload_optimizer")),
        offload_param=_offloaded(zero.get("offload_param")),
        gradient_checkpointing=bool(prof.get("gradient_checkpointing", False)),
        bf16=bool((prof.get("bf16") or {}).get("enabled", False)),
    )


def _offloaded(block: Any) -> bool:
    return isinstance(block, dict) and str(block.get("device", "none")).lower() in ("cpu", "nvme")


def _ranks_layout(n: int, gpus_per_node: int) -> tuple[int, int]:
    """(ranks per node, nodes) of an engine on ``n`` GPUs, whole nodes first."""
    if n <= gpus_per_node:
        return n, 1
    return gpus_per_node, -(-n // gpus_per_node)


def update_memory(shape: ModelShape, profile: DeepSpeedProfile, *, n: int, dtype_bytes: int, seq_len: int,
                  train: TrainConfig, p: PlanConfig, on_gpu: bool = True) -> UpdateMemory:
    """The update as ``update_agent`` builds it: ZeRO-3 models constructed partitioned (``zero.Init``), the reference
    partitioned too; a micro-batch of ``train.micro_batch_tokens`` padded tokens (at least one whole sequence), else
    ``train.micro_batch`` sequences; the vocabulary projection in ``train.logprob_chunk_tokens`` chunks."""
    per_node, nodes = _ranks_layout(n, p.gpus_per_node)
    if on_gpu:
        states = zero_model_states(profile.stage, shape.params, shape.largest_layer, gpus_per_node=per_node,
                                   nodes=nodes, offload_optimizer=profile.offload_optimizer,
                                   offload_param=profile.offload_param, zero_init=True,
                                   buffer_factor=p.ds_buffer_factor)
    else:  # one CPU process: nothing is sharded, everything lives in host memory
        states = ModelStates(16 * shape.params, 16 * shape.params, "formula: 16·P in host memory (one CPU process)")
    ref = reference_model_bytes(shape.params, dtype_bytes, ranks=n, sharded=on_gpu and profile.stage == 3)
    tokens = max(train.micro_batch_tokens, seq_len) if train.micro_batch_tokens else train.micro_batch * seq_len
    act = activation_bytes(tokens=tokens, hidden=shape.hidden_size, intermediate=shape.intermediate_size,
                           layers=shape.num_layers, heads=shape.num_heads, kv_heads=shape.num_kv_heads,
                           head_dim=shape.head_dim, vocab=shape.vocab_size, dtype_bytes=dtype_bytes,
                           checkpointing=profile.gradient_checkpointing, logprob_chunk=train.logprob_chunk_tokens)
    reserved = int(p.reserved_gb * GB) if on_gpu else 0
    return UpdateMemory(states=states, reference_bytes=ref, activation_bytes=int(act * p.activation_overhead),
                        reserved_bytes=reserved)


def tp_candidates(shape: ModelShape, n: int, gpus_per_node: int, replicas: int | None = None) -> list[int]:
    """Tensor-parallel sizes an agent's engines on ``n`` GPUs can take: powers of two within one node that divide
    ``n``, the attention heads and the MLP width (vLLM shards both), whose KV heads they divide or replicate evenly,
    and whose ``replicas`` engines (``backend.data_parallel_size``; None: ``n // t``) fit the ``n`` GPUs."""
    out, t = [], 1
    while t <= min(n, gpus_per_node):
        if n % t == 0 and shape.num_heads % t == 0 and shape.intermediate_size % t == 0 \
                and (shape.num_kv_heads % t == 0 or t % shape.num_kv_heads == 0) and (replicas or n // t) * t <= n:
            out.append(t)
        t *= 2
    return out or [1]


def choose_tp(shape: ModelShape, member: AgentConfig, cfg: RunConfig, *, n: int, dtype_bytes: int,
              seq_len: int) -> int:
    """The tensor-parallel size of the agent's vLLM engines on ``n`` GPUs: the config's
    (:func:`mars2.config.fixed_tp`), else the smallest of :func:`tp_candidates` whose engines start and together hold
    the rollout's requests at once; where none does, the one that holds the most of them, ties to the smaller:

        TP = min argmax_t min(replicas(t) · max_seqs(t), in_flight),   replicas(t) = n // t

    (an engine whose weights leave no room for one ``max_model_len`` sequence holds none). Decoding is bound by
    memory traffic: an engine that holds more sequences at once makes more tokens per pass over its weights, so
    when TP 1 leaves room for a handful, a wider engine is faster for the same GPUs."""
    fixed = fixed_tp(member, cfg.backend)
    if fixed is not None:
        return fixed
    demand = in_flight(cfg)
    best, held_best = 1, -1
    for t in tp_candidates(shape, n, cfg.plan.gpus_per_node, cfg.backend.data_parallel_size):
        roll = rollout_plan(shape, member, cfg, n=n, dtype_bytes=dtype_bytes, seq_len=seq_len, tp=t)
        kv = roll.kv
        starts = kv is not None and kv.per_gpu_bytes > 0 and kv.tokens >= (roll.max_model_len or seq_len)
        held = min(roll.replicas * kv.max_seqs, demand) if starts else 0
        if held > held_best:
            best, held_best = t, held
    return best


def rollout_plan(shape: ModelShape, member: AgentConfig, cfg: RunConfig, *, n: int, dtype_bytes: int,
                 seq_len: int, tp: int | None = None) -> RolloutPlan:
    """Generation memory of the engines ``load_backend`` starts: vLLM with tensor-parallel size ``tp`` (default: the
    config's, else 1) and ``n // tp`` replicas (or ``backend.data_parallel_size``), or transformers on the agent's
    first GPU."""
    p, weights = cfg.plan, shape.params * dtype_bytes
    gpu_bytes = int(p.gpu_memory_gb * GB)
    if member.backend == "vllm":
        tp = tp or fixed_tp(member, cfg.backend) or 1
        replicas = cfg.backend.data_parallel_size or max(1, n // tp)
        kv = vllm_kv_budget(weights_bytes=weights, gpu_bytes=gpu_bytes, utilization=cfg.backend.gpu_memory_utilization,
                            tp=tp, layers=shape.num_layers, kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                            dtype_bytes=dtype_bytes, seq_len=seq_len, concurrent=-(-in_flight(cfg) // replicas))
        return RolloutPlan("vllm", tp, -(-weights // tp), kv, cfg.backend.max_model_len, replicas=replicas)
    if member.device.startswith("cuda"):  # transformers on one GPU: what the weights leave
        per_token = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype_bytes)
        budget = gpu_bytes - weights - int(p.reserved_gb * GB)
        tokens = max(0, budget) // per_token
        columns = cache_columns(seq_len)  # the engine's buffers keep spare columns (SlackLayer)
        kv = KVBudget(per_gpu_bytes=budget, bytes_per_token_gpu=per_token, tokens=tokens, seq_len=seq_len,
                      max_seqs=tokens // columns, needed_seqs=cfg.search.batch_size,
                      needed_bytes_per_gpu=cfg.search.batch_size * columns * per_token)
        return RolloutPlan("transformers", 1, weights, kv, None)
    return RolloutPlan("transformers", 1, weights, None, None)


def in_flight(cfg: RunConfig) -> int:
    """Requests one agent's engines may hold at once in a rollout: every tree of the cycle has up to
    ``expansions_per_wave`` requests in flight, and each may ask this agent (with m agents the mean share is 1/m,
    but a tree's agent is drawn per node, so the memory plan takes the bound); at most ``search.trees_in_flight``
    trees are searched at once (whatever the tree strategy). Independent sampling sends ``n_samples`` per problem."""
    trees = cfg.data.max_train_problems or cfg.search.batch_size
    if cfg.search.strategy == "independent":
        return trees * cfg.search.n_samples
    window = cfg.search.trees_in_flight
    return (min(trees, window) if window else trees) * cfg.search.expansions_per_wave


def _check(shape: ModelShape, member: AgentConfig, profile: DeepSpeedProfile, upd: UpdateMemory | None,
           roll: RolloutPlan, p: PlanConfig, n: int) -> tuple[list[str], list[str]]:
    """(reasons it does not fit, warnings) for one agent on ``n`` GPUs (placement and host memory aside; ``upd``
    None: no update to fit)."""
    reasons, warnings = [], []
    if not member.device.startswith("cuda"):
        return reasons, warnings
    gpu_bytes = int(p.gpu_memory_gb * GB)
    if upd is not None and upd.gpu_bytes > gpu_bytes:
        reasons.append(
            f"the update needs {_gb(upd.gpu_bytes)} GB per GPU on {n} GPU(s) ({profile.label} model states "
            f"{_gb(upd.states.gpu_bytes)} (the reference, {_gb(upd.reference_bytes)}, runs before and is freed) + activations "
            f"{_gb(upd.activation_bytes)} + reserve {_gb(upd.reserved_bytes)}) but a GPU has {p.gpu_memory_gb:g} GB")
    if roll.backend == "vllm" and roll.kv is not None:
        kv = roll.kv
        if roll.replicas * roll.tp > n:
            reasons.append(f"{roll.replicas} vLLM engine(s) of tensor parallelism {roll.tp} need "
                           f"{roll.replicas * roll.tp} GPUs but it has {n} (backend.tensor_parallel_size / "
                           "data_parallel_size)")
        if shape.num_heads % roll.tp or (shape.num_kv_heads % roll.tp and roll.tp % shape.num_kv_heads):
            reasons.append(f"vLLM tensor parallelism {roll.tp} (backend.tensor_parallel_size) does not divide the "
                           f"{shape.num_heads} attention / {shape.num_kv_heads} KV heads")
        if roll.max_model_len is not None and roll.max_model_len > shape.max_position_embeddings:
            reasons.append(f"backend.max_model_len={roll.max_model_len} exceeds the model's "
                           f"max_position_embeddings={shape.max_position_embeddings}")
        if roll.max_model_len is not None and kv.seq_len > roll.max_model_len:
            reasons.append(f"a sequence of {kv.seq_len} tokens (plan.prompt_tokens + search.max_new_tokens) exceeds "
                           f"backend.max_model_len={roll.max_model_len}")
        if kv.per_gpu_bytes <= 0:
            reasons.append(f"vLLM: the weights ({_gb(roll.weights_per_gpu_bytes)} GB per GPU) leave no KV cache in "
                           f"gpu_memory_utilization × {p.gpu_memory_gb:g} GB")
        elif roll.max_model_len is not None and kv.tokens < roll.max_model_len:
            reasons.append(f"vLLM's KV cache holds {kv.tokens} tokens, less than one max_model_len="
                           f"{roll.max_model_len} sequence (vLLM refuses to start)")
        elif kv.max_seqs < kv.needed_seqs:
            warnings.append(f"an engine's KV cache holds {kv.max_seqs} sequences of {kv.seq_len} tokens at once, fewer "
                            f"than the up to {kv.needed_seqs} requests the rollout's trees can send each of the "
                            f"{roll.replicas} engine(s) at once: vLLM queues the rest (slower rollouts)")
        if roll.tp > p.gpus_per_node:
            warnings.append(f"vLLM tensor parallelism {roll.tp} spans nodes (slow); prefer <= {p.gpus_per_node}")
    elif roll.kv is not None and roll.kv.needed_bytes_per_gpu > max(0, roll.kv.per_gpu_bytes):
        reasons.append(f"transformers generation needs {_gb(roll.weights_per_gpu_bytes)} GB weights + "
                       f"{_gb(roll.kv.needed_bytes_per_gpu)} GB KV cache on one GPU of {p.gpu_memory_gb:g} GB")
    return reasons, warnings


def _evaluate(shape: ModelShape, member: AgentConfig, cfg: RunConfig, profile: DeepSpeedProfile, n: int,
              dtype_bytes: int, seq_len: int, updates: bool = True):
    """(update memory, rollout plan, reasons, warnings) of one agent on ``n`` GPUs; without ``updates`` (a run that
    only generates: evaluation, the gate) the update's memory is reported but decides nothing."""
    on_gpu = member.device.startswith("cuda")
    upd = update_memory(shape, profile, n=n, dtype_bytes=dtype_bytes, seq_len=seq_len,
                        train=cfg.train, p=cfg.plan, on_gpu=on_gpu)
    tp = choose_tp(shape, member, cfg, n=n, dtype_bytes=dtype_bytes, seq_len=seq_len) \
        if on_gpu and member.backend == "vllm" else None
    roll = rollout_plan(shape, member, cfg, n=n, dtype_bytes=dtype_bytes, seq_len=seq_len, tp=tp)
    reasons, warnings = _check(shape, member, profile, upd if updates else None, roll, cfg.plan, n)
    if on_gpu and updates and upd.cpu_bytes > cfg.plan.cpu_memory_gb * GB:
        reasons.append(f"{profile.label} needs {_gb(upd.cpu_bytes)} GB host memory per node "
                       f"(DeepSpeed's estimate) but a node has {cfg.plan.cpu_memory_gb:g} GB")
    return upd, roll, reasons, warnings


def min_gpus(shape: ModelShape, member: AgentConfig, cfg: RunConfig, profile: DeepSpeedProfile, *,
             dtype_bytes: int, seq_len: int, updates: bool = True) -> int | None:
    """Fewest GPUs (up to the whole cluster) on which this agent's rollout, and with ``updates`` its update with its
    profile, fit."""
    for n in range(1, cfg.plan.nodes * cfg.plan.gpus_per_node + 1):
        if not _evaluate(shape, member, cfg, profile, n, dtype_bytes, seq_len, updates)[2]:
            return n
    return None


def _place(n: int, free: list[list[bool]], node_per_agent: bool) -> list[Span] | None:
    """Take ``n`` GPUs: a contiguous range on one node when n fits a node, else whole free nodes."""
    per_node = len(free[0])
    if n <= per_node:
        for node, gpus in enumerate(free):
            if node_per_agent and not all(gpus):
                continue
            for start in range(per_node - n + 1):
                if all(gpus[start:start + n]):
                    last = start + n - 1 if not node_per_agent else per_node - 1
                    for g in range(start, last + 1):
                        gpus[g] = False
                    return [Span(node, start, start + n - 1)]
        return None
    whole = [node for node, gpus in enumerate(free) if all(gpus)]
    need = -(-n // per_node)
    if len(whole) < need:
        return None
    spans, left = [], n
    for node in whole[:need]:
        take = min(per_node, left)
        spans.append(Span(node, 0, take - 1))
        free[node] = [False] * per_node
        left -= take
    return spans


def one_gpu_zero2_hint(shape: ModelShape, member: AgentConfig, index: int, cfg: RunConfig, profile: DeepSpeedProfile,
                       dtype_bytes: int, seq_len: int) -> list[str]:
    """A warning naming a ZeRO-2 profile of ``cfg.deepspeed_profiles`` (same bf16 and checkpointing, no offload) on
    whose update the agent also fits, when the agent trains with ZeRO-3 without offload on one GPU; else none.

    On one GPU ZeRO-3 has nothing to partition across, yet still fetches and releases every module's parameters
    around each forward and backward (host work the GPU waits on)."""
    if profile.stage != 3 or profile.offload_optimizer or profile.offload_param:
        return []
    for name, prof in sorted(cfg.deepspeed_profiles.items()):
        alt = profile_of(name, prof)
        if (alt.stage, alt.offload_optimizer, alt.offload_param) != (2, False, False) or \
                (alt.bf16, alt.gradient_checkpointing) != (profile.bf16, profile.gradient_checkpointing):
            continue
        upd, _, reasons, _ = _evaluate(shape, member, cfg, alt, 1, dtype_bytes, seq_len)
        if not reasons:
            return [f"ZeRO-3 on one GPU partitions nothing but still gathers and frees every module's weights in "
                    f"each pass; {name} fits too ({_gb(upd.gpu_bytes)} GB per GPU) and is faster (docs/gpu.md, "
                    f"section 2a): agents.members.{index}.deepspeed={name}"]
    return []


def reachable_nodes(cfg: RunConfig) -> int:
    """Nodes a run can place agents on: node 0, and one more per work pool ``orchestration.node_pools`` names beyond
    the first (an engine on another node is a service that node's pool starts), at most ``plan.nodes``."""
    return max(1, min(cfg.plan.nodes, len(cfg.orchestration.node_pools)))


def plan(cfg: RunConfig, *, updates: bool = True) -> ClusterPlan:
    """The resource plan of ``cfg`` on the nodes of the cluster ``cfg.plan`` describes that the run reaches
    (:func:`reachable_nodes`): the preset's layout (each agent's ``gpus``, ``plan.node_per_agent``) where it fits,
    else the first that fits of the preset's GPU counts halved, quartered, ... (at least 1), a node per agent first
    where the preset asks for it, then packed; else the preset's layout with its reasons. Each vLLM agent's
    tensor-parallel size is :func:`choose_tp`'s. ``ClusterPlan.chosen`` says in one line what was chosen and why.

    "Fits" is the engines' and the update's memory with ``updates`` (a training run); without (a run that only
    generates: evaluation, the gate) the engines' alone, so such a run may take a smaller layout than training."""
    nodes = reachable_nodes(cfg)
    cuda = [m for m in cfg.agents.owners if m.device.startswith("cuda")]
    asked = {m.name: max(1, m.gpus) for m in cuda}
    given = _layout(cfg, asked, cfg.plan.node_per_agent, nodes, updates)
    if not cuda or (given.fits and not _split(given)):
        given.chosen = _chosen(given, "as the preset asks") if cuda else ""
        return given
    k, halved = 2, None
    while True:
        gpus = {name: max(1, g // k) for name, g in asked.items()}
        for per_agent in dict.fromkeys((cfg.plan.node_per_agent, False)):
            cp = _layout(cfg, gpus, per_agent, nodes, updates)
            halved = halved or (cp if not per_agent else None)
            if cp.fits and not _split(cp):
                cp.chosen = _chosen(cp, f"the preset's {_gpu_counts(asked)} GPUs"
                                        f"{' on nodes of their own' if cfg.plan.node_per_agent else ''} do not fit "
                                        f"{_reach(cfg, nodes)}")
                return cp
        if all(g == 1 for g in gpus.values()):
            break
        k *= 2
    if halved is not None:
        why = [f"{a.name}: {a.reasons[0]}" for a in halved.agents if a.reasons] + halved.reasons
        given.reasons.append(f"packed as {_gpu_counts({a.name: a.gpus for a in halved.agents if a.device == 'cuda'})}"
                             f" GPUs it does not fit either ({'; '.join(why)})")
    if nodes < cfg.plan.nodes:
        given.reasons.append(f"the run reaches {_reach(cfg, nodes)}")
    return given


def _split(cp: ClusterPlan) -> bool:
    """Whether an agent's GPUs span nodes (one agent's update and engines run on one node)."""
    return any(len({s.node for s in a.update_spans}) > 1 for a in cp.agents)


def _gpu_counts(gpus: dict[str, int]) -> str:
    return " + ".join(str(g) for g in gpus.values())


def _reach(cfg: RunConfig, nodes: int) -> str:
    p = cfg.plan
    where = f"{nodes} node(s) of {p.gpus_per_node} {p.gpu_name}"
    if nodes < p.nodes:
        where += (f" (of the cluster's {p.nodes}: a run reaches one node per work pool in orchestration.node_pools, "
                  f"which names {len(cfg.orchestration.node_pools)})")
    return where


def _chosen(cp: ClusterPlan, why: str) -> str:
    """One line: each GPU agent's GPUs, node, engines and tensor-parallel size, and why this layout."""
    parts = []
    for a in cp.agents:
        if a.device != "cuda":
            continue
        where = ",".join(str(s) for s in a.update_spans)
        engines = (f"{a.rollout.replicas} engine(s) x TP {a.rollout.tp}" if a.rollout.backend == "vllm"
                   else "transformers")
        parts.append(f"{a.name} {a.gpus} GPU(s) {where} ({engines})")
    return "; ".join(parts) + f": {why}"


def _layout(cfg: RunConfig, gpus: dict[str, int], node_per_agent: bool, nodes: int,
            updates: bool = True) -> ClusterPlan:
    """The plan of one layout: CUDA owner ``name`` on ``gpus[name]`` GPUs of the first ``nodes`` nodes (``updates``:
    as :func:`plan`)."""
    p = cfg.plan
    seq_len = p.prompt_tokens + cfg.search.max_new_tokens
    free = [[True] * p.gpus_per_node for _ in range(nodes)]
    members = cfg.agents.members
    agents: list[AgentPlan] = []
    node_host: dict[int, int] = {}
    node_agents: dict[int, list[int]] = {}
    for m in cfg.agents.owners:
        roles = [x.name for x in members if x.owner == m.name]
        shape = model_shape(m.model, m.tiny)
        dtype_bytes = DTYPE_BYTES[m.dtype]
        profile = deepspeed_profile(cfg, m)
        on_gpu = m.device.startswith("cuda")
        n = gpus[m.name] if on_gpu else 0
        upd, roll, reasons, warnings = _evaluate(shape, m, cfg, profile, max(1, n), dtype_bytes, seq_len, updates)
        if on_gpu and updates and m.update_procs is not None and m.update_procs > n:
            reasons.append(f"update_procs={m.update_procs} ranks need as many GPUs but it has {n}")
        if on_gpu and updates and n == 1 and not reasons:
            warnings += one_gpu_zero2_hint(shape, m, members.index(m), cfg, profile, dtype_bytes, seq_len)
        if on_gpu and m.gpus < 1:
            warnings.insert(0, "gpus=0 on a CUDA device: planned as 1 GPU")
        zero_opts = _zero_options(shape, n, p) if on_gpu else {}
        gmin = min_gpus(shape, m, cfg, profile, dtype_bytes=dtype_bytes, seq_len=seq_len, updates=updates) \
            if on_gpu else None
        if on_gpu and reasons:
            what = f"with {profile.label}" if updates else "its engines"
            reasons.append(f"{what} it needs at least {gmin} GPUs" if gmin is not None else
                           f"{what} ({m.deepspeed or 'default profile'}) it fits on no number of GPUs of this cluster"
                           if updates else f"{what} fit on no number of GPUs of this cluster")
        spans: list[Span] = []
        if on_gpu:
            spans = _place(n, free, node_per_agent) or []
            if not spans:
                left = sum(map(sum, free))
                where = "on nodes of its own" if node_per_agent or n > p.gpus_per_node else "on one node"
                reasons.append(f"no room: it needs {n} GPU(s) {where} but {left} of {nodes * p.gpus_per_node} "
                               "GPUs are left")
            for node in sorted({s.node for s in spans}) if updates else ():
                node_host[node] = node_host.get(node, 0) + upd.cpu_bytes
                node_agents.setdefault(node, []).append(upd.cpu_bytes)
        if roll.backend == "vllm":
            roll.spans = list(spans)
        elif spans:  # transformers generates on the agent's first GPU (member.device)
            roll.spans = [Span(spans[0].node, spans[0].first, spans[0].first)]
        agents.append(AgentPlan(
            name=m.name, roles=roles, model=m.model, shape=shape, device="cuda" if on_gpu else "cpu", dtype=m.dtype,
            profile=profile, gpus=n, gpus_min=gmin, weights_bytes=shape.params * dtype_bytes, update=upd,
            zero_options=zero_opts, rollout=roll, update_spans=spans, reasons=reasons, warnings=warnings))
    host = p.cpu_memory_gb * GB  # an agent that alone exceeds it already says so; here: agents sharing a node
    reasons = [f"node{node} needs {_gb(b)} GB host memory for the {len(node_agents[node])} agents placed on it "
               f"(DeepSpeed's estimates) but has {p.cpu_memory_gb:g} GB" for node, b in sorted(node_host.items())
               if b > host and max(node_agents[node]) <= host]
    used = sum(a.gpus for a in agents if a.update_spans)
    return ClusterPlan(cluster=p, preset=cfg.agents.preset, agents=agents, node_host_bytes=node_host, used_gpus=used,
                       gpu_memory_utilization=cfg.backend.gpu_memory_utilization, reasons=reasons,
                       node_per_agent=node_per_agent, updates=updates)


def _zero_options(shape: ModelShape, gpus: int, p: PlanConfig) -> dict[str, int]:
    """Each ZeRO option's model states per GPU (DeepSpeed's estimators) for an agent on ``gpus`` GPUs."""
    per_node, nodes = _ranks_layout(gpus, p.gpus_per_node)
    return {label: zero_model_states(stage, shape.params, shape.largest_layer, gpus_per_node=per_node, nodes=nodes,
                                     offload_optimizer=opt, offload_param=par, zero_init=True,
                                     buffer_factor=p.ds_buffer_factor).gpu_bytes
            for label, stage, opt, par in ZERO_OPTIONS}


def require_fit(cp: ClusterPlan) -> ClusterPlan:
    """``cp`` unchanged, or :class:`PlanRefused` with :meth:`ClusterPlan.refusal`."""
    if not cp.fits:
        raise PlanRefused(cp.refusal())
    return cp


def _gb(b: float) -> str:
    return f"{b / GB:.1f}"
