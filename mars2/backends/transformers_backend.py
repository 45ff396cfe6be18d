"""Batched generation with Hugging Face transformers (CPU or one GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mars2.backends.base import Generation, SamplingParams, end_token_ids, prompt_seeds, request_seed


class TransformersBackend:
    """Left-padded batched sampling; returns the sampled tokens' log-probs under the sampling distribution."""

    def __init__(self, model, tokenizer, *, device: str = "cpu", batch_size: int = 32, progress: bool = False):
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.uses_host_cpu = str(device).startswith("cpu")  # see tree_search.grading_overlaps_generation
        self.batch_size = batch_size
        self.progress = progress
        self.starts = 1  # a model loaded into this process: one engine start
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        generation = getattr(model, "generation_config", None)
        self.stop_ids = end_token_ids(getattr(generation, "eos_token_id", None), tokenizer.eos_token_id)

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """``params.n`` generations per prompt; sample j of prompt i is decoded with the seed ``request_seed(seeds[i],
        j)`` (see :meth:`generate_batch`), so what it samples depends on its prompt and seed, not on its batch."""
        from tqdm.auto import tqdm

        seeds = list(seeds) if seeds is not None else prompt_seeds(params, len(prompts))
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        # similar lengths share a batch (less padding), and batches are equal-sized rather than full + remainder
        order = sorted(range(len(rows)), key=lambda r: len(prompts[rows[r][0]]))
        n_batches = max(1, -(-len(rows) // self.batch_size))
        size = -(-len(rows) // n_batches)
        out: list[list[Generation | None]] = [[None] * params.n for _ in prompts]
        for b in tqdm(range(n_batches), desc="generate", unit="batch", disable=not self.progress, leave=False):
            chunk = [rows[r] for r in order[b * size : (b + 1) * size]]
            batch = self.generate_batch([prompts[i] for i, _ in chunk], params,
                                        [request_seed(seeds[i], j) for i, j in chunk])
            for (i, j), gen in zip(chunk, batch, strict=True):
                out[i][j] = gen
        return out  # type: ignore[return-value]

    def generate_batch(self, prompts: list[str], params: SamplingParams, seeds: list[int]) -> list[Generation]:
        """One left-padded batch, decoded token by token with a KV cache; row b's t-th draw uses the uniform
        ``row_uniforms(seeds, t)[b]``, a function of its seed and t only.

        Per step, with logits z ∈ R^{B×V}: greedy (T = 0) takes argmax z and reports log softmax(z); sampling
        draws from π = top_p(softmax(z / T)) (renormalised) and reports log π of the drawn token — the processed
        log-probs truncated importance sampling compares with the trainer's (as ``compute_transition_scores``
        with ``normalize_logits=True`` did)."""
        import torch

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        row_seeds = np.asarray([int(s) for s in seeds], dtype=np.uint64)
        stop = torch.tensor(self.stop_ids, device=self.device)
        finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=self.device)
        step_ids, positions, cache = ids, (mask.long().cumsum(-1) - 1).clamp(min=0), None
        tokens, logprobs = [], []
        with torch.no_grad():
            for step in range(params.max_new_tokens):
                out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token, logprob = next_tokens(out.logits[:, -1, :].float(), params, row_uniforms(row_seeds, step))
                token = torch.where(finished, torch.full_like(token, tok.pad_token_id), token)
                tokens.append(token)
                logprobs.append(logprob)
                finished |= torch.isin(token, stop)
                if bool(finished.all()):
                    break
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
                step_ids, positions = token[:, None], positions[:, -1:] + 1
        new_ids = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in prompts]
        new_lps = torch.stack(logprobs, dim=1).tolist() if logprobs else [[] for _ in prompts]
        gens = []
        for row in range(len(prompts)):
            prompt_ids = ids[row][mask[row, : ids.shape[1]].bool()].tolist()
            new, finish = new_ids[row], "length"
            end = next((i for i, t in enumerate(new) if t in self.stop_ids), None)
            if end is not None:
                new, finish = new[: end + 1], "stop"
            gens.append(Generation(prompt_ids=prompt_ids, response_ids=new,
                                   logprobs=[float(x) for x in new_lps[row][: len(new)]],
                                   text=tok.decode(new, skip_special_tokens=True), finish_reason=finish))
        return gens


def row_uniforms(seeds, step: int):
    """u_b = splitmix64(seed_b + (step + 1)·φ) / 2^64 ∈ [0, 1): one uniform per row and step, a pure function of the
    row's seed and the step (counter-based), so no row's draws depend on the rows beside it; [B] float64."""
    with np.errstate(over="ignore"):
        z = seeds + np.uint64(step + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def next_tokens(logits, params: SamplingParams, uniforms) -> tuple:
    """One decoding step for a batch: logits [B, V], uniforms [B] → (tokens [B], their log-probs [B]).

    Sampling is inverse-CDF: token_b = min{i : Σ_{j≤i} π_b(j) > u_b}, a token of zero probability is never drawn;
    see ``generate_batch`` for π."""
    import torch

    if params.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = logits.argmax(dim=-1)
        return token, logp.gather(-1, token[:, None])[:, 0]
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_lp, index = logp.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included, as HF does)
        drop = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp() >= params.top_p
        logp = logp.scatter(-1, index, sorted_lp.masked_fill(drop, float("-inf")))
        logp = torch.log_softmax(logp, dim=-1)
    cdf = logp.double().exp().cumsum(dim=-1)
    u = torch.as_tensor(uniforms, dtype=torch.float64, device=logits.device)[:, None] * cdf[:, -1:]
    token = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    return token, logp.gather(-1, token[:, None])[:, 0]


def load_transformers_backend(model_dir: str, tokenizer_dir: str, *, device: str = "cpu", dtype: str = "float32",
                              batch_size: int = 32, progress: bool = False) -> tuple[TransformersBackend, Any]:
    """Load a local model folder and its tokenizer (never from a hub) into a :class:`TransformersBackend`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True)
    return TransformersBackend(model, tokenizer, device=device, batch_size=batch_size, progress=progress), tokenizer
