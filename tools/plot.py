"""Curves of several runs on one figure, from their ``metrics.jsonl``.

    python tools/plot.py RUN_DIR [RUN_DIR ...] -o curves.png [--metric val/acc] [--smooth K]
    python tools/plot.py BASELINE RLEP -o curves.png --paired [--threshold 0.6]
    python tools/plot.py RUN_DIR [RUN_DIR ...] -o replay.png --replay
    python tools/plot.py RUN_DIR [RUN_DIR ...] -o timeline.png --timeline [--steps 20]

Draws the metric against step for every run, marks each run's peak, and marks where a run first
reaches another run's peak (the paper's "RLEP reaches the baseline's peak at step 135").
Writes the same numbers to ``curves.json`` next to the PNG.

``--paired`` compares two runs validated on the same questions with the same seeds from their
per-answer records (``RUN/validation/step-*.jsonl``): each run's accuracy gets a 95% band, a
second panel draws the second run minus the first with its paired bootstrap interval, and
``curves.json`` holds megatron_rlep/paired.py's ``curves`` (per step, area, steps-to-threshold).

``--replay`` draws the replay panel instead: one small plot per replay metric (``REPLAY``: the
replayed share of sequences, effective M, replays' share of the advantage mass, their accuracy,
their age, the pool's size), every run on each, and ``replay.json`` with the points.

``--timeline`` draws each run's steps end to end in wall time (the first ``--steps``), a lane for
the engines and one for the learner, each step's part of a lane dark for the time that side
worked and light for the time it waited for the other (the learner's wait drawn at the step's
start, the engines' at its end) (``time/rollout_idle``, ``time/learner_idle``: runs with
asynchronous rollout log them; a synchronous run's engines wait through the update and sync, its
learner through generation), and ``timeline.json`` with the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def read_curve(run_dir: Path, metric: str, required: bool = False) -> list[tuple[int, float]]:
    """(step, value) of ``metric`` in a run's metrics.jsonl; ``required``: a run that never
    logged it stops with the metrics it did log."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give run directories written by "
                                "python -m megatron_rlep.train")
    points, logged = {}, set()
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            logged.update(k for k, v in record.items() if v is not None)
            if record.get(metric) is not None:
                points[record["step"]] = float(record[metric])  # a resumed step: the last wins
    if required and not points:
        names = sorted(logged - {"step", "time"})
        raise ValueError(f"{run_dir} logged no {metric}; pick --metric from its metrics: "
                         f"{', '.join(names[:40])}{', ...' if len(names) > 40 else ''}")
    return sorted(points.items())


REPLAY = ("train/replay_fraction", "train/replays_per_group", "train/replay_advantage_share",
          "train/acc_replay", "train/replay_age_mean", "pool/answers")


def plot_replay(runs: dict[str, Path], output: Path) -> dict:
    """The replay panel of ``runs`` ({name: run dir}); returns {metric: {name: points}}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {m: {n: read_curve(r, m) for n, r in runs.items()} for m in REPLAY}
    fig, axes = plt.subplots(2, 3, figsize=(11, 6), sharex=True)
    for ax, (metric, per_run) in zip(axes.flat, data.items()):
        for name, points in per_run.items():
            if points:
                ax.plot(*zip(*points), marker="o", markersize=2, label=name)
        ax.set_title(metric, fontsize=9)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return data


def timeline(run_dir: Path, steps: int) -> list[dict]:
    """Per step: its seconds and each side's idle seconds (a synchronous run's from its phases:
    the engines idle outside generation, the learner during it)."""
    out = []
    for step, seconds in read_curve(run_dir, "time/step_s", required=True)[:steps]:
        record = {"step": step, "step_s": seconds}
        for side, name in (("rollout", "time/rollout_idle"), ("learner", "time/learner_idle")):
            logged = dict(read_curve(run_dir, name))
            if step in logged:
                record[f"{side}_idle_s"] = min(logged[step], seconds)
        if "rollout_idle_s" not in record:
            generation = dict(read_curve(run_dir, "time/rollout_s")).get(step, 0.0)
            record["rollout_idle_s"], record["learner_idle_s"] = seconds - generation, generation
        out.append(record)
    return out


def plot_timeline(runs: dict[str, Path], output: Path, steps: int) -> dict:
    """Each run's engines and learner, busy and idle, step by step in wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {n: timeline(r, steps) for n, r in runs.items()}
    fig, axes = plt.subplots(len(data), 1, figsize=(11, 1.6 + 1.3 * len(data)), squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], data.items()):
        start = 0.0
        for row in rows:
            for lane, side, colour in ((1, "rollout", "tab:blue"), (0, "learner", "tab:orange")):
                idle = row[f"{side}_idle_s"]  # the learner waits first, the engines after
                busy = (start + idle if side == "learner" else start, row["step_s"] - idle)
                waits = (start if side == "learner" else start + busy[1], idle)
                ax.broken_barh([busy], (lane - 0.35, 0.7), color=colour)
                ax.broken_barh([waits], (lane - 0.35, 0.7), color=colour, alpha=0.2)
            ax.axvline(start, color="black", lw=0.3)
            start += row["step_s"]
        busy = {side: 1 - sum(r[f"{side}_idle_s"] for r in rows) / max(start, 1e-9)
                for side in ("rollout", "learner")}
        ax.set_yticks([0, 1], [f"learner {busy['learner']:.0%} busy",
                               f"engines {busy['rollout']:.0%} busy"])
        ax.set_title(f"{name}: {len(rows)} steps, {start:.0f} s", fontsize=9)
    axes[-1, 0].set_xlabel("seconds (dark: working, light: waiting for the other side)")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return data


def smooth(values: list[float], k: int) -> list[float]:
    """Trailing mean over the last ``k`` points (k <= 1: unchanged)."""
    if k <= 1:
        return list(values)
    return [sum(values[max(0, i - k + 1):i + 1]) / (i + 1 - max(0, i - k + 1))
            for i in range(len(values))]


def summarise(curves: dict[str, list[tuple[int, float]]]) -> dict:
    """Peak per run, and for every ordered pair the first step where one reaches the other's peak."""
    out = {}
    for name, points in curves.items():
        if not points:
            out[name] = {"curve": [], "peak": None, "peak_step": None, "final": None}
            continue
        peak_step, peak = max(points, key=lambda p: (p[1], -p[0]))
        out[name] = {"curve": points, "peak": peak, "peak_step": peak_step, "final": points[-1][1],
                     "reaches_peak_of": {}}
    for a in curves:
        for b in curves:
            if a != b and out[a]["peak"] is not None and out[b]["peak"] is not None:
                step = next((s for s, v in curves[a] if v >= out[b]["peak"]), None)
                out[a]["reaches_peak_of"][b] = step
    return out


def plot(curves: dict, summary: dict, metric: str, output: Path, compared: dict | None = None
         ) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if compared is None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    else:
        fig, (ax, below) = plt.subplots(2, 1, figsize=(7, 6.4), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 2]})
    for index, (name, points) in enumerate(curves.items()):
        if not points:
            continue
        steps, values = zip(*points)
        (line,) = ax.plot(steps, values, marker="o", markersize=3, label=name)
        if compared is not None:  # the run's own 95% interval over held-out questions
            run = "ab"[index]
            per = compared["per_step"]
            ax.fill_between([p["step"] for p in per], [p[f"{run}_low"] for p in per],
                            [p[f"{run}_high"] for p in per], color=line.get_color(), alpha=0.15)
        s = summary[name]
        ax.scatter([s["peak_step"]], [s["peak"]], s=90, marker="*", color=line.get_color(),
                   zorder=5)
        ax.annotate(f"peak {s['peak']:.3f} @ {s['peak_step']}", (s["peak_step"], s["peak"]),
                    textcoords="offset points", xytext=(4, 6), fontsize=8, color=line.get_color())
        for other, step in s["reaches_peak_of"].items():
            if step is not None and step < summary[other]["peak_step"]:
                ax.axvline(step, color=line.get_color(), linestyle=":", linewidth=1)
                ax.annotate(f"{name} reaches {other}'s peak @ {step}", (step, ax.get_ylim()[0]),
                            rotation=90, fontsize=7, va="bottom", ha="right",
                            color=line.get_color())
    ax.margins(x=0.12, y=0.12)  # room for the peak labels at the edges
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if compared is not None:
        a, b = list(curves)
        per = compared["per_step"]
        steps = [p["step"] for p in per]
        below.axhline(0, color="gray", linewidth=1)
        below.plot(steps, [p["diff"] for p in per], marker="o", markersize=3, color="black")
        below.fill_between(steps, [p["low"] for p in per], [p["high"] for p in per],
                           color="black", alpha=0.15)
        below.set_ylabel(f"{b} - {a}\n(95% paired interval)", fontsize=8)
        below.grid(alpha=0.3)
        ax = below
    ax.set_xlabel("step")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=Path("curves.png"))
    parser.add_argument("--metric", default="val/acc")
    parser.add_argument("--smooth", type=int, default=1, help="trailing mean over K points")
    parser.add_argument("--names", nargs="*", help="legend names (default: directory names)")
    parser.add_argument("--paired", action="store_true",
                        help="two runs: bands and the paired difference (see above)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="with --paired: the fixed accuracy of steps-to-threshold")
    parser.add_argument("--seed", type=int, default=0, help="with --paired: bootstrap seed")
    parser.add_argument("--replay", action="store_true", help="the replay panel (see above)")
    parser.add_argument("--timeline", action="store_true",
                        help="engines and learner busy and idle, step by step (see above)")
    parser.add_argument("--steps", type=int, default=20, help="with --timeline: steps drawn")
    args = parser.parse_args(argv)
    names = args.names or [r.name for r in args.runs]
    if len(names) != len(args.runs):
        print("error: --names needs one name per run directory", file=sys.stderr)
        return 2
    if args.paired and len(args.runs) != 2:
        print("error: --paired compares exactly two run directories", file=sys.stderr)
        return 2
    compared = None
    try:
        if args.replay or args.timeline:
            data = plot_replay(dict(zip(names, args.runs)), args.output) if args.replay else \
                plot_timeline(dict(zip(names, args.runs)), args.output, args.steps)
            args.output.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
            return 0
        raw = {n: read_curve(r, args.metric, required=True) for n, r in zip(names, args.runs)}
        if args.paired:
            from megatron_rlep.paired import curves as paired_curves, validation_records

            compared = paired_curves(*(validation_records(r) for r in args.runs), args.threshold,
                                     seed=args.seed)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    curves = {n: list(zip([s for s, _ in p], smooth([v for _, v in p], args.smooth)))
              for n, p in raw.items()}
    summary = summarise(curves)
    plot(curves, summary, args.metric + (f" (mean of {args.smooth})" if args.smooth > 1 else ""),
         args.output, compared)
    args.output.with_suffix(".json").write_text(json.dumps(
        {"metric": args.metric, "smooth": args.smooth, "runs": summary, "paired": compared},
        indent=1) + "\n")
    print(json.dumps({n: {k: v for k, v in s.items() if k != "curve"} for n, s in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
