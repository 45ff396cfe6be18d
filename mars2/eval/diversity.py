"""Diversity of correct solutions: DA@K, AEC and G-Vendi — OUR definitions (docs/algorithm.md §19).

The MARS² paper names these three metrics but no public source defines them, so the definitions below are ours
(docs/eval.md states them and their limits):

* **algorithm class** of a program (:func:`algorithm_class`): ``level="exact"`` — the same program up to
  identifier names, comments, docstrings, type annotations and layout (hash of :func:`normalise_code`);
  ``level="structure"`` (default) — a coarser signature: maximum loop-nesting depth (following calls into the
  program's own functions), whether it recurses, and the set of library/builtin functions and methods it calls
  (input/output and conversion boiler-plate left out).
* **DA@K** (:func:`distinct_algorithms_at_k`): the expected number of distinct algorithm classes among K correct
  solutions drawn without replacement from a problem's correct solutions, in closed form — no sampling.
* **AEC** (:func:`aec`): average effective number of algorithm classes, exp(entropy of the class proportions),
  over problems with at least one correct solution.
* **G-Vendi** (:func:`g_vendi`): mean over problems of the Vendi score of the correct solutions' model-free
  AST n-gram embeddings (:func:`code_embedding`). In the literature G-Vendi (Jung et al. 2025, "Prismatic
  Synthesis") embeds samples by the loss gradients of a proxy model; ours is a model-free stand-in.

Safety: programs are only parsed with :mod:`ast`; nothing here compiles, imports or executes them.
Keys depend on ``ast``'s node types, so compare classes computed with the same Python minor version.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from math import comb
from typing import Literal

import numpy as np
import pandas as pd

from mars2.eval.metrics import _check_binary, _check_table

Level = Literal["exact", "structure"]

UNPARSED = "#unparsed "
"""Prefix of :func:`normalise_code`'s fallback for code that does not parse (``ast.dump`` never starts so)."""

# Calls that read/write data or convert types: they differ between equivalent programs in small ways only.
_BOILERPLATE = frozenset({
    "print", "input", "open", "exit", "quit", "int", "str", "float", "bool", "list", "tuple", "map", "len",
    "range", "enumerate", "zip", "reversed", "abs", "min", "max", "sum", "iter", "next",
    "sys.exit", "sys.setrecursionlimit", "threading.stack_size", "threading.Thread",
    ".split", ".strip", ".rstrip", ".lstrip", ".readline", ".readlines", ".read", ".write", ".flush", ".join",
    ".format", ".append", ".extend", ".encode", ".decode", ".__next__", ".start",
})
_BOILERPLATE_PREFIXES = ("sys.stdin", "sys.stdout", "io.")
# Different spellings of one primitive.
_ALIASES = {".sort": "sorted", "functools.cache": "functools.lru_cache", "heapq.heappushpop": "heapq.heappush"}
_INPUT_CALLS = frozenset({"input", "open", ".split", ".readline", ".readlines", ".read", ".__next__"})
_WRAPPERS = frozenset({"map", "list", "tuple", "int", "str", "iter", "enumerate"})
_OUTPUT_CALLS = frozenset({"print", ".write"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


# ---------------------------------------------------------------------------------------------- normalisation


def normalise_code(code: str) -> str:
    """Canonical text of a program: ``ast.dump`` (no positions) after stripping and renaming.

    Removed: comments, docstrings and other bare string statements, type annotations, layout.
    Renamed to v0, v1, … in order of first appearance: every name the program binds (variables, arguments,
    functions, classes, exception/match captures) and keyword arguments naming its own parameters.
    Kept: builtins, attribute names, imported names, constants. Code that does not parse gives
    ``UNPARSED + whitespace-normalised text``.
    """
    tree = _parse(code)
    if tree is None:
        return UNPARSED + " ".join(code.split())
    try:
        scope = _Scope.of(tree)
        return ast.dump(_Rename(scope).visit(tree), annotate_fields=True, include_attributes=False)
    except RecursionError:
        return UNPARSED + " ".join(code.split())


def algorithm_class(code: str, level: Level = "structure") -> str:
    """Key of the program's algorithm class (module docstring). Equal keys = same class.

    ``exact``: ``"exact:" + sha256(normalise_code(code))[:16]``.
    ``structure``: ``"structure:depth=<d>;recursion=<0|1>;calls=<sorted, comma-separated>"``.
    Unparsable code falls back to ``"unparsed:" + sha256(whitespace-normalised text)[:16]`` at both levels.
    """
    if level not in ("exact", "structure"):
        raise ValueError(f"algorithm_class: level must be 'exact' or 'structure', got {level!r}")
    if not isinstance(code, str):
        raise TypeError(f"algorithm_class: code must be a str, got {type(code).__name__}")
    return _algorithm_class(code, level)


@lru_cache(maxsize=4096)
def _algorithm_class(code: str, level: str) -> str:
    text = normalise_code(code)
    if text.startswith(UNPARSED):
        return "unparsed:" + _sha(text)
    if level == "exact":
        return "exact:" + _sha(text)
    try:
        return "structure:" + _Structure(_parse(code)).signature()
    except RecursionError:
        return "unparsed:" + _sha(text)


# ---------------------------------------------------------------------------------------------- the metrics


def distinct_algorithms_at_k(codes: Sequence[str], k: int, level: Level = "structure",
                             mode: Literal["expected", "first"] = "expected") -> float:
    """DA@K of one problem, ``codes`` = its correct solutions (n of them, in generation order).

    ``expected`` (default): E[#distinct classes in a uniformly random K-subset]
        = Σ_a [1 − C(n − m_a, K) / C(n, K)],  m_a = number of solutions in class a  (= #classes when K ≥ n).
    ``first``: the number of distinct classes among the first K solutions.
    No correct solution → 0.
    """
    if k < 1:
        raise ValueError(f"DA@K needs K >= 1, got {k}")
    if mode not in ("expected", "first"):
        raise ValueError(f"DA@K mode must be 'expected' or 'first', got {mode!r}")
    classes = [algorithm_class(c, level) for c in codes]
    if mode == "first":
        return float(len(set(classes[:k])))
    n = len(classes)
    if k >= n:
        return float(len(set(classes)))
    return float(sum(1 - comb(n - m, k) / comb(n, k) for m in Counter(classes).values()))


def effective_classes(codes: Sequence[str], level: Level = "structure") -> float:
    """exp(H(p)), p_a = m_a / n the class proportions of one problem's solutions (Hill number of order 1).

    Equals the number of classes when they are equally common, 1 when there is one; 0 for no solution. It is
    also the Vendi score under the kernel "same class" (1) / "different class" (0).
    """
    if not codes:
        return 0.0
    n = len(codes)
    p = np.array(list(Counter(algorithm_class(c, level) for c in codes).values()), dtype=float) / n
    return float(np.exp(-(p * np.log(p)).sum()))


def aec(per_problem_correct_codes: Mapping[str, Sequence[str]], level: Level = "structure") -> float:
    """AEC = mean over problems with ≥ 1 correct solution of :func:`effective_classes` of those solutions.

    Problems with no correct solution are left out (count them with :func:`diversity_metrics`); NaN if no
    problem has one.
    """
    if not per_problem_correct_codes:
        raise ValueError("aec: no problems given")
    values = [effective_classes(codes, level) for codes in per_problem_correct_codes.values() if len(codes)]
    return float(np.mean(values)) if values else float("nan")


def vendi_score(X: np.ndarray) -> float:
    """Vendi score (Friedman & Dieng 2023) of n items embedded as rows of X, shape (n, d).

    VS = exp(−Σ_i λ_i log λ_i), λ = eigenvalues of K/n, K_ij = cos(x_i, x_j) (n × n). 1 when all items are
    identical (up to scale), n when they are mutually orthogonal.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"vendi_score needs a non-empty (n, d) array, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("vendi_score: the embedding has NaN or infinite entries")
    norms = np.linalg.norm(X, axis=1)
    if (norms == 0).any():
        raise ValueError("vendi_score: a row is all zeros, so its cosine similarity is undefined")
    Xn = X / norms[:, None]
    n, d = Xn.shape
    # Xn Xn^T / n and Xn^T Xn / n share their non-zero eigenvalues; take the smaller matrix.
    gram = Xn @ Xn.T if n <= d else Xn.T @ Xn
    lam = np.linalg.eigvalsh(gram / n)
    lam = lam[lam > 1e-12]  # round-off leaves tiny negative eigenvalues; 0 log 0 = 0
    return float(np.exp(-(lam * np.log(lam)).sum()))


def code_embedding(codes: Sequence[str], dim: int = 2048, idf: bool = True) -> np.ndarray:
    """Model-free embedding of programs, shape (n, dim), rows L2-normalised.

    Features: vertical AST n-grams (a node with its parent and grandparent, n = 1..3) of node types, where a
    non-local name or an attribute also carries its identifier (``Name:sorted``, ``Attribute.append``); local
    names do not, so renaming changes nothing. Each n-gram is hashed (blake2b, stable across runs) into
    ``dim`` buckets; weight = log(1 + count), times the smoothed idf log((1 + n)/(1 + df)) + 1 over ``codes``
    when ``idf``. Unparsable code is embedded by its word/punctuation tokens.
    """
    if dim < 1:
        raise ValueError(f"code_embedding: dim must be >= 1, got {dim}")
    if not len(codes):
        raise ValueError("code_embedding: no programs given")
    counts = np.zeros((len(codes), dim))
    for i, code in enumerate(codes):
        if not isinstance(code, str):
            raise TypeError(f"code_embedding: code {i} is a {type(code).__name__}, not a str")
        for token in _tokens(code):
            counts[i, _bucket(token, dim)] += 1
    X = np.log1p(counts)
    if idf:
        df = (counts > 0).sum(axis=0)
        X = X * (np.log((1 + len(codes)) / (1 + df)) + 1)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def g_vendi(codes_by_problem: Mapping[str, Sequence[str]], dim: int = 2048) -> float:
    """Our G-Vendi: mean over problems with ≥ 1 program of vendi_score(code_embedding(programs)).

    :func:`diversity_metrics` passes each problem's correct solutions. NaN if no problem has a program.
    """
    if not codes_by_problem:
        raise ValueError("g_vendi: no problems given")
    values = [vendi_score(code_embedding(codes, dim)) for codes in codes_by_problem.values() if len(codes)]
    return float(np.mean(values)) if values else float("nan")


def diversity_metrics(nodes_or_samples: pd.DataFrame, k: int, level: Level = "structure") -> dict[str, float]:
    """DA@K, AEC and G-Vendi of the correct solutions (reward = 1) in a table with ``problem_id``, ``code``,
    ``reward`` (rows in generation order, or sorted by ``node_id`` when present); all agents pooled — filter
    the table by ``agent`` for one agent's numbers.

    Returns ``da_at_k`` and ``g_vendi`` and ``aec`` (means over problems with ≥ 1 correct solution; NaN if
    none), ``n_problems_with_correct``, ``n_problems`` and ``k``.
    """
    if k < 1:
        raise ValueError(f"DA@K needs K >= 1, got {k}")
    _check_table(nodes_or_samples, ("problem_id", "code", "reward"), "diversity")
    _check_binary(nodes_or_samples["reward"], "diversity")
    table = nodes_or_samples
    if "node_id" in table.columns:
        table = table.sort_values(["problem_id", "node_id"], kind="stable")
    correct = table[table["reward"].astype(float) == 1.0]
    bad = correct.loc[~correct["code"].map(lambda c: isinstance(c, str)), "problem_id"]
    if len(bad):
        raise ValueError(f"diversity: correct solution(s) without code text, e.g. problem {bad.iloc[0]!r}")
    solved = {pid: g["code"].tolist() for pid, g in correct.groupby("problem_id", sort=True)}
    n_problems = int(table["problem_id"].nunique())
    if not solved:
        return {"da_at_k": float("nan"), "aec": float("nan"), "g_vendi": float("nan"),
                "n_problems_with_correct": 0, "n_problems": n_problems, "k": k}
    return {
        "da_at_k": float(np.mean([distinct_algorithms_at_k(c, k, level) for c in solved.values()])),
        "aec": aec(solved, level),
        "g_vendi": g_vendi(solved),
        "n_problems_with_correct": len(solved),
        "n_problems": n_problems,
        "k": k,
    }


# ---------------------------------------------------------------------------------------------- AST helpers


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _parse(code: str) -> ast.Module | None:
    if not isinstance(code, str):
        raise TypeError(f"expected program text (str), got {type(code).__name__}")
    try:
        return _Strip().visit(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _is_string_statement(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


class _Strip(ast.NodeTransformer):
    """Drops docstrings and other bare string statements, and type annotations."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                kept = [s for s in stmts if not _is_string_statement(s)]
                if not kept and field == "body" and not isinstance(node, ast.Module):
                    kept = [ast.Pass()]
                setattr(node, field, kept)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, type_comment=None))


class _Scope:
    """What a program binds: local names, its own functions' names and parameters, imported names."""

    def __init__(self) -> None:
        self.local: set[str] = set()
        self.params: set[str] = set()
        self.functions: dict[str, ast.AST] = {}
        self.imports: dict[str, str] = {}

    @classmethod
    def of(cls, tree: ast.AST) -> _Scope:
        scope = cls()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                scope.local.add(node.id)
            elif isinstance(node, ast.arg):
                scope.local.add(node.arg)
                scope.params.add(node.arg)
            elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                scope.local.add(node.name)
                if isinstance(node, _FUNCTIONS):
                    scope.functions[node.name] = node
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                scope.local.update(node.names)
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                scope.local.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                scope.local.add(node.rest)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    scope.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name != "*":
                        scope.imports[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name
        scope.local -= scope.imports.keys()
        return scope


class _Rename(ast.NodeTransformer):
    """Renames the program's own identifiers to v0, v1, … in order of first appearance (field order)."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope
        self.names: dict[str, str] = {}

    def _canon(self, name: str) -> str:
        if name not in self.scope.local:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._canon(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._canon(node.arg)
        return self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        # Only keywords naming the program's own parameters: sorted(a, key=…) must keep "key".
        if node.arg in self.scope.params:
            node.arg = self._canon(node.arg)
        return self.generic_visit(node)

    def _named(self, node: ast.AST) -> ast.AST:
        if getattr(node, "name", None):
            node.name = self._canon(node.name)
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_ExceptHandler = _named
    visit_MatchAs = visit_MatchStar = _named

    def visit_MatchMapping(self, node: ast.MatchMapping) -> ast.AST:
        if node.rest:
            node.rest = self._canon(node.rest)
        return self.generic_visit(node)

    def _names(self, node: ast.Global | ast.Nonlocal) -> ast.AST:
        node.names = [self._canon(n) for n in node.names]
        return node

    visit_Global = visit_Nonlocal = _names


class _Structure:
    """The ``structure`` signature: loop-nesting depth, recursion, library calls (see algorithm_class)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.scope = _Scope.of(tree)
        self._inner: dict[str, int] = {}
        self._pending: set[str] = set()

    def signature(self) -> str:
        calls, recursive = self._calls()
        depth = self._depth(self.tree, 0)
        return f"depth={depth};recursion={int(recursive)};calls={','.join(sorted(calls))}"

    def _resolve(self, func: ast.expr) -> tuple[str, str] | None:
        """("user", name) for the program's own function, ("lib", name) for a library call, None for neither."""
        if isinstance(func, ast.Name):
            if func.id in self.scope.imports:
                return "lib", self.scope.imports[func.id]
            if func.id in self.scope.functions:
                return "user", func.id
            return None if func.id in self.scope.local else ("lib", func.id)
        if isinstance(func, ast.Attribute):
            parts, base = [func.attr], func.value
            while isinstance(base, ast.Attribute):
                parts.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in self.scope.imports:
                return "lib", ".".join([self.scope.imports[base.id], *reversed(parts)])
            if isinstance(base, ast.Name) and base.id in ("self", "cls") and func.attr in self.scope.functions:
                return "user", func.attr
            return "lib", "." + func.attr
        return None

    def _calls(self) -> tuple[set[str], bool]:
        calls: set[str] = set()
        recursive = False
        for fn, node in _walk_with_function(self.tree):
            targets = [node.func] if isinstance(node, ast.Call) else []
            if isinstance(node, _FUNCTIONS):
                # A bare decorator (@cache) is a call too.
                targets = [d for d in node.decorator_list if not isinstance(d, ast.Call)]
            for target in targets:
                hit = self._resolve(target)
                if hit is None:
                    continue
                kind, name = hit
                if kind == "user":
                    recursive |= name in fn
                    continue
                name = _ALIASES.get(name, name)
                if name not in _BOILERPLATE and not name.startswith(_BOILERPLATE_PREFIXES):
                    calls.add(name)
        return calls, recursive

    def _is_input(self, expr: ast.expr) -> bool:
        """An iteration over input data (``input().split()``, ``map(int, …)`` of it, ``sys.stdin``)."""
        if isinstance(expr, ast.Call):
            hit = self._resolve(expr.func)
            name = hit[1] if hit and hit[0] == "lib" else ""
            if name in _INPUT_CALLS or name.startswith("sys.stdin"):
                return True
            return name in _WRAPPERS and any(self._is_input(a) for a in expr.args)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            hit = self._resolve(expr)
            return bool(hit and hit[1].startswith("sys.stdin"))
        return False

    def _is_output(self, body: list[ast.stmt]) -> bool:
        """A loop body that only prints."""
        def prints(s: ast.stmt) -> bool:
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
                return False
            hit = self._resolve(s.value.func)
            return bool(hit and (hit[1] in _OUTPUT_CALLS or hit[1].startswith("sys.stdout")))
        return all(prints(s) for s in body)

    def _function_depth(self, name: str) -> int:
        """Loop depth inside the program's own function ``name``, following its calls (cycles cut)."""
        if name in self._inner:
            return self._inner[name]
        if name in self._pending:
            return 0
        self._pending.add(name)
        node = self.scope.functions[name]
        depth = max(self._depth(s, 0) for s in node.body)
        self._pending.discard(name)
        self._inner[name] = depth
        return depth

    def _depth(self, node: ast.AST, d: int) -> int:
        """Maximum loop-nesting depth reached inside ``node`` when ``node`` sits at depth d."""
        if isinstance(node, (*_FUNCTIONS, ast.Lambda)):
            # Analysed where it is called (and from depth 0 as a possible entry point).
            body = node.body if isinstance(node.body, list) else [node.body]
            return max([d, *(self._depth(s, 0) for s in body)])
        if isinstance(node, (ast.For, ast.AsyncFor)):
            counted = not self._is_input(node.iter) and not self._is_output(node.body)
            inner = d + 1 if counted else d
            parts = [self._depth(node.iter, d), self._depth(node.target, inner),
                     *(self._depth(s, inner) for s in node.body), *(self._depth(s, d) for s in node.orelse)]
            return max(inner, *parts)
        if isinstance(node, ast.While):
            parts = [self._depth(node.test, d + 1), *(self._depth(s, d + 1) for s in node.body),
                     *(self._depth(s, d) for s in node.orelse)]
            return max(d + 1, *parts)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            level, best = d, d
            for gen in node.generators:
                best = max(best, self._depth(gen.iter, level))
                if not self._is_input(gen.iter):
                    level += 1
                best = max(best, level, *(self._depth(c, level) for c in gen.ifs))
            elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return max(best, *(self._depth(e, level) for e in elts))
        best = d
        if isinstance(node, ast.Call):
            hit = self._resolve(node.func)
            if hit and hit[0] == "user":
                best = d + self._function_depth(hit[1])
        for child in ast.iter_child_nodes(node):
            best = max(best, self._depth(child, d))
        return best


def _walk_with_function(tree: ast.AST) -> Iterator[tuple[frozenset[str], ast.AST]]:
    """Every node with the names of the functions enclosing it."""
    stack: list[tuple[ast.AST, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        node, enclosing = stack.pop()
        yield enclosing, node
        inner = enclosing | {node.name} if isinstance(node, _FUNCTIONS) else enclosing
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


# ---------------------------------------------------------------------------------------------- embedding


def _tokens(code: str) -> list[str]:
    tree = _parse(code)
    if tree is None:
        return ["UNPARSED", *(f"tok:{t}" for t in re.findall(r"\w+|[^\w\s]", code))]
    scope = _Scope.of(tree)
    tokens: list[str] = []
    stack: list[tuple[ast.AST, tuple[str, ...]]] = [(tree, ())]
    while stack:
        node, ancestors = stack.pop()
        if isinstance(node, ast.expr_context):
            continue
        label = type(node).__name__
        if isinstance(node, ast.Name) and node.id not in scope.local:
            label += ":" + scope.imports.get(node.id, node.id)
        elif isinstance(node, ast.Attribute):
            label += "." + node.attr
        path = (*ancestors, label)
        tokens.extend(" / ".join(path[-n:]) for n in range(1, min(3, len(path)) + 1))
        stack.extend((child, path[-2:]) for child in ast.iter_child_nodes(node))
    return tokens


def _bucket(token: str, dim: int) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little") % dim


__all__ = [
    "UNPARSED", "aec", "algorithm_class", "code_embedding", "distinct_algorithms_at_k", "diversity_metrics",
    "effective_classes", "g_vendi", "normalise_code", "vendi_score",
]
