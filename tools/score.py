#!/usr/bin/env python
"""Score responses against ground truths, with the trainer's rules and workers.

    python tools/score.py IN.jsonl|IN.parquet -o OUT.jsonl [--mode dapo|math|code|custom]
        [--function FILE.py:NAME] [--workers N] [--timeout S]

Each input row has ``response`` and a ground truth (``ground_truth``, or verl's
``reward_model.ground_truth``), and optionally ``data_source``, ``extra_info`` and ``length``
(the response length in tokens, used with --max-length for the overlong penalty); a verl-format
parquet of code problems with a ``response`` column is scored by its tests in the sandbox
(``--mode code``). Each output line is the row plus ``correct``, ``pred``, ``reward`` and
``status`` (ok, error, timeout, infra). The output is written to a temporary file and renamed,
so a failed run never leaves half a file. A summary (rows, accuracy, failures, seconds) goes to
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from megatron_rlep.config import VERIFIER_MODES
from megatron_rlep.reward.scorer import Item, Scorer, settings


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--mode", choices=VERIFIER_MODES, default="dapo")
    parser.add_argument("--function", help="custom: the reward function, FILE.py:NAME")
    parser.add_argument("--workers", type=int, default=2, help="scoring processes")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds an answer")
    parser.add_argument("--max-length", type=int, default=None,
                        help="response token limit; with a 'length' field adds the overlong penalty")
    parser.add_argument("--overlong-buffer", type=int, default=512)
    parser.add_argument("--overlong-factor", type=float, default=1.0)
    return parser.parse_args(argv)


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL or parquet file, each with ``response`` and ``ground_truth`` (taken
    from verl's ``reward_model.ground_truth`` where the row has no ``ground_truth``)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows, unit = pq.read_table(path).to_pylist(), "row"
    else:
        rows, unit = [], "line"
        with open(path, encoding="utf-8") as src:
            for number, line in enumerate(src, 1):
                if line.strip():
                    rows.append(_parse(line, number, path))
    for number, row in enumerate(rows, 1):
        if "ground_truth" not in row and isinstance(row.get("reward_model"), dict):
            row["ground_truth"] = row["reward_model"].get("ground_truth")
        for key in ("response", "ground_truth"):
            if row.get(key) is None:
                raise ValueError(f"{path}: {unit} {number} has no '{key}' field; each {unit} "
                                 "needs 'response' and 'ground_truth'.")
    return rows


def _parse(line: str, number: int, path: Path) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {number} is not JSON ({err.msg}); each line must be one "
                         f"JSON object.") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}: line {number} is not a JSON object; each line must be one.")
    return row


def score_file(args) -> tuple[int, int, float, dict]:
    start = time.time()
    rows = read_rows(args.input)
    scorer = Scorer(settings(args.mode, function=args.function, workers=args.workers,
                             timeout_s=args.timeout, max_failures=1.0),
                    max_length=args.max_length, overlong_buffer=args.overlong_buffer,
                    overlong_factor=args.overlong_factor)
    try:
        scores = scorer.score([Item(str(r.get("data_source") or ""), r["response"],
                                    str(r["ground_truth"]), r.get("extra_info") or None,
                                    r.get("length")) for r in rows])
    finally:
        scorer.close()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{args.output.name}.", dir=args.output.parent)
    try:
        with os.fdopen(fd, "w") as dst:
            for row, score in zip(rows, scores):
                row.update(correct=score.correct, pred=score.pred, reward=score.reward,
                           status=score.status)
                dst.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, args.output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    statuses = {s: sum(x.status == s for x in scores) for s in ("error", "timeout", "infra")}
    return len(rows), sum(s.correct for s in scores), time.time() - start, statuses


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.input.is_file():
        print(f"error: {args.input} does not exist; pass a JSONL or parquet file of responses.",
              file=sys.stderr)
        return 2
    try:
        rows, correct, seconds, failures = score_file(args)
    except ValueError as err:  # a bad file, or a reward function that does not load
        print(f"error: {err}", file=sys.stderr)
        return 2
    accuracy = correct / rows if rows else 0.0
    print(json.dumps({"rows": rows, "accuracy": round(accuracy, 6), "seconds": round(seconds, 3),
                      "mode": args.mode, **failures}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
