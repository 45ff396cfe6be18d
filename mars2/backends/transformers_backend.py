"""Batched generation with Hugging Face transformers (CPU or one GPU)."""

from __future__ import annotations

from typing import Any

from mars2.backends.base import Generation, SamplingParams, end_token_ids


class TransformersBackend:
    """Left-padded batched sampling; returns the sampled tokens' log-probs under the sampling distribution."""

    def __init__(self, model, tokenizer, *, device: str = "cpu", batch_size: int = 32, progress: bool = False):
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.uses_host_cpu = str(device).startswith("cpu")  # see tree_search.grading_overlaps_generation
        self.batch_size = batch_size
        self.progress = progress
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        generation = getattr(model, "generation_config", None)
        self.stop_ids = end_token_ids(getattr(generation, "eos_token_id", None), tokenizer.eos_token_id)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        import torch
        from tqdm.auto import tqdm

        rows = [(i, p) for i, p in enumerate(prompts) for _ in range(params.n)]
        # similar lengths share a batch (less padding), and batches are equal-sized rather than full + remainder
        order = sorted(range(len(rows)), key=lambda r: len(rows[r][1]))
        n_batches = max(1, -(-len(rows) // self.batch_size))
        size = -(-len(rows) // n_batches)
        out: list[list[Generation | None]] = [[None] * params.n for _ in prompts]
        for b in tqdm(range(n_batches), desc="generate", unit="batch", disable=not self.progress, leave=False):
            chunk = order[b * size : (b + 1) * size]
            torch.manual_seed(params.seed * 1_000_003 + b)
            for r, gen in zip(chunk, self._generate_batch([rows[r][1] for r in chunk], params), strict=True):
                out[rows[r][0]][r % params.n] = gen
        return out  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[str], params: SamplingParams) -> list[Generation]:
        import torch

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        greedy = params.temperature <= 0
        sampling = {} if greedy else {"temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        with torch.no_grad():
            res = self.model.generate(
                **enc,
                do_sample=not greedy,
                max_new_tokens=params.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=self.stop_ids,
                return_dict_in_generate=True,
                output_scores=True,
                **sampling,
            )
            logprobs = self.model.compute_transition_scores(res.sequences, res.scores, normalize_logits=True)
        prompt_len = enc["input_ids"].shape[1]
        gens = []
        for row in range(len(prompts)):
            prompt_ids = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
            new = res.sequences[row, prompt_len:].tolist()
            lps = logprobs[row].tolist()
            finish = "length"
            end = next((i for i, t in enumerate(new) if t in self.stop_ids), None)
            if end is not None:
                new = new[: end + 1]
                finish = "stop"
            gens.append(
                Generation(
                    prompt_ids=prompt_ids,
                    response_ids=new,
                    logprobs=[float(x) for x in lps[: len(new)]],
                    text=tok.decode(new, skip_special_tokens=True),
                    finish_reason=finish,
                )
            )
        return gens


def load_transformers_backend(model_dir: str, tokenizer_dir: str, *, device: str = "cpu", dtype: str = "float32",
                              batch_size: int = 32, progress: bool = False) -> tuple[TransformersBackend, Any]:
    """Load a local model folder and its tokenizer (never from a hub) into a :class:`TransformersBackend`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True)
    return TransformersBackend(model, tokenizer, device=device, batch_size=batch_size, progress=progress), tokenizer
