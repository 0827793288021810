"""The built-in task ``code``: short Python functions, checked by unit tests in the sandbox.

Each problem asks for one named function (``Write a Python function plus_seven(x) that
returns x plus 7.``); its ground truth is a Skywork-style ``{"assert_case": [...]}`` of four
literal asserts on seeded inputs, which the code checker runs call by call in the sandbox and
compares outside it (``megatron_rlep/reward/code.py``). The prompt is a one-line system message,
one worked example in a fenced ``python`` block, then the question. Problems of the test split
are those whose text hashes into one bucket of eight, as in ``arithmetic``; levels run from
adding a constant to a loop. ``docs/task_levels.md`` records how often the built-in model passes
each level.

This module generates examples only; the code checker scores them.
"""

from __future__ import annotations

import json

from megatron_rlep.example import Example
from megatron_rlep.tasks import distinct
DEMONSTRATION = (
    {"role": "system", "content": "Write the Python function asked for. Put the code in one "
                                  "```python block."},
    {"role": "user", "content": "Write a Python function plus_two(x) that returns x plus 2."},
    {"role": "assistant", "content": "```python\ndef plus_two(x):\n    return x + 2\n```"},
)
VERIFIER = {"mode": "code"}  # how a run on this task scores: the code checker
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _level_1(rng):  # x + k
    k = rng.randint(3, 9)
    return f"plus_{NUMBERS[k]}", "x", f"returns x plus {k}", lambda x: x + k, _ints(rng)


def _level_2(rng):  # x * k
    k = rng.randint(2, 9)
    return f"times_{NUMBERS[k]}", "x", f"returns x times {k}", lambda x: x * k, _ints(rng)


def _level_3(rng):  # x - k
    k = rng.randint(2, 9)
    return f"minus_{NUMBERS[k]}", "x", f"returns x minus {k}", lambda x: x - k, _ints(rng)


def _level_4(rng):  # a * x + b
    a, b = rng.randint(2, 5), rng.randint(1, 9)
    return f"line_{a}_{b}", "x", f"returns {a} times x plus {b}", lambda x: a * x + b, _ints(rng)


def _level_5(rng):  # a string repeated
    k = rng.randint(2, 4)
    words = ["ab", "xy", "cat", "hi", "no"]
    return (f"repeat_{NUMBERS[k]}", "s", f"returns the string s repeated {k} times",
            lambda s: s * k, [rng.choice(words) for _ in range(4)])


def _level_6(rng):  # sum of a list
    return ("total", "values", "returns the sum of the list values",
            lambda values: sum(values),
            [[rng.randint(0, 20) for _ in range(rng.randint(1, 5))] for _ in range(4)])


def _level_7(rng):  # the larger of x and a constant
    k = rng.randint(3, 9)
    return (f"at_least_{NUMBERS[k]}", "x", f"returns x if x is larger than {k}, else {k}",
            lambda x: max(x, k), [rng.randint(0, 12) for _ in range(4)])


def _ints(rng) -> list[int]:
    return [rng.randint(-20, 50) for _ in range(4)]


LEVELS = {1: _level_1, 2: _level_2, 3: _level_3, 4: _level_4, 5: _level_5, 6: _level_6,
          7: _level_7}


def examples(split: str = "train", levels=(1, 2, 3), n: int = 64, seed: int = 0) -> list[Example]:
    """``n`` distinct problems of ``split``, levels taken in turn, deterministic from ``seed``;
    a problem is its function (name and task) with its inputs."""
    def draw(level, rng, index):
        name, arg, task, function, inputs = LEVELS[level](rng)
        question = f"Write a Python function {name}({arg}) that {task}."
        asserts = [f"assert {name}({value!r}) == {function(value)!r}" for value in inputs]
        return question + repr(inputs), Example(
            f"C{level}-{index}", DEMONSTRATION + ({"role": "user", "content": question},),
            json.dumps({"assert_case": asserts}), f"code-L{level}")

    return distinct("code", LEVELS, split, levels, n, seed, draw)
