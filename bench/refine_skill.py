"""Does a warm-started tiny agent read its parent? A quick probe of the known-answer benchmark's refine skill.

Builds the known-answer dataset, trains a tokenizer and one tiny agent from scratch (the bootstrap's own functions:
generate examples of its data mix plus one refine example per wrong reading, every other one with T+ detail), then
samples on the first 48 held-out problems:

* fresh: 4 programs per problem from the generate prompt; the share that is exactly the true reading's program
  (``ref``) or exactly another reading's (``wrong``): their sum is how often the agent knows the template;
* refine: one refinement of every wrong-reading program (right template, wrong detail); the share that is exactly
  the true reading (it read the parent's failure), and the share that copies the parent back.

A refinement that reads its feedback fixes a wrong reading every time; one that ignores the parent writes the true
reading about as often as a fresh sample. Exact match is a lower bound of success (a passing program may differ in
spelling); nothing is executed. The figures are comparable between settings of one run of this script only as far
as the sampling noise allows (48 problems).

    python bench/refine_skill.py --arch llama --hidden 128 --steps 240
    python bench/refine_skill.py --n-problems 1024 --rename        # must the refinement copy from the parent?
    python bench/refine_skill.py --both-ways --refine-only --n-problems 1024 --steps 480

``--both-ways`` adds, per wrong reading, the mirror refine example on the problem pinned to that reading
(:func:`mars2.data.known_answer.known_answer_counterfactuals`): parent = the true reading, answer = the other one, same
statement, so only the parent and its failure tell the answer; ``--refine-only`` drops the generate examples.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from types import SimpleNamespace

import torch

from mars2.backends.base import SamplingParams
from mars2.backends.transformers_backend import TransformersBackend
from mars2.data.known_answer import known_answer_counterfactuals
from mars2.data.lcb import problem_from_lcb_row
from mars2.data.sources import build_dataset
from mars2.models.tiny import build_tiny_model, train_tokenizer
from mars2.search.prompts import chat_messages, extract_code, generate_prompt, refine_prompt, result_summary
from mars2.train.warm_start import (WarmStartExample, reference_example, supervised_warm_start, warm_start_examples,
                                    warm_start_mix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--n-problems", type=int, default=256)
    ap.add_argument("--fraction", type=float, default=0.75)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--copy-steps", type=int, default=0,
                    help="first train this many steps to copy random token strings (a copy curriculum)")
    ap.add_argument("--rename", action="store_true",
                    help="give each problem's constant a name of its own (FIRST -> FIRST_7): a refinement must copy it")
    ap.add_argument("--both-ways", action="store_true",
                    help="also show each training problem pinned to another reading, its true program as the parent")
    ap.add_argument("--refine-only", action="store_true", help="train on the refine examples alone")
    a = ap.parse_args()
    torch.manual_seed(a.seed)

    ds = build_dataset(SimpleNamespace(
        source="known_answer", path=None, release=None, start_date=None, end_date=None, n_problems=a.n_problems,
        seed=0, split="hash", eval_fraction=0.25, split_date=None, eval_ids_file=None, eval_source=None,
        eval_path=None, eval_release=None, eval_start_date=None, eval_end_date=None, reject_fatal=True))
    refs, wrong = ds.reference_solutions, ds.wrong_readings
    counterfactuals = known_answer_counterfactuals(a.n_problems, 0)
    if a.rename:
        for pid in refs:
            name = refs[pid].split(" = ", 1)[0]
            new = f"{name}_{random.Random(pid).randint(1, 9)}"
            refs[pid], wrong[pid] = (re.sub(rf"\b{name}\b", new, refs[pid]),
                                     [re.sub(rf"\b{name}\b", new, w) for w in wrong[pid]])
    held_out = ds.eval[:48]
    tok = train_tokenizer([p.statement for p in ds.train] + [p.starter_code for p in ds.train]
                          + [refs[p.id] for p in ds.train], 1024)
    model = build_tiny_model(a.arch, vocab_size=len(tok), hidden_size=a.hidden, num_layers=a.layers, num_heads=4,
                             num_kv_heads=4, intermediate_size=a.hidden * 5 // 2, max_position_embeddings=1024,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, seed=a.seed)

    def chat(user: str) -> str:
        return tok.apply_chat_template(chat_messages(user, "You are a concise Python programmer."), tokenize=False,
                                       add_generation_prompt=True)

    def failed(problem, i: int) -> str:  # what the grader says of a wrong reading: the pinning test fails
        t = problem.public_tests[-1]
        return result_summary("WA", len(problem.public_tests) - 1, len(problem.public_tests),
                              f"Input:\n{t.input}\nExpected:\n{t.output}", detailed=i % 2 == 1)

    mix = set(warm_start_mix([p.id for p in ds.train], a.fraction, a.seed))
    problems = [p for p in ds.train if p.id in mix]
    examples = [] if a.refine_only else warm_start_examples(problems, refs, tok, lambda p: chat(generate_prompt(p)))
    cases = [(p, w) for p in problems for w in wrong[p.id]]
    examples += [reference_example(p.id, chat(refine_prompt(p, w, failed(p, i))), refs[p.id], tok)
                 for i, (p, w) in enumerate(cases)]
    if a.both_ways:
        flipped = [(problem_from_lcb_row(c["row"]), refs[p.id], c["solution"]) for p in problems
                   for c in counterfactuals[p.id]]
        examples += [reference_example(q.id, chat(refine_prompt(q, parent, failed(q, i))), answer, tok)
                     for i, (q, parent, answer) in enumerate(flipped)]
    t0 = time.perf_counter()
    if a.copy_steps:
        rng = random.Random(a.seed)
        strings = [[rng.randrange(3, len(tok)) for _ in range(rng.randint(8, 48))] for _ in range(4000)]
        copies = [WarmStartExample("copy", s + [tok.eos_token_id], s + [tok.eos_token_id]) for s in strings]
        copied = supervised_warm_start(model, copies, pad_id=tok.pad_token_id, steps=a.copy_steps, lr=a.lr,
                                       batch_size=32, seed=a.seed)
        print(f"copy curriculum: {a.copy_steps} steps, loss {copied['loss_first']:.2f} -> {copied['loss_last']:.2f}")
    stats = supervised_warm_start(model, examples, pad_id=tok.pad_token_id, steps=a.steps, lr=a.lr, batch_size=16,
                                  seed=a.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"{a.arch} hidden {a.hidden} x {a.layers} layers ({params / 1e6:.2f} M), {len(examples)} examples, "
          f"{a.steps} steps: {time.perf_counter() - t0:.0f} s, last loss {stats['loss_last']:.3f}")

    backend = TransformersBackend(model, tok)

    def same(code: str | None, program: str) -> bool:
        return (code or "").strip() == program.strip()

    outs = backend.generate([chat(generate_prompt(p)) for p in held_out],
                            SamplingParams(n=4, temperature=0.7, max_new_tokens=128, seed=0),
                            [random.Random(p.id).randrange(10**9) for p in held_out])
    codes = [(p, extract_code(g.text)) for p, gens in zip(held_out, outs, strict=True) for g in gens]
    ref = sum(same(c, refs[p.id]) for p, c in codes) / len(codes)
    other = sum(any(same(c, w) for w in wrong[p.id]) for p, c in codes) / len(codes)
    print(f"fresh:  true reading {ref:.1%}, another reading {other:.1%} ({len(codes)} programs)")
    parents = [(p, w) for p in held_out for w in wrong[p.id]]
    outs = backend.generate([chat(refine_prompt(p, w, failed(p, i))) for i, (p, w) in enumerate(parents)],
                            SamplingParams(n=1, temperature=0.7, max_new_tokens=128, seed=1),
                            list(range(len(parents))))
    fixed = sum(same(extract_code(g[0].text), refs[p.id]) for (p, _), g in zip(parents, outs, strict=True))
    copied = sum(same(extract_code(g[0].text), w) for (_, w), g in zip(parents, outs, strict=True))
    print(f"refine: true reading {fixed / len(parents):.1%}, parent copied {copied / len(parents):.1%} "
          f"({len(parents)} wrong-reading parents)")


if __name__ == "__main__":
    main()
