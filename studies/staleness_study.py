"""Replay under staleness: the two-phase demo's arms against the synchronous one, paired by
seed, with the lags each arm got and what they did to the update.

One seed of every arm at a time (a demo resumes its finished runs, so a machine's time that
runs out leaves paired seeds); the synchronous arm builds each seed's pool, and every other
arm's RLEP replays that same pool (the demo's ``pool`` key):

    python studies/demo_seeds.py --seeds 1 --root runs/stale/sync --prune
    python studies/demo_seeds.py --seeds 1 --root runs/stale/n2 --prune \
        pool=runs/stale/sync/seed-1/pool algorithm.max_staleness=2 rollout.partial=true \
        rollout.segment_tokens=16 rollout.extra_prompts=8 [algorithm.correction....]
    python studies/staleness_study.py --arms sync=runs/stale/sync n2=runs/stale/n2 ... \
        [--seeds 1 2 3 4 5] [--json docs/records/staleness/screen.json]

The first arm is the reference. For every other arm and each of the demo's runs (baseline,
RLEP): the difference from the reference's same run of the same seed in the final evaluation
and the area under the validation curve, pooled over the seeds the two arms share with a 95%
interval from a two-level bootstrap over seeds and held-out questions
(``demo_seeds.pooled_pairs``). For every arm: RLEP minus its own baseline, pooled the same way;
per run, the wall-clock minutes from the start of its first step to its first validation at or
above the peak of the same seed's synchronous baseline (validation included, start-up not), per
seed, and how many seeds reach it; and the means over its steps and seeds of what the trainer
logs of staleness (``correction.lag_metrics``, ``class_metrics``): the lags in versions and in
optimizer updates, the gap from the sampling to the proximal policy per lag, the replays' mean
advantage and share of the gradient, the fresh answers' accuracy. And the delay model: per
arm, run and seed, the shift d in steps that best maps the reference's validation curve onto
the arm's (``delay_fit``), pooled over seeds, beside the arm's mean lag: where d is near the lag
and the shifted curve leaves little, staleness cost the arm time and nothing else.

Arms pool only where they are paired: for every seed, each arm's runs were trained by the same
code (``code.jsonl``, which the trainer writes at each start: one code, committed) and each
arm's RLEP replayed the same pool (its files' sha256); otherwise the study stops in one
sentence naming the arm, seed and run. The record keeps, per arm and seed, that code, the pool's
path and hash, each run's evaluation and validation points, and its share of tokens at each
lag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo_seeds import final_evaluation, pooled, pooled_pairs  # noqa: E402

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


LOGGED = ("stale/lag_versions_mean", "stale/lag_updates_mean", "stale/replay/advantage_mean",
          "stale/fresh/advantage_mean", "stale/replay/gradient_share", "train/acc_fresh",
          "correction/fresh/truncated_fraction", "correction/fresh/m2_masked_fraction",
          "actor/clip_fraction", "stale/replay/clip_fraction")
BY_LAG = ("stale/tokens_versions_{}", "stale/lag_{}/kl_behaviour_proximal",
          "stale/lag_{}/clip_fraction")  # per lag in versions, every lag a step logged


def logged(run_dirs: list[Path]) -> dict:
    """The mean over every step of ``run_dirs`` of each ``LOGGED`` metric and of each ``BY_LAG``
    one at every lag from 0 to the largest any step trained (None where no step logged it; a
    step without tokens at a lag counts 0 in that lag's share), and that largest lag."""
    rows = [json.loads(line) for d in run_dirs for line in
            (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "stale/lag_versions_mean" in r]
    out = {"stale/lag_versions_max": max((r["stale/lag_versions_max"] for r in rows
                                          if r.get("stale/lag_versions_max") is not None),
                                         default=None)}
    lags = range((out["stale/lag_versions_max"] or 0) + 1)
    for key in [*LOGGED, *(form.format(lag) for form in BY_LAG for lag in lags)]:
        if key.startswith("stale/tokens_versions_"):
            values = [r.get(key, 0.0) for r in steps]
        else:
            values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    return out


class Unpaired(ValueError):
    """Arms that cannot be compared seed by seed: its message is the whole sentence."""


def pool_of(run_dir: Path) -> dict | None:
    """The pool a run replayed (its ``config.json``'s ``algorithm.pool``): its path and the
    sha256 of its files by name (of the file, for a pool in one file; None where the path is
    gone); None for a run without one."""
    config = run_dir / "config.json"
    pool = json.loads(config.read_text())["algorithm"].get("pool") if config.exists() else None
    if not pool:
        return None
    root = Path(pool)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        return {"path": pool, "sha256": None}
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return {"path": pool, "sha256": digest.hexdigest()}


def code_of(run_dir: Path) -> str | None:
    """The one committed code that trained every start of a run (``code.jsonl``); None if the
    run has no record, several codes, or uncommitted changes."""
    path = run_dir / "code.jsonl"
    starts = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    codes = {s["code"] for s in starts}
    if not starts or len(codes) != 1 or None in codes or any(s["dirty"] for s in starts):
        return None
    return codes.pop()


def seed_record(seed_dir: Path) -> dict:
    """One seed of an arm: per run, its code, the pool it replayed, its final evaluation (mean
    correct over the evaluation's answers), its validation points and its share of tokens at
    each lag."""
    out = {}
    for run in RUNS:
        run_dir = seed_dir / run
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
        steps = [r for r in rows if "stale/lag_versions_mean" in r]
        lags = sorted({int(k.rsplit("_", 1)[1]) for r in steps for k in r
                       if k.startswith("stale/tokens_versions_")})
        answers = [json.loads(line)["correct"] for line in
                   (seed_dir / f"eval-{run}" / "samples.jsonl").read_text().splitlines()]
        out[run] = {"code": code_of(run_dir), "pool": pool_of(run_dir),
                    "eval": statistics.fmean(answers),
                    "validation": {r["step"]: r["val/acc"] for r in rows
                                   if r.get("val/acc") is not None},
                    "lag_shares": {k: statistics.fmean(r.get(f"stale/tokens_versions_{k}", 0.0)
                                                       for r in steps) for k in lags}}
    return out


def check_paired(records: dict[str, dict[int, dict]], codes: bool = True) -> None:
    """``Unpaired`` unless, seed by seed, every arm's runs were trained by one committed code
    (with ``codes``) and every arm's RLEP replayed the same pool."""
    reference = next(iter(records))
    for n, seeds in records.items():
        for seed, record in seeds.items():
            ref = records[reference][seed]
            for run in RUNS:
                code, ref_code = record[run]["code"], ref[run]["code"]
                if codes and (code is None or code != ref_code):
                    what = ("has no single committed code in its code.jsonl (several, "
                            "uncommitted changes, or none recorded)" if code is None else
                            f"ran code {code}, the reference arm {reference}'s ran {ref_code}")
                    raise Unpaired(f"arm {n}, seed {seed}, run {run} {what}: rerun it at the "
                                   "reference's commit, or leave the arm out")
            pool, ref_pool = record["rlep"]["pool"], ref["rlep"]["pool"]
            gone = next((p["path"] for p in (pool, ref_pool) if p and p["sha256"] is None), None)
            if gone:
                raise Unpaired(f"arm {n}, seed {seed}: the pool {gone} its RLEP or the reference "
                               "arm's replayed is not here, so their pairing cannot be shown: "
                               "put the pool back at that path")
            if (pool or {}).get("sha256") != (ref_pool or {}).get("sha256"):
                raise Unpaired(f"arm {n}, seed {seed}: its RLEP replayed "
                               f"{pool and pool['path']} and the reference arm {reference}'s "
                               f"{ref_pool and ref_pool['path']}, which differ: give every arm "
                               "the reference's pool (the demo's pool= key)")


def did(ref: Path, root: Path, seeds: list[int]) -> dict:
    """The estimand: RLEP's gain over its baseline in the arm at ``root`` minus its gain in the
    reference arm at ``ref`` (the difference-in-differences), in the final evaluation and in
    the area under the validation curve; per seed, and over the seeds with the t-interval
    (``t_low``, ``t_high``) beside a bootstrap that resamples the seeds and the questions they
    share jointly (``paired.joint``)."""
    from megatron_rlep import paired

    def gain(seed_dir: Path) -> tuple:
        runs = [seed_dir / run for run in RUNS]
        return (paired.point_difference(*map(final_evaluation, runs)),
                paired.curve_area_difference(*map(paired.validation_records, runs)))

    units = {"eval": [], "area": []}
    for seed in seeds:
        (ref_eval, ref_area), (arm_eval, arm_area) = (gain(r / f"seed-{seed}") for r in (ref, root))
        units["eval"].append(paired.difference_of(ref_eval, arm_eval))
        units["area"].append(paired.difference_of(ref_area, arm_area))
    out = {}
    for key, per_seed in units.items():
        boot = paired.joint(per_seed)
        t = pooled(boot["per_seed"])
        out[key] = {**boot, "t_low": t["low"], "t_high": t["high"]}
    return out


def at(curve: dict[int, float], step: float) -> float:
    """``curve`` ({step: value}) at ``step``, linear between its points, its first value
    before them and its last after them."""
    points = sorted(curve.items())
    if step <= points[0][0]:
        return points[0][1]
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[-1][1]


def delay_fit(reference: dict[int, float], arm: dict[int, float], most: float,
              grid: float = 0.05) -> dict:
    """The delay model: the shift d (in steps, 0 to ``most`` by ``grid``) that brings the
    reference's validation curve closest to the arm's points in least squares, arm(s) ~
    reference(s - d); with the root mean square residual at d and unshifted (d = 0). The
    first d of the smallest residual wins a tie."""
    def rms(d: float) -> float:
        return statistics.fmean((v - at(reference, s - d)) ** 2 for s, v in arm.items()) ** 0.5

    shifts = [k * grid for k in range(int(round(most / grid)) + 1)]
    best = min(shifts, key=lambda d: (round(rms(d), 12), d))
    return {"delay": best, "rms": rms(best), "rms_unshifted": rms(0.0)}


def delays(records: dict[str, dict[int, dict]], reference: str, n: str) -> dict:
    """Per run of arm ``n``: the delay model fitted seed by seed against the reference arm's
    same run and seed (up to half the reference's last validated step), the delays pooled
    with a t-interval over seeds, and the mean residuals at the fit and unshifted."""
    out = {}
    for run in RUNS:
        fits = {}
        for seed, record in records[n].items():
            ref = {int(k): v for k, v in records[reference][seed][run]["validation"].items()}
            mine = {int(k): v for k, v in record[run]["validation"].items()}
            fits[seed] = delay_fit(ref, mine, max(ref) / 2)
        if fits:
            out[run] = {"per_seed": fits, **pooled([f["delay"] for f in fits.values()]),
                        "rms": statistics.fmean(f["rms"] for f in fits.values()),
                        "rms_unshifted": statistics.fmean(f["rms_unshifted"]
                                                          for f in fits.values())}
    return out


def study(arms: dict[str, Path], seeds: list[int] | None = None, codes: bool = True) -> dict:
    reference = next(iter(arms))
    ref = arms[reference]
    peaks = {s: max(acc for acc, _ in validation_times(ref / f"seed-{s}" / "baseline").values())
             for s in seeds_of(ref) if seeds is None or s in seeds}
    records = {n: {s: seed_record(root / f"seed-{s}") for s in seeds_of(root) if s in peaks}
               for n, root in arms.items()}
    check_paired(records, codes)  # every arm's seeds are the reference's (``peaks``)
    result = {"reference": reference, "arms": {}}
    for n, root in arms.items():
        done = [s for s in seeds_of(root) if s in peaks]
        arm = {"root": str(root), "seeds": done, "per_seed": records[n],
               "minutes_to_peak": {}, "versus_reference": {},
               "logged": {run: logged([root / f"seed-{s}" / run for s in done]) for run in RUNS}}
        if n != reference and done:
            arm["did"] = did(ref, root, done)
            arm["delay"] = delays(records, reference, n)
        if done:
            arm["rlep_minus_baseline"] = pooled_pairs(
                [(root / f"seed-{s}" / "baseline", root / f"seed-{s}" / "rlep") for s in done])
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

    def number(x, form="{:.3f}"):
        return "" if x is None else form.format(x)

    def by_lag(m, form, fmt, first=0):  # "a / b / ..." at lags first..the largest; "-": none
        return " / ".join(number(m[form.format(k)], fmt) or "-"
                          for k in range(first, (m["stale/lag_versions_max"] or 0) + 1))

    def both(x):
        t = "" if x["t_low"] is None else f"[{x['t_low']:+.3f}, {x['t_high']:+.3f}]"
        return f"{x['mean']:+.3f} | {t} | [{x['low']:+.3f}, {x['high']:+.3f}]"

    ref = result["reference"]
    dids = [f"Difference-in-differences: RLEP minus baseline in the arm, minus the same in {ref} "
            "(the t-interval over seeds is the one to read: seeds are what the arms replicate; "
            "the bootstrap resamples seeds and their shared questions jointly)", "",
            "| arm | seeds | eval | t-interval | bootstrap | area | t-interval | bootstrap |",
            "|---|---|---|---|---|---|---|---|"]
    dids += [f"| {n} | {len(arm['seeds'])} | {both(arm['did']['eval'])} | "
             f"{both(arm['did']['area'])} |" for n, arm in result["arms"].items() if "did" in arm]
    lines = [f"| arm | run | seeds | eval minus {ref} (95%) | area minus {ref} (95%) "
             f"| minutes to {ref} baseline's peak (mean of those that reach it) | reached |",
             "|---|---|---|---|---|---|---|"]
    gains = ["| arm | RLEP minus baseline, eval (95%) | area (95%) |", "|---|---|---|"]
    lags = ["| arm | run | lag in versions: mean, max | tokens at lag 0 / 1 / ... | lag in updates "
            "| KL(behaviour, proximal) at lag 1 / 2 / ... | truncated (fresh) | clipped: all, "
            "fresh at lag 0 / 1 / ... (6: six or more), replays | masked by M2PO (fresh) "
            "| replay advantage | replay gradient share | fresh accuracy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, arm in result["arms"].items():
        if "rlep_minus_baseline" in arm:
            g = arm["rlep_minus_baseline"]
            gains.append(f"| {n} | {cell(g['eval'])} | {cell(g['area'])} |")
        for run in RUNS:
            m = arm["logged"][run]
            lags.append(
                f"| {n} | {run} | {number(m['stale/lag_versions_mean'], '{:.2f}')}, "
                f"{m['stale/lag_versions_max'] or 0} | "
                f"{by_lag(m, 'stale/tokens_versions_{}', '{:.2f}')} | "
                f"{number(m['stale/lag_updates_mean'], '{:.2f}')} | "
                f"{by_lag(m, 'stale/lag_{}/kl_behaviour_proximal', '{:.1e}', 1)} | "
                f"{number(m['correction/fresh/truncated_fraction'], '{:.4f}')} | "
                f"{number(m['actor/clip_fraction'], '{:.4f}')}; "
                f"{by_lag(m, 'stale/lag_{}/clip_fraction', '{:.4f}')}; "
                f"{number(m['stale/replay/clip_fraction'], '{:.4f}') or '-'} | "
                f"{number(m['correction/fresh/m2_masked_fraction'], '{:.4f}')} | "
                f"{number(m['stale/replay/advantage_mean'])} | "
                f"{number(m['stale/replay/gradient_share'])} | {number(m['train/acc_fresh'])} |")
    for n, arm in result["arms"].items():
        for run in RUNS:
            versus = arm["versus_reference"].get(run)
            t = arm["minutes_to_peak"][run]
            minutes = "" if t["mean"] is None else f"{t['mean']:.1f}"
            lines.append(f"| {n} | {run} | {len(arm['seeds'])} | "
                         f"{cell(versus['eval']) if versus else ''} | "
                         f"{cell(versus['area']) if versus else ''} | {minutes} | "
                         f"{t['reached']}/{len(arm['seeds'])} |")
    shifts = [f"Delay model: each arm's validation points against {ref}'s same run shifted by d "
              "steps, d fitted by least squares per seed (t-interval over seeds); staleness "
              "costs time alone where d is near the arm's mean lag and the residual falls to "
              "the seeds' noise", "",
              "| arm | run | seeds | delay d in steps | mean lag in versions | residual at d "
              "| unshifted |", "|---|---|---|---|---|---|---|"]
    for n, arm in result["arms"].items():
        for run, fit in arm.get("delay", {}).items():
            t = "" if fit["low"] is None else f" [{fit['low']:.2f}, {fit['high']:.2f}]"
            shifts.append(f"| {n} | {run} | {fit['seeds']} | {fit['mean']:.2f}{t} | "
                          f"{number(arm['logged'][run]['stale/lag_versions_mean'], '{:.2f}')} "
                          f"| {fit['rms']:.3f} | {fit['rms_unshifted']:.3f} |")
    return "\n\n".join("\n".join(t) for t in (dids, shifts, lines, gains, lags))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", required=True, metavar="NAME=ROOT",
                   help="an arm's name and the root of its demo_seeds.py runs; the first is the "
                        "reference")
    p.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default: every "
                   "seed the reference finished)")
    p.add_argument("--json", type=Path)
    p.add_argument("--without-code-records", action="store_true",
                   help="pool runs that have no code.jsonl (trained before the trainer wrote "
                        "one); their pools are still checked")
    args = p.parse_args(argv)
    arms = {}
    for spec in args.arms:
        n, sep, root = spec.partition("=")
        if not sep or not n:
            p.error(f"--arms {spec}: give NAME=ROOT, e.g. n1=runs/stale/n1")
        if not seeds_of(Path(root)):
            p.error(f"--arms {spec}: {root} holds no finished demo seed (seed-K/report.json); "
                    "run studies/demo_seeds.py --root there first")
        arms[n] = Path(root)
    try:
        result = study(arms, args.seeds, codes=not args.without_code_records)
    except Unpaired as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
