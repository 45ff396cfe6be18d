"""Continuous batching for a transformers causal LM: requests join and leave the running batch at every decode step.

One thread owns the model and runs the decode loop. Each iteration it

1. *admits* waiting requests while the batch has room: their prompts are prefilled together (left-padded), each
   samples its first token, and their KV caches are written below the running batch's rows, right-aligned (the
   columns left of a row's own are zeros, masked out);
2. *steps* the running batch: one forward pass of every row's last token ([B, 1], with the KV cache, the
   attention mask [B, L + 1] and per-row position ids), one token sampled per row (``sampler.next_tokens``, the
   row's own seed, step, temperature and top-p);
3. *evicts* finished rows (an end token, or ``max_new_tokens``), resolving their futures: the last rows move into
   the holes, and the cache columns no remaining row attends to leave the window.

The running cache is a :class:`SlackLayer` per model layer: preallocated buffers with spare rows and columns, so a
decode step writes one column in place, where transformers' ``DynamicLayer`` copies the whole cache every step.

So the batch stays as full as the requests in flight allow, a row that finished early costs nothing, and a request
that arrives mid-flight starts at the next step instead of waiting for the batch to drain (the wave barrier of
static batching). Positions are explicit and padding is masked, so a row computes the same thing whatever it is
batched with; with the per-request uniforms of the sampler, what it samples does not depend on its batch.

Rows share the columns of one window, so the model's prefill caches must be full-attention ``DynamicLayer`` s (a
sliding-window layer would be corrupted by padding; such a model is refused with a clear error).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from mars2.shims.transformers_cache import DynamicLayer

from mars2.backends.base import cache_columns


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
        self._admitting = 0  # taken off the queue, not yet rows: neither waiting nor running during their prefill
        self._holds = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._cache = self._mask = self._last = self._pos = None
        self.steps = 0  # decode steps run (a batched forward pass of the running rows each)
        self.rows_stepped = 0  # Σ over steps of the rows in the batch: rows_stepped / steps = mean batch size
        self.waiting_stepped = 0  # Σ over steps of the requests waiting: (rows + waiting) / steps = mean demand
        # Σ over steps of rows × cache window width (the key/value columns attention reads, padding included) and of
        # the rows' own tokens (prompt and response so far): 1 − context / columns = the padding share of the reads
        self.columns_stepped = self.context_stepped = 0
        self.prefills = 0  # prefill forward passes (an admission runs one per group of similar prompt lengths)
        self.prefill_tokens = 0  # Σ prompt tokens prefilled, padding included
        # the decode thread's CPU seconds in admissions and in decode steps (torch's intra-op worker threads, used
        # with more than one torch thread, are not counted; on a GPU this is the host's share only)
        self.prefill_s = self.decode_s = 0.0

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
            self._cv.wait_for(lambda: not self._rows and not self._waiting and not self._admitting)
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
                    self._cv.notify_all()
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
                    self._admitting = len(admit)
            try:
                with self.model_lock:
                    if admit:
                        t0 = time.thread_time()
                        self._admit(admit)
                        self.prefill_s += time.thread_time() - t0
                    if self._rows:
                        t0 = time.thread_time()
                        self._step()
                        self.decode_s += time.thread_time() - t0
            except BaseException as e:  # a failed forward pass fails its rows, not the loop
                with self._cv:
                    for r in [*admit, *self._rows]:
                        if not r.future.done():
                            r.future.set_exception(e)
                    self._rows, self._cache = [], None
                    self._cv.notify_all()
            if admit:
                with self._cv:
                    self._admitting = 0
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
            self.prefill_tokens += ids.numel()
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
        self.columns_stepped += len(self._rows) * mask.shape[1]
        self.context_stepped += sum(len(r.prompt_ids) + len(r.tokens) for r in self._rows)
        self._sample_and_evict(self._rows, out.logits[:, -1, :])

    def _merge(self, requests, caches: list, masks: list, logits) -> None:
        """Sample the new rows' first tokens, then write their prefills' caches into the running batch's
        (:class:`SlackLayer`: in place where its buffers have room), below its rows."""
        import torch

        pos = torch.cat([m.sum(-1) for m in masks])
        if self._rows:
            masks, pos = [self._mask, *masks], torch.cat([self._pos, pos])
        else:
            self._cache = slack_cache(caches[0], self.max_batch)
        self._mask = left_pad_cat(masks)
        join_rows(self._cache, caches, self._mask.shape[1])
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
        """Drop the finished rows: the last kept rows move into the holes (:func:`fill_holes`: a copy of the moved
        rows only, not of the batch), and the cache's window starts at the first column a remaining row attends to."""
        import torch

        order = fill_holes(keep)
        with self._cv:
            self._rows = [self._rows[i] for i in order]
            if not self._rows:
                self._cache = self._mask = self._last = self._pos = None
                self._cv.notify_all()
                return
        index = torch.tensor(order, dtype=torch.long, device=self._mask.device)
        mask = self._mask[index]
        first = int(mask.any(dim=0).nonzero()[0])  # columns before it are padding for every remaining row
        pairs = [(new, old) for new, old in enumerate(order) if new != old]
        # one host-to-device copy per eviction, not one per layer
        moved = torch.tensor(pairs, dtype=torch.long, device=self._mask.device).T if pairs else None
        for layer in self._cache.layers:
            layer.keep_rows(moved, len(order), first)
        self._mask, self._last, self._pos = mask[:, first:], self._last[index], self._pos[index]


def last_logits_only(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it: a prefill needs the last position's logits only
    ([B, 1, vocab] instead of [B, L, vocab])."""
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def check_cache_layers(cache) -> None:
    """A merge copies prefill caches' ``keys``/``values`` [B, H, L, D] into one window of columns shared by every row:
    full-attention dynamic layers only."""
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


def fill_holes(keep: list[int]) -> list[int]:
    """The rows' new order after an eviction: row i of the new batch is old row ``order[i]``. Kept rows below
    ``len(keep)`` stay where they are; the kept rows above it fill the holes the evicted rows left. So only as many
    rows move as were evicted from below, e.g. keep [0, 2, 3, 5] → [0, 5, 2, 3]."""
    n = len(keep)
    stay = {i for i in keep if i < n}
    movers = iter(i for i in keep if i >= n)
    return [i if i in stay else next(movers) for i in range(n)]


def left_pad_cat(masks: list):
    """Stack attention masks [B_i, L_i] → [Σ B_i, max L_i], left-padded with zeros (masked out)."""
    import torch
    import torch.nn.functional as F

    width = max(m.shape[1] for m in masks)
    return torch.cat([F.pad(m, [width - m.shape[1], 0]) for m in masks])


class SlackLayer(DynamicLayer):
    """A full-attention cache layer whose ``keys``/``values`` [B, H, L, D] are views of buffers [R, H, C, D]
    (R ≥ B rows, C ≥ L columns): a decode step writes its token's keys and values into the next free column, where
    :class:`DynamicLayer` concatenates, i.e. copies the whole cache every step (O(B·L) per step, O(B·L²) per
    request). The live window is rows [0, B) and columns [start, end); when a step or a merge needs more than the
    buffers hold, :meth:`reserve` moves the window into new buffers with room to spare (a quarter of the width in
    columns, twice the rows up to ``max_rows``), so the copies are amortised over many steps."""

    def __init__(self, keys, values, max_rows: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.max_rows, self.rows, self.start, self.end = max(max_rows, keys.shape[0]), 0, 0, 0
        self.key_buf = keys.new_zeros((0, keys.shape[1], 0, keys.shape[3]))
        self.value_buf = values.new_zeros((0, values.shape[1], 0, values.shape[3]))
        self._view()

    def _view(self) -> None:
        self.keys = self.key_buf[:self.rows, :, self.start:self.end]
        self.values = self.value_buf[:self.rows, :, self.start:self.end]

    def reserve(self, rows: int, width: int, extra: int = 1) -> None:
        """Make room for ``rows`` rows, a window of ``width`` columns ending at ``end`` (a merge widens it to the
        left) and ``extra`` free columns after it (a step appends there), moving the live window into new zeroed
        buffers if the present ones are too small."""
        r, _, c, _ = self.key_buf.shape
        if rows <= r and width <= self.end and self.end + extra <= c:
            return
        rows_cap = max(rows, min(self.max_rows, 2 * rows), r)
        cols = cache_columns(width, extra)
        live = self.end - self.start
        for name in ("key_buf", "value_buf"):
            old = getattr(self, name)
            new = old.new_zeros((rows_cap, old.shape[1], cols, old.shape[3]))
            new[:self.rows, :, width - live:width] = old[:self.rows, :, self.start:self.end]
            setattr(self, name, new)
        self.start, self.end = width - live, width
        self._view()

    def update(self, key_states, value_states, *args, **kwargs):
        """Append n positions ([B, H, n, D]) in place; returns the whole window."""
        n = key_states.shape[-2]
        self.reserve(self.rows, self.end - self.start, n)
        self.key_buf[:self.rows, :, self.end:self.end + n] = key_states
        self.value_buf[:self.rows, :, self.end:self.end + n] = value_states
        self.end += n
        self._view()
        return self.keys, self.values

    def join(self, layers: list, width: int) -> None:
        """Add the rows of prefilled ``layers`` (keys [b_i, H, L_i, D]) below the live ones, the window widened to
        ``width`` columns; every row is right-aligned at ``end`` and the columns left of its own are zeroed (masked
        out, and finite, so that a zero attention weight times a stale value stays zero)."""
        rows = self.rows + sum(layer.keys.shape[0] for layer in layers)
        self.reserve(rows, width)
        start = self.end - width
        for buf in (self.key_buf, self.value_buf):
            buf[:self.rows, :, start:self.start] = 0
        self.start = start
        for layer in layers:
            b, length = layer.keys.shape[0], layer.keys.shape[2]
            for buf, new in ((self.key_buf, layer.keys), (self.value_buf, layer.values)):
                buf[self.rows:self.rows + b, :, start:self.end - length] = 0
                buf[self.rows:self.rows + b, :, self.end - length:self.end] = new
            self.rows += b
        self._view()

    def keep_rows(self, moved, rows: int, first: int) -> None:
        """After an eviction: copy row ``old`` into row ``new`` for each column (new, old) of ``moved`` (a [2, m]
        index tensor on the cache's device; None: no row moves), keep ``rows`` rows, and drop the window's first
        ``first`` columns (padding for every remaining row)."""
        self.rows, self.start = rows, self.start + first
        if moved is not None:
            new, old = moved
            for buf in (self.key_buf, self.value_buf):
                buf[new, :, self.start:self.end] = buf[old, :, self.start:self.end]
        self._view()

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError("SlackLayer is the continuous batcher's cache: rows and columns change only through "
                                  "update, join, keep_rows and reserve")

    is_croppable = False
    crop = batch_select_indices = batch_repeat_interleave = reorder_cache = reset = _refuse


def slack_cache(prefill_cache, max_rows: int):
    """An empty cache of :class:`SlackLayer` s shaped like ``prefill_cache``'s layers."""
    from mars2.shims.transformers_cache import Cache

    return Cache(layers=[SlackLayer(layer.keys, layer.values, max_rows) for layer in prefill_cache.layers])


def join_rows(cache, prefill_caches: list, width: int) -> None:
    """Append the rows of ``prefill_caches`` to ``cache`` (:meth:`SlackLayer.join`), layer by layer."""
    for i, layer in enumerate(cache.layers):
        layer.join([c.layers[i] for c in prefill_caches], width)
