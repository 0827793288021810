"""The two-phase demo for several seeds, and what they say together.

    python studies/demo_seeds.py [--seeds 1 2 3 4 5] [--root runs/demo-seeds] \
        [--json docs/records/demo_history/demo_seeds.json] [--prune] [demo or training overrides ...]

Runs ``python -m megatron_rlep.demo seed=K out=ROOT/seed-K`` for each seed (a finished seed is
not run again: the demo resumes), then prints a Markdown table per seed of the paired
differences RLEP minus baseline (final evaluation, area under the validation curve, last
validation point; 95% paired bootstrap intervals over held-out questions) and the numbers that
explain them (replay fraction, effective M, the pool, the baseline's saturation, the replays'
share of the advantage mass), and the pooled line: the mean over seeds of each paired
difference with a 95% t-interval over seeds and a 95% interval from a two-level bootstrap over
seeds and, within each, held-out questions (megatron_rlep/paired.py ``nested``).

With ``compare=matched`` (a demo key) every seed also trains the compute-matched control (DAPO
with G + M fresh rollouts), and a second table compares RLEP with it, and it with the baseline,
the same way, with the sequences each run trained on and its training time.

``--prune`` removes the Megatron checkpoints of every finished seed (its ``hf/`` policies, logs
and validation records stay), so many seeds fit the disk. Nothing is tuned on the result.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def logged_mean(run_dir: Path, key: str) -> float | None:
    values = [r[key] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def seed_row(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    c, base, rlep = report["paired"], report["runs"]["baseline"], report["runs"]["rlep"]
    row = {"seed": report["seed"], "eval": c["evaluation"], "area": c["area"],
           "last": c["validation"][-1], "baseline_peak": base["peak"],
           "baseline_peak_step": base["peak_step"], "baseline_final": base["final"],
           "replay_fraction": rlep["replay_fraction"], "effective_m": rlep["effective_m"],
           "pool_questions": report["pool"]["questions"],
           "pool_pass_rate": report["pool"]["mean_pass_rate"],
           "replay_advantage_share": logged_mean(out / "rlep", "train/replay_advantage_share"),
           "minutes": report["total_seconds"] / 60}
    if report.get("matched"):
        row["matched"] = {name: {"eval": m["evaluation"], "area": m["area"],
                                 "last": m["validation"][-1]}
                          for name, m in report["matched"].items()}
        row["cost"] = {run: {"sequences": r["sequences"], "minutes": r["wall_s"] / 60}
                       for run, r in report["runs"].items()}
    return row


def tool_row(out: Path) -> dict | None:
    """A seed's runs with tools as their steps logged them (``train._tool_metrics``): the
    held-out curve, calls per answer at step 1 and over the run, the share of calls without
    error, and the seconds and share of a step's rollout in tools (medians over the steps
    without validation, whose calls earlier commits counted in); by step, ``TOOL_STEP_KEYS``.
    None for a run without tools."""
    from megatron_rlep.demo import TOOL_STEP_KEYS

    report, runs = json.loads((out / "report.json").read_text()), {}
    for run in ("baseline", "rlep"):
        log = out / run / "metrics.jsonl"
        steps = [r for r in map(json.loads, log.read_text().splitlines() if log.is_file() else [])
                 if r.get("tools/calls_per_answer") is not None]
        if not steps:
            return None
        plain = [r for r in steps if r.get("val/acc") is None] or steps
        runs[run] = {"curve": report["runs"][run]["curve"],
                     "first_calls": steps[0]["tools/calls_per_answer"],
                     "calls_per_answer": statistics.fmean(r["tools/calls_per_answer"]
                                                          for r in steps),
                     "ok_share": statistics.fmean(r["tools/ok_share"] for r in steps
                                                  if r.get("tools/ok_share") is not None),
                     "tools_s": statistics.median(r["time/tools_s"] for r in plain),
                     "time_share": statistics.median(r["tools/time_share"] for r in plain),
                     "per_step": [[r["step"], *(r.get(k) for k in TOOL_STEP_KEYS)]
                                  for r in steps]}
    return runs


def tools_markdown(rows: list[dict]) -> str:
    """One line per seed and run with tools, and their means over seeds."""
    lines = ["| seed | run | held-out accuracy by step | calls per answer (step 1; run) | "
             "calls without error | a step's rollout in tools |", "|" + "---|" * 6]
    keys = ("first_calls", "calls_per_answer", "ok_share", "tools_s", "time_share")
    for seed, runs in rows:
        for run, t in runs.items():
            curve = " / ".join(f"{acc:.3f}" for _, acc in t["curve"])
            lines.append(f"| {seed} | {run} | {curve} | {t['first_calls']:.2f}; "
                         f"{t['calls_per_answer']:.2f} | {t['ok_share']:.1%} | "
                         f"{t['tools_s']:.2f} s ({t['time_share']:.1%}) |")
    for run in rows[0][1]:
        m = {k: statistics.fmean(runs[run][k] for _, runs in rows) for k in keys}
        curves = zip(*(runs[run]["curve"] for _, runs in rows))
        curve = " / ".join(f"{statistics.fmean(acc for _, acc in point):.3f}" for point in curves)
        lines.append(f"| mean of {len(rows)} | {run} | {curve} | {m['first_calls']:.2f}; "
                     f"{m['calls_per_answer']:.2f} | {m['ok_share']:.1%} | "
                     f"{m['tools_s']:.2f} s ({m['time_share']:.1%}) |")
    return "\n".join(lines) + "\n\n" + steps_markdown(rows)


def steps_markdown(rows: list[dict], every: int = 4) -> str:
    """At step 1 and every ``every`` steps, the means over seeds (of the seeds that logged each
    at that step): calls per answer, the share of calls without error, the model's turns per
    answer, and the share of answers with a failed call that ended right (recovered)."""
    steps = _steps(rows, every)
    lines = ["| run | " + " | ".join(f"step {k}" for k in steps) + " |",
             "|" + "---|" * (1 + len(steps))]
    shown = (("{:.2f} calls", 0), ("{:.1%} without error", 1), ("{:.2f} turns", 2),
             ("{:.1%} recovered", 3))
    for run in rows[0][1]:
        cells = []
        for k in steps:
            at = [dict((x[0], x[1:]) for x in runs[run]["per_step"]).get(k) for _, runs in rows]
            parts = [form.format(statistics.fmean(values)) for form, i in shown
                     if (values := [a[i] for a in at if a and len(a) > i and a[i] is not None])]
            cells.append(", ".join(parts) or "-")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _steps(rows: list[dict], every: int) -> list[int]:
    last = max(x[0] for _, runs in rows for t in runs.values() for x in t["per_step"])
    return [1] + list(range(every, last + 1, every))


COMPARISONS = {"rlep_minus_matched": ("matched", "rlep"),
               "matched_minus_baseline": ("baseline", "matched")}


def bootstrap_pooled(root: Path, seeds: list[int], a: str, b: str) -> dict:
    """B minus A pooled over seeds for eval, area and last point, each with the two-level
    bootstrap interval over seeds and held-out questions (paired.nested)."""
    return pooled_pairs([(root / f"seed-{s}" / a, root / f"seed-{s}" / b) for s in seeds])


def final_evaluation(run_dir: Path) -> dict[str, float]:
    """{question: accuracy} of a demo run's final evaluation, which lies beside it in
    ``eval-RUN``."""
    from megatron_rlep import paired

    return paired.question_accuracy(json.loads(line) for line in (
        run_dir.parent / f"eval-{run_dir.name}" / "samples.jsonl").read_text().splitlines())


def pooled_pairs(pairs: list[tuple[Path, Path]]) -> dict:
    """B minus A for (A, B) run directories of the demo, one pair a seed, pooled as above."""
    from megatron_rlep import paired

    units = {"eval": [], "area": [], "last": []}
    for a, b in pairs:
        va, vb = paired.validation_records(a), paired.validation_records(b)
        last = max(va.keys() & vb.keys())
        units["eval"].append(paired.point_difference(final_evaluation(a), final_evaluation(b)))
        units["area"].append(paired.curve_area_difference(va, vb))
        units["last"].append(paired.point_difference(va[last], vb[last]))
    return {k: paired.nested(v) for k, v in units.items()}


def pooled(diffs: list[float]) -> dict:
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return {"mean": mean, "low": None, "high": None, "seeds": len(diffs)}
    half = T_975.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean": mean, "low": mean - half, "high": mean + half, "seeds": len(diffs)}


def matched_markdown(rows: list[dict], pool: dict, boot: dict) -> str:
    """The compute-matched table: RLEP - matched and matched - baseline per seed, with the
    sequences and minutes of every run, and the pooled lines."""
    def d(x):
        return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    runs = ("baseline", "rlep", "matched")
    lines = ["| seed | " + " | ".join(f"{m} {name.replace('_', ' ')}" for name in
                                      ("rlep_minus_matched", "matched_minus_baseline")
                                      for m in ("eval", "area", "last point")) +
             " | sequences (baseline / RLEP / matched) | minutes (baseline / RLEP / matched) |",
             "|" + "---|" * 9]
    for r in rows:
        m, cost = r["matched"], r["cost"]
        cells = [d(m[name][k]) for name in ("rlep_minus_matched", "matched_minus_baseline")
                 for k in ("eval", "area", "last")]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " | " +
                     " / ".join(str(cost[x]["sequences"]) for x in runs) + " | " +
                     " / ".join(f"{cost[x]['minutes']:.1f}" for x in runs) + " |")
    for label, intervals in (("95% t-interval", pool), ("95% bootstrap, seeds x questions", boot)):
        cells = [_pooled_cell(intervals[name][k]) for name in ("rlep_minus_matched",
                                                                "matched_minus_baseline")
                 for k in ("eval", "area", "last")]
        lines.append(f"| pooled ({len(rows)} seeds, {label}) | " + " | ".join(cells) + " | | |")
    return "\n".join(lines)


def _pooled_cell(x: dict) -> str:
    if x["low"] is None:
        return f"{x['mean']:+.3f}"
    return f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"


def markdown(rows: list[dict], pool: dict, boot: dict | None = None) -> str:
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

    p = _pooled_cell
    lines.append(f"| pooled ({pool['eval']['seeds']} seeds, 95% t-interval) | {p(pool['eval'])} | "
                 f"{p(pool['area'])} | {p(pool['last'])} | | | | | | | |")
    if boot is not None:
        lines.append(f"| pooled ({pool['eval']['seeds']} seeds, 95% bootstrap, seeds x questions) "
                     f"| {p(boot['eval'])} | {p(boot['area'])} | {p(boot['last'])} | | | | | | | |")
    return "\n".join(lines)


def prune(out: Path) -> None:
    """A finished seed's Megatron checkpoints go; its policies, logs and records stay."""
    for checkpoints in out.glob("*/checkpoints"):
        shutil.rmtree(checkpoints)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--root", type=Path, default=Path("runs/demo-seeds"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--prune", action="store_true",
                        help="remove finished seeds' Megatron checkpoints (see above)")
    args, overrides = parser.parse_known_args(argv)
    for seed in args.seeds:
        out = args.root / f"seed-{seed}"
        report = out / "report.json"
        matched_missing = "compare=matched" in overrides and report.is_file() and \
            not json.loads(report.read_text()).get("matched")
        if not report.is_file() or matched_missing:
            print(f"seed {seed}: python -m megatron_rlep.demo seed={seed} out={out}", flush=True)
            done = subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"seed={seed}",
                                   f"out={out}", "progress=false", *overrides])
            if done.returncode != 0:
                print(f"error: the demo for seed {seed} failed (exit {done.returncode}); its "
                      f"logs are in {out / 'logs'}; rerun to resume it", file=sys.stderr)
                return done.returncode
        if args.prune:
            prune(out)
    rows = [seed_row(args.root / f"seed-{seed}") for seed in args.seeds]
    pool = {k: pooled([r[k]["diff"] for r in rows]) for k in ("eval", "area", "last")}
    have_records = all((args.root / f"seed-{s}" / "eval-rlep" / "samples.jsonl").is_file()
                       for s in args.seeds)
    boot = bootstrap_pooled(args.root, args.seeds, "baseline", "rlep") if have_records else None
    text = markdown(rows, pool, boot)
    result = {"seeds": rows, "pooled": pool, "bootstrap": boot, "overrides": overrides}
    if all("matched" in r for r in rows):
        result["matched_pooled"] = {name: {k: pooled([r["matched"][name][k]["diff"] for r in rows])
                                           for k in ("eval", "area", "last")}
                                    for name in ("rlep_minus_matched", "matched_minus_baseline")}
        result["matched_bootstrap"] = {name: bootstrap_pooled(args.root, args.seeds,
                                                              *COMPARISONS[name])
                                       for name in ("rlep_minus_matched", "matched_minus_baseline")}
        text += "\n\n" + matched_markdown(rows, result["matched_pooled"],
                                           result["matched_bootstrap"])
    tools = [(s, t) for s in args.seeds if (t := tool_row(args.root / f"seed-{s}"))]
    if tools:
        result["tools"] = dict(tools)
        text += "\n\n" + tools_markdown(tools)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
