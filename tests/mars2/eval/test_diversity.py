"""Our diversity metrics (mars2/eval/diversity.py): normalisation, classes, DA@K, AEC, Vendi, G-Vendi."""

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from mars2.eval import (
    aec,
    algorithm_class,
    code_embedding,
    distinct_algorithms_at_k,
    diversity_metrics,
    effective_classes,
    g_vendi,
    normalise_code,
    vendi_score,
)
from mars2.eval.diversity import UNPARSED

BUBBLE = '''
def main():
    """Bubble sort."""
    n = int(input())
    arr = list(map(int, input().split()))
    for i in range(n):
        for j in range(n - 1 - i):
            if arr[j] > arr[j + 1]:  # swap
                arr[j], arr[j + 1] = arr[j + 1], arr[j]
    print(*arr)


main()
'''

# The same program with other names, comments, docstring and annotations.
BUBBLE_RENAMED = '''
def solve() -> None:
    # read
    size: int = int(input())
    values = list(map(int, input().split()))
    for a in range(size):
        for b in range(size - 1 - a):
            if values[b] > values[b + 1]:
                values[b], values[b + 1] = values[b + 1], values[b]
    print(*values)
solve()
'''

# Bubble sort again, with a different input idiom and no function: same algorithm, different program.
BUBBLE_INLINE = '''
m = int(input())
xs = [int(t) for t in input().split()]
for p in range(m):
    for q in range(m - 1 - p):
        if xs[q] > xs[q + 1]:
            xs[q], xs[q + 1] = xs[q + 1], xs[q]
print(*xs)
'''

BUILTIN_SORT = '''
n = int(input())
a = sorted(map(int, input().split()))
print(*a)
'''

METHOD_SORT = '''
n = int(input())
b = list(map(int, input().split()))
b.sort()
print(*b)
'''

HEAP_SORT = '''
import heapq
n = int(input())
h = list(map(int, input().split()))
heapq.heapify(h)
print(*[heapq.heappop(h) for _ in range(n)])
'''

# ------------------------------------------------------------------------------------------------ normalise


def test_renaming_comments_docstrings_annotations_do_not_change_the_normal_form():
    assert normalise_code(BUBBLE) == normalise_code(BUBBLE_RENAMED)
    assert algorithm_class(BUBBLE, "exact") == algorithm_class(BUBBLE_RENAMED, "exact")
    assert normalise_code(BUBBLE) != normalise_code(BUBBLE_INLINE)
    assert "'arr'" not in normalise_code(BUBBLE) and "Bubble" not in normalise_code(BUBBLE)


def test_builtins_attributes_imports_and_library_keywords_are_kept():
    text = normalise_code("import numpy as np\nx = np.zeros(3)\ny = sorted(x, key=abs)\nx.sum()\n")
    for kept in ("'np'", "'zeros'", "'sorted'", "'abs'", "'sum'", "arg='key'"):
        assert kept in text, kept
    assert "'x'" not in text and "'y'" not in text
    # keywords naming the program's own parameters are renamed with them
    assert normalise_code("def f(a, b):\n    return a\nf(b=1, a=2)\n") == \
        normalise_code("def g(p, q):\n    return p\ng(q=1, p=2)\n")


def test_names_are_numbered_by_first_appearance():
    assert normalise_code("b = 1\na = b") == normalise_code("x = 1\ny = x")
    assert normalise_code("b = 1\na = b") != normalise_code("x = 1\ny = 1")


def test_unparsable_code_has_a_stable_marked_fallback():
    text = normalise_code("def f(:\n    return  1\n")
    assert text.startswith(UNPARSED)
    assert text == normalise_code("def  f(:   return 1")
    assert algorithm_class("def f(:", "structure") == algorithm_class("def  f(:", "exact")
    assert algorithm_class("def f(:").startswith("unparsed:")


def test_code_is_parsed_never_run(tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\nraise SystemExit(3)\n"
    normalise_code(code)
    algorithm_class(code)
    code_embedding([code])
    assert not marker.exists()


def test_bad_arguments():
    with pytest.raises(ValueError):
        algorithm_class(BUBBLE, "fuzzy")
    with pytest.raises(TypeError):
        algorithm_class(None)


# ------------------------------------------------------------------------------------------------ classes


def test_structure_level_groups_one_algorithm_and_separates_others():
    bubble = {algorithm_class(c) for c in (BUBBLE, BUBBLE_RENAMED, BUBBLE_INLINE)}
    assert len(bubble) == 1
    assert algorithm_class(BUBBLE) == "structure:depth=2;recursion=0;calls="
    assert algorithm_class(BUILTIN_SORT) == "structure:depth=0;recursion=0;calls=sorted"
    assert algorithm_class(METHOD_SORT) == algorithm_class(BUILTIN_SORT)        # .sort() spells sorted()
    assert algorithm_class(HEAP_SORT) == "structure:depth=1;recursion=0;calls=heapq.heapify,heapq.heappop"
    assert algorithm_class(BUBBLE, "exact") != algorithm_class(BUILTIN_SORT, "exact")


def test_structure_sees_recursion_memoisation_and_loops_inside_called_functions():
    fib = ("from functools import lru_cache\n@lru_cache(None)\ndef f(n):\n"
           "    return n if n < 2 else f(n - 1) + f(n - 2)\nprint(f(int(input())))\n")
    assert algorithm_class(fib) == "structure:depth=0;recursion=1;calls=functools.lru_cache"
    inner = "def g(n):\n    for i in range(n):\n        pass\nfor t in range(3):\n    g(t)\n"
    assert algorithm_class(inner).startswith("structure:depth=2;")
    method = ("class Solution:\n    def dfs(self, n):\n        return 0 if n == 0 else self.dfs(n - 1)\n")
    assert ";recursion=1;" in algorithm_class(method)


# ------------------------------------------------------------------------------------------------ DA@K, AEC


def test_da_at_k_hand_example():
    codes = [BUBBLE, BUBBLE_RENAMED, BUILTIN_SORT]          # classes: A, A, B
    # K=2: A appears unless the pair is the one without A: 1 − C(1,2)/C(3,2) = 1; B: 1 − C(2,2)/C(3,2) = 2/3
    assert distinct_algorithms_at_k(codes, 2) == pytest.approx(5 / 3)
    assert distinct_algorithms_at_k(codes, 1) == pytest.approx(1.0)
    assert distinct_algorithms_at_k(codes, 3) == 2.0
    assert distinct_algorithms_at_k(codes, 10) == 2.0
    assert distinct_algorithms_at_k(codes, 2, mode="first") == 1.0
    assert distinct_algorithms_at_k(codes[::-1], 2, mode="first") == 2.0
    assert distinct_algorithms_at_k([], 5) == 0.0
    assert distinct_algorithms_at_k(codes, 2, level="exact") == pytest.approx(5 / 3)


def test_da_at_k_equals_brute_force_mean_over_subsets():
    codes = [BUBBLE, BUBBLE_INLINE, BUILTIN_SORT, METHOD_SORT, HEAP_SORT, BUBBLE_RENAMED]
    classes = [algorithm_class(c) for c in codes]
    assert len(set(classes)) == 3
    for k in range(1, len(codes) + 1):
        subsets = list(combinations(range(len(codes)), k))
        brute = np.mean([len({classes[i] for i in s}) for s in subsets])
        assert distinct_algorithms_at_k(codes, k) == pytest.approx(brute), k


def test_da_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        distinct_algorithms_at_k([BUBBLE], 0)
    with pytest.raises(ValueError):
        distinct_algorithms_at_k([BUBBLE], 1, mode="random")


def test_aec_hand_example():
    two_to_one = math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert effective_classes([BUBBLE, BUBBLE_RENAMED, BUILTIN_SORT]) == pytest.approx(two_to_one)
    assert effective_classes([BUBBLE, BUILTIN_SORT, HEAP_SORT]) == pytest.approx(3.0)
    assert effective_classes([BUBBLE, BUBBLE_INLINE]) == pytest.approx(1.0)
    got = aec({"p": [BUBBLE, BUBBLE_RENAMED, BUILTIN_SORT], "q": [HEAP_SORT], "r": []})
    assert got == pytest.approx((two_to_one + 1.0) / 2)          # r (no correct solution) left out
    assert math.isnan(aec({"r": []}))
    with pytest.raises(ValueError):
        aec({})


# ------------------------------------------------------------------------------------------------ Vendi


def test_vendi_identical_and_orthogonal():
    assert vendi_score(np.ones((5, 3))) == pytest.approx(1.0)
    assert vendi_score(np.array([[1.0, 2.0], [2.0, 4.0], [-0.5, -1.0]])) == pytest.approx(1.0)  # cos ±1
    assert vendi_score(np.eye(4)) == pytest.approx(4.0)
    assert vendi_score(np.eye(6)[:3]) == pytest.approx(3.0)
    assert vendi_score(np.array([[3.0, 0.0]])) == pytest.approx(1.0)


def test_vendi_hand_computed_two_by_two():
    # cos = 0.5: K/2 = [[.5, .25], [.25, .5]], eigenvalues 0.75 and 0.25
    X = np.array([[1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert vendi_score(X) == pytest.approx(expected)
    assert expected == pytest.approx(1.7548, abs=1e-4)


def test_vendi_more_items_than_dimensions():
    # rows 0 and 2 coincide: K/3 has eigenvalues 2/3, 1/3, 0
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert vendi_score(X) == pytest.approx(math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))))


@pytest.mark.parametrize("X", [np.zeros((0, 3)), np.ones(3), np.array([[1.0, 0.0], [0.0, 0.0]]),
                               np.array([[np.nan, 1.0]])])
def test_vendi_rejects_bad_embeddings(X):
    with pytest.raises(ValueError):
        vendi_score(X)


def test_code_embedding_is_deterministic_normalised_and_name_blind():
    codes = [BUBBLE, BUBBLE_RENAMED, BUILTIN_SORT, "def f(:"]
    E = code_embedding(codes, dim=256)
    assert E.shape == (4, 256)
    assert np.allclose(np.linalg.norm(E, axis=1), 1.0)
    assert np.array_equal(E, code_embedding(codes, dim=256))
    assert E[0] @ E[1] == pytest.approx(1.0)
    assert E[0] @ E[2] < 0.9
    with pytest.raises(ValueError):
        code_embedding([])


def test_g_vendi():
    assert g_vendi({"p": [BUBBLE, BUBBLE_RENAMED]}) == pytest.approx(1.0)
    pair = vendi_score(code_embedding([BUBBLE, HEAP_SORT]))
    assert 1.0 < pair < 2.0
    assert g_vendi({"p": [BUBBLE], "q": [BUBBLE, HEAP_SORT], "r": []}) == pytest.approx((1.0 + pair) / 2)
    assert math.isnan(g_vendi({"r": []}))
    with pytest.raises(ValueError):
        g_vendi({})


# ------------------------------------------------------------------------------------------------ table


def _table() -> pd.DataFrame:
    rows = [
        ("p", 3, BUILTIN_SORT, 1), ("p", 0, BUBBLE, 1), ("p", 1, "print(1)", 0), ("p", 2, BUBBLE_RENAMED, 1),
        ("q", 0, HEAP_SORT, 1), ("q", 1, None, 0),
        ("r", 0, BUBBLE, 0),
    ]
    return pd.DataFrame(rows, columns=["problem_id", "node_id", "code", "reward"])


def test_diversity_metrics_hand_example():
    got = diversity_metrics(_table(), k=2)
    two_to_one = math.exp(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert got["n_problems"] == 3 and got["n_problems_with_correct"] == 2 and got["k"] == 2
    assert got["da_at_k"] == pytest.approx((5 / 3 + 1) / 2)
    assert got["aec"] == pytest.approx((two_to_one + 1) / 2)
    p = vendi_score(code_embedding([BUBBLE, BUBBLE_RENAMED, BUILTIN_SORT]))
    assert got["g_vendi"] == pytest.approx((p + 1) / 2)


def test_diversity_metrics_without_correct_solutions_and_bad_tables():
    none = diversity_metrics(_table().assign(reward=0), k=1)
    assert none["n_problems_with_correct"] == 0 and math.isnan(none["da_at_k"])
    with pytest.raises(ValueError, match="missing column"):
        diversity_metrics(_table().drop(columns="code"), k=1)
    with pytest.raises(ValueError, match="empty"):
        diversity_metrics(_table().iloc[:0], k=1)
    with pytest.raises(ValueError, match="0/1"):
        diversity_metrics(_table().assign(reward=0.5), k=1)
    with pytest.raises(ValueError, match="without code"):
        diversity_metrics(_table().assign(reward=1), k=1)
    with pytest.raises(ValueError, match="K >= 1"):
        diversity_metrics(_table().assign(reward=0), k=0)

