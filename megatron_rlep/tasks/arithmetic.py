"""The built-in task ``arithmetic``: integer-answer arithmetic problems in the DAPO template.

Problems are drawn from a seeded generator per difficulty level. A problem belongs to the test
split when a hash of its text falls in the test bucket (1 in 8), to the train split otherwise,
so the splits are disjoint by construction and the same for every seed. Each prompt is a
one-line system message asking for the DAPO rule's "Answer:" line, one worked example, then the
question: about 74 tokens with SmolLM2's chat template (the DAPO template twice, after the
model's default system prompt, made 186, ten times a typical answer). Levels run from
one-digit sums to multi-step expressions; ``docs/arithmetic_levels.md`` records how often the
built-in model solves each.

This module generates examples only; it does not score them (the verifier does).
"""

from __future__ import annotations

from megatron_rlep.example import Example
from megatron_rlep.tasks import distinct
# One worked example before each question shows the 135M model the "Answer:" line format.
DEMONSTRATION = (
    {"role": "system", "content": "Solve the problem. Put the final answer on its own line "
                                  "after \"Answer:\"."},
    {"role": "user", "content": "Compute $12 + 5$."},
    {"role": "assistant", "content": "12 + 5 = 17.\nAnswer: 17"},
)


def _level_1(rng):  # a + b, up to 20 plus one digit
    a, b = rng.randint(1, 20), rng.randint(1, 9)
    return f"{a} + {b}", a + b


def _level_2(rng):  # times tables up to 12
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"{a} \\times {b}", a * b


def _level_3(rng):  # a + b, two digits
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} + {b}", a + b


def _level_4(rng):  # a - b, two digits minus one digit
    a, b = rng.randint(10, 99), rng.randint(2, 9)
    return f"{a} - {b}", a - b


def _level_5(rng):  # a + b + c, two digits
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} + {b} + {c}", a + b + c


def _level_6(rng):  # a * b, two digits by one digit
    a, b = rng.randint(11, 99), rng.randint(2, 9)
    return f"{a} \\times {b}", a * b


def _level_7(rng):  # a * b, two digits by two digits
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return f"{a} \\times {b}", a * b


LEVELS = {1: _level_1, 2: _level_2, 3: _level_3, 4: _level_4, 5: _level_5, 6: _level_6,
          7: _level_7}


def examples(split: str = "train", levels=(1, 2, 3), n: int = 64, seed: int = 0) -> list[Example]:
    """``n`` distinct problems of ``split``, levels taken in turn, deterministic from ``seed``."""
    def draw(level, rng, index):
        expression, answer = LEVELS[level](rng)
        prompt = DEMONSTRATION + ({"role": "user", "content": f"Compute ${expression}$."},)
        return expression, Example(f"L{level}-{index}", prompt, str(answer), f"arithmetic-L{level}")

    return distinct("arithmetic", LEVELS, split, levels, n, seed, draw)
