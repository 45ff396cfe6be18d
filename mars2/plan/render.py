"""Rich tables of a :class:`~mars2.plan.planner.ClusterPlan`: one per agent, then the placement summary."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mars2.plan.memory import GB, kv_bytes_per_token
from mars2.plan.models import DTYPE_BYTES
from mars2.plan.planner import AgentPlan, ClusterPlan, Span


def _gb(b: float) -> str:
    return f"{b / GB:,.1f} GB" if b >= 0.1 * GB or b == 0 else f"{b / 2**20:,.1f} MB"


def _spans(spans: list[Span]) -> str:
    return ", ".join(map(str, spans)) or "—"


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def agent_table(a: AgentPlan, cp: ClusterPlan) -> Table:
    t = Table(title=f"agent {a.name}" + (f"  (roles: {', '.join(a.roles)})" if len(a.roles) > 1 else ""),
              title_justify="left", show_header=False, expand=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    _model_rows(t, a)
    if cp.updates:
        _update_rows(t, a, cp)
    _rollout_rows(t, a, cp)
    if a.device == "cuda" and cp.updates:
        need = a.gpus_min if a.gpus_min is not None else "none fits"
        t.add_row("GPUs", f"{a.gpus} configured, {need} needed with {a.profile.label}")
        t.add_row("placement", f"rollout {_spans(a.rollout.spans)}  ·  update {_spans(a.update_spans)} "
                               f"[dim](phases alternate on the same GPUs)[/dim]")
    elif a.device == "cuda":
        need = a.gpus_min if a.gpus_min is not None else "none fits"
        t.add_row("GPUs", f"{a.gpus} configured, {need} needed by its engines (no update is planned)")
        t.add_row("placement", f"rollout {_spans(a.rollout.spans)}")
    else:
        t.add_row("placement", "CPU (rollout and update in the flow's process)")
    for w in a.warnings:
        t.add_row(Text("warning", style="yellow"), Text(w, style="yellow"))
    t.add_row("verdict", Text("fits", style="bold green") if a.fits else
              Text("DOES NOT FIT: " + "; ".join(a.reasons), style="bold red"))
    return t


def _model_rows(t: Table, a: AgentPlan) -> None:
    """The model: architecture, parameter count, weights, DeepSpeed profile."""
    s = a.shape
    t.add_row("model", f"{s.name}  [dim]({s.source})[/dim]")
    t.add_row("architecture", f"{s.architecture}: {s.num_layers} layers, hidden {s.hidden_size}, MLP "
                              f"{s.intermediate_size}, heads {s.num_heads} ({s.num_kv_heads} KV) x {s.head_dim}, "
                              f"vocab {s.vocab_size}" + (", tied embeddings" if s.tied_embeddings else ""))
    public = s.public_params
    dev = ""
    if public:
        shown = f"{public / 1e9:.1f} B" if public >= 1e9 else f"{public / 1e6:.0f} M"
        dev = f"; public {shown} ({(s.params - public) / public:+.1%})"
    t.add_row("parameters", f"{fmt_params(s.params)} ({s.params:,}){dev}")
    t.add_row("largest layer", f"{fmt_params(s.largest_layer)} ({s.largest_layer_name or 'root'})")
    t.add_row("weights", f"{_gb(a.weights_bytes)} in {a.dtype}")
    p = a.profile
    t.add_row("DeepSpeed", f"{p.name}: {p.label}, bf16 {'on' if p.bf16 else 'off'}, gradient checkpointing "
                           f"{'on' if p.gradient_checkpointing else 'off'}")


def _update_rows(t: Table, a: AgentPlan, cp: ClusterPlan) -> None:
    """The update's memory: per GPU and per node, or host memory on CPU."""
    c, u = cp.cluster, a.update
    if a.device == "cuda":
        t.add_row(f"model states/GPU\n(on {a.gpus} GPU{'s' if a.gpus > 1 else ''})",
                  "  ".join(f"{k} {v / GB:,.1f}" for k, v in a.zero_options.items()) + " GB  [dim](DeepSpeed's "
                  "estimators; Z0 = 16 B/param)[/dim]")
        ok = u.gpu_bytes <= c.gpu_memory_gb * GB
        t.add_row("update/GPU", Text.from_markup(
            f"[{'green' if ok else 'red'}]{_gb(u.gpu_bytes)}[/] of {c.gpu_memory_gb:g} GB = model states "
            f"{_gb(u.states.gpu_bytes)} [dim]({u.states.source})[/dim] + activations {_gb(u.activation_bytes)} "
            f"[dim](estimate x{c.activation_overhead:g})[/dim] + reserve {_gb(u.reserved_bytes)}; the reference "
            f"({_gb(u.reference_bytes)}) scores the batch first and is freed"))
        t.add_row("host/node", f"{_gb(u.cpu_bytes)} of {c.cpu_memory_gb:g} GB [dim](DeepSpeed's estimate)[/dim]")
    else:
        t.add_row("update (CPU)", f"{_gb(u.states.gpu_bytes + u.reference_bytes + u.activation_bytes)} host memory = "
                                  f"model states {_gb(u.states.gpu_bytes)} + reference {_gb(u.reference_bytes)} + "
                                  f"activations {_gb(u.activation_bytes)} (estimate)")


def _rollout_rows(t: Table, a: AgentPlan, cp: ClusterPlan) -> None:
    """The rollout's engines and KV cache."""
    s, r = a.shape, a.rollout
    per_token = kv_bytes_per_token(s.num_layers, s.num_kv_heads, s.head_dim, DTYPE_BYTES[a.dtype])
    if r.kv is not None:
        kv = r.kv
        what = (f"vLLM, {r.replicas} engine(s) x TP {r.tp}, gpu_memory_utilization {cp.gpu_memory_utilization:g}"
                if r.backend == "vllm"
                else "transformers on one GPU")
        t.add_row("rollout", f"{what}: weights {_gb(r.weights_per_gpu_bytes)}/GPU, KV cache "
                             f"{_gb(max(0, kv.per_gpu_bytes))}/GPU = {kv.tokens:,} tokens "
                             f"({per_token / 1024:,.0f} KiB/token, {kv.bytes_per_token_gpu / 1024:,.0f} KiB per GPU)")
        full = f"; {kv.tokens // r.max_model_len} at max_model_len {r.max_model_len}" if r.max_model_len else ""
        t.add_row("KV at lengths", f"{kv.seq_len} tokens/sequence: {kv.max_seqs:,} sequences at once per engine (the "
                                   f"rollout may send it up to {kv.needed_seqs}){full}")
    else:
        t.add_row("rollout", f"transformers on CPU: KV cache {per_token / 1024:,.1f} KiB/token")


def summary_table(cp: ClusterPlan) -> Table:
    c = cp.cluster
    t = Table(title=f"placement: agents={cp.preset} on {c.nodes} node(s) x {c.gpus_per_node} {c.gpu_name} "
                    f"({c.gpu_memory_gb:g} GB)", title_justify="left")
    for col in ("agent", "model", "params", "DeepSpeed", "GPUs (min)", "update/GPU", "KV seqs", "rollout", "update",
                "fits"):
        t.add_column(col, overflow="fold")
    for a in cp.agents:
        kv = a.rollout.kv
        t.add_row(a.name, a.shape.name, fmt_params(a.shape.params), a.profile.label,
                  f"{a.gpus} ({a.gpus_min if a.gpus_min is not None else '—'})" if a.device == "cuda" else "cpu",
                  _gb(a.update.gpu_bytes) if a.device == "cuda" and cp.updates else "—",
                  f"{kv.max_seqs:,}" if kv is not None else "—",
                  _spans(a.rollout.spans) if a.device == "cuda" else "cpu",
                  (_spans(a.update_spans) if cp.updates else "no update") if a.device == "cuda" else "cpu",
                  Text("yes", style="green") if a.fits else Text("NO", style="bold red"))
    return t


def footer(cp: ClusterPlan) -> Text:
    c = cp.cluster
    used_nodes = sorted({s.node for a in cp.agents for s in a.update_spans})
    free_nodes = [n for n in range(c.nodes) if n not in used_nodes]
    host = ", ".join(f"node{n} {_gb(b)}" for n, b in sorted(cp.node_host_bytes.items()))
    line = (f"GPUs: {cp.used_gpus} of {cp.total_gpus} used"
            + (f"; free nodes: {', '.join(f'node{n}' for n in free_nodes)}" if free_nodes and used_nodes else "")
            + (f". Host memory per node: {host} of {c.cpu_memory_gb:g} GB" if host else "") + ".")
    out = Text(line)
    for r in cp.reasons:
        out.append("\n" + r, style="bold red")
    if cp.fits and cp.chosen:
        out.append(f"\nchosen: {cp.chosen}")
    out.append("\nplan: " + ("fits" if cp.fits else "DOES NOT FIT"), style="bold green" if cp.fits else "bold red")
    return out


def render(cp: ClusterPlan, console: Console | None = None) -> None:
    console = console or Console()
    console.print(Group(*[agent_table(a, cp) for a in cp.agents], summary_table(cp), footer(cp)))
