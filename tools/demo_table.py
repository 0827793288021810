"""One markdown table of several demo runs (e.g. seeds), from their ``report.json``.

    python tools/demo_table.py runs/demo-seed1 runs/demo-seed2 runs/demo-seed3 [--json FILE]

A row per run: peak held-out accuracy and its step for the baseline and RLEP, the first step at
which RLEP reaches the baseline's peak, final validation accuracy, the evaluation's mean@n, the
pool's size and the demo's wall time; then the mean over runs of every numeric column.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ["seed", "baseline peak", "baseline peak step", "RLEP peak", "RLEP peak step",
           "RLEP reaches baseline peak at step", "baseline final", "RLEP final",
           "baseline eval mean@n", "RLEP eval mean@n", "pool questions", "pool answers",
           "demo minutes"]


def row(report: dict) -> list:
    b, r = report["runs"]["baseline"], report["runs"]["rlep"]
    return [report["seed"], b["peak"], b["peak_step"], r["peak"], r["peak_step"],
            report["rlep_steps_to_baseline_peak"], b["final"], r["final"], b["eval"]["mean@n"],
            r["eval"]["mean@n"], report["pool"]["questions"], report["pool"]["trajectories"],
            report["total_seconds"] / 60]


def cell(value) -> str:
    if value is None:
        return "never"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: list[list]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    means = ["mean"]
    for i in range(1, len(COLUMNS)):
        values = [r[i] for r in rows]
        means.append(sum(values) / len(values) if None not in values else
                     f"{sum(v is not None for v in values)} of {len(values)} reach it")
    lines.append("| " + " | ".join(cell(v) if not isinstance(v, str) else v for v in means) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="demo output directories")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.runs if not (d / "report.json").is_file()]
    if missing:
        print(f"error: {', '.join(missing)} hold no report.json; give directories a finished "
              "python -m megatron_rlep.demo wrote", file=sys.stderr)
        return 2
    rows = [row(json.loads((d / "report.json").read_text())) for d in args.runs]
    print(table(rows), end="")
    if args.json:
        args.json.write_text(json.dumps([dict(zip(COLUMNS, r)) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
