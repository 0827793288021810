"""Evaluation metrics over n sampled answers per question: mean@n, pass@k and maj@k.

Per question with n samples of which c are correct:

* ``mean@n`` = c / n, the paper's number (accuracy averaged over samples).
* ``pass@k`` = 1 - C(n-c, k) / C(n, k), the unbiased estimator of Chen et al. 2021: the chance
  that a random k-subset of the n samples holds a correct one.
* ``maj@k``: the majority vote over the normalised predictions of k samples is correct. Samples
  without a prediction (no answer line) do not vote; with no vote at all the question counts
  as wrong. Tie rule: among the most frequent predictions, the one whose first vote comes
  earliest in sample order wins. At k = n the vote is over all samples; for k < n it is the
  mean over k-subsets (kept in sample order): every subset when there are at most
  ``MAJ_SUBSETS`` of them, else ``MAJ_SUBSETS`` subsets drawn with a seed fixed by
  (question, k), so the number never changes between runs.

Each dataset's number is the mean over its questions; its standard error is the standard
deviation of the per-question values over sqrt(questions) (0 with one question). ``all`` pools
the questions of every dataset. k runs over 1, 2, 4, ... and n itself.

The input is the rows of ``samples.jsonl``: ``data_source``, ``id``, ``sample_index``,
``pred``, ``correct``. Pure functions; no files, models or verifiers.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import Counter

MAJ_SUBSETS = 1000


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as a product so it never overflows."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_correct(preds: list, correct: list[bool]) -> bool:
    """Whether the majority vote of these samples (in sample order) is correct."""
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(p for p in preds if p is not None and votes[p] == top)  # earliest first vote
    return any(ok for p, ok in zip(preds, correct) if p == winner)


def maj_at_k(preds: list, correct: list[bool], k: int, key: str = "") -> float:
    """Mean majority-vote correctness over k-subsets of the samples (see the module doc)."""
    n = len(preds)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n (n={n}, k={k})")
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets = itertools.combinations(range(n), k)
    else:
        digest = hashlib.sha256(f"maj\x00{key}\x00{k}".encode()).digest()
        rng = random.Random(digest)
        subsets = (sorted(rng.sample(range(n), k)) for _ in range(MAJ_SUBSETS))
    results = [majority_correct([preds[i] for i in s], [correct[i] for i in s]) for s in subsets]
    return sum(results) / len(results)


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    return ks if ks[-1] == n else ks + [n]


def mean_or_none(values) -> float | None:
    """The mean of ``values`` (any iterable), or None when there are none."""
    values = list(values)
    return sum(values) / len(values) if values else None


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def question_table(rows) -> dict[tuple[str, str], list[dict]]:
    """Rows grouped by (data_source, id), each group in sample order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["data_source"], str(row["id"])), []).append(row)
    for group in groups.values():
        group.sort(key=lambda r: r["sample_index"])
    return groups


def summarize(groups: list[list[dict]]) -> dict:
    """The metrics of a set of questions (each a list of sample rows in sample order)."""
    n = min(len(g) for g in groups)  # questions with more samples use their first n
    groups = [g[:n] for g in groups]
    ks = k_values(n)
    per_question = {"mean@n": [], **{f"pass@{k}": [] for k in ks}, **{f"maj@{k}": [] for k in ks}}
    for g in groups:
        preds, correct = [r["pred"] for r in g], [bool(r["correct"]) for r in g]
        key = f"{g[0]['data_source']}\x00{g[0]['id']}"
        per_question["mean@n"].append(sum(correct) / n)
        for k in ks:
            per_question[f"pass@{k}"].append(pass_at_k(n, sum(correct), k))
            per_question[f"maj@{k}"].append(maj_at_k(preds, correct, k, key))
    stats = {name: mean_and_stderr(values) for name, values in per_question.items()}
    out = {"n": n, "questions": len(groups), "mean@n": stats["mean@n"][0],
           "pass@k": {str(k): stats[f"pass@{k}"][0] for k in ks},
           "maj@k": {str(k): stats[f"maj@{k}"][0] for k in ks},
           "stderr": {"mean@n": stats["mean@n"][1],
                      "pass@k": {str(k): stats[f"pass@{k}"][1] for k in ks},
                      "maj@k": {str(k): stats[f"maj@{k}"][1] for k in ks}}}
    return out


def compute(rows) -> dict:
    """``{"<data_source>": {...}, "all": {...}}`` from sample rows (see the module doc)."""
    table = question_table(rows)
    if not table:
        raise ValueError("no samples to compute metrics from")
    sources = list(dict.fromkeys(source for source, _ in table))
    out = {s: summarize([g for (src, _), g in table.items() if src == s]) for s in sources}
    out["all"] = summarize(list(table.values()))
    return out


def markdown(metrics: dict) -> str:
    """A table: one row per data source, mean@n, pass@k and maj@k with standard errors."""
    ks = list(metrics["all"]["pass@k"])
    head = ["data source", "questions", "n", "mean@n"] + [f"pass@{k}" for k in ks] + \
           [f"maj@{k}" for k in ks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for source, m in metrics.items():
        def cell(value, err):
            return f"{100 * value:.1f} ± {100 * err:.1f}"
        cells = [source, str(m["questions"]), str(m["n"]), cell(m["mean@n"], m["stderr"]["mean@n"])]
        cells += [cell(m["pass@k"][k], m["stderr"]["pass@k"][k]) if k in m["pass@k"] else "-"
                  for k in ks]
        cells += [cell(m["maj@k"][k], m["stderr"]["maj@k"][k]) if k in m["maj@k"] else "-"
                  for k in ks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nNumbers in %, ± one standard error over questions.\n"
