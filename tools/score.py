#!/usr/bin/env python
"""Score responses against ground truths.

    python tools/score.py IN.jsonl --mode {dapo,math} -o OUT.jsonl

Each input line is a JSON object with ``response`` and ``ground_truth`` (and optionally
``length``, the response length in tokens, used with --max-length for the overlong penalty).
Each output line is the input plus ``correct``, ``pred`` and ``reward``. The output is written
to a temporary file and renamed, so a failed run never leaves half a file. A summary (rows,
accuracy, seconds) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from megatron_rlep.verifier import Verifier


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--mode", choices=["dapo", "math"], default="dapo")
    parser.add_argument("--max-length", type=int, default=None,
                        help="response token limit; with a 'length' field adds the overlong penalty")
    parser.add_argument("--overlong-buffer", type=int, default=512)
    parser.add_argument("--overlong-factor", type=float, default=1.0)
    return parser.parse_args(argv)


def score_file(args) -> tuple[int, int, float]:
    verifier = Verifier(args.mode, max_length=args.max_length,
                        overlong_buffer=args.overlong_buffer, overlong_factor=args.overlong_factor)
    start, rows, correct = time.time(), 0, 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{args.output.name}.", dir=args.output.parent)
    try:
        with open(args.input, encoding="utf-8") as src, os.fdopen(fd, "w") as dst:
            for number, line in enumerate(src, 1):
                if not line.strip():
                    continue
                row = _parse(line, number, args.input)
                score = verifier.score(row["response"], str(row["ground_truth"]),
                                       length=row.get("length"))
                row.update(correct=score.correct, pred=score.pred, reward=score.reward)
                dst.write(json.dumps(row, ensure_ascii=False) + "\n")
                rows += 1
                correct += score.correct
        os.replace(tmp, args.output)
    finally:
        verifier.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return rows, correct, time.time() - start


def _parse(line: str, number: int, path: Path) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {number} is not JSON ({err.msg}); each line must be one "
                         f"JSON object.") from None
    for key in ("response", "ground_truth"):
        if not isinstance(row, dict) or key not in row:
            raise ValueError(f"{path}: line {number} has no '{key}' field; each line needs "
                             f"'response' and 'ground_truth'.")
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.input.is_file():
        print(f"error: {args.input} does not exist; pass a JSONL file of responses.",
              file=sys.stderr)
        return 2
    try:
        rows, correct, seconds = score_file(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    accuracy = correct / rows if rows else 0.0
    print(json.dumps({"rows": rows, "accuracy": round(accuracy, 6), "seconds": round(seconds, 3),
                      "mode": args.mode}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
