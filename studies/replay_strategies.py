"""The replay strategies against the DAPO baseline on the built-in demo's settings.

    python studies/replay_strategies.py [--seeds 1 2 3] [--root runs/replay-strategies] \
        [--arms rescue priority refresh] [--json docs/records/replay_strategies/replay_strategies.json] \
        [--plot docs/records/replay_strategies/replay_strategies.png] [overrides ...]

Per seed: ``python -m megatron_rlep.demo seed=K out=ROOT/seed-K`` (the baseline, its pool, RLEP
with the paper's ``uniform`` replay, evaluations, report; a finished seed is not run again),
then one more RLEP run per arm from the same base model, seed and pool, differing only in the
arm's settings (``ARMS``), in ``ROOT/seed-K/<arm>``; the ``matched`` arm is the compute-matched control, DAPO
with G + M fresh rollouts and no pool. Every run validates on the same held-out
questions with the same sampling seeds, so each arm is compared with the baseline point by
point: the difference of the area under the validation curve and of the last point, with 95%
paired bootstrap intervals over questions (megatron_rlep/paired.py), and the cost as the ratio of
its mean step time to the baseline's, the ratio of the sequences it trains on, and both as
numbers (sequences trained, minutes of training steps). Over seeds:
the mean difference with a 95% t-interval. ``--plot``: every run's validation curve, a panel per
seed.
Reported whatever it shows; nothing is tuned on the result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))
sys.path.insert(0, str(ROOT / "tools"))

ARMS = {
    "uniform": [],  # the demo's own RLEP run
    "rescue": ["algorithm.replay.strategy=rescue"],
    "priority": ["algorithm.replay.strategy=priority"],
    "refresh": ["algorithm.replay.refresh=true", "algorithm.replay.strategy=recent"],
    # a control: questions absent from the pool get G fresh rollouts like the baseline's, not
    # G + M, so the difference to the baseline is the replays alone
    "uniform_nofill": ["algorithm.fill_absent=false"],
    # the compute-matched control: DAPO with G + M fresh rollouts per prompt, no pool (the
    # demo's compare=matched run, trained here when the demo did not)
    "matched": [],
}


def arm_run(out: Path, arm: str, extra: list[str]) -> Path:
    """The arm's training run (the demo's RLEP command plus the arm's settings); resumes."""
    from megatron_rlep.config import compose
    from megatron_rlep.demo import split_arguments, training_overrides

    if arm == "uniform":
        return out / "rlep"
    mine, train_extra = split_arguments(extra)
    cfg = compose([f"out={out}", *mine], "demo")
    if arm == "matched":
        group = compose(training_overrides(cfg, train_extra, "baseline", out)).algorithm
        argv = training_overrides(cfg, train_extra, "matched", out,
                                  group.rollouts_per_prompt + cfg.replay_per_prompt)
    else:
        argv = training_overrides(cfg, train_extra, "rlep", out)
        argv = [a for a in argv if not a.startswith("run_dir=")] + [f"run_dir={out / arm}",
                                                                      *ARMS[arm]]
    if not (out / arm / "hf").is_dir():
        subprocess.run([sys.executable, "-m", "megatron_rlep.train", *argv], check=True)
    return out / arm


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mean(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def compare(out: Path, run_dir: Path, seed: int) -> dict:
    from megatron_rlep import paired
    from megatron_rlep.paired import validation_records

    base, other = validation_records(out / "baseline"), validation_records(run_dir)
    c = paired.curves(base, other, 0.6, seed=seed)
    rows, base_rows = metrics(run_dir), metrics(out / "baseline")

    def sequences(rows):
        return sum(r.get("train/sequences") or 0 for r in rows)

    return {"area": c["area"], "last": c["per_step"][-1],
            "step_time_ratio": mean(rows, "time/step_s") / mean(base_rows, "time/step_s"),
            "sequences_ratio": sequences(rows) / sequences(base_rows),
            "sequences": sequences(rows),
            "minutes": sum(r.get("time/step_s") or 0 for r in rows) / 60,
            "replay_fraction": mean(rows, "train/replay_fraction"),
            "groups_with_replays": mean(rows, "train/groups_with_replays"),
            "replay_advantage_share": mean(rows, "train/replay_advantage_share")}


def markdown(table: dict, pooled_rows: dict) -> str:
    def d(x):
        return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    def p(x):
        return f"{x['mean']:+.3f}" if x["low"] is None else \
            f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    lines = ["| arm | seed | area - baseline | last point - baseline | step time / baseline | "
             "sequences / baseline | sequences | minutes | replay fraction | groups with replays | "
             "replays' advantage share |", "|" + "---|" * 11]
    for arm, rows in table.items():
        for seed, r in rows.items():
            lines.append(f"| {arm} | {seed} | {d(r['area'])} | {d(r['last'])} | "
                         f"{r['step_time_ratio']:.2f} | {r['sequences_ratio']:.2f} | "
                         f"{r['sequences']} | {r['minutes']:.1f} | {r['replay_fraction']:.3f} | "
                         f"{r['groups_with_replays']:.2f} | {r['replay_advantage_share']:.3f} |")
        pool = pooled_rows[arm]
        lines.append(f"| {arm} | pooled ({pool['area']['seeds']} seeds, 95% t) | {p(pool['area'])} "
                     f"| {p(pool['last'])} | | | | | | | |")
    return "\n".join(lines)


def plot(root: Path, seeds: list[int], arms: list[str], path: Path) -> None:
    """Validation accuracy against step of the baseline and every arm, a panel per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from megatron_rlep.paired import validation_records

    columns = min(len(seeds), 5)  # five panels a row
    rows = -(-len(seeds) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.6 * rows), sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(seeds):]:
        ax.set_visible(False)
    for ax, seed in zip(axes.flat, seeds):
        out = (root / f"seed-{seed}").resolve()
        for arm in ["baseline", *arms]:
            run = out / ("baseline" if arm == "baseline" else "rlep" if arm == "uniform" else arm)
            curve = validation_records(run)
            steps = sorted(curve)
            ax.plot(steps, [sum(curve[s].values()) / len(curve[s]) for s in steps], marker="o",
                    ms=3, label=arm, color="black" if arm == "baseline" else None)
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("held-out accuracy (128 questions x 2)")
    axes.flat[len(seeds) - 1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    from demo_seeds import pooled

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--root", type=Path, default=Path("runs/replay-strategies"))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args, extra = parser.parse_known_args(argv)
    table: dict = {arm: {} for arm in args.arms}
    for seed in args.seeds:
        out = (args.root / f"seed-{seed}").resolve()
        if not (out / "report.json").is_file():
            subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"seed={seed}",
                            f"out={out}", *extra], check=True)
        for arm in args.arms:
            table[arm][seed] = compare(out, arm_run(out, arm, [f"seed={seed}", *extra]), seed)
    pooled_rows = {arm: {k: pooled([r[k]["diff"] for r in rows.values()]) for k in ("area", "last")}
                   for arm, rows in table.items()}
    text = markdown(table, pooled_rows)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"arms": {a: ARMS[a] for a in args.arms}, "table": table,
                                         "pooled": pooled_rows, "overrides": extra}, indent=1) + "\n")
    if args.plot:
        plot(args.root, args.seeds, args.arms, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
