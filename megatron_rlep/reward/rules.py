"""Which rule scores an answer, and the rules themselves, as a scorer worker runs them.

``verifier.mode`` picks: ``dapo`` or ``math`` (the math rule for every answer), ``code`` (the
code checker in the sandbox for every answer), or ``custom``, which dispatches by the example's
``data_source`` as verl's default reward does: math sources to the math rule
(``verifier.math_rule``), code sources to the code checker, everything else to the user's
function ``verifier.function`` (``FILE.py:NAME`` or ``package.module:NAME``), called as verl
calls it: ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

A function returns a float, or a dict with ``score`` and optionally ``acc`` (and ``pred``).
``acc`` is what "verified" means for dynamic sampling, the experience pool and evaluation;
without it an answer is verified when its score is above 0. The math rule and the code checker
give +1 for a verified answer and -1 otherwise (the code checker's ``partial_credit``: 2 x the
share of tests passed - 1; verified only when all pass).

This module runs inside the scorer's worker processes (``worker.py``), never in a trainer's.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
from pathlib import Path

from megatron_rlep.reward.sources import source_kind


def load_function(spec: str):
    """The function ``spec`` names: ``FILE.py:NAME`` or ``package.module:NAME``; ValueError in
    one sentence naming what is wrong."""
    where, _, name = (spec or "").rpartition(":")
    if not where or not name:
        raise ValueError(f"verifier.function={spec!r} must be FILE.py:NAME or module:NAME "
                         "(e.g. verifier.function=my_reward.py:compute_score)")
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"verifier.function={spec}: {path} does not exist; give the "
                             "reward file's path (relative to where the command runs)")
        module_spec = importlib.util.spec_from_file_location(f"reward_plugin_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            raise ValueError(f"verifier.function={spec}: importing {path} failed "
                             f"({type(err).__name__}: {err})") from None
    else:
        try:
            module = importlib.import_module(where)
        except Exception as err:
            raise ValueError(f"verifier.function={spec}: module {where} does not import "
                             f"({type(err).__name__}: {err})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"verifier.function={spec}: {where} has no function {name}")
    return function


def from_function(result) -> tuple[float, bool, str | None]:
    """(score, verified, prediction) of what a reward function returned; TypeError or
    ValueError, in one sentence, for a result that is not a finite number (NaN or infinity
    would poison every advantage of its group)."""
    pred = None
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(f"returned a dict without 'score' (keys {sorted(result)}); return "
                            "a float or a dict with 'score' and optionally 'acc'")
        score = finite(result["score"], "'score'")
        verified = bool(result["acc"]) if "acc" in result else score > 0
        pred = None if result.get("pred") is None else str(result["pred"])
        return score, verified, pred
    score = finite(result, "a score")
    return score, score > 0, pred


def finite(value, what: str) -> float:
    """``value`` as a float (True and False are 1 and 0); it must be a finite real number."""
    if not isinstance(value, numbers.Real) and not (
            isinstance(value, str) and what == "'score'"):
        raise TypeError(f"returned {what} of type {type(value).__name__}; return a float or a "
                        "dict with 'score'")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"returned {what} {str(value)[:40]!r}, not a number; return a float "
                        "or a dict with 'score'") from None
    if not math.isfinite(number):
        raise ValueError(f"returned {what} of {number}, which is not a finite number; return "
                         "a finite float (an answer it cannot score: raise, and it is counted "
                         "as an error)")
    return number


class Rules:
    """The rules of one ``verifier`` setting (a dict of its keys); ``score(item)`` gives a dict:
    score, correct, pred, status (``ok``, or ``infra`` when the sandbox could not start)."""

    def __init__(self, settings: dict):
        self.mode = settings["mode"]
        self.settings = settings
        self._math, self._code = None, None
        self.function = load_function(settings["function"]) if self.mode == "custom" else None

    def route(self, data_source: str) -> str:
        if self.mode in ("dapo", "math"):
            return "math"
        if self.mode == "code":
            return "code"
        kind = source_kind(data_source)
        return kind if kind != "other" else "function"

    def score(self, item: dict) -> dict:
        route = self.route(item["data_source"])
        if route == "math":
            if self._math is None:
                from megatron_rlep.reward.math_rule import MathRule

                rule = self.mode if self.mode in ("dapo", "math") else self.settings["math_rule"]
                self._math = MathRule(rule)
            correct, pred = self._math.verdict(item["response"], item["ground_truth"])
            return {"score": 1.0 if correct else -1.0, "correct": correct, "pred": pred,
                    "status": "ok"}
        if route == "code":
            verdict = self.code_checker().check(item["response"], item["ground_truth"],
                                                item.get("extra_info"))
            if verdict.status == "infra":
                return {"score": 0.0, "correct": False, "pred": None, "status": "infra",
                        "error": verdict.detail}
            share = verdict.passed / verdict.total if verdict.total else 0.0
            score = 2 * share - 1 if self.settings["code"]["partial_credit"] else \
                (1.0 if verdict.correct else -1.0)
            return {"score": score, "correct": verdict.correct,
                    "pred": f"{verdict.passed}/{verdict.total}", "status": "ok"}
        score, verified, pred = from_function(self.function(
            item["data_source"], item["response"], item["ground_truth"], item.get("extra_info")))
        return {"score": score, "correct": verified, "pred": pred, "status": "ok"}

    def code_checker(self):
        if self._code is None:
            from megatron_rlep.reward.code import CodeChecker
            from megatron_rlep.reward.sandbox import Limits, isolation

            c = self.settings["code"]
            self._code = CodeChecker(Limits(c["wall_s"], c["cpu_s"], c["memory_mb"], c["nproc"],
                                            c["fsize_mb"], c["tmpfs_mb"], c["output_kb"] << 10),
                                     c["partial_credit"], c["in_process_patching"],
                                     **isolation(self.settings.get("sandbox")))
        return self._code

    def close(self) -> None:
        if self._math is not None:
            self._math.close()
