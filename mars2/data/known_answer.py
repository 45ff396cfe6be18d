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

A program states the detail as one named constant on its first line (``INCLUSIVE = True``, ``IF_NONE = -1``, ...), so
the readings' programs differ in that constant alone. A failed program with the right algorithm and the wrong
reading therefore carries what a fresh sample lacks: with two readings its failure names the other one, with three
the expected output does; and the repair is the same one-line edit on every template.
This benchmark favours refinement **by construction**; it validates the loop (a correct MARS² loop must show refine
> fresh there), it is not evidence about real models (docs/data.md).

Problem ``i`` depends only on ``(seed, i)``; the template of problem ``i`` is ``perm[i % n_templates]`` and output is
byte-identical for equal arguments, as for :mod:`mars2.data.toy`, whose helpers and contest dates this module shares.
"""

from __future__ import annotations

import json
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mars2.data.toy import (_FIRST_CONTEST, _DAYS_BETWEEN_CONTESTS, _PROBLEMS_PER_CONTEST, _STDIN_LIST_FORMAT, _ints,
                            _line, _list_in, _method)

__all__ = ["KNOWN_ANSWER_TEMPLATES", "Reading", "known_answer_benchmark", "known_answer_counterfactuals",
           "known_answer_readings", "known_answer_reference_solutions", "known_answer_wrong_readings"]


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
    return "n = int(input())\na = list(map(int, input().split()))\n" + "\n".join(body) + "\n"


def _readings(flag: str, values: list[tuple[str, str, Callable[..., Any]]], program: str) -> tuple[Reading, ...]:
    """One reading per ``(name, literal, solve)``: the program is ``program`` (a complete, dedented text) under the
    line ``<flag> = <literal>``, so the readings differ in that one constant."""
    return tuple(Reading(name, solve, f"{flag} = {literal}\n" + program) for name, literal, solve in values)


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


def _bounds(r: random.Random) -> tuple:
    lo = r.randint(1, 10)
    return _small_list(r, 20), lo, r.randint(lo + 2, 20)


def _with_x(r: random.Random) -> tuple:
    a = _small_list(r, 5)
    return a, r.choice(a)


def _with_k(r: random.Random) -> tuple:
    a = _small_list(r, 6)
    return a, r.randint(1, len(set(a)))


def _mostly_sorted(r: random.Random) -> tuple:
    return (sorted(_small_list(r, 6)) if r.random() < 0.7 else _small_list(r, 6),)


def _two_values(r: random.Random) -> tuple:
    a = _small_list(r, 5)
    return (a if len(set(a)) > 1 else a + [a[0] % 5 + 1],)


def _share(r: random.Random) -> tuple:
    b = r.randint(2, 9)
    return r.randint(1, 9) * b + (0 if r.random() < 0.5 else r.randint(1, b - 1)), b


def _pairs(a: list[int], t: int, same: bool) -> int:
    return sum(a[i] + a[j] == t for i in range(len(a)) for j in range(i if same else i + 1, len(a)))


def _binary(yes: Callable[..., Any], no: Callable[..., Any], names: tuple[str, str]) -> list:
    """Two readings of a boolean detail: ``names[0]`` answers with ``yes`` (the flag True), ``names[1]`` with ``no``."""
    return [(names[0], "True", yes), (names[1], "False", no)]


# --------------------------------------------------------------------------------------------------
# stdin templates


def _stdin(title: str, difficulty: str, detail: str, description: str, output_format: str, constraints: str,
           readings: tuple[Reading, ...], gen: Callable[[random.Random], tuple],
           input_format: str = _STDIN_LIST_FORMAT, render_input: Callable[..., str] = _list_in) -> _Ambiguous:
    return _Ambiguous(title=title, difficulty=difficulty, detail=detail, description=description,
                      input_format=input_format, output_format=output_format, constraints=constraints,
                      readings=readings, gen=gen, render_input=render_input)


def _n_and(a: list[int], *rest: int) -> str:
    """Input rendering: ``n`` and the scalar arguments on the first line, the list on the second."""
    return f"{len(a)} {' '.join(map(str, rest))}\n{' '.join(map(str, a))}\n"


@_template("range_count")
def _range_count(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Numbers Between", "easy", "whether the bounds L and R count as between",
        "You are given n integers and two integers L and R. Print how many of the integers lie between L and R.",
        "Print one integer.", "1 <= n <= 10\n1 <= L < R <= 20\n1 <= a_i <= 20",
        _readings("INCLUSIVE", _binary(lambda a, lo, hi: sum(lo <= x <= hi for x in a),
                                       lambda a, lo, hi: sum(lo < x < hi for x in a), ("inclusive", "exclusive")),
                  "n, l, r = map(int, input().split())\na = list(map(int, input().split()))\n"
                  "print(sum(l <= x <= r if INCLUSIVE else l < x < r for x in a))\n"),
        _bounds, "The first line contains n, L and R. The second line contains n integers a_1, ..., a_n.",
        _n_and)


@_template("max_position")
def _max_position(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Where Is the Largest", "easy", "which position counts when the largest value repeats",
        "You are given n integers. Print the position of the largest of them (positions start at 1).",
        "Print one integer.", "1 <= n <= 10\n1 <= a_i <= 9",
        _readings("FIRST", _binary(lambda a: _first_max(a) + 1, lambda a: _last_max(a) + 1,
                                   ("first", "last")),
                  _stdin_program("print(a.index(max(a)) + 1 if FIRST else n - a[::-1].index(max(a)))")),
        lambda r: (_small_list(r, 5),))


@_template("smallest_even")
def _smallest_even(rng: random.Random) -> _Ambiguous:
    values = [(name, literal, lambda a, none=none: min([x for x in a if x % 2 == 0], default=none))
              for name, literal, none in (("minus_one", "-1", -1), ("zero", "0", 0), ("none", '"NONE"', "NONE"))]
    return _stdin(
        "Smallest Even Number", "easy", "what to print when no number is even",
        "You are given n integers. Print the smallest even number among them.", "Print the answer.",
        "1 <= n <= 10\n1 <= a_i <= 30",
        _readings("IF_NONE", values, _stdin_program("e = [x for x in a if x % 2 == 0]",
                                                    "print(min(e) if e else IF_NONE)")),
        lambda r: (_ints(r, r.randint(1, 5), 1, 30),))


@_template("distinct_values")
def _distinct_values(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Distinct Values", "easy", "the order of the values printed",
        "You are given n integers. Print each distinct value once, separated by spaces.",
        "Print the distinct values on one line.", "1 <= n <= 10\n1 <= a_i <= 9",
        _readings("SORTED", _binary(lambda a: sorted(set(a)), lambda a: list(dict.fromkeys(a)),
                                    ("sorted", "first_seen")),
                  _stdin_program("print(*(sorted(set(a)) if SORTED else dict.fromkeys(a)))")),
        lambda r: (_small_list(r, 9),))


@_template("average")
def _average(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Integer Average", "easy", "how the average is rounded to an integer",
        "You are given n positive integers. Print their average as an integer.", "Print one integer.",
        "1 <= n <= 10\n1 <= a_i <= 100",
        _readings("ROUND_UP", _binary(lambda a: -(-sum(a) // len(a)), lambda a: sum(a) // len(a),
                                      ("ceil", "floor")),
                  _stdin_program("print(-(-sum(a) // n) if ROUND_UP else sum(a) // n)")),
        lambda r: (_ints(r, r.randint(1, 5), 1, 100),))


@_template("count_letter")
def _count_letter(rng: random.Random) -> _Ambiguous:
    c = rng.choice("abcdefg")
    alphabet = c + c.upper() + "".join(rng.sample([x for x in "hijklmn"], 2))
    return _stdin(
        f"Count the Letter {c}", "easy", f"whether an upper-case {c.upper()} counts",
        f"You are given a string S of English letters. Print how many times the letter {c} occurs in S.",
        "Print one integer.", "1 <= |S| <= 10",
        _readings("IGNORE_CASE", _binary(lambda s: s.lower().count(c), lambda s: s.count(c),
                                         ("case_insensitive", "case_sensitive")),
                  f"s = input()\nprint((s.lower() if IGNORE_CASE else s).count(\"{c}\"))\n"),
        lambda r: (_letters(r, alphabet),), "The input is one line containing the string S.", _line)


@_template("longest_run")
def _longest_run(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Longest Increasing Run", "medium", "whether equal neighbours continue a run",
        "You are given n integers. Print the length of the longest contiguous increasing run.", "Print one integer.",
        "1 <= n <= 10\n1 <= a_i <= 9",
        _readings("STRICT", _binary(lambda a: _runs(a, True), lambda a: _runs(a, False),
                                    ("strict", "non_strict")),
                  _stdin_program("best = cur = 1", "for i in range(1, n):",
                                 "    up = a[i] > a[i - 1] if STRICT else a[i] >= a[i - 1]",
                                 "    cur = cur + 1 if up else 1", "    best = max(best, cur)", "print(best)")),
        lambda r: (_small_list(r, 5),))


@_template("is_sorted")
def _is_sorted(rng: random.Random) -> _Ambiguous:
    def yes_no(holds: Callable[[int, int], bool]) -> Callable[[list[int]], str]:
        return lambda a: "Yes" if all(holds(x, y) for x, y in zip(a, a[1:])) else "No"

    return _stdin(
        "Is It Increasing", "easy", "whether equal neighbours are allowed",
        "You are given n integers. Print Yes if they are in increasing order, otherwise print No.",
        "Print Yes or No.", "1 <= n <= 10\n1 <= a_i <= 9",
        _readings("STRICT", _binary(yes_no(operator.lt), yes_no(operator.le), ("strict", "non_strict")),
                  _stdin_program("ok = all(a[i] < a[i + 1] if STRICT else a[i] <= a[i + 1] for i in range(n - 1))",
                                 'print("Yes" if ok else "No")')),
        _mostly_sorted)


@_template("kth_smallest")
def _kth_smallest(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "K-th Smallest", "medium", "whether repeated values count once",
        "You are given n integers and an integer k. Print the k-th smallest value.", "Print one integer.",
        "1 <= n <= 10\n1 <= k <= the number of distinct values\n1 <= a_i <= 9",
        _readings("DISTINCT", _binary(lambda a, k: sorted(set(a))[k - 1], lambda a, k: sorted(a)[k - 1],
                                      ("distinct", "with_repeats")),
                  "n, k = map(int, input().split())\na = list(map(int, input().split()))\n"
                  "print(sorted(set(a) if DISTINCT else a)[k - 1])\n"),
        _with_k, "The first line contains n and k. The second line contains n integers a_1, ..., a_n.", _n_and)


@_template("divide")
def _divide(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Share the Sweets", "easy", "how a quotient that is not whole is rounded",
        "A sweets are shared among B children. Print how many sweets each child gets, as an integer.",
        "Print one integer.", "1 <= A <= 100\n2 <= B <= 9",
        _readings("ROUND_UP", _binary(lambda a, b: -(-a // b), lambda a, b: a // b, ("ceil", "floor")),
                  "a, b = map(int, input().split())\nprint(-(-a // b) if ROUND_UP else a // b)\n"),
        _share, "The input is one line with two integers A and B.", lambda a, b: f"{a} {b}\n")


@_template("find_position")
def _find_position(rng: random.Random) -> _Ambiguous:
    return _stdin(
        "Find the Number", "easy", "which position counts when x occurs more than once",
        "You are given n integers and an integer x that occurs among them. Print the position of x "
        "(positions start at 1).", "Print one integer.", "1 <= n <= 10\n1 <= a_i <= 5",
        _readings("FIRST", _binary(lambda a, x: a.index(x) + 1, lambda a, x: len(a) - a[::-1].index(x),
                                   ("first", "last")),
                  "n, x = map(int, input().split())\na = list(map(int, input().split()))\n"
                  "print(a.index(x) + 1 if FIRST else n - a[::-1].index(x))\n"),
        _with_x, "The first line contains n and x. The second line contains n integers a_1, ..., a_n.", _n_and)


# --------------------------------------------------------------------------------------------------
# functional templates


def _functional(title: str, difficulty: str, detail: str, description: str, constraints: str, func_name: str,
                signature: str, arg_names: tuple[str, ...], gen: Callable[[random.Random], tuple], flag: str,
                values: list[tuple[str, str, Callable[..., Any]]], body: str, imports: str = "") -> _Ambiguous:
    """A functional template whose readings differ in the module constant ``flag`` (set above ``class Solution``)."""
    method = _method(f"{func_name}(self, {signature}", body)
    program = (imports.strip("\n") + "\n" if imports else "") + "\n" + method
    return _Ambiguous(title=title, difficulty=difficulty, detail=detail, description=description,
                      constraints=constraints, gen=gen, func_name=func_name, signature=signature,
                      arg_names=arg_names, readings=_readings(flag, values, program))


@_template("f_count_in_range")
def _f_count_in_range(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Count in Range", "easy", "whether lo and hi count as between",
        "You are given an integer array nums and two integers lo and hi. Return how many elements of nums lie "
        "between lo and hi.", "1 <= nums.length <= 10\n1 <= lo < hi <= 20\n1 <= nums[i] <= 20",
        "countInRange", "nums: list[int], lo: int, hi: int) -> int", ("nums", "lo", "hi"), _bounds, "INCLUSIVE",
        _binary(lambda a, lo, hi: sum(lo <= x <= hi for x in a),
                lambda a, lo, hi: sum(lo < x < hi for x in a), ("inclusive", "exclusive")),
        "return sum(lo <= x <= hi if INCLUSIVE else lo < x < hi for x in nums)")


@_template("f_index_of_max")
def _f_index_of_max(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Index of the Maximum", "easy", "which index counts when the maximum repeats",
        "You are given an integer array nums. Return the index (0-based) of its largest element.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "indexOfMax", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),), "FIRST", _binary(_first_max, _last_max, ("first", "last")),
        "return nums.index(max(nums)) if FIRST else len(nums) - 1 - nums[::-1].index(max(nums))")


@_template("f_smallest_even")
def _f_smallest_even(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Smallest Even Element", "easy", "what to return when no element is even",
        "You are given an integer array nums. Return its smallest even element.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 30", "smallestEven", "nums: list[int]) -> int", ("nums",),
        lambda r: (_ints(r, r.randint(1, 5), 1, 30),), "IF_NONE",
        [(name, str(none), lambda a, none=none: min([x for x in a if x % 2 == 0], default=none))
         for name, none in (("minus_one", -1), ("zero", 0))],
        "e = [x for x in nums if x % 2 == 0]\nreturn min(e) if e else IF_NONE")


@_template("f_unique_values")
def _f_unique_values(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Unique Values", "easy", "the order of the returned values",
        "You are given an integer array nums. Return the list of its distinct values.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "uniqueValues", "nums: list[int]) -> list[int]", ("nums",),
        lambda r: (_small_list(r, 9),), "SORTED",
        _binary(lambda a: sorted(set(a)), lambda a: list(dict.fromkeys(a)), ("sorted", "first_seen")),
        "return sorted(set(nums)) if SORTED else list(dict.fromkeys(nums))")


@_template("f_most_frequent")
def _f_most_frequent(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Most Frequent Value", "medium", "which value to return when several are equally frequent",
        "You are given an integer array nums. Return the value that occurs most often.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "mostFrequent", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),), "TIE",
        [(rule, f'"{rule}"', lambda a, rule=rule: _mode(a, rule)) for rule in ("smallest", "largest", "first")],
        'c = Counter(nums)\ntop = [x for x in c if c[x] == max(c.values())]\n'
        'return min(top) if TIE == "smallest" else max(top) if TIE == "largest" else top[0]',
        imports="from collections import Counter")


@_template("f_count_vowels")
def _f_count_vowels(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Count Vowels", "easy", "whether y is a vowel",
        "You are given a string s of lowercase English letters. Return the number of vowels in s.",
        "1 <= s.length <= 10", "countVowels", "s: str) -> int", ("s",), lambda r: (_letters(r, "aeiybcdy"),),
        "Y_IS_VOWEL", _binary(lambda s: sum(ch in "aeiouy" for ch in s),
                              lambda s: sum(ch in "aeiou" for ch in s), ("with_y", "without_y")),
        'return sum(ch in ("aeiouy" if Y_IS_VOWEL else "aeiou") for ch in s)')


@_template("f_second_largest")
def _f_second_largest(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Second Largest", "easy", "whether a repeated maximum counts twice",
        "You are given an integer array nums with at least two distinct values. Return its second largest value.",
        "2 <= nums.length <= 10\n1 <= nums[i] <= 9", "secondLargest", "nums: list[int]) -> int", ("nums",),
        _two_values, "DISTINCT",
        _binary(lambda a: sorted(set(a))[-2], lambda a: sorted(a)[-2], ("distinct", "with_repeats")),
        "return sorted(set(nums) if DISTINCT else nums)[-2]")


@_template("f_average")
def _f_average(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Average Value", "easy", "how the average is rounded to an integer",
        "You are given an array nums of positive integers. Return their average as an integer.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 100", "averageValue", "nums: list[int]) -> int", ("nums",),
        lambda r: (_ints(r, r.randint(1, 5), 1, 100),), "ROUND_UP",
        _binary(lambda a: -(-sum(a) // len(a)), lambda a: sum(a) // len(a), ("ceil", "floor")),
        "s = sum(nums)\nreturn -(-s // len(nums)) if ROUND_UP else s // len(nums)")


@_template("f_count_char")
def _f_count_char(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Count a Character", "easy", "whether upper-case letters match",
        "You are given a string s of English letters and a lowercase letter c. Return how many times c occurs in s.",
        "1 <= s.length <= 10\nc is a lowercase English letter.", "countChar", "s: str, c: str) -> int", ("s", "c"),
        lambda r: (_letters(r, "abcABCxy"), r.choice("abc")), "IGNORE_CASE",
        _binary(lambda s, c: s.lower().count(c), lambda s, c: s.count(c),
                ("case_insensitive", "case_sensitive")),
        "return (s.lower() if IGNORE_CASE else s).count(c)")


@_template("f_is_increasing")
def _f_is_increasing(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Increasing Array", "easy", "whether equal neighbours are allowed",
        "You are given an integer array nums. Return true if its elements are in increasing order.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "isIncreasing", "nums: list[int]) -> bool", ("nums",),
        _mostly_sorted, "STRICT",
        _binary(lambda a: all(x < y for x, y in zip(a, a[1:])),
                lambda a: all(x <= y for x, y in zip(a, a[1:])), ("strict", "non_strict")),
        "pairs = zip(nums, nums[1:])\nreturn all(x < y if STRICT else x <= y for x, y in pairs)")


@_template("f_longest_run")
def _f_longest_run(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Longest Increasing Stretch", "medium", "whether equal neighbours continue a stretch",
        "You are given an integer array nums. Return the length of its longest contiguous increasing stretch.",
        "1 <= nums.length <= 10\n1 <= nums[i] <= 9", "longestRun", "nums: list[int]) -> int", ("nums",),
        lambda r: (_small_list(r, 5),), "STRICT",
        _binary(lambda a: _runs(a, True), lambda a: _runs(a, False), ("strict", "non_strict")),
        "best = cur = 1\nfor x, y in zip(nums, nums[1:]):\n    cur = cur + 1 if (y > x if STRICT else y >= x) else 1\n"
        "    best = max(best, cur)\nreturn best")


@_template("f_pairs_with_sum")
def _f_pairs_with_sum(rng: random.Random) -> _Ambiguous:
    return _functional(
        "Pairs With a Sum", "medium", "whether an element pairs with itself",
        "You are given an integer array nums and an integer target. Return the number of index pairs (i, j) whose "
        "elements add up to target.", "1 <= nums.length <= 8\n1 <= nums[i] <= 6\n2 <= target <= 12",
        "pairsWithSum", "nums: list[int], target: int) -> int", ("nums", "target"),
        lambda r: (_small_list(r, 6), r.randint(2, 12)), "SAME_INDEX",
        _binary(lambda a, t: _pairs(a, t, True), lambda a, t: _pairs(a, t, False),
                ("same_index", "distinct_indices")),
        "n = len(nums)\nstart = 0 if SAME_INDEX else 1\n"
        "return sum(nums[i] + nums[j] == target for i in range(n) for j in range(i + start, n))")


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


def _make_problem(i: int, seed: int, name: str, template: Callable[[random.Random], _Ambiguous],
                  truth: int | None = None) -> _Drawn:
    rng = random.Random(f"mars2-known-answer/{seed}/{i}")
    spec = template(rng)
    drawn = rng.randrange(len(spec.readings))
    truth = drawn if truth is None else truth  # the statement is drawn before the truth matters: it stays the same
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


def _counterfactuals(d: _Drawn, i: int, seed: int) -> list[_Drawn]:
    """Problem ``i`` once per other reading taken as the truth: the same statement and examples, the tests pinned
    to that reading."""
    templates = dict(_TEMPLATES)
    return [_make_problem(i, seed, d.template, templates[d.template], truth=k)
            for k in range(len(d.spec.readings)) if k != d.truth]


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


def known_answer_counterfactuals(n_problems: int = 256, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``question_id -> [{"row": row, "solution": program}]``: the problem once per *other* reading taken as the
    truth — the same statement, examples and ``question_id``, the tests pinned to that reading — with that
    reading's program. Against such a row the true reading's program is the wrong one, so a refine example built on it
    (parent = the true reading, answer = the other) has the same statement as the original's (parent = the other,
    answer = the true reading): only the parent and its failure tell the two apart."""
    return {d.row["question_id"]: [{"row": c.row, "solution": c.spec.readings[c.truth].solution}
                                   for c in _counterfactuals(d, i, seed)]
            for i, d in enumerate(_generate(n_problems, seed))}


def known_answer_readings(n_problems: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """Per problem: ``question_id``, ``template``, ``detail`` (what the statement leaves open), ``reading`` (the true
    one) and ``readings`` (all, in the template's order); for analysis, never shown to an agent."""
    return [{"question_id": d.row["question_id"], "template": d.template, "detail": d.spec.detail,
             "reading": d.spec.readings[d.truth].name, "readings": [r.name for r in d.spec.readings]}
            for d in _generate(n_problems, seed)]
