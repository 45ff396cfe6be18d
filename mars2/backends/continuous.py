"""Continuous batching for a transformers causal LM: requests join and leave the running batch at every decode step.

One thread owns the model and runs the decode loop. Each iteration it

1. *admits* waiting requests while the batch has room: their prompts are prefilled together (left-padded), each
   samples its first token, and their KV caches are merged into the running batch's (both left-padded to the
   longer one along the sequence axis; padded columns are masked out);
2. *steps* the running batch: one forward pass of every row's last token ([B, 1], with the KV cache, the
   attention mask [B, L + 1] and per-row position ids), one token sampled per row (``sampler.next_tokens``, the
   row's own seed, step, temperature and top-p);
3. *evicts* finished rows (an end token, or ``max_new_tokens``), resolving their futures, and drops the cache
   columns no remaining row attends to.

So the batch stays as full as the requests in flight allow, a row that finished early costs nothing, and a request
that arrives mid-flight starts at the next step instead of waiting for the batch to drain (the wave barrier of
static batching). Positions are explicit and padding is masked, so a row computes the same thing whatever it is
batched with; with the per-request uniforms of the sampler, what it samples does not depend on its batch.

The merge pads the cache's tensors, so the model's cache layers must be full-attention ``DynamicLayer`` s (a
sliding-window layer would be corrupted by padding; such a model is refused with a clear error).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field


IDLE_EXIT_S = 1.0
_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A decode thread still inside torch when the interpreter finalises aborts the process: stop them first."""
    for batcher in list(_running):
        batcher.close()


@dataclass
class Completion:
    """A finished request: the sampled ids (the end token included when one ended it) and their log-probs."""

    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


@dataclass
class _Request:
    prompt_ids: list[int]
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    future: Future
    queued_at: int = 0  # the batcher's step count when it was submitted
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class ContinuousBatcher:
    """``submit(prompt_ids, temperature, top_p, max_new_tokens, seed) → Future[Completion]``; at most ``max_batch``
    rows decode together. ``drained()`` holds new admissions, waits for the running rows to finish and then holds
    the model (for an in-place weight load)."""

    def __init__(self, model, *, pad_id: int, stop_ids: list[int], device: str = "cpu", max_batch: int = 32,
                 admit_after_steps: int = 4, max_padding: float = 0.25):
        self.model = model
        self.pad_id = int(pad_id)
        self.stop_ids = list(stop_ids)
        self.device = device
        self.max_batch = max(1, int(max_batch))
        self.admit_after_steps = admit_after_steps
        self.max_padding = max_padding
        self._last_logits_only = last_logits_only(model)
        self.model_lock = threading.Lock()  # held while the model computes
        self._cv = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Request] = []
        self._holds = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._cache = self._mask = self._last = self._pos = None
        self.steps = 0  # decode steps run (a batched forward pass of the running rows each)
        self.rows_stepped = 0  # Σ over steps of the rows in the batch: rows_stepped / steps = mean batch size
        self.waiting_stepped = 0  # Σ over steps of the requests waiting: (rows + waiting) / steps = mean demand
        self.prefills = 0  # prefill forward passes (an admission runs one per group of similar prompt lengths)

    def submit(self, prompt_ids: list[int], *, temperature: float, top_p: float, max_new_tokens: int,
               seed: int) -> Future:
        """One request → ``Future[Completion]``."""
        return self.submit_many([(prompt_ids, seed)], temperature=temperature, top_p=top_p,
                                max_new_tokens=max_new_tokens)[0]

    def submit_many(self, requests: list[tuple[list[int], int]], *, temperature: float, top_p: float,
                    max_new_tokens: int) -> list[Future]:
        """(prompt ids, seed) requests queued together (admitted together while the batch has room)."""
        if any(not ids for ids, _ in requests):
            raise ValueError("an empty prompt")
        futures = [Future() for _ in requests]
        if max_new_tokens <= 0:
            for f in futures:
                f.set_result(Completion([], [], "length"))
            return futures
        with self._cv:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            for (ids, seed), future in zip(requests, futures, strict=True):
                self._waiting.append(_Request(list(ids), float(temperature), float(top_p), int(max_new_tokens),
                                              int(seed), future, queued_at=self.steps))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="continuous-batcher", daemon=True)
                self._thread.start()
                _running.add(self)
            self._cv.notify_all()
        return futures

    @contextlib.contextmanager
    def drained(self) -> Iterator[None]:
        """Once every request submitted before has finished, hold the model for the block (requests submitted
        meanwhile wait, and run after it)."""
        with self._cv:
            self._cv.wait_for(lambda: not self._rows and not self._waiting)
            self._holds += 1
        try:
            with self.model_lock:
                yield
        finally:
            with self._cv:
                self._holds -= 1
                self._cv.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        """Fail what is waiting or running and stop the decode thread (waiting up to ``timeout_s`` for its step)."""
        with self._cv:
            self._closed = True
            thread = self._thread
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _loop(self) -> None:
        """The decode thread; it ends after ``IDLE_EXIT_S`` with nothing to do (and holds no reference to the batcher
        or its model then), and ``submit`` starts it again."""
        while True:
            with self._cv:
                busy = self._cv.wait_for(lambda: self._closed or self._rows or (self._waiting and not self._holds),
                                         timeout=IDLE_EXIT_S)
                if self._closed:
                    for r in [*self._waiting, *self._rows]:
                        r.future.set_exception(RuntimeError("the batcher was closed"))
                    self._waiting.clear()
                    self._rows, self._cache, self._thread = [], None, None
                    return
                if not busy:
                    if not self._waiting:
                        self._thread = None
                        return
                    continue
                admit = []
                if self._admission_due():
                    while self._waiting and len(self._rows) + len(admit) < self.max_batch:
                        admit.append(self._waiting.popleft())
            try:
                with self.model_lock:
                    if admit:
                        self._admit(admit)
                    if self._rows:
                        self._step()
            except BaseException as e:  # a failed forward pass fails its rows, not the loop
                with self._cv:
                    for r in [*admit, *self._rows]:
                        if not r.future.done():
                            r.future.set_exception(e)
                    self._rows, self._cache = [], None
                    self._cv.notify_all()

    def _admission_due(self) -> bool:
        """Admit when the batch is empty; with a backlog, when an eighth of the batch is free; otherwise when an
        eighth of the batch is waiting or the oldest request has waited ``admit_after_steps`` decode steps. Each
        admission is a forward pass of its own (the prefill): admitting in groups keeps their number well below
        the number of decode steps, whether requests trickle in (a tree search) or rows free up one by one."""
        room = self.max_batch - len(self._rows)
        if self._holds or not self._waiting or room <= 0:
            return False
        group = max(1, self.max_batch // 8)
        if not self._rows:
            return True
        if len(self._waiting) >= room:  # a backlog: wait until a group of rows is free
            return room >= group
        return len(self._waiting) >= group or self.steps - self._waiting[0].queued_at >= self.admit_after_steps

    def _admit(self, requests: list[_Request]) -> None:
        """Prefill ``requests`` in groups of similar prompt length (:func:`length_groups`), then join them to the
        running batch in one merge. Only the last position's logits are computed ([b, 1, vocab])."""
        import torch

        requests = sorted(requests, key=lambda r: len(r.prompt_ids))
        caches, masks, logits = [], [], []
        for group in length_groups([len(r.prompt_ids) for r in requests], self.max_padding):
            chunk = requests[group]
            width = len(chunk[-1].prompt_ids)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, r in enumerate(chunk):
                ids[b, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
                mask[b, width - len(r.prompt_ids):] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                 **self._last_logits_only)
            self.prefills += 1
            check_cache_layers(out.past_key_values)
            caches.append(out.past_key_values)
            masks.append(mask)
            logits.append(out.logits[:, -1, :])
        self._merge(requests, caches, masks, torch.cat(logits))

    def _step(self) -> None:
        import torch

        mask = torch.cat([self._mask, self._mask.new_ones((self._mask.shape[0], 1))], dim=-1)
        with torch.no_grad():
            out = self.model(input_ids=self._last[:, None], attention_mask=mask, position_ids=self._pos[:, None],
                             past_key_values=self._cache, use_cache=True)
        self._cache, self._mask, self._pos = out.past_key_values, mask, self._pos + 1
        self.steps += 1
        self.rows_stepped += len(self._rows)
        self.waiting_stepped += len(self._waiting)
        self._sample_and_evict(self._rows, out.logits[:, -1, :])

    def _merge(self, requests, caches: list, masks: list, logits) -> None:
        """Sample the new rows' first tokens, then join them (their prefills' caches, in one concatenation) to the
        running batch."""
        import torch

        pos = torch.cat([m.sum(-1) for m in masks])
        if self._rows:
            caches, masks, pos = [self._cache, *caches], [self._mask, *masks], torch.cat([self._pos, pos])
        self._cache, self._mask = concat_caches(caches, masks)
        self._pos = pos
        old = self._rows
        self._rows = [*old, *requests]
        self._last = torch.cat([self._last, torch.zeros(len(requests), dtype=torch.long, device=pos.device)]) \
            if old else torch.zeros(len(requests), dtype=torch.long, device=pos.device)
        self._sample_and_evict(requests, logits, offset=len(old))

    def _sample_and_evict(self, rows: list[_Request], logits, offset: int = 0) -> None:
        """Draw one token for ``rows`` (rows ``offset:`` of the batch), then drop every finished row."""
        import numpy as np
        import torch

        from mars2.backends.sampler import next_tokens, row_uniforms

        temperature = torch.tensor([r.temperature for r in rows], dtype=logits.dtype, device=logits.device)
        top_p = torch.tensor([r.top_p for r in rows], dtype=logits.dtype, device=logits.device)
        uniforms = row_uniforms(np.asarray([r.seed for r in rows], dtype=np.uint64), [len(r.tokens) for r in rows])
        token, logprob = next_tokens(logits.float(), temperature, top_p, uniforms)
        self._last[offset:offset + len(rows)] = token
        keep = []
        for b, (r, t, lp) in enumerate(zip(rows, token.tolist(), logprob.tolist(), strict=True)):
            r.tokens.append(t)
            r.logprobs.append(lp)
            if t in self.stop_ids:
                r.future.set_result(Completion(r.tokens, r.logprobs, "stop"))
            elif len(r.tokens) >= r.max_new_tokens:
                r.future.set_result(Completion(r.tokens, r.logprobs, "length"))
            else:
                keep.append(offset + b)
        keep = list(range(offset)) + keep
        if len(keep) < len(self._rows):
            self._evict(keep)

    def _evict(self, keep: list[int]) -> None:
        import torch

        with self._cv:
            self._rows = [self._rows[i] for i in keep]
            if not self._rows:
                self._cache = self._mask = self._last = self._pos = None
                self._cv.notify_all()
                return
        index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
        mask = self._mask[index]
        first = int(mask.any(dim=0).nonzero()[0])  # columns before it are padding for every remaining row
        for layer in self._cache.layers:
            layer.keys, layer.values = layer.keys[index, :, first:], layer.values[index, :, first:]
        self._mask, self._last, self._pos = mask[:, first:], self._last[index], self._pos[index]


def last_logits_only(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it: a prefill needs the last position's logits only
    ([B, 1, vocab] instead of [B, L, vocab])."""
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def check_cache_layers(cache) -> None:
    """The merge and the eviction pad and slice ``keys``/``values`` [B, H, L, D]: full-attention dynamic layers only."""
    from transformers.cache_utils import DynamicLayer

    for layer in getattr(cache, "layers", [None]):
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(f"continuous batching needs full-attention DynamicLayer caches, this model's "
                                      f"cache has {type(layer).__name__}")


def length_groups(lengths: list[int], max_padding: float) -> list[slice]:
    """Split sorted prompt ``lengths`` into consecutive groups each prefilled as one left-padded batch, starting a
    new group where padding every prompt so far to the next length would exceed ``max_padding`` of the group's
    tokens: padded tokens cost a prefill as much as real ones (attention quadratically), while a prefill of a few
    long prompts costs about as much per token as a large one."""
    groups, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] * (i + 1 - start) > (1 + max_padding) * sum(lengths[start:i + 1]):
            groups.append(slice(start, i))
            start = i
    return groups


def concat_caches(caches: list, masks: list):
    """Stack batches' caches on the batch axis, left-padding the shorter along the sequence axis: keys/values
    [B_i, H, L_i, D] → [Σ B_i, H, max L_i, D] (into the first cache); masks [B_i, L_i] likewise."""
    import torch
    import torch.nn.functional as F

    if len(caches) == 1:
        return caches[0], masks[0]
    width = max(m.shape[1] for m in masks)

    def left_pad(t, axis_from_end: int):
        missing = width - t.shape[-axis_from_end]
        if not missing:
            return t
        pad = [0, 0] * (axis_from_end - 1) + [missing, 0]
        return F.pad(t, pad)

    for layers in zip(*(c.layers for c in caches), strict=True):
        layers[0].keys = torch.cat([left_pad(layer.keys, 2) for layer in layers])
        layers[0].values = torch.cat([left_pad(layer.values, 2) for layer in layers])
    return caches[0], torch.cat([left_pad(m, 1) for m in masks])
