"""The built-in task ``chain``: a product too large to compute in one's head, then a further
step on its result, for runs with a Python tool (``rollout.tools=[python]``; ``rollout/tools.py``).

The tool helps but does not finish the job: an answer computes the product, reads the result
back and takes the further step, in its head (level 1: times ten; level 2: plus one) or in a
second call that starts from the number it read (level 3: minus a four-digit number; level 4:
the sum of its digits). Each prompt shows worked examples of its own level (the built-in model
copies the steps it sees, and takes none it was not shown). Answers are integers, checked by
the math rule as in ``arithmetic``; the splits are disjoint in the same way
(``tasks.split_of``).
"""

from __future__ import annotations

from megatron_rlep.example import Example
from megatron_rlep.tasks import distinct
from megatron_rlep.tasks.calculator import SYSTEM, chat_call, fenced_call

SHOWS_TOOL_CALL = True  # its prompt shows calls in the run's format (``rollout.tool_format``)
STEPS = {1: "multiply the result by $10$", 2: "add $1$ to the result",
         3: "subtract ${}$ from the result", 4: "add up the digits of the result"}
# the worked examples' numbers: the fenced prompt shows the first, the chat prompt both (after
# one, the built-in model rarely calls in the chat format: docs/tools.md)
EXAMPLES = ((4821, 37, 1234), (6359, 24, 2718))


def question(a: int, b: int, level: int, c: int | None = None) -> str:
    return f"Compute ${a} \\times {b}$, then {STEPS[level].format(c)}."


def answer(product: int, level: int, c: int | None = None) -> int:
    return {1: product * 10, 2: product + 1, 3: product - (c or 0),
            4: sum(int(d) for d in str(product))}[level]


def worked(level: int, a: int, b: int, c: int) -> tuple[str, tuple, str]:
    """A worked example of ``level``: its question, its calls with what the python tool prints
    (tests/test_tasks.py runs them), its answer. The product is one call; the further step is
    taken in the answer's head (levels 1, 2) or in a second call that starts from the number
    read back (3, 4)."""
    p = a * b
    calls = [(f"print({a} * {b})", str(p))]
    if level == 3:
        calls.append((f"print({p} - {c})", str(p - c)))
    if level == 4:
        calls.append((f'print(sum(map(int, "{p}")))', str(answer(p, 4))))
    return question(a, b, level, c), tuple(calls), str(answer(p, level, c))


def demonstration(level: int, tool_format: str = "fence") -> tuple:
    """The system turn and ``level``'s worked examples in ``tool_format``: fenced blocks, or the
    chat template's calls and tool messages."""
    shown = []
    for numbers in EXAMPLES[:2 if tool_format == "chat" else 1]:
        problem, calls, result = worked(level, *numbers)
        shown.append({"role": "user", "content": problem})
        if tool_format == "chat":
            shown += [m for code, out in calls for m in chat_call(code, out)]
            shown.append({"role": "assistant", "content": f"Answer: {result}"})
        else:
            shown.append({"role": "assistant", "content": "".join(
                fenced_call(code, out) for code, out in calls) + f"Answer: {result}"})
    return ({"role": "system", "content": SYSTEM[tool_format]}, *shown)


def _draw(level):
    def draw(rng):
        a, b = rng.randint(1000, 9999), rng.randint(11, 99)  # four digits by two
        c = rng.randint(1000, 9999) if level == 3 else None
        return question(a, b, level, c), answer(a * b, level, c)
    return draw


LEVELS = {level: _draw(level) for level in STEPS}


def examples(split: str = "train", levels=(1, 2), n: int = 64, seed: int = 0,
             tool_format: str = "fence") -> list[Example]:
    """``n`` distinct problems of ``split``, levels taken in turn, deterministic from ``seed``;
    the prompt's worked example calls the tool in ``tool_format`` (``rollout.tool_format``)."""
    fmt = "chat" if tool_format == "chat" else "fence"

    def draw(level, rng, index):
        problem, result = LEVELS[level](rng)
        prompt = demonstration(level, fmt) + ({"role": "user", "content": problem},)
        return problem, Example(f"H{level}-{index}", prompt, str(result),
                                f"arithmetic-chain-L{level}")

    return distinct("chain", LEVELS, split, levels, n, seed, draw)
