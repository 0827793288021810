"""Paired comparison of two runs on the same held-out questions, by bootstrap over questions.

Both runs answer the same questions with the same sampling seeds at every validation, so their
difference is paired: a question's noise is shared. Each statistic is computed on the questions
as they are, then on ``reps`` resamples of the questions (with replacement, the same resample
for both runs and for every step of a curve); the 95% interval is the 2.5th and 97.5th
percentile of the resampled values.

* ``difference``: mean accuracy of B minus A, per question set (a validation point, or the
  final evaluation).
* ``curves``: the same at every common validation step (with each run's own interval too);
  the difference of the areas under the curves (trapezoids, divided by the steps spanned: a
  mean accuracy over training); and the first step at which each run reaches a threshold (a
  fixed accuracy, or A's best), with the share of resamples in which it does.

* ``nested``: a statistic pooled over several seeds, each with its own questions, with a
  two-level bootstrap: resample the seeds, then each drawn seed's questions.
* ``joint``: the same for seeds that share their questions (every seed of a study validates on
  the same held-out set): one resample of the questions serves every seed drawn.
  ``difference_of`` turns two per-seed differences into a difference-in-differences.

Input: ``{question id: accuracy}`` per run (the mean over that question's answers). Pure
functions; ``validation_records`` alone reads a run's files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable


def question_accuracy(rows) -> dict[str, float]:
    """Mean correctness per question from rows with ``id`` (and ``data_source``) and ``correct``."""
    totals: dict[str, list[int]] = {}
    for row in rows:
        key = f"{row.get('data_source', '')}/{row['id']}"
        totals.setdefault(key, [0, 0])
        totals[key][0] += bool(row["correct"])
        totals[key][1] += 1
    return {key: right / n for key, (right, n) in totals.items()}


def validation_records(run_dir: str | Path) -> dict[int, dict[str, float]]:
    """{step: {question: accuracy}} from a run's per-answer validation records
    (``RUN/validation/step-*.jsonl``, written by the trainer)."""
    out = {}
    for path in sorted((Path(run_dir) / "validation").glob("step-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[int(path.stem.split("-")[1])] = question_accuracy(rows)
    if not out:
        raise FileNotFoundError(f"{Path(run_dir) / 'validation'} holds no step-*.jsonl; a paired "
                                "comparison needs runs whose trainer wrote per-answer validation "
                                "records")
    return out


def resamples(questions: list[str], reps: int, seed: int) -> list[list[str]]:
    """``reps`` draws of len(questions) questions with replacement, the first one unresampled."""
    rng = random.Random(seed)
    return [questions] + [rng.choices(questions, k=len(questions)) for _ in range(reps)]


def interval(values: list[float]) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles (nearest rank)."""
    ordered = sorted(values)
    last = len(ordered) - 1
    return ordered[round(0.025 * last)], ordered[round(0.975 * last)]


def _mean(acc: dict[str, float], sample: list[str]) -> float:
    return sum(acc[q] for q in sample) / len(sample)


def _common(a: dict, b: dict) -> list[str]:
    questions = sorted(a.keys() & b.keys())
    if not questions or len(questions) != len(a) or len(questions) != len(b):
        raise ValueError(f"a paired comparison needs the same questions in both runs "
                         f"({len(a)} and {len(b)}, {len(questions)} in common)")
    return questions


def difference(a: dict[str, float], b: dict[str, float], reps: int = 2000, seed: int = 0) -> dict:
    """B's mean accuracy minus A's, with its bootstrap interval."""
    draws = resamples(_common(a, b), reps, seed)
    diffs = [_mean(b, s) - _mean(a, s) for s in draws]
    low, high = interval(diffs[1:])
    return {"diff": diffs[0], "low": low, "high": high, "questions": len(draws[0])}


def area(steps: list[int], values: list[float]) -> float:
    """Trapezoid area under (steps, values) over the steps spanned (the value itself for one step)."""
    if len(steps) == 1:
        return values[0]
    total = sum((s1 - s0) * (v0 + v1) / 2
                for s0, s1, v0, v1 in zip(steps, steps[1:], values, values[1:]))
    return total / (steps[-1] - steps[0])


def first_step(steps: list[int], values: list[float], threshold: float):
    return next((s for s, v in zip(steps, values) if v >= threshold - 1e-12), None)


def curves(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], threshold: float,
           reps: int = 2000, seed: int = 0) -> dict:
    """Per common step, the area and steps-to-threshold, each with its interval (see above)."""
    steps = sorted(a.keys() & b.keys())
    if not steps:
        raise ValueError("the two runs have no validation step in common")
    questions = _common(a[steps[0]], b[steps[0]])
    for s in steps:
        _common(a[s], b[s])
    draws = resamples(questions, reps, seed)
    curve_a = [[_mean(a[s], d) for s in steps] for d in draws]
    curve_b = [[_mean(b[s], d) for s in steps] for d in draws]
    out = {"steps": steps, "per_step": [], "questions": len(questions)}
    for i, s in enumerate(steps):
        diffs = [cb[i] - ca[i] for ca, cb in zip(curve_a, curve_b)]
        low, high = interval(diffs[1:])
        (a_low, a_high), (b_low, b_high) = (interval([c[i] for c in curve[1:]])
                                            for curve in (curve_a, curve_b))
        out["per_step"].append({"step": s, "a": curve_a[0][i], "b": curve_b[0][i],
                                "diff": diffs[0], "low": low, "high": high, "a_low": a_low,
                                "a_high": a_high, "b_low": b_low, "b_high": b_high})
    areas = [area(steps, cb) - area(steps, ca) for ca, cb in zip(curve_a, curve_b)]
    low, high = interval(areas[1:])
    out["area"] = {"a": area(steps, curve_a[0]), "b": area(steps, curve_b[0]),
                   "diff": areas[0], "low": low, "high": high}
    out["to_threshold"] = {}
    for name, level in (("fixed", lambda ca: threshold), ("a_best", max)):  # A's best: per draw
        entry = {"level": level(curve_a[0])}
        for run, curve in (("a", curve_a), ("b", curve_b)):
            reached = [first_step(steps, c, level(ca)) for c, ca in zip(curve, curve_a)]
            hits = [r for r in reached[1:] if r is not None]
            entry[run] = {"step": reached[0], "reached_share": len(hits) / reps,
                          "low": interval(hits)[0] if hits else None,
                          "high": interval(hits)[1] if hits else None}
        out["to_threshold"][name] = entry
    return out


def curve_area_difference(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]
                          ) -> tuple[list[str], Callable[[list[str]], float]]:
    """(the questions, the area of B's curve minus A's on a sample of them), for ``nested``."""
    steps = sorted(a.keys() & b.keys())
    if not steps:
        raise ValueError("the two runs have no validation step in common")
    questions = _common(a[steps[0]], b[steps[0]])
    return questions, lambda sample: (area(steps, [_mean(b[s], sample) for s in steps]) -
                                      area(steps, [_mean(a[s], sample) for s in steps]))


def point_difference(a: dict[str, float], b: dict[str, float]
                     ) -> tuple[list[str], Callable[[list[str]], float]]:
    """(the questions, B's mean accuracy minus A's on a sample of them), for ``nested``."""
    return _common(a, b), lambda sample: _mean(b, sample) - _mean(a, sample)


def nested(units: list[tuple[list[str], Callable[[list[str]], float]]], reps: int = 2000,
           seed: int = 0) -> dict:
    """The mean over seeds of a per-seed statistic, with a 95% interval from a two-level
    bootstrap: each draw takes len(units) seeds with replacement, then, for each seed drawn,
    its questions with replacement, and averages the statistic over the seeds drawn. ``units``
    holds one (questions, statistic) pair per seed."""
    rng = random.Random(seed)
    value = sum(stat(questions) for questions, stat in units) / len(units)
    draws = []
    for _ in range(reps):
        picked = rng.choices(units, k=len(units))
        draws.append(sum(stat(rng.choices(questions, k=len(questions)))
                         for questions, stat in picked) / len(picked))
    low, high = interval(draws)
    return {"mean": value, "low": low, "high": high, "seeds": len(units)}


def difference_of(a: tuple[list[str], Callable[[list[str]], float]],
                  b: tuple[list[str], Callable[[list[str]], float]]
                  ) -> tuple[list[str], Callable[[list[str]], float]]:
    """(the questions, B's statistic minus A's on a sample of them) for two statistics of the
    same questions (``point_difference``, ``curve_area_difference``): with each a difference
    of two runs, a difference-in-differences."""
    if a[0] != b[0]:
        raise ValueError(f"a difference of two statistics needs the same questions "
                         f"({len(a[0])} and {len(b[0])})")
    return a[0], lambda sample: b[1](sample) - a[1](sample)


def joint(units: list[tuple[list[str], Callable[[list[str]], float]]], reps: int = 2000,
          seed: int = 0) -> dict:
    """The mean over seeds of a per-seed statistic whose seeds share their questions, with a
    95% interval from a bootstrap that draws the seeds with replacement and one resample of
    the shared questions for all of them (``nested`` resamples each seed's questions on their
    own, which treats one held-out set as several and narrows the interval); and each seed's
    value."""
    questions = units[0][0]
    if any(q != questions for q, _ in units):
        raise ValueError("a joint bootstrap needs every seed on the same questions; use nested")
    per_seed = [stat(questions) for _, stat in units]
    rng = random.Random(seed)
    draws = []
    for _ in range(reps):
        picked = rng.choices(units, k=len(units))
        sample = rng.choices(questions, k=len(questions))
        draws.append(sum(stat(sample) for _, stat in picked) / len(picked))
    low, high = interval(draws)
    return {"mean": sum(per_seed) / len(per_seed), "low": low, "high": high,
            "seeds": len(units), "per_seed": per_seed}
