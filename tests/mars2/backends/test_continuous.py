"""Tiny offline models, the transformers backend, and log-prob consistency between rollout and training."""

import threading

import pytest
import torch

from mars2.backends import SamplingParams
from mars2.backends.transformers_backend import load_transformers_backend
from mars2.train.update import Sample, pack_batch, token_logprobs


def test_tokenizer_round_trips_code_and_has_chat_template(tiny_tokenizer):
    code = "n = int(input())\nprint(sum(range(n)))\n"
    assert tiny_tokenizer.decode(tiny_tokenizer(code)["input_ids"]) == code
    text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                              add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n") and tiny_tokenizer.eos_token == "<|end|>"


ROUND_TRIP_TEXT = "x = 12345 + 6.07e3\nfor i in range(10):\n    print(i*2, 'it''s', \"ünï\")  # 99 bottles\n"


def project_ids(tokenizer_dir, model_dir) -> tuple[list[int], list[int]]:
    """Ids of a string with digits and code, and of a chat-formatted prompt, from the tokenizer folder the project
    loads and from the model folder as anyone else loads it; the two pairs must be equal."""
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "You are a careful Python programmer."},
                {"role": "user", "content": ROUND_TRIP_TEXT}]
    out = []
    for d in (tokenizer_dir, model_dir):
        tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
        chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append((tok(ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"],
                    tok(chat, add_special_tokens=False)["input_ids"], tok.decode(tok(ROUND_TRIP_TEXT)["input_ids"])))
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_saved_model_folder_gives_the_project_tokenizers_ids_through_auto_tokenizer(tmp_path, tiny_tokenizer, arch):
    """transformers builds Qwen2Tokenizer for any qwen2 folder; the tiny tokenizer must give the same ids there."""
    from mars2.models.tiny import build_tiny_model
    from mars2.train.checkpoints import complete_model_folder

    tiny_tokenizer.save_pretrained(tmp_path / "tokenizer")
    model = build_tiny_model(arch, vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=1, num_heads=4,
                             num_kv_heads=2, intermediate_size=64, max_position_embeddings=256,
                             pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id, seed=0)
    model.save_pretrained(tmp_path / "model")
    complete_model_folder(tmp_path / "model", tmp_path / "tokenizer")
    ours, theirs = project_ids(tmp_path / "tokenizer", tmp_path / "model")
    assert ours == theirs and ours[2] == ROUND_TRIP_TEXT


def test_a_trained_folder_keeps_its_source_models_generation_config(tmp_path, tiny_tokenizer):
    """save_pretrained writes transformers' own generation_config.json; the completed folder carries the source
    model's (its end tokens, its sampling defaults), and a folder without a source keeps the one it has."""
    import json

    from mars2.models.tiny import build_tiny_model
    from mars2.train.checkpoints import complete_model_folder

    tiny_tokenizer.save_pretrained(tmp_path / "tokenizer")
    model = build_tiny_model("qwen2", vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=1, num_heads=4,
                             num_kv_heads=2, intermediate_size=64, max_position_embeddings=256,
                             pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id, seed=0)
    (tmp_path / "source").mkdir()
    source = {"eos_token_id": [tiny_tokenizer.eos_token_id, 7], "temperature": 0.6, "top_p": 0.95}
    (tmp_path / "source" / "generation_config.json").write_text(json.dumps(source))
    model.save_pretrained(tmp_path / "trained")
    assert (tmp_path / "trained" / "generation_config.json").is_file()  # transformers' own, written by save
    complete_model_folder(tmp_path / "trained", tmp_path / "tokenizer", source_model_dir=tmp_path / "source")
    assert json.loads((tmp_path / "trained" / "generation_config.json").read_text()) == source
    model.save_pretrained(tmp_path / "alone")
    own = (tmp_path / "alone" / "generation_config.json").read_text()
    complete_model_folder(tmp_path / "alone", tmp_path / "tokenizer")
    assert (tmp_path / "alone" / "generation_config.json").read_text() == own


def test_two_architectures_differ(tiny_tokenizer):
    from mars2.models.tiny import build_tiny_model

    kw = dict(vocab_size=len(tiny_tokenizer), hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
              intermediate_size=64, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, seed=0)
    q, ll = build_tiny_model("qwen2", **kw), build_tiny_model("llama", **kw)
    assert type(q).__name__ == "Qwen2ForCausalLM" and type(ll).__name__ == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        build_tiny_model("gpt9", **kw)


def test_generation_shapes_finish_reasons_and_seeded_determinism(tiny_model_dir):
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir), batch_size=3)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in ("sum", "a much longer prompt about max")]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)
    out = backend.generate(prompts, params)
    assert [len(g) for g in out] == [2, 2]
    for gens in out:
        for g in gens:
            assert 1 <= len(g.response_ids) <= 12 and len(g.logprobs) == len(g.response_ids)
            assert all(lp <= 1e-6 for lp in g.logprobs)
            assert g.finish_reason == ("stop" if g.response_ids[-1] == tok.eos_token_id else "length")
            assert tok.pad_token_id not in g.prompt_ids
    again = backend.generate(prompts, params)
    assert [[g.response_ids for g in gs] for gs in out] == [[g.response_ids for g in gs] for gs in again]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_rollout_logprobs_match_the_trainers_logprobs(tiny_model_dir, temperature):
    """At any sampling temperature T the sampler's log-probs equal the training forward pass's log π_T (no spurious
    IS ratio), and differ from the untempered log π when T != 1."""
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in ("x", "print the maximum")]
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=10)
    gens = [g for gs in backend.generate(prompts, params) for g in gs]
    batch = pack_batch([Sample(g.prompt_ids, g.response_ids, g.logprobs, 0.0) for g in gens], tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(backend.model, batch["input_ids"], batch["attention_mask"], temperature)
        plain = token_logprobs(backend.model, batch["input_ids"], batch["attention_mask"])
    m = batch["mask"].bool()
    assert torch.allclose(logp[m], batch["rollout_logp"][m], atol=1e-4)
    assert torch.allclose(plain[m], batch["rollout_logp"][m], atol=1e-4) == (temperature == 1.0)


def test_generation_stops_at_every_end_token_the_model_lists(tiny_model_dir):
    """Qwen3's generation config lists two end tokens (<|im_end|>, <|endoftext|>); the tokenizer knows one. A response
    ends at whichever comes first, as vLLM does with the model's generation config."""
    from mars2.backends.base import end_token_ids, generation_config_eos

    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    prompt = tok.apply_chat_template([{"role": "user", "content": "sum"}], tokenize=False, add_generation_prompt=True)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=7)
    free = [g for gs in backend.generate([prompt], params) for g in gs]
    # make the first sampled token of the first response an extra end token: the same seed now stops right there
    extra = free[0].response_ids[0]
    assert extra != tok.eos_token_id
    from mars2.backends.transformers_backend import TransformersBackend

    backend.model.generation_config.eos_token_id = [tok.eos_token_id, extra]
    stopped = [g for gs in TransformersBackend(backend.model, tok).generate([prompt], params) for g in gs]
    assert stopped[0].response_ids == [extra] and stopped[0].finish_reason == "stop"
    for g in stopped:
        assert sum(t in (extra, tok.eos_token_id) for t in g.response_ids) <= 1  # nothing after an end token
    assert end_token_ids([5, 7], 7) == [5, 7] and end_token_ids(None, 3) == [3] and end_token_ids(9, None) == [9]
    assert generation_config_eos(str(tiny_model_dir)) in (tok.eos_token_id, [tok.eos_token_id])


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_request_samples_the_same_text_alone_or_batched_with_others(tiny_model_dir, temperature):
    """Per-request seeds: what a prompt samples depends on its prompt and seed, not on the other prompts of the call
    (padding, batch size, position in the batch) — the tree search's runs do not depend on their batching."""
    from mars2.backends.base import request_seed

    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir), batch_size=8)
    chat = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in ("sum", "a much longer prompt about the maximum of a list", "x", "print the primes below n")]
    seeds = [request_seed(0, "problem", i) for i in range(len(chat))]
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=16, seed=0)
    together = backend.generate(chat, params, seeds)
    for i, prompt in enumerate(chat):
        alone = backend.generate([prompt], params, [seeds[i]])[0]
        assert [g.response_ids for g in alone] == [g.response_ids for g in together[i]]
        assert all(a.logprobs == pytest.approx(b.logprobs, abs=1e-5) for a, b in zip(alone, together[i]))
    reordered = backend.generate(chat[::-1], params, seeds[::-1])[::-1]
    assert [[g.response_ids for g in gs] for gs in reordered] == [[g.response_ids for g in gs] for gs in together]
    if temperature > 0:  # another seed, another sample
        other = backend.generate(chat, params, [s + 1 for s in seeds])
        assert [[g.response_ids for g in gs] for gs in other] != [[g.response_ids for g in gs] for gs in together]


def test_the_sampler_draws_from_the_tempered_top_p_distribution():
    """Inverse-CDF sampling with counter-based uniforms: over many seeds the frequencies are softmax(z / T)
    (top-p: renormalised over the kept tokens, the others never drawn), and each token's reported log-prob is log π."""
    import numpy as np

    from mars2.backends.base import request_seed
    from mars2.backends.sampler import next_tokens, row_uniforms

    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20_000, 1)
    seeds = np.asarray([request_seed(0, i) for i in range(len(z))], dtype=np.uint64)
    for temperature, top_p, expected in ((1.0, 1.0, torch.softmax(z[0], -1)),
                                         (0.5, 1.0, torch.softmax(z[0] / 0.5, -1)),
                                         (1.0, 0.8, torch.softmax(z[0, :2], -1).tolist() + [0.0, 0.0])):
        token, logprob = next_tokens(z, temperature, top_p, row_uniforms(seeds, 3))
        freq = torch.bincount(token, minlength=4).double() / len(z)
        assert torch.allclose(freq, torch.as_tensor(expected, dtype=torch.float64), atol=0.015), (freq, expected)
        assert torch.allclose(logprob.exp(), torch.as_tensor(expected)[token].float(), atol=1e-5)
    u = row_uniforms(seeds[:3], 0)
    assert (u >= 0).all() and (u < 1).all() and len(set(u)) == 3 and (row_uniforms(seeds[:3], 1) != u).all()


def test_length_groups_split_sorted_prompts_where_padding_would_exceed_the_bound():
    from mars2.backends.continuous import length_groups

    def padding(lengths, group):
        chunk = lengths[group]
        return chunk[-1] * len(chunk) / sum(chunk) - 1

    lengths = [5, 6, 6, 7, 40, 41, 44, 300]
    groups = length_groups(lengths, 0.25)
    assert [lengths[g] for g in groups] == [[5, 6, 6, 7], [40, 41, 44], [300]]
    assert all(padding(lengths, g) <= 0.25 for g in groups)
    assert length_groups(lengths, 100.0) == [slice(0, 8)]  # any padding allowed: one prefill
    assert length_groups([9], 0.0) == [slice(0, 1)] and length_groups([4, 4, 4], 0.0) == [slice(0, 3)]


def test_prompts_of_different_lengths_admitted_together_prefill_in_groups_and_sample_as_alone(tiny_model_dir):
    """One admission of short and long prompts runs one prefill per length group (no short prompt padded to the long
    ones), joins them to the batch in one merge, and each request samples what it samples alone."""
    from mars2.backends.continuous import ContinuousBatcher, length_groups

    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    short = [tok("def f(x):")["input_ids"], tok("print(x)")["input_ids"]]
    long = [tok("read n numbers and print the largest of them " * 6)["input_ids"],
            tok("read n numbers and print the smallest one of them " * 6)["input_ids"]]
    assert 3 * max(map(len, short)) < min(map(len, long))
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=12)

    def batcher():
        return ContinuousBatcher(backend.model, pad_id=tok.pad_token_id, stop_ids=backend.stop_ids, max_batch=8)

    together = batcher()
    with together.drained():  # hold the decode thread so that all four are admitted at once
        futures = together.submit_many([(ids, 100 + i) for i, ids in enumerate([long[0], *short, long[1]])], **kw)
    got = [f.result(timeout=60) for f in futures]
    groups = length_groups(sorted(map(len, [*short, *long])), together.max_padding)
    assert together.prefills == len(groups) >= 2 and together.steps >= 1
    # decode step s feeds each live row its s-th token (the first was sampled at the merge): the row attends to its
    # prompt and s tokens, and the window is as wide as the longest row's, so the short rows' reads are padding
    prompts = [long[0], *short, long[1]]
    live = [[i for i, g in enumerate(got) if len(g.response_ids) > s] for s in range(1, 13)]
    assert together.steps == sum(map(bool, live))
    assert together.context_stepped == sum(len(prompts[i]) + s for s, rows in enumerate(live, 1) for i in rows)
    assert together.columns_stepped == sum(len(rows) * max(len(prompts[i]) + s for i in rows)
                                           for s, rows in enumerate(live, 1) if rows)
    assert together.columns_stepped > together.context_stepped
    for i, ids in enumerate([long[0], *short, long[1]]):
        alone = batcher().submit(ids, seed=100 + i, **kw).result(timeout=60)
        assert alone.response_ids == got[i].response_ids
        assert alone.logprobs == pytest.approx(got[i].logprobs, abs=1e-5)
    together.close()


def test_fill_holes_moves_only_the_rows_evicted_from_below():
    from mars2.backends.continuous import fill_holes

    assert fill_holes([0, 2, 3, 5]) == [0, 5, 2, 3]
    assert fill_holes([0, 1, 2]) == [0, 1, 2] and fill_holes([4]) == [4] and fill_holes([]) == []
    for keep in ([1, 3, 4, 6, 7], [5, 6, 7], [0, 3]):
        order = fill_holes(keep)
        assert sorted(order) == keep  # every kept row once
        assert all(order[i] == i for i in range(len(order)) if i in keep)  # kept rows below the cut stay put


def test_slack_layer_holds_what_concatenation_would_through_steps_merges_and_evictions():
    """SlackLayer writes in place and moves its window only when it runs out of room; whatever the sequence of decode
    steps (update), merges (join) and evictions (keep_rows), its keys/values equal the left-padded concatenation a
    DynamicLayer would hold (padding zeroed)."""
    from transformers.cache_utils import DynamicLayer

    from mars2.backends.continuous import SlackLayer, fill_holes

    g = torch.Generator().manual_seed(0)
    heads, dim = 2, 3

    def prefilled(rows, length):
        layer = DynamicLayer()
        layer.update(torch.randn(rows, heads, length, dim, generator=g), torch.randn(rows, heads, length, dim, generator=g))
        return layer

    rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # the reference: each row's real keys/values [H, n, D]

    def expected():
        width = max(k.shape[1] for k, _ in rows)
        pad = lambda t: torch.nn.functional.pad(t, [0, 0, width - t.shape[1], 0])  # noqa: E731
        return torch.stack([pad(k) for k, _ in rows]), torch.stack([pad(v) for _, v in rows])

    first = prefilled(3, 5)
    slack = SlackLayer(first.keys, first.values, max_rows=16)
    slack.join([first], 5)
    rows += [(first.keys[i], first.values[i]) for i in range(3)]
    buffers, moves = slack.key_buf, 0
    widened_in_place = 0
    for step in range(60):
        start_before = slack.start
        k, v = torch.randn(len(rows), heads, 1, dim, generator=g), torch.randn(len(rows), heads, 1, dim, generator=g)
        keys, values = slack.update(k, v)
        rows = [(torch.cat([rk, k[i]], 1), torch.cat([rv, v[i]], 1)) for i, (rk, rv) in enumerate(rows)]
        if step % 7 == 3:  # a merge: two prompt groups of other lengths join below the running rows
            # the second group is a little wider than the window: it widens it into columns evicted rows left
            longer = keys.shape[2] + min(slack.start, 3) if slack.start else 30 + step
            groups = [prefilled(2, 4 + step // 3), prefilled(1, longer)]
            width = max(keys.shape[2], *(layer.keys.shape[2] for layer in groups))
            slack.join(groups, width)
            rows += [(layer.keys[i], layer.values[i]) for layer in groups for i in range(layer.keys.shape[0])]
        if step % 5 == 4 and len(rows) > 2:  # an eviction: every third row finishes
            keep = [i for i in range(len(rows)) if i % 3 != 1]
            order = fill_holes(keep)
            rows = [rows[i] for i in order]
            width = max(k.shape[1] for k, _ in rows)
            pairs = [(n, o) for n, o in enumerate(order) if n != o]
            moved = torch.tensor(pairs, dtype=torch.long).T if pairs else None
            slack.keep_rows(moved, len(order), slack.end - slack.start - width)
        moves += slack.key_buf is not buffers
        widened_in_place += step % 7 == 3 and slack.key_buf is buffers and slack.start < start_before
        buffers = slack.key_buf
        want_k, want_v = expected()
        assert torch.equal(slack.keys, want_k) and torch.equal(slack.values, want_v), step
        assert slack.get_seq_length() == want_k.shape[2]
    assert 1 <= moves <= 20  # the window moved, but far less often than every step
    assert widened_in_place  # and a merge widened it into free columns of the same buffers


def test_requests_joining_a_running_batch_at_different_steps_sample_as_alone(tiny_model_dir):
    """Requests of different prompt lengths and lengths to generate, arriving while others decode, in a batch too
    small for all of them: rows join mid-flight, finished rows leave holes that the last rows fill, and the cache
    outgrows its spare columns; every request still samples what it samples alone."""
    import time

    from mars2.backends.continuous import ContinuousBatcher

    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    texts = ["def f(x):", "read n numbers and print the largest of them " * 3, "print(x)", "sum a list " * 9,
             "x", "sort the input lines and print them " * 2, "n = int(input())"]
    requests = [(tok(t)["input_ids"], 300 + i, 8 + 23 * (i % 4)) for i, t in enumerate(texts)]

    def batcher():
        return ContinuousBatcher(backend.model, pad_id=tok.pad_token_id, stop_ids=[], max_batch=3)

    b = batcher()
    futures = []
    for ids, seed, n in requests:
        futures.append(b.submit(ids, temperature=1.0, top_p=0.9, max_new_tokens=n, seed=seed))
        time.sleep(0.02)
    got = [f.result(timeout=120) for f in futures]
    assert b.prefills >= 3 and b.steps > max(n for *_, n in requests)
    for (ids, seed, n), together in zip(requests, got, strict=True):
        alone = batcher().submit(ids, temperature=1.0, top_p=0.9, max_new_tokens=n, seed=seed).result(timeout=120)
        assert len(together.response_ids) == n and alone.response_ids == together.response_ids
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-5)
    b.close()


def test_a_merge_that_widens_the_window_in_place_exposes_zeros_not_an_evicted_rows_keys():
    """Rows [A, B, Y]; Y, the widest, finishes and the columns only it used leave the window. C then joins in Y's
    old row (written over the window only), and a row as wide as Y widens the window back into those columns without
    moving the buffers: in C's row they must read as padding (zeros), not as Y's old keys."""
    from transformers.cache_utils import DynamicLayer

    from mars2.backends.continuous import SlackLayer

    def prefilled(rows, length, value):
        layer = DynamicLayer()
        layer.update(torch.full((rows, 1, length, 2), value), torch.full((rows, 1, length, 2), value))
        return layer

    ab, y, c, z = prefilled(2, 4, 1.0), prefilled(1, 10, 7.0), prefilled(1, 4, 3.0), prefilled(1, 10, 5.0)
    slack = SlackLayer(ab.keys, ab.values, max_rows=8)
    slack.join([ab, y], 10)
    slack.keep_rows(None, 2, 6)  # Y (the last row) finished: 6 columns of padding for A and B leave the window
    slack.join([c], 4)
    assert slack.keys.shape[2] == 4 and torch.equal(slack.keys[2], c.keys[0])
    buffers = slack.key_buf
    slack.join([z], 10)
    assert slack.key_buf is buffers  # widened in place
    assert torch.equal(slack.keys[2, :, :6], torch.zeros(1, 6, 2)) and torch.equal(slack.keys[3], z.keys[0])
    assert torch.equal(slack.values[:3, :, :6], torch.zeros(3, 1, 6, 2))
    # what generate()'s beam search or assisted decoding would call is refused, not silently undone by the next step
    assert not slack.is_croppable
    for call in (lambda: slack.crop(-1), lambda: slack.batch_select_indices(torch.tensor([0])), slack.reset):
        with pytest.raises(NotImplementedError, match="continuous batcher's cache"):
            call()


def test_drained_waits_for_a_request_taken_off_the_queue_but_still_in_its_prefill(tiny_model_dir):
    """Between leaving the queue and joining the rows, an admitted request is in its prefill: ``drained()`` (what an
    in-place weight load holds) must wait for it too, or the new weights land in the middle of its response."""
    import time

    backend, _ = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    prefilling = threading.Event()

    def slow_prefill(module, args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefilling.set()
            time.sleep(0.3)

    backend.model.register_forward_pre_hook(slow_prefill, with_kwargs=True)
    future = backend.submit("print the primes below n", SamplingParams(temperature=1.0, max_new_tokens=20), seed=1)
    assert prefilling.wait(30)
    with backend.batcher.drained():
        assert future.done() and future.result().response_ids
    backend.batcher.close()


def test_a_response_that_fails_to_decode_fails_its_future_instead_of_leaving_it_unresolved(tiny_model_dir):
    """The text is decoded in the batcher's done-callback, where concurrent.futures would log an exception and drop
    it: the caller must get the error, not wait forever."""
    backend, _ = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))

    def broken_decode(*args, **kwargs):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a broken byte")

    backend.tokenizer.decode = broken_decode
    future = backend.submit("print x", SamplingParams(max_new_tokens=3), seed=2)
    with pytest.raises(UnicodeDecodeError):
        future.result(timeout=60)
    backend.batcher.close()


def test_the_backends_declare_their_capabilities_as_protocols(tiny_model_dir):
    """The search streams to a backend with submit; the pool puts to sleep one with sleep; engine_starts reads
    starts: each capability is a runtime-checkable protocol, not a probed attribute."""
    from mars2.backends.base import CountedBackend, GenerationBackend, SleepingBackend, StreamingBackend
    from mars2.backends.engine import EngineClient

    backend, _ = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    assert isinstance(backend, GenerationBackend) and isinstance(backend, StreamingBackend)
    assert isinstance(backend, CountedBackend) and not isinstance(backend, SleepingBackend)
    assert all(hasattr(EngineClient, m) for m in ("generate", "submit", "sleep"))

    class BatchOnly:
        def generate(self, prompts, params, seeds=None):
            return []

    assert isinstance(BatchOnly(), GenerationBackend) and not isinstance(BatchOnly(), StreamingBackend)
