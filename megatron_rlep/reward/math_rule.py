"""Scoring math answers: the DAPO rule, an equivalence-aware mode, and DAPO's overlong penalty.

``mode="dapo"`` is the rule the paper trained with (docs/method.md, "The reward"):
look at the last 300 characters, take the last ``Answer: ...`` line, normalise prediction and
ground truth with the Minerva rules, compare as strings.

``mode="math"`` accepts everything the DAPO rule accepts, plus mathematically equivalent final
answers (``1/2`` = ``\\frac{1}{2}`` = ``0.5``, ``\\sqrt{12}`` = ``2\\sqrt{3}``, intervals, sets,
polynomials) decided by math-verify. math-verify (sympy) can hang or exhaust memory on hostile
input such as ``9^{9^{9}}``, so it runs in a child process (``equivalence.py``) that is killed
when it passes its deadline; obviously explosive answers are not sent at all.

This module scores text only: it knows nothing about tokenizers, models or training; the
scorer (``scorer.py``) runs it in its worker processes and shapes the reward.
"""

from __future__ import annotations

import re

DAPO_TAIL_CHARS = 300
MATH_TAIL_CHARS = 1000
INVALID = "[INVALID]"
ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva normalisation (Lewkowycz et al. 2022, appendix D.1), in the order the rule applies them.
_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)
_UNWRAP = (  # (pattern, replacement), applied once each, in order
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),  # keep the first $...$ span
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),  # \sqrt2 -> \sqrt{2}
)


def normalize_final_answer(answer: str) -> str:
    """Minerva's ``normalize_final_answer``: the string the DAPO rule compares."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in _REMOVED:
        answer = answer.replace(expression, "")
    for pattern, replacement in _UNWRAP:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():  # 100,000 -> 100000
        answer = answer.replace(",", "")
    return answer.strip()


def extract_answer_line(text: str) -> str | None:
    """The text after the last ``Answer:`` in ``text``, up to the end of its line."""
    matches = ANSWER_LINE.findall(text)
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def dapo_verdict(response: str, ground_truth: str) -> tuple[bool, str | None]:
    """The DAPO math rule: (correct, normalised prediction or None when no answer line).

    A response without an answer line is compared as the reference does, as "[INVALID]".
    """
    line = extract_answer_line(response[-DAPO_TAIL_CHARS:])
    pred = normalize_final_answer(INVALID if line is None else line)
    return pred == normalize_final_answer(ground_truth), (None if line is None else pred)


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: ``min(0, -(L - (L_max - buffer)) / buffer * factor)``.

    Zero up to ``L_max - buffer`` tokens, then falls linearly to ``-factor`` at ``L_max``.
    """
    if buffer <= 0:
        return 0.0
    return min(0.0, -(length - (max_length - buffer)) / buffer * factor)


class MathRule:
    """A math answer's verdict: ``dapo`` (the paper's rule) or ``math`` (the same, plus
    equivalent final answers decided by math-verify in a child process within ``timeout_s``,
    counted from when that child is ready)."""

    def __init__(self, mode: str = "dapo", timeout_s: float = 0.9):
        if mode not in ("dapo", "math"):
            raise ValueError(f"math rule {mode!r} is unknown; use 'dapo' or 'math'.")
        self.mode = mode
        self._equivalence = None
        if mode == "math":
            from megatron_rlep.reward.equivalence import EquivalenceChecker

            self._equivalence = EquivalenceChecker(timeout_s=timeout_s)

    def verdict(self, response: str, ground_truth: str) -> tuple[bool, str | None]:
        """(correct, the normalised prediction or None when the response gives no answer)."""
        if self.mode == "dapo":
            return dapo_verdict(response, str(ground_truth))
        tail = response[-MATH_TAIL_CHARS:]
        answer = extract_answer_line(tail)
        if answer is None:
            answer = last_boxed(tail)
        if answer is None:
            return False, None
        pred = normalize_final_answer(answer)
        if pred == normalize_final_answer(str(ground_truth)):
            return True, pred
        return self._equivalence.equivalent(answer, str(ground_truth)), pred

    def close(self) -> None:
        if self._equivalence is not None:
            self._equivalence.close()
