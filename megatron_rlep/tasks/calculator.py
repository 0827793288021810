"""The built-in task ``calculator``: arithmetic with numbers too large to do in one's head, for
runs with a Python tool (``rollout.tools=[python]``; ``rollout/tools.py``).

The prompt shows the tool's format once: a worked example whose answer runs a ``python`` block
and reads its ``output`` block before the "Answer:" line, so the built-in model calls the tool
from the first step. Answers are integers, checked by the math rule as in ``arithmetic``; the
splits are disjoint in the same way (``tasks.split_of``). Levels grow from a sum of three
four-digit numbers to products of three-digit numbers and sums of products.
"""

from __future__ import annotations

from megatron_rlep.example import Example
from megatron_rlep.tasks import distinct

SHOWS_TOOL_CALL = True  # its prompt shows a call in the run's format (``rollout.tool_format``)
ANSWER = "Put the final answer on its own line after \"Answer:\"."
# the system turn of a tool task's prompt, in each rollout.tool_format
SYSTEM = {"fence": "Solve the problem. You can run Python: write a ```python block and its "
                   f"output follows. {ANSWER}",
          "chat": f"Solve the problem. You can run Python with the python tool. {ANSWER}"}


def fenced_call(code: str, output: str) -> str:
    """A call and its output as the fenced format writes them (rollout/tools.py)."""
    return f"```python\n{code}\n```\n```output\n{output}\n```\n"


def chat_call(code: str, output: str) -> tuple:
    """A call and its tool message in the chat template's format (rollout/chat_tools.py)."""
    return ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "python", "arguments": {"code": code}}}]},
            {"role": "tool", "name": "python", "content": output})


DEMONSTRATION = (
    {"role": "system", "content": SYSTEM["fence"]},
    {"role": "user", "content": "Compute $4821 \\times 37$."},
    {"role": "assistant", "content": fenced_call("print(4821 * 37)", "178377") + "Answer: 178377"},
)


def chat_example(expression: str, code: str, result: str) -> tuple:
    """A worked example in the chat template's format: a call, its tool message, the answer."""
    return ({"role": "user", "content": f"Compute ${expression}$."}, *chat_call(code, result),
            {"role": "assistant", "content": f"Answer: {result}"})


# two worked examples: after one, the built-in model starts "<tool_" and goes on "response",
# writing the result itself, far more often than "call" (docs/tools.md)
CHAT_DEMONSTRATION = (
    {"role": "system", "content": SYSTEM["chat"]},
    *chat_example("4821 \\times 37", "print(4821 * 37)", "178377"),
    *chat_example("352 \\times 418 + 77", "print(352 * 418 + 77)", "147213"))


def _level_1(rng):  # a + b + c, four digits
    a, b, c = (rng.randint(1000, 9999) for _ in range(3))
    return f"{a} + {b} + {c}", a + b + c


def _level_2(rng):  # a * b, four digits by two digits
    a, b = rng.randint(1000, 9999), rng.randint(11, 99)
    return f"{a} \\times {b}", a * b


def _level_3(rng):  # a * b, three digits by three digits
    a, b = rng.randint(101, 999), rng.randint(101, 999)
    return f"{a} \\times {b}", a * b


def _level_4(rng):  # a * b + c * d, three digits by two
    a, b, c, d = rng.randint(101, 999), rng.randint(11, 99), rng.randint(101, 999), \
        rng.randint(11, 99)
    return f"{a} \\times {b} + {c} \\times {d}", a * b + c * d


LEVELS = {1: _level_1, 2: _level_2, 3: _level_3, 4: _level_4}


def examples(split: str = "train", levels=(1, 2), n: int = 64, seed: int = 0,
             tool_format: str = "fence") -> list[Example]:
    """``n`` distinct problems of ``split``, levels taken in turn, deterministic from ``seed``;
    the prompt's worked example calls the tool in ``tool_format`` (``rollout.tool_format``)."""
    shown = CHAT_DEMONSTRATION if tool_format == "chat" else DEMONSTRATION

    def draw(level, rng, index):
        expression, answer = LEVELS[level](rng)
        prompt = shown + ({"role": "user", "content": f"Compute ${expression}$."},)
        return expression, Example(f"C{level}-{index}", prompt, str(answer), f"arithmetic-calculator-L{level}")

    return distinct("calculator", LEVELS, split, levels, n, seed, draw)
