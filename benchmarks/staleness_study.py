"""The two-phase demo at several staleness bounds, five seeds each, against the synchronous one.

    python benchmarks/demo_seeds.py --seeds 1 2 3 4 5 --root runs/staleness-0 --prune
    python benchmarks/demo_seeds.py --seeds 1 2 3 4 5 --root runs/staleness-1 --prune \
        algorithm.max_staleness=1 rollout.placement=disaggregated rollout.ranks=1 \
        rollout.partial=true rollout.segment_tokens=16
    (the same with max_staleness=2 into runs/staleness-2; one seed of every arm at a time,
    ``--seeds 1`` for N = 0, 1, 2, then ``--seeds 2``..., leaves paired seeds when a machine's
    time runs out: a demo resumes its finished runs), then
    python benchmarks/staleness_study.py --arms 0=runs/staleness-0 1=runs/staleness-1 \
        2=runs/staleness-2 [--seeds 1 2 3 4 5] [--json docs/staleness_study.json]

The first arm is the reference (the synchronous trainer). For every other arm and each of the
demo's runs (baseline, RLEP): the difference from the reference's same run of the same seed in
the final evaluation and the area under the validation curve, pooled over the seeds the two arms
share with a 95% interval from a two-level bootstrap over seeds and held-out questions
(``demo_seeds.pooled_pairs``). For every arm and run: the wall-clock minutes from the start of its
first step to its first validation at or above the peak of the same seed's synchronous baseline
(validation included, start-up not), per seed, and how many seeds reach it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo_seeds import pooled_pairs  # noqa: E402

RUNS = ("baseline", "rlep")


def validation_times(run_dir: Path) -> dict[int, tuple[float, float]]:
    """{step: (val/acc, seconds since its first step began)} of one run's metrics; the
    validation before the first step (step 0's row, no step time) counts as at 0 seconds."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    steps = [r for r in rows if "time/step_s" in r]
    if not steps:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no step: the run has not trained one")
    start = steps[0]["time"] - steps[0]["time/step_s"]
    return {r["step"]: (r["val/acc"], max(0.0, r["time"] - start)) for r in rows
            if r.get("val/acc") is not None}


def minutes_to(run_dir: Path, target: float) -> float | None:
    """Minutes until the run's first validation at or above ``target``; None if none is."""
    for _, (acc, seconds) in sorted(validation_times(run_dir).items()):
        if acc >= target - 1e-12:
            return seconds / 60
    return None


def seeds_of(root: Path) -> list[int]:
    """The seeds whose demo finished under ``root`` (its report written)."""
    return sorted(int(d.name.split("-")[1]) for d in root.glob("seed-*")
                  if (d / "report.json").exists())


def study(arms: dict[int, Path], seeds: list[int] | None = None) -> dict:
    reference = min(arms)
    ref = arms[reference]
    peaks = {s: max(acc for acc, _ in validation_times(ref / f"seed-{s}" / "baseline").values())
             for s in seeds_of(ref) if seeds is None or s in seeds}
    result = {"reference": reference, "arms": {}}
    for n, root in sorted(arms.items()):
        done = [s for s in seeds_of(root) if s in peaks]
        arm = {"root": str(root), "seeds": done, "minutes_to_peak": {}, "versus_reference": {}}
        for run in RUNS:
            times = {s: minutes_to(root / f"seed-{s}" / run, peaks[s]) for s in done}
            reached = [t for t in times.values() if t is not None]
            arm["minutes_to_peak"][run] = {
                "per_seed": times, "reached": len(reached),
                "mean": statistics.fmean(reached) if reached else None}
            if n != reference and done:
                arm["versus_reference"][run] = pooled_pairs(
                    [(ref / f"seed-{s}" / run, root / f"seed-{s}" / run) for s in done])
        result["arms"][n] = arm
    result["baseline_peaks"] = peaks
    return result


def markdown(result: dict) -> str:
    def cell(x):
        return f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    ref = result["reference"]
    lines = [f"| max_staleness | run | seeds | eval minus N={ref} (95%) | area minus N={ref} (95%) "
             f"| minutes to N={ref} baseline's peak (mean of those that reach it) | reached |",
             "|---|---|---|---|---|---|---|"]
    for n, arm in result["arms"].items():
        for run in RUNS:
            versus = arm["versus_reference"].get(run)
            t = arm["minutes_to_peak"][run]
            minutes = "" if t["mean"] is None else f"{t['mean']:.1f}"
            lines.append(f"| {n} | {run} | {len(arm['seeds'])} | "
                         f"{cell(versus['eval']) if versus else ''} | "
                         f"{cell(versus['area']) if versus else ''} | {minutes} | "
                         f"{t['reached']}/{len(arm['seeds'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", required=True, metavar="N=ROOT",
                   help="max_staleness=root of its demo_seeds.py runs; the smallest N is the "
                        "reference")
    p.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default: every "
                   "seed the reference finished)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    arms = {}
    for spec in args.arms:
        n, sep, root = spec.partition("=")
        if not sep or not n.isdigit():
            p.error(f"--arms {spec}: give max_staleness=ROOT, e.g. 1=runs/staleness-1")
        if not seeds_of(Path(root)):
            p.error(f"--arms {spec}: {root} holds no finished demo seed (seed-K/report.json); "
                    "run benchmarks/demo_seeds.py --root there first")
        arms[int(n)] = Path(root)
    result = study(arms, args.seeds)
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
