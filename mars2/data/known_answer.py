"""A known-answer benchmark for the tree's refine action, in LiveCodeBench's ``code_generation_lite`` row schema.

Each problem leaves one detail to its tests, the way real statements leave edge cases to hidden tests: whether a
range's bounds are inclusive, which of tied maxima counts, what to answer when nothing qualifies, the order of an
output, floor or ceiling, case-sensitivity, strict or non-strict. A template lists the plausible **readings** of its
statement, each with its own answer function and reference program; a problem draws one reading as the truth.

* The statement's examples are inputs on which **every reading agrees**, so the statement is consistent with all of
  them and a fresh sample can at best guess the reading: its success is bounded by the guess.
* The public tests are those examples plus one **pinning** test on which the true reading disagrees with every
  other one, so a program with a wrong reading fails a public test; the tree's refine prompt carries that verdict,
  and with T+ detail the failing input, the expected and the actual output.
* The hidden tests hold at least two pinning tests, so a wrong reading also fails the reward.

A failed program with the right algorithm and the wrong reading therefore carries what a fresh sample lacks: with
two readings its failure names the other one, with three the expected output does. This benchmark favours
refinement **by construction**; it validates the loop (a correct MARS² loop must show refine > fresh there), it is
not evidence about real models (docs/data.md).

Problem ``i`` depends only on ``(seed, i)``; the template of problem ``i`` is ``perm[i % n_templates]`` and output is
byte-identical for equal arguments, as for :mod:`mars2.data.toy`, whose row assembly this module shares.
"""

from __future__ import annotations

import json
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mars2.data.toy import (_FIRST_CONTEST, _DAYS_BETWEEN_CONTESTS, _PROBLEMS_PER_CONTEST, _STDIN_LIST_FORMAT, _code,
                            _ints, _line, _list_in, _method)

__all__ = ["KNOWN_ANSWER_TEMPLATES", "Reading", "known_answer_benchmark", "known_answer_readings",
           "known_answer_reference_solutions", "known_answer_wrong_readings"]


@dataclass(frozen=True)
class Reading:
    """One plausible reading of a statement: its name, the answer it gives and a program that implements it."""

    name: str
    solve: Callable[..., Any]
    solution: str


@dataclass(frozen=True)
class _Ambiguous:
    """A template's concrete problem: one statement, several readings of it."""

    title: str
    difficulty: str
    description: str
    constraints: str
    detail: str  # what the statement leaves open
    readings: tuple[Reading, ...]
    gen: Callable[[random.Random], tuple]  # rng -> args
    input_format: str = ""
    output_format: str = ""
    render_input: Callable[..., str] | None = None
    func_name: str | None = None
    arg_names: tuple[str, ...] = ()
    signature: str = ""

    @property
    def functional(self) -> bool:
        return self.func_name is not None

    def header(self) -> str:
        return f"{self.func_name}(self, {self.signature}"

    def output(self, reading: Reading, args: tuple) -> str:
        answer = reading.solve(*args)
        return json.dumps(answer) if self.functional else _stdout(answer)

    def input(self, args: tuple) -> str:
        if self.functional:
            return "\n".join(json.dumps(a) for a in args)
        assert self.render_input is not None
        return self.render_input(*args)


def _stdout(answer: Any) -> str:
    if isinstance(answer, list):
        return " ".join(map(str, answer)) + "\n"
    return _line(answer)


_TEMPLATES: list[tuple[str, Callable[[random.Random], _Ambiguous]]] = []


def _template(name: str):
    def register(fn: Callable[[random.Random], _Ambiguous]) -> Callable[[random.Random], _Ambiguous]:
        _TEMPLATES.append((name, fn))
        return fn

    return register


def _stdin_program(*body: str) -> str:
    return _code("n = int(input())\na = list(map(int, input().split()))\n" + "\n".join(body))


def _first_max(a: list[int]) -> int:
    return a.index(max(a))


def _last_max(a: list[int]) -> int:
    return len(a) - 1 - a[::-1].index(max(a))


def _runs(a: list[int], strict: bool) -> int:
    best = cur = 1
    for x, y in zip(a, a[1:]):
        cur = cur + 1 if (y > x if strict else y >= x) else 1
        best = max(best, cur)
    return best


def _mode(a: list[int], rule: str) -> int:
    counts: dict[int, int] = {}
    for x in a:
        counts[x] = counts.get(x, 0) + 1
    top = [x for x in counts if counts[x] == max(counts.values())]  # in order of first occurrence
    return {"smallest": min(top), "largest": max(top), "first": top[0]}[rule]


def _small_list(r: random.Random, hi: int = 6) -> list[int]:
    return _ints(r, r.randint(2, 7), 1, hi)


def _letters(r: random.Random, alphabet: str) -> str:
    return "".join(r.choice(alphabet) for _ in range(r.randint(3, 10)))


# --------------------------------------------------------------------------------------------------
# stdin templates


@_template("range_count")
def _range_count(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        lo = r.randint(1, 10)
        return _small_list(r, 20), lo, r.randint(lo + 2, 20)

    return _Ambiguous(
        title="Numbers Between", difficulty="easy", detail="whether the bounds L and R count as between",
        description="You are given n integers and two integers L and R. Print how many of the integers lie between "
                    "L and R.",
        input_format="The first line contains n, L and R. The second line contains n integers a_1, ..., a_n.",
        output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= L < R <= 20\n1 <= a_i <= 20",
        readings=(
            Reading("inclusive", lambda a, lo, hi: sum(lo <= x <= hi for x in a), _code("""
                n, l, r = map(int, input().split())
                a = list(map(int, input().split()))
                print(sum(l <= x <= r for x in a))
                """)),
            Reading("exclusive", lambda a, lo, hi: sum(lo < x < hi for x in a), _code("""
                n, l, r = map(int, input().split())
                a = list(map(int, input().split()))
                print(sum(l < x < r for x in a))
                """)),
        ),
        gen=gen, render_input=lambda a, lo, hi: f"{len(a)} {lo} {hi}\n{' '.join(map(str, a))}\n")


@_template("max_position")
def _max_position(rng: random.Random) -> _Ambiguous:
    return _Ambiguous(
        title="Where Is the Largest", difficulty="easy", detail="which position counts when the largest value repeats",
        description="You are given n integers. Print the position of the largest of them (positions start at 1).",
        input_format=_STDIN_LIST_FORMAT, output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= a_i <= 9",
        readings=(Reading("first", lambda a: _first_max(a) + 1, _stdin_program("print(a.index(max(a)) + 1)")),
                  Reading("last", lambda a: _last_max(a) + 1, _stdin_program("print(n - a[::-1].index(max(a)))"))),
        gen=lambda r: (_small_list(r, 5),), render_input=_list_in)


@_template("smallest_even")
def _smallest_even(rng: random.Random) -> _Ambiguous:
    def reading(name: str, none: Any, shown: str) -> Reading:
        return Reading(name, lambda a: min([x for x in a if x % 2 == 0], default=none),
                       _stdin_program("e = [x for x in a if x % 2 == 0]", f"print(min(e) if e else {shown})"))

    return _Ambiguous(
        title="Smallest Even Number", difficulty="easy", detail="what to print when no number is even",
        description="You are given n integers. Print the smallest even number among them.",
        input_format=_STDIN_LIST_FORMAT, output_format="Print the answer.",
        constraints="1 <= n <= 10\n1 <= a_i <= 30",
        readings=(reading("minus_one", -1, "-1"), reading("zero", 0, "0"), reading("none", "NONE", '"NONE"')),
        gen=lambda r: (_ints(r, r.randint(1, 5), 1, 30),), render_input=_list_in)


@_template("distinct_values")
def _distinct_values(rng: random.Random) -> _Ambiguous:
    return _Ambiguous(
        title="Distinct Values", difficulty="easy", detail="the order of the values printed",
        description="You are given n integers. Print each distinct value once, separated by spaces.",
        input_format=_STDIN_LIST_FORMAT, output_format="Print the distinct values on one line.",
        constraints="1 <= n <= 10\n1 <= a_i <= 9",
        readings=(Reading("sorted", lambda a: sorted(set(a)), _stdin_program("print(*sorted(set(a)))")),
                  Reading("first_seen", lambda a: list(dict.fromkeys(a)), _stdin_program("print(*dict.fromkeys(a))"))),
        gen=lambda r: (_small_list(r, 9),), render_input=_list_in)


@_template("average")
def _average(rng: random.Random) -> _Ambiguous:
    return _Ambiguous(
        title="Integer Average", difficulty="easy", detail="how the average is rounded to an integer",
        description="You are given n positive integers. Print their average as an integer.",
        input_format=_STDIN_LIST_FORMAT, output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= a_i <= 100",
        readings=(Reading("floor", lambda a: sum(a) // len(a), _stdin_program("print(sum(a) // n)")),
                  Reading("ceil", lambda a: -(-sum(a) // len(a)), _stdin_program("print(-(-sum(a) // n))"))),
        gen=lambda r: (_ints(r, r.randint(1, 5), 1, 100),), render_input=_list_in)


@_template("count_letter")
def _count_letter(rng: random.Random) -> _Ambiguous:
    c = rng.choice("abcdefg")
    alphabet = c + c.upper() + "".join(rng.sample([x for x in "hijklmn"], 2))
    return _Ambiguous(
        title=f"Count the Letter {c}", difficulty="easy", detail=f"whether an upper-case {c.upper()} counts",
        description=f"You are given a string S of English letters. Print how many times the letter {c} occurs in S.",
        input_format="The input is one line containing the string S.", output_format="Print one integer.",
        constraints="1 <= |S| <= 10",
        readings=(Reading("case_sensitive", lambda s: s.count(c), _code(f'print(input().count("{c}"))')),
                  Reading("case_insensitive", lambda s: s.lower().count(c),
                          _code(f'print(input().lower().count("{c}"))'))),
        gen=lambda r: (_letters(r, alphabet),), render_input=_line)


@_template("longest_run")
def _longest_run(rng: random.Random) -> _Ambiguous:
    def reading(name: str, strict: bool) -> Reading:
        op = ">" if strict else ">="
        return Reading(name, lambda a: _runs(a, strict), _stdin_program(
            "best = cur = 1", "for i in range(1, n):", f"    cur = cur + 1 if a[i] {op} a[i - 1] else 1",
            "    best = max(best, cur)", "print(best)"))

    return _Ambiguous(
        title="Longest Increasing Run", difficulty="medium", detail="whether equal neighbours continue a run",
        description="You are given n integers. Print the length of the longest contiguous increasing run.",
        input_format=_STDIN_LIST_FORMAT, output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= a_i <= 9",
        readings=(reading("strict", True), reading("non_strict", False)),
        gen=lambda r: (_small_list(r, 5),), render_input=_list_in)


@_template("is_sorted")
def _is_sorted(rng: random.Random) -> _Ambiguous:
    def reading(name: str, op: str) -> Reading:
        holds = operator.lt if op == "<" else operator.le
        return Reading(name, lambda a: "Yes" if all(holds(x, y) for x, y in zip(a, a[1:])) else "No",
                       _stdin_program(f'print("Yes" if all(a[i] {op} a[i + 1] for i in range(n - 1)) else "No")'))

    return _Ambiguous(
        title="Is It Increasing", difficulty="easy", detail="whether equal neighbours are allowed",
        description="You are given n integers. Print Yes if they are in increasing order, otherwise print No.",
        input_format=_STDIN_LIST_FORMAT, output_format="Print Yes or No.",
        constraints="1 <= n <= 10\n1 <= a_i <= 9",
        readings=(reading("strict", "<"), reading("non_strict", "<=")),
        gen=lambda r: (sorted(_small_list(r, 6)) if r.random() < 0.7 else _small_list(r, 6),), render_input=_list_in)


@_template("kth_smallest")
def _kth_smallest(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        a = _small_list(r, 6)
        return a, r.randint(1, len(set(a)))

    return _Ambiguous(
        title="K-th Smallest", difficulty="medium", detail="whether repeated values count once",
        description="You are given n integers and an integer k. Print the k-th smallest value.",
        input_format="The first line contains n and k. The second line contains n integers a_1, ..., a_n.",
        output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= k <= the number of distinct values\n1 <= a_i <= 9",
        readings=(
            Reading("with_repeats", lambda a, k: sorted(a)[k - 1], _code("""
                n, k = map(int, input().split())
                a = list(map(int, input().split()))
                print(sorted(a)[k - 1])
                """)),
            Reading("distinct", lambda a, k: sorted(set(a))[k - 1], _code("""
                n, k = map(int, input().split())
                a = list(map(int, input().split()))
                print(sorted(set(a))[k - 1])
                """)),
        ),
        gen=gen, render_input=lambda a, k: f"{len(a)} {k}\n{' '.join(map(str, a))}\n")


@_template("divide")
def _divide(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        b = r.randint(2, 9)
        return r.randint(1, 9) * b + (0 if r.random() < 0.5 else r.randint(1, b - 1)), b

    return _Ambiguous(
        title="Share the Sweets", difficulty="easy", detail="how a quotient that is not whole is rounded",
        description="A sweets are shared among B children. Print how many sweets each child gets, as an integer.",
        input_format="The input is one line with two integers A and B.", output_format="Print one integer.",
        constraints="1 <= A <= 100\n2 <= B <= 9",
        readings=(Reading("floor", lambda a, b: a // b, _code("a, b = map(int, input().split())\nprint(a // b)")),
                  Reading("ceil", lambda a, b: -(-a // b), _code("a, b = map(int, input().split())\nprint(-(-a // b))"))),
        gen=gen, render_input=lambda a, b: f"{a} {b}\n")


@_template("find_position")
def _find_position(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        a = _small_list(r, 5)
        return a, r.choice(a)

    return _Ambiguous(
        title="Find the Number", difficulty="easy", detail="which position counts when x occurs more than once",
        description="You are given n integers and an integer x that occurs among them. Print the position of x "
                    "(positions start at 1).",
        input_format="The first line contains n and x. The second line contains n integers a_1, ..., a_n.",
        output_format="Print one integer.",
        constraints="1 <= n <= 10\n1 <= a_i <= 5",
        readings=(
            Reading("first", lambda a, x: a.index(x) + 1, _code("""
                n, x = map(int, input().split())
                a = list(map(int, input().split()))
                print(a.index(x) + 1)
                """)),
            Reading("last", lambda a, x: len(a) - a[::-1].index(x), _code("""
                n, x = map(int, input().split())
                a = list(map(int, input().split()))
                print(n - a[::-1].index(x))
                """)),
        ),
        gen=gen, render_input=lambda a, x: f"{len(a)} {x}\n{' '.join(map(str, a))}\n")


# --------------------------------------------------------------------------------------------------
# functional templates


def _functional(title: str, difficulty: str, detail: str, description: str, constraints: str, func_name: str,
                signature: str, arg_names: tuple[str, ...], gen: Callable[[random.Random], tuple],
                readings: list[tuple[str, Callable[..., Any], str]], imports: str = "") -> _Ambiguous:
    header = f"{func_name}(self, {signature}"
    return _Ambiguous(title=title, difficulty=difficulty, detail=detail, description=description,
                      constraints=constraints, gen=gen, func_name=func_name, signature=signature,
                      arg_names=arg_names,
                      readings=tuple(Reading(name, solve, _method(header, body, imports))
                                     for name, solve, body in readings))


@_template("f_count_in_range")
def _f_count_in_range(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        lo = r.randint(1, 10)
        return _small_list(r, 20), lo, r.randint(lo + 2, 20)

    return _functional(
        "Count in Range", "easy", "whether lo and hi count as between",
        "You are given an integer array nums and two integers lo and hi. Return how many elements of nums lie "
        "between lo and hi.", "1 <= nums.length <= 10\n1 <= lo < hi <= 20\n1 <= nums[i] <= 20",
        "countInRange", "nums: list[int], lo: int, hi: int) -> int", ("nums", "lo", "hi"), gen,
        [("inclusive", lambda a, lo, hi: sum(lo <= x <= hi for x in a), "return sum(lo <= x <= hi for x in nums)"),
         ("exclusive", lambda a, lo, hi: sum(lo < x < hi for x in a), "return sum(lo < x < hi for x in nums)")])


@_template("f_index_of_max")
def _f_index_of_max(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Index of the Maximum", "easy", "which index counts when the maximum repeats",
        "You are given an integer array nums. Return the index (0-based) of its largest element.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "indexOfMax", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),),
        [("first", _first_max, "return nums.index(max(nums))"),
         ("last", _last_max, "return len(nums) - 1 - nums[::-1].index(max(nums))")])


@_template("f_smallest_even")
def _f_smallest_even(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Smallest Even Element", "easy", "what to return when no element is even",
        "You are given an integer array nums. Return its smallest even element.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 30", "smallestEven", "nums: list[int]) -> int", ("nums",),
        lambda r: (_ints(r, r.randint(1, 5), 1, 30),),
        [(name, lambda a, none=none: min([x for x in a if x % 2 == 0], default=none),
          f"e = [x for x in nums if x % 2 == 0]\nreturn min(e) if e else {none}")
         for name, none in (("minus_one", -1), ("zero", 0))])


@_template("f_unique_values")
def _f_unique_values(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Unique Values", "easy", "the order of the returned values",
        "You are given an integer array nums. Return the list of its distinct values.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "uniqueValues", "nums: list[int]) -> list[int]", ("nums",),
        lambda r: (_small_list(r, 9),),
        [("sorted", lambda a: sorted(set(a)), "return sorted(set(nums))"),
         ("first_seen", lambda a: list(dict.fromkeys(a)), "return list(dict.fromkeys(nums))")])


@_template("f_most_frequent")
def _f_most_frequent(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Most Frequent Value", "medium", "which value to return when several are equally frequent",
        "You are given an integer array nums. Return the value that occurs most often.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "mostFrequent", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),),
        [("smallest", lambda a: _mode(a, "smallest"), "c = Counter(nums)\nreturn min(c, key=lambda x: (-c[x], x))"),
         ("largest", lambda a: _mode(a, "largest"), "c = Counter(nums)\nreturn max(c, key=lambda x: (c[x], x))"),
         ("first", lambda a: _mode(a, "first"), "c = Counter(nums)\nreturn max(c, key=c.get)")],
        imports="from collections import Counter")


@_template("f_count_vowels")
def _f_count_vowels(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Count Vowels", "easy", "whether y is a vowel",
        "You are given a string s of lowercase English letters. Return the number of vowels in s.",
        "1 <= s.length <= 10", "countVowels", "s: str) -> int", ("s",),
        lambda r: (_letters(r, "aeiybcdy"),),
        [("without_y", lambda s: sum(ch in "aeiou" for ch in s), 'return sum(ch in "aeiou" for ch in s)'),
         ("with_y", lambda s: sum(ch in "aeiouy" for ch in s), 'return sum(ch in "aeiouy" for ch in s)')])


@_template("f_second_largest")
def _f_second_largest(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        a = _small_list(r, 5)
        return (a if len(set(a)) > 1 else a + [a[0] % 5 + 1],)

    return _functional(
        "Second Largest", "easy", "whether a repeated maximum counts twice",
        "You are given an integer array nums with at least two distinct values. Return its second largest value.",
        "2 <= nums.length <= 10\n1 <= nums[i] <= 9", "secondLargest", "nums: list[int]) -> int", ("nums",), gen,
        [("distinct", lambda a: sorted(set(a))[-2], "return sorted(set(nums))[-2]"),
         ("with_repeats", lambda a: sorted(a)[-2], "return sorted(nums)[-2]")])


@_template("f_average")
def _f_average(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Average Value", "easy", "how the average is rounded to an integer",
        "You are given an array nums of positive integers. Return their average as an integer.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 100", "averageValue", "nums: list[int]) -> int", ("nums",),
        lambda r: (_ints(r, r.randint(1, 5), 1, 100),),
        [("floor", lambda a: sum(a) // len(a), "return sum(nums) // len(nums)"),
         ("ceil", lambda a: -(-sum(a) // len(a)), "return -(-sum(nums) // len(nums))")])


@_template("f_count_char")
def _f_count_char(rng: random.Random) -> _Ambiguous:
    def gen(r: random.Random) -> tuple:
        c = r.choice("abc")
        return _letters(r, "abcABCxy"), c

    return _functional(
        "Count a Character", "easy", "whether upper-case letters match",
        "You are given a string s of English letters and a lowercase letter c. Return how many times c occurs in s.",
        "1 <= s.length <= 10\nc is a lowercase English letter.", "countChar", "s: str, c: str) -> int", ("s", "c"),
        gen,
        [("case_sensitive", lambda s, c: s.count(c), "return s.count(c)"),
         ("case_insensitive", lambda s, c: s.lower().count(c), "return s.lower().count(c)")])


@_template("f_is_increasing")
def _f_is_increasing(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Increasing Array", "easy", "whether equal neighbours are allowed",
        "You are given an integer array nums. Return true if its elements are in increasing order.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "isIncreasing", "nums: list[int]) -> bool", ("nums",),
        lambda r: (sorted(_small_list(r, 6)) if r.random() < 0.7 else _small_list(r, 6),),
        [("strict", lambda a: all(x < y for x, y in zip(a, a[1:])),
          "return all(nums[i] < nums[i + 1] for i in range(len(nums) - 1))"),
         ("non_strict", lambda a: all(x <= y for x, y in zip(a, a[1:])),
          "return all(nums[i] <= nums[i + 1] for i in range(len(nums) - 1))")])


@_template("f_longest_run")
def _f_longest_run(rng: random.Random) -> _Ambiguous:
    def body(op: str) -> str:
        return (f"best = cur = 1\nfor i in range(1, len(nums)):\n    cur = cur + 1 if nums[i] {op} nums[i - 1] else 1\n"
                "    best = max(best, cur)\nreturn best")

    return _functional(
        "Longest Increasing Stretch", "medium", "whether equal neighbours continue a stretch",
        "You are given an integer array nums. Return the length of its longest contiguous increasing stretch.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "longestRun", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),),
        [("strict", lambda a: _runs(a, True), body(">")), ("non_strict", lambda a: _runs(a, False), body(">="))])


@_template("f_pairs_with_sum")
def _f_pairs_with_sum(rng: random.Random) -> _Ambiguous:
    def count(a: list[int], t: int, same: bool) -> int:
        return sum(a[i] + a[j] == t for i in range(len(a)) for j in range(i if same else i + 1, len(a)))

    return _functional(
        "Pairs With a Sum", "medium", "whether an element pairs with itself",
        "You are given an integer array nums and an integer target. Return the number of index pairs (i, j) whose "
        "elements add up to target.",
        "1 <= nums.length <= 8\n1 <= nums[i] <= 6\n2 <= target <= 12", "pairsWithSum",
        "nums: list[int], target: int) -> int", ("nums", "target"),
        lambda r: (_small_list(r, 6), r.randint(2, 12)),
        [("distinct_indices", lambda a, t: count(a, t, False),
          "n = len(nums)\nreturn sum(nums[i] + nums[j] == target for i in range(n) for j in range(i + 1, n))"),
         ("same_index", lambda a, t: count(a, t, True),
          "n = len(nums)\nreturn sum(nums[i] + nums[j] == target for i in range(n) for j in range(i, n))")])


KNOWN_ANSWER_TEMPLATES: tuple[str, ...] = tuple(name for name, _ in _TEMPLATES)


# --------------------------------------------------------------------------------------------------
# assembling rows

_TRIES = 400


@dataclass(frozen=True)
class _Drawn:
    """One problem: its row, the template, the true reading's index, the spec it came from and the arguments behind
    its public tests (the statement's examples first, the pinning test last) and hidden tests."""

    row: dict[str, str]
    template: str
    truth: int
    spec: _Ambiguous
    public: tuple[tuple, ...]
    hidden: tuple[tuple, ...]


def _draw(rng: random.Random, spec: _Ambiguous, want: Callable[[tuple], bool], seen: set[str], what: str) -> tuple:
    for _ in range(_TRIES):
        args = spec.gen(rng)
        if spec.input(args) not in seen and want(args):
            seen.add(spec.input(args))
            return args
    raise RuntimeError(f"known-answer template {spec.title!r}: no {what} input in {_TRIES} draws")


def _statement(spec: _Ambiguous, examples: list[tuple]) -> str:
    truth = spec.readings[0]  # every reading agrees on the examples
    parts = [spec.description, ""]
    if spec.functional:
        for k, args in enumerate(examples, start=1):
            shown = ", ".join(f"{n} = {json.dumps(a)}" for n, a in zip(spec.arg_names, args))
            parts += [f"Example {k}:", "", f"Input: {shown}", f"Output: {spec.output(truth, args)}", ""]
        parts += ["Constraints:", "", spec.constraints]
    else:
        parts += ["Input", "", spec.input_format, "", "Output", "", spec.output_format, "", "Constraints", "",
                  spec.constraints, ""]
        for k, args in enumerate(examples, start=1):
            parts += [f"Sample Input {k}", "", spec.input(args).rstrip("\n"), "", f"Sample Output {k}", "",
                      spec.output(truth, args).rstrip("\n"), ""]
    return "\n".join(parts).rstrip("\n") + "\n"


def _make_problem(i: int, seed: int, name: str, template: Callable[[random.Random], _Ambiguous]) -> _Drawn:
    rng = random.Random(f"mars2-known-answer/{seed}/{i}")
    spec = template(rng)
    truth = rng.randrange(len(spec.readings))
    right = spec.readings[truth]
    others = [r for k, r in enumerate(spec.readings) if k != truth]

    def agree(args: tuple) -> bool:
        return len({spec.output(r, args) for r in spec.readings}) == 1

    def pins(args: tuple) -> bool:  # the true reading differs from every other reading here
        return all(spec.output(r, args) != spec.output(right, args) for r in others)

    seen: set[str] = set()
    examples = [_draw(rng, spec, agree, seen, "agreeing") for _ in range(rng.randint(1, 2))]
    public = examples + [_draw(rng, spec, pins, seen, "pinning")]
    hidden = [_draw(rng, spec, pins, seen, "pinning") for _ in range(2)]
    hidden += [_draw(rng, spec, lambda a: True, seen, "hidden") for _ in range(rng.randint(2, 4))]
    testtype = "functional" if spec.functional else "stdin"

    def tests_json(cases: list[tuple]) -> str:
        return json.dumps([{"input": spec.input(a), "output": spec.output(right, a), "testtype": testtype}
                           for a in cases])

    contest = i // _PROBLEMS_PER_CONTEST
    row = {
        "question_title": spec.title,
        "question_content": _statement(spec, examples),
        "platform": "known_answer",
        "question_id": f"ka_{i + 1:04d}",
        "contest_id": f"ka-contest-{contest + 1:03d}",
        "contest_date": (_FIRST_CONTEST + timedelta(days=_DAYS_BETWEEN_CONTESTS * contest)).isoformat(),
        "starter_code": (f"class Solution:\n    def {spec.header()}:\n        " if spec.functional else ""),
        "difficulty": spec.difficulty,
        "public_test_cases": tests_json(public),
        "private_test_cases": tests_json(hidden),
        "metadata": json.dumps({"func_name": spec.func_name}) if spec.functional else "{}",
    }
    return _Drawn(row, name, truth, spec, tuple(public), tuple(hidden))


def _generate(n_problems: int, seed: int) -> list[_Drawn]:
    if n_problems < 0:
        raise ValueError(f"n_problems must be >= 0, got {n_problems}")
    order = list(range(len(_TEMPLATES)))
    random.Random(f"mars2-known-answer/{seed}/templates").shuffle(order)
    return [_make_problem(i, seed, *_TEMPLATES[order[i % len(order)]]) for i in range(n_problems)]


def known_answer_benchmark(n_problems: int = 256, seed: int = 0) -> list[dict[str, str]]:
    """``n_problems`` known-answer problems as ``code_generation_lite`` rows (every value a ``str``); ``question_id``
    ``ka_0001``, ...; 1–2 agreeing examples shown in the statement, public tests = those + one pinning test, 4–6
    hidden tests of which 2 pin the reading."""
    return [d.row for d in _generate(n_problems, seed)]


def known_answer_reference_solutions(n_problems: int = 256, seed: int = 0) -> dict[str, str]:
    """``question_id -> program`` implementing each problem's true reading."""
    return {d.row["question_id"]: d.spec.readings[d.truth].solution for d in _generate(n_problems, seed)}


def known_answer_wrong_readings(n_problems: int = 256, seed: int = 0) -> dict[str, list[str]]:
    """``question_id -> programs`` of the problem's other readings: right algorithm, wrong detail (each fails a
    public test); the warm-start shows them as refine examples with the reference as the answer."""
    return {d.row["question_id"]: [r.solution for k, r in enumerate(d.spec.readings) if k != d.truth]
            for d in _generate(n_problems, seed)}


def known_answer_readings(n_problems: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """Per problem: ``question_id``, ``template``, ``detail`` (what the statement leaves open), ``reading`` (the true
    one) and ``readings`` (all, in the template's order); for analysis, never shown to an agent."""
    return [{"question_id": d.row["question_id"], "template": d.template, "detail": d.spec.detail,
             "reading": d.spec.readings[d.truth].name, "readings": [r.name for r in d.spec.readings]}
            for d in _generate(n_problems, seed)]
