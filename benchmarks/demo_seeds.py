"""The two-phase demo for several seeds, and what they say together.

    python benchmarks/demo_seeds.py [--seeds 1 2 3 4 5] [--root runs/demo-seeds] \
        [--json docs/demo_seeds.json] [demo or training overrides ...]

Runs ``python -m megatron_rlep.demo seed=K out=ROOT/seed-K`` for each seed (a finished seed is
not run again: the demo resumes), then prints a Markdown table per seed of the paired
differences RLEP minus baseline (final evaluation, area under the validation curve, last
validation point; 95% paired bootstrap intervals over held-out questions) and the numbers that
explain them (replay fraction, effective M, the pool, the baseline's saturation, the replays'
share of the advantage mass), and the pooled line: the mean over seeds of each paired
difference with a 95% t-interval over seeds. Nothing is tuned on the result.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def logged_mean(run_dir: Path, key: str) -> float | None:
    values = [r[key] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def seed_row(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    c, base, rlep = report["paired"], report["runs"]["baseline"], report["runs"]["rlep"]
    return {"seed": report["seed"], "eval": c["evaluation"], "area": c["area"],
            "last": c["validation"][-1], "baseline_peak": base["peak"],
            "baseline_peak_step": base["peak_step"], "baseline_final": base["final"],
            "replay_fraction": rlep["replay_fraction"], "effective_m": rlep["effective_m"],
            "pool_questions": report["pool"]["questions"],
            "pool_pass_rate": report["pool"]["mean_pass_rate"],
            "replay_advantage_share": logged_mean(out / "rlep", "train/replay_advantage_share"),
            "minutes": report["total_seconds"] / 60}


def pooled(diffs: list[float]) -> dict:
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return {"mean": mean, "low": None, "high": None, "seeds": len(diffs)}
    half = T_975.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean": mean, "low": mean - half, "high": mean + half, "seeds": len(diffs)}


def markdown(rows: list[dict], pool: dict) -> str:
    def d(x):
        return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    lines = ["| seed | eval RLEP - baseline | area RLEP - baseline | last point RLEP - baseline | "
             "baseline peak (step) | baseline final | replay fraction | effective M | "
             "pool questions (pass rate) | replays' advantage share | minutes |",
             "|" + "---|" * 11]
    for r in rows:
        rate = f"{r['pool_pass_rate']:.2f}" if r["pool_pass_rate"] is not None else "-"
        share = f"{r['replay_advantage_share']:.3f}" if r["replay_advantage_share"] is not None else "-"
        lines.append(f"| {r['seed']} | {d(r['eval'])} | {d(r['area'])} | {d(r['last'])} | "
                     f"{r['baseline_peak']:.3f} ({r['baseline_peak_step']}) | "
                     f"{r['baseline_final']:.3f} | {r['replay_fraction']:.3f} | "
                     f"{r['effective_m']:.2f} | {r['pool_questions']} ({rate}) | {share} | "
                     f"{r['minutes']:.1f} |")

    def p(x):
        if x["low"] is None:
            return f"{x['mean']:+.3f}"
        return f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    lines.append(f"| pooled ({pool['eval']['seeds']} seeds, 95% t-interval) | {p(pool['eval'])} | "
                 f"{p(pool['area'])} | {p(pool['last'])} | | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--root", type=Path, default=Path("runs/demo-seeds"))
    parser.add_argument("--json", type=Path, default=None)
    args, overrides = parser.parse_known_args(argv)
    for seed in args.seeds:
        out = args.root / f"seed-{seed}"
        if not (out / "report.json").is_file():
            print(f"seed {seed}: python -m megatron_rlep.demo seed={seed} out={out}", flush=True)
            done = subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"seed={seed}",
                                   f"out={out}", "progress=false", *overrides])
            if done.returncode != 0:
                print(f"error: the demo for seed {seed} failed (exit {done.returncode}); its "
                      f"logs are in {out / 'logs'}; rerun to resume it", file=sys.stderr)
                return done.returncode
    rows = [seed_row(args.root / f"seed-{seed}") for seed in args.seeds]
    pool = {k: pooled([r[k]["diff"] for r in rows]) for k in ("eval", "area", "last")}
    text = markdown(rows, pool)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"seeds": rows, "pooled": pool, "overrides": overrides},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
