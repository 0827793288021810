"""Recompute evaluation metrics from saved samples.

    python tools/metrics.py DIR/samples.jsonl -o METRICS.json [--md METRICS.md]

Each line of the input is one sample with ``data_source``, ``id``, ``sample_index``, ``pred``
and ``correct`` (tools/evaluate.py writes them). The metrics (mean@n, pass@k, maj@k with
standard errors, per data source and over all) are defined in megatron_rlep/metrics.py; the
table is printed as well.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep import metrics  # noqa: E402
from megatron_rlep.files import write_json_atomic, write_text_atomic  # noqa: E402

FIELDS = ("data_source", "id", "sample_index", "pred", "correct")


def read_samples(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not JSON ({err.msg}); each line must "
                                 "be one sample object.") from None
            missing = [k for k in FIELDS if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"{path}: line {number} lacks {', '.join(missing)}; each sample "
                                 f"needs {', '.join(FIELDS)} (as tools/evaluate.py writes them).")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no samples; pass the samples.jsonl of an evaluation.")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--md", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        rows = read_samples(args.samples)
    except (OSError, ValueError) as err:
        message = err if isinstance(err, ValueError) else f"{args.samples} cannot be read " \
            f"({err.strerror}); pass the samples.jsonl of an evaluation."
        print(f"error: {message}", file=sys.stderr)
        return 2
    result = metrics.compute(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(result, args.output)
    table = metrics.markdown(result)
    if args.md:
        write_text_atomic(table, args.md)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
