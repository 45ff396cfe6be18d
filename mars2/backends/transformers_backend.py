"""Generation with Hugging Face transformers (CPU or one GPU), continuously batched."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from mars2.backends.base import Generation, SamplingParams, call_seeds, end_token_ids, request_seed


class TransformersBackend:
    """A transformers model behind a :class:`~mars2.backends.continuous.ContinuousBatcher`: ``submit`` one request,
    or ``generate`` a list; both return the sampled tokens' log-probs under the sampling distribution."""

    def __init__(self, model, tokenizer, *, device: str = "cpu", batch_size: int = 32):
        from mars2.backends.continuous import ContinuousBatcher

        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.starts = 1  # a model loaded into this process: one engine start
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        generation = getattr(model, "generation_config", None)
        self.stop_ids = end_token_ids(getattr(generation, "eos_token_id", None), tokenizer.eos_token_id)
        self._tokenizer_lock = threading.Lock()
        self.batcher = ContinuousBatcher(self.model, pad_id=tokenizer.pad_token_id, stop_ids=self.stop_ids,
                                         device=device, max_batch=batch_size)

    def submit(self, prompt: str, params: SamplingParams, seed: int) -> Future:
        """One request (``params.n`` is ignored: one generation, the one ``generate([prompt], params, [seed])`` gives
        first) → ``Future[Generation]``; it joins the running batch at the next decode step."""
        return self.submit_samples([(prompt, request_seed(seed, 0))], params)[0]

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """``params.n`` generations per prompt; sample j of prompt i is the request seeded ``request_seed(seeds[i],
        j)``, so what it samples depends on its prompt and seed, not on the other requests."""
        seeds = call_seeds(params, prompts, seeds)
        rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        rows.sort(key=lambda r: len(prompts[r[0]]))  # shortest prompts first: rows admitted together pad less
        futures = dict(zip(rows, self.submit_samples([(prompts[i], request_seed(seeds[i], j)) for i, j in rows], params),
                           strict=True))
        return [[futures[i, j].result() for j in range(params.n)] for i in range(len(prompts))]

    def submit_samples(self, requests: list[tuple[str, int]], params: SamplingParams) -> list[Future]:
        """(prompt, sample seed) requests, queued together → one ``Future[Generation]`` each."""
        with self._tokenizer_lock:  # one Rust tokenizer, used from the caller's and the batcher's threads
            prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in requests]
        inner = self.batcher.submit_many([(ids, seed) for ids, (_, seed) in zip(prompt_ids, requests, strict=True)],
                                         temperature=params.temperature, top_p=params.top_p,
                                         max_new_tokens=params.max_new_tokens)
        return [self._as_generation(f, ids) for f, ids in zip(inner, prompt_ids, strict=True)]

    def _as_generation(self, done: Future, prompt_ids: list[int]) -> Future:
        out: Future = Future()

        def finish(f: Future) -> None:
            if f.exception() is not None:
                out.set_exception(f.exception())
                return
            c = f.result()
            try:
                with self._tokenizer_lock:
                    text = self.tokenizer.decode(c.response_ids, skip_special_tokens=True)
            except Exception as e:  # concurrent.futures would log and drop it, leaving the caller waiting forever
                out.set_exception(e)
                return
            out.set_result(Generation(prompt_ids=prompt_ids, response_ids=c.response_ids, logprobs=c.logprobs,
                                      text=text, finish_reason=c.finish_reason))

        done.add_done_callback(finish)
        return out


def load_transformers_backend(model_dir: str, tokenizer_dir: str, *, device: str = "cpu", dtype: str = "float32",
                              batch_size: int = 32) -> tuple[TransformersBackend, Any]:
    """Load a local model folder and its tokenizer (never from a hub) into a :class:`TransformersBackend`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True)
    return TransformersBackend(model, tokenizer, device=device, batch_size=batch_size), tokenizer
