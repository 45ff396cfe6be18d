"""Supervised warm-start ("bootstrap") of a tiny agent on reference solutions of the training split.

Random tiny models never pass a test, so every reward — and every advantage — would be zero. A brief
supervised fine-tune on reference programs gives each agent a prior that passes some problems but far from
all, so the RL loop has a signal to learn from. Agents differ in data mix (a seeded share of the training
problems), seed and architecture, so their priors differ the way real heterogeneous models' do.

A tree refines failed programs, so a warm-start on generate prompts alone leaves the refine prompt out of
distribution. With ``refine_per_problem`` > 0 the mix also holds *refine* examples: a faulty variant of the
reference (one constant, operator or builtin changed: :func:`faulty_variants`) that fails a public test, shown in
the tree's refine prompt with its verdict, and the reference as the answer. With ``own_failures`` a second phase
adds the agent's own failed samples (:func:`own_failures`) as refine examples of the same kind.

The loss is next-token cross-entropy on the response tokens only (the prompt is context):

    L = − Σ_i Σ_{t ∈ response_i} log π(y_t | x_i, y_<t) / Σ_i |response_i|

Plain torch AdamW with linear warmup and cosine decay: the warm-start is a one-off on a CPU-sized model;
the RL updates that follow go through the agent's DeepSpeed engine (:mod:`mars2.train.update`).
"""

from __future__ import annotations

import io
import math
import random
import time
import tokenize
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mars2.config import BootstrapConfig
from mars2.data.schema import Problem


@dataclass(frozen=True)
class WarmStartExample:
    """One (prompt, reference answer) pair as token ids; the answer ends with EOS."""

    problem_id: str
    prompt_ids: list[int]
    response_ids: list[int]


def reference_answer(solution: str) -> str:
    """The answer format the prompts ask for: one fenced Python block."""
    return "```python\n" + solution.strip("\n") + "\n```"


def warm_start_mix(problem_ids: Sequence[str], fraction: float, seed: int) -> list[str]:
    """The agent's data mix: a seeded ``fraction`` of the training problems (at least one), in input order."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"bootstrap data_fraction must be in (0, 1], got {fraction}")
    ids = list(problem_ids)
    k = max(1, round(fraction * len(ids)))
    keep = set(random.Random(seed).sample(ids, k))
    return [i for i in ids if i in keep]


def reference_example(problem_id: str, prompt: str, reference: str, tokenizer) -> WarmStartExample:
    """``prompt`` (chat-formatted text) → the reference in the answer format, as token ids ending with EOS."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer = tokenizer(reference_answer(reference), add_special_tokens=False)["input_ids"]
    return WarmStartExample(problem_id, prompt_ids, answer + [tokenizer.eos_token_id])


def warm_start_examples(problems: Sequence[Problem], references: Mapping[str, str], tokenizer,
                        prompt_of: Callable[[Problem], str]) -> list[WarmStartExample]:
    """Tokenised examples for the problems that have a reference solution.

    ``prompt_of(problem)`` returns the full chat-formatted prompt text the agent sees at rollout time, so the
    warm-start trains exactly the input distribution the search will use.
    """
    out = [reference_example(p.id, prompt_of(p), references[p.id], tokenizer) for p in problems if p.id in references]
    if not out:
        raise ValueError("bootstrap: none of the training problems has a reference solution")
    return out


# one-token faults: each operator, builtin or keyword becomes a plausible wrong neighbour
SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+", "*": "+", "//": "%",
         "%": "//", "+=": "-=", "-=": "+=", "min": "max", "max": "min", "True": "False", "False": "True", "and": "or",
         "or": "and", "sorted": "list", "sum": "max", "any": "all", "all": "any", "abs": "int", "reversed": "sorted",
         "upper": "lower", "lower": "upper", "append": "remove", "break": "continue", "gcd": "lcm", "count": "index"}


def mutation_sites(source: str) -> list[tuple[int, int, int, str]]:
    """Every one-token fault of ``source`` as ``(line, start col, end col, replacement)``: an integer literal
    n → n + 1 and n − 1 (0 → 1), a token of :data:`SWAPS` → its swap, a short lowercase string literal → one letter
    on (``"b"`` → ``"c"``) or its last letter dropped (``"aeiou"`` → ``"aeio"``). Comments are left alone."""
    sites = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (line, start), (_, end) = tok.start, tok.end
        if tok.type == tokenize.NUMBER and tok.string.isdigit():
            n = int(tok.string)
            sites += [(line, start, end, str(m)) for m in ((n + 1, n - 1) if n > 0 else (1,))]
        elif tok.type == tokenize.STRING and tok.string[0] in "'\"" and tok.string[1:-1].isalpha() \
                and tok.string[1:-1].islower() and len(tok.string) <= 12:
            q, text = tok.string[0], tok.string[1:-1]
            faulty = chr((ord(text) - ord("a") + 1) % 26 + ord("a")) if len(text) == 1 else text[:-1]
            sites.append((line, start, end, q + faulty + q))
        elif tok.type in (tokenize.OP, tokenize.NAME) and tok.string in SWAPS:
            sites.append((line, start, end, SWAPS[tok.string]))
    return sites


def mutate(source: str, site: tuple[int, int, int, str]) -> str:
    """``source`` with one site's token replaced."""
    line, start, end, replacement = site
    lines = source.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][:start] + replacement + lines[line - 1][end:]
    return "".join(lines)


def faulty_variants(source: str, rng: random.Random, k: int) -> list[str]:
    """Up to ``k`` distinct one-token faults of ``source`` (in a seeded order) that still parse. Whether one fails a
    test is for the grader to say: a fault may be harmless (``<`` → ``<=`` on a bound never reached)."""
    sites = mutation_sites(source)
    rng.shuffle(sites)
    out: list[str] = []
    for site in sites:
        variant = mutate(source, site)
        if variant in out or variant == source:
            continue
        try:
            compile(variant, "<variant>", "exec")  # parses only; nothing runs
        except SyntaxError:
            continue
        out.append(variant)
        if len(out) == k:
            break
    return out


def faulty_attempts(problems: Sequence[Problem], references: Mapping[str, str], k: int, seed: int,
                    grade: Callable[[list[tuple[str, Sequence[Any], str | None]]], list[Any]]
                    ) -> tuple[list[tuple[Problem, str, Any]], int]:
    """Per problem with a reference, up to ``k`` faulty variants that fail a public test, each with its verdict
    (``grade``: the search's public-test grader, run in the sandbox); and how many graded variants were harmless
    (passed every public test). Three candidates per wanted variant are graded."""
    rng = random.Random(seed)
    candidates = [(p, v) for p in problems if p.id in references
                  for v in faulty_variants(references[p.id], rng, 3 * k)]
    verdicts = grade([(v, p.public_tests, p.func_name) for p, v in candidates])
    kept: dict[str, int] = {}
    out = []
    for (p, v), verdict in zip(candidates, verdicts, strict=True):
        if verdict.status != "AC" and kept.get(p.id, 0) < k:
            kept[p.id] = kept.get(p.id, 0) + 1
            out.append((p, v, verdict))
    return out, sum(v.status == "AC" for v in verdicts)


def wrong_reading_attempts(problems: Sequence[Problem], wrong: Mapping[str, Sequence[str]],
                           grade: Callable[[list[tuple[str, Sequence[Any], str | None]]], list[Any]]
                           ) -> list[tuple[Problem, str, Any]]:
    """Per problem, each program of ``wrong[problem.id]`` (another reading of its statement) that fails a public test,
    with its verdict (``grade``: the search's public-test grader, run in the sandbox), in problem order."""
    candidates = [(p, code) for p in problems for code in wrong.get(p.id, ())]
    verdicts = grade([(code, p.public_tests, p.func_name) for p, code in candidates])
    return [(p, code, v) for (p, code), v in zip(candidates, verdicts, strict=True) if v.status != "AC"]


def own_failures(problems: Sequence[Problem], backend, prompt_of: Callable[[Problem], str], *, n: int,
                 temperature: float, max_new_tokens: int, seed: int,
                 grade: Callable[[list[tuple[str | None, Sequence[Any], str | None]]], list[Any]]
                 ) -> list[tuple[Problem, str | None, Any]]:
    """The agent's own failures: ``n`` programs per problem sampled by ``backend`` from ``prompt_of(problem)`` (the
    generate prompt), graded on the public tests; those that fail, with their verdicts, in problem order."""
    from mars2.backends.base import SamplingParams, request_seed
    from mars2.search.prompts import extract_code

    params = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    outs = backend.generate([prompt_of(p) for p in problems], params,
                            [request_seed(seed, p.id, "own failures") for p in problems])
    drawn = [(p, extract_code(g.text)) for p, gens in zip(problems, outs, strict=True) for g in gens]
    verdicts = grade([(code, p.public_tests, p.func_name) for p, code in drawn])
    return [(p, code, v) for (p, code), v in zip(drawn, verdicts, strict=True) if v.status != "AC"]


def refine_examples(cases: Sequence[tuple[Problem, str, Any]], references: Mapping[str, str], tokenizer,
                    prompt_of: Callable[[Problem, str, Any, int], str]) -> list[WarmStartExample]:
    """Tokenised refine examples: ``prompt_of(problem, faulty program, its verdict, i)`` is the i-th case's
    chat-formatted refine prompt, the answer the problem's reference in the answer format."""
    return [reference_example(problem.id, prompt_of(problem, faulty, verdict, i), references[problem.id], tokenizer)
            for i, (problem, faulty, verdict) in enumerate(cases)]


def pack_sft_batch(examples: Sequence[WarmStartExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` (B, T) and ``labels`` (B, T) = −100 outside responses."""
    width = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        seq = e.prompt_ids + e.response_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(e.prompt_ids) : len(seq)] = torch.tensor(e.response_ids)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def warm_start_lr(step: int, *, steps: int, lr: float, warmup_ratio: float, min_lr_ratio: float = 0.1) -> float:
    """Linear warmup over ⌈warmup_ratio·steps⌉ steps, then cosine from ``lr`` to ``min_lr_ratio·lr``."""
    warm = max(1, math.ceil(warmup_ratio * steps))
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def supervised_warm_start(model, examples: Sequence[WarmStartExample], *, pad_id: int, steps: int, lr: float,
                          batch_size: int, seed: int, warmup_ratio: float = 0.05, grad_clip: float = 1.0,
                          progress: Callable[[int, float], None] | None = None) -> dict[str, float]:
    """``steps`` AdamW steps on random batches of ``examples`` (in place); returns loss/timing figures."""
    if steps < 1:
        raise ValueError(f"bootstrap steps must be >= 1, got {steps}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    first = last = float("nan")
    tokens = 0
    t0 = time.perf_counter()
    for step in range(steps):
        batch = pack_sft_batch(rng.sample(list(examples), min(batch_size, len(examples))), pad_id)
        for group in opt.param_groups:
            group["lr"] = warm_start_lr(step, steps=steps, lr=lr, warmup_ratio=warmup_ratio)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        tokens += int((batch["labels"] != -100).sum())
        last = float(loss.detach())
        first = last if step == 0 else first
        if progress is not None:
            progress(step + 1, last)
    model.eval()
    seconds = time.perf_counter() - t0
    return {"loss_first": first, "loss_last": last, "steps": steps, "n_examples": len(examples),
            "response_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9)}


# The recipe: one weight owner's warm-start, step by step (the bootstrap stage calls warm_start_owner).

ChatFn = Callable[[Problem, str], str]  # (problem, user prompt) -> the chat-formatted text its agent sees


def warm_start_problems(train: Sequence[Problem], fraction: float, seed: int) -> list[Problem]:
    """The owner's data mix (:func:`warm_start_mix`), in the training split's order."""
    mix = set(warm_start_mix([p.id for p in train], fraction, seed))
    return [p for p in train if p.id in mix]


def refine_prompt_of(chat: ChatFn) -> Callable[[Problem, str | None, Any, int], str]:
    """The i-th refine example's prompt: the tree's refine prompt with the case's verdict, every other one (odd i)
    with T+ detail."""
    from mars2.search.prompts import refine_prompt, result_summary

    def refining(p: Problem, code: str | None, v: Any, i: int) -> str:
        return chat(p, refine_prompt(p, code, result_summary(v.status, v.passed, v.total, v.detail,
                                                             detailed=i % 2 == 1)))

    return refining


def refine_cases(problems: Sequence[Problem], references: Mapping[str, str], bootstrap: BootstrapConfig,
                 wrong: Mapping | None,
                 grade: Callable) -> tuple[dict[str, list], dict[str, float]]:
    """The first phase's refine cases, each (problem, program, verdict): ``faulty`` (``bootstrap.refine_per_problem``
    variants of each reference that fail a public test) and ``wrong_readings`` (with ``bootstrap.wrong_readings``:
    the dataset's programs that read the statement wrongly), and their counts as metrics."""
    cases: dict[str, list] = {}
    metrics: dict[str, float] = {}
    if bootstrap.refine_per_problem:
        cases["faulty"], harmless = faulty_attempts(problems, references, bootstrap.refine_per_problem, bootstrap.seed,
                                                    grade)
        metrics = {"refine_examples": len(cases["faulty"]), "harmless_variants": harmless}
    if bootstrap.wrong_readings:
        cases["wrong_readings"] = wrong_reading_attempts(problems, wrong or {}, grade)
        metrics["wrong_reading_examples"] = len(cases["wrong_readings"])
    return cases, metrics


def fine_tune(model, examples: Sequence[WarmStartExample], *, pad_id: int, bootstrap: BootstrapConfig, steps: int,
              seed: int,
              what: str) -> dict[str, float]:
    """:func:`supervised_warm_start` at the owner's lr and batch size, with a progress bar named ``what``."""
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        job = bar.add_task(what, total=steps)
        return supervised_warm_start(model, examples, pad_id=pad_id, steps=steps, lr=bootstrap.lr,
                                     batch_size=bootstrap.batch_size, seed=seed,
                                     progress=lambda step, loss: bar.update(job, completed=step))


def own_failures_phase(model, tok, problems: Sequence[Problem], examples: list[WarmStartExample],
                       references: Mapping[str, str], chat: ChatFn, bootstrap: BootstrapConfig, grade: Callable,
                       name: str) -> tuple[list, dict[str, float]]:
    """The second phase: ``bootstrap.own_failures`` samples per problem from the warm model, its failures added as
    refine examples to the first phase's, ``bootstrap.own_failures_steps`` more steps; returns the failures and
    their metrics. A failure longer than every reference is cut at the longest one."""
    from mars2.backends.transformers_backend import TransformersBackend
    from mars2.search.prompts import generate_prompt

    longest = max(len(e.response_ids) for e in examples)
    failures = own_failures(problems, TransformersBackend(model, tok), lambda p: chat(p, generate_prompt(p)),
                            n=bootstrap.own_failures, temperature=bootstrap.own_failures_temperature,
                            max_new_tokens=longest, seed=bootstrap.seed, grade=grade)
    second = fine_tune(model, examples + refine_examples(failures, references, tok, refine_prompt_of(chat)),
                       pad_id=tok.pad_token_id, bootstrap=bootstrap, steps=bootstrap.own_failures_steps,
                       seed=bootstrap.seed + 1, what=f"own failures {name}")
    return failures, {"own_failures": len(failures), "own_failures_loss_last": second["loss_last"],
                      "own_failure_share": len(failures) / (bootstrap.own_failures * len(problems)),
                      "own_failures_seconds": second["seconds"]}


def case_rows(cases: Sequence[tuple[Problem, str | None, Any]]) -> list[dict[str, Any]]:
    """Refine cases as JSON rows: problem id, program, public status."""
    return [{"problem_id": p.id, "code": code, "status": v.status} for p, code, v in cases]


def warm_start_owner(out: Path, name: str, bootstrap: BootstrapConfig, roles: Sequence[str], init_model: str,
                     tokenizer: str, train: Sequence[Problem], references: Mapping[str, str], wrong: Mapping | None,
                     grade: Callable) -> dict:
    """Fine-tune the initial weights of owner ``name`` on its data mix: generate examples, and refine examples of
    faulty variants and of the wrong readings ``wrong`` (graded with ``grade``, the search's public-test grader in
    the sandbox); then, with ``bootstrap.own_failures``, a second phase with its own failed samples. Writes
    ``model/`` (complete: with the tokenizer files), ``mix.json`` and the refine cases (``faulty.json``,
    ``wrong_readings.json``, ``own_failures.json``) into ``out``; returns ``{"metrics": ...}``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mars2.io import atomic_write_json
    from mars2.search.prompts import chat_messages, generate_prompt
    from mars2.train.checkpoints import complete_model_folder

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    problems = warm_start_problems(train, bootstrap.data_fraction, bootstrap.seed)
    role_of = {p.id: roles[i % len(roles)] for i, p in enumerate(problems)}

    def chat(p: Problem, user_prompt: str) -> str:
        return tok.apply_chat_template(chat_messages(user_prompt, role_of[p.id]), tokenize=False,
                                       add_generation_prompt=True)

    examples = warm_start_examples(problems, references, tok, lambda p: chat(p, generate_prompt(p)))
    cases, extra = refine_cases(problems, references, bootstrap, wrong, grade)
    for kind, found in cases.items():
        examples += refine_examples(found, references, tok, refine_prompt_of(chat))
        atomic_write_json(out / f"{kind}.json", case_rows(found))
    model = AutoModelForCausalLM.from_pretrained(init_model, local_files_only=True)
    stats = fine_tune(model, examples, pad_id=tok.pad_token_id, bootstrap=bootstrap, steps=bootstrap.steps,
                      seed=bootstrap.seed, what=f"bootstrap {name}")
    if bootstrap.own_failures:
        failures, second = own_failures_phase(model, tok, problems, examples, references, chat, bootstrap, grade, name)
        atomic_write_json(out / "own_failures.json", case_rows(failures))
        extra |= second
    model.save_pretrained(out / "model", safe_serialization=True)
    complete_model_folder(out / "model", tokenizer, source_model_dir=init_model)
    atomic_write_json(out / "mix.json", sorted(p.id for p in problems))
    return {"metrics": stats | extra}
