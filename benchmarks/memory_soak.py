"""A long run's host memory, step by step: flat after warm-up, or by how much it grows.

    python benchmarks/memory_soak.py [--steps 300] [--modes sync async] [--warmup 20] \
        [--out runs/memory-soak] [extra training overrides ...]

Each mode runs the CPU baseline job (``experiment=cpu_baseline``) for ``--steps`` steps, no
validation or checkpoint after the start, in a process of its own: ``sync`` as the trainer
runs by default, ``async`` disaggregated under torchrun (one learner, one rollout rank: the
weights reach the engine by broadcast after every update, partial rollouts, N = 1). While it
runs, the proportional and the unique set sizes (PSS, USS) and the anonymous pages of the
launcher and every process under it (the ranks, their scorers and engines) are summed every
``--every`` seconds; each
sample is assigned to the step being run (the lines of ``metrics.jsonl`` so far). Per step the
median sample is kept. The slope of each after ``--warmup`` steps is the least-squares line's,
with a 95% interval from a bootstrap over steps (blocks of 10, for the samples' correlation).
PSS is the run's footprint; it and USS move when other processes mapping the same libraries
start or end (two modes run side by side: one's end steps the other's up), the anonymous pages
(``anon_``) do not. Beside them, what the ranks log every step
(``LOGGED``): each side's process tree and its heap's live and free bytes
(megatron_rlep/host_memory.py), with their slopes: live bytes that grow are a leak, free bytes
that jump once and stay are the allocator keeping the high-water mark of its largest step.
Writes ``OUT/memory_soak.json`` (each mode as it ends; a mode run later into the same OUT joins
the modes already there) and ``OUT/memory_soak.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

from megatron_rlep.host_memory import tree_sizes

ROOT = Path(__file__).resolve().parent.parent
MODES = {
    "sync": (1, []),
    "async": (2, ["rollout.placement=disaggregated", "rollout.ranks=1",
                  "algorithm.max_staleness=1", "rollout.partial=true",
                  "rollout.segment_tokens=16"]),
}


# what the ranks log of their memory every step (megatron_rlep/host_memory.py): the learner's
# process tree and its heap's live and free bytes, and the rollout ranks' as they report them
LOGGED = ("perf/host_memory_gib", "perf/heap_", "perf/rollout_")
# each sample's columns after the step: PSS under the plain keys, then USS, then anonymous pages
KINDS = (("", 1), ("uss_", 2), ("anon_", 3))


def slope(steps: list[int], mib: list[float]) -> float:
    """The least-squares slope of ``mib`` against ``steps`` (MiB a step)."""
    n = len(steps)
    mx, my = sum(steps) / n, sum(mib) / n
    sxx = sum((x - mx) ** 2 for x in steps)
    return sum((x - mx) * (y - my) for x, y in zip(steps, mib)) / sxx if sxx else 0.0


def slope_interval(steps: list[int], mib: list[float], block: int = 10,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the slope by a bootstrap over blocks of ``block`` consecutive steps."""
    blocks = [list(range(i, min(i + block, len(steps)))) for i in range(0, len(steps), block)]
    rng, out = random.Random(seed), []
    for _ in range(draws):
        picked = [i for b in rng.choices(blocks, k=len(blocks)) for i in b]
        if len({steps[i] for i in picked}) > 1:
            out.append(slope([steps[i] for i in picked], [mib[i] for i in picked]))
    out.sort()
    return out[int(0.025 * len(out))], out[int(0.975 * len(out)) - 1]


def soak(mode: str, args, extra: list[str]) -> dict:
    nproc, overrides = MODES[mode]
    run_dir = Path(args.out) / mode
    launcher = [sys.executable] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc)]
    argv = [*launcher, "-m", "megatron_rlep.train", "experiment=cpu_baseline",
            f"algorithm.total_steps={args.steps}", "logging.eval_every=0",
            "logging.save_every=0", "logging.wandb=disabled", "logging.progress=false",
            "resume=false", f"run_dir={run_dir}", *overrides, *extra]
    metrics = run_dir / "metrics.jsonl"
    samples, done = [], threading.Event()
    with open(Path(args.out) / f"{mode}.log", "w") as log:
        child = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

        def sample():
            while not done.wait(args.every):
                try:
                    step = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                    samples.append((step, *(size / 2**20 for size in tree_sizes(child.pid))))
                except OSError:
                    continue
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        code = child.wait()
        done.set()
        thread.join()
    if code:
        raise SystemExit(f"{mode}: the run failed (exit status {code}); see "
                         f"{Path(args.out) / f'{mode}.log'}")
    result = {"mode": mode, "command": " ".join(argv)}
    for kind, column in KINDS:
        per_step = {}
        for sample in samples:
            per_step.setdefault(sample[0], []).append(sample[column])
        steps = sorted(s for s in per_step if s >= args.warmup)
        medians = [sorted(per_step[s])[len(per_step[s]) // 2] for s in steps]
        result.update({"steps": sorted(per_step),
                       f"{kind}mib": [sorted(v)[len(v) // 2] for _, v in sorted(per_step.items())],
                       f"{kind}slope_mib_per_step": slope(steps, medians),
                       f"{kind}slope_interval": list(slope_interval(steps, medians)),
                       f"{kind}first_after_warmup_mib": medians[0] if medians else None,
                       f"{kind}last_mib": medians[-1] if medians else None})
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    keys = sorted({k for row in rows for k in row if k.startswith(LOGGED) and k.endswith("_gib")})
    logged, slopes = {}, {}
    for key in keys:
        logged[key] = [row.get(key) for row in rows]
        points = [(row["step"], row[key] * 1024) for row in rows
                  if row["step"] >= args.warmup and row.get(key) is not None]
        slopes[key] = slope(*zip(*points)) if points else None
    return {**result, "logged_gib": logged, "logged_slope_mib_per_step": slopes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=list(MODES))
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--out", default="runs/memory-soak")
    args, extra = parser.parse_known_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    record = Path(args.out) / "memory_soak.json"
    for mode in args.modes:  # each mode's result kept as it ends; other modes' earlier ones too
        earlier = json.loads(record.read_text()) if record.exists() else []
        results = [r for r in earlier if r["mode"] != mode] + [soak(mode, args, extra)]
        record.write_text(json.dumps(results, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        for (kind, _), style in zip(KINDS, ("-", "--", ":")):
            if f"{kind}mib" in r:
                low, high = r[f"{kind}slope_interval"]
                ax.plot(r["steps"], r[f"{kind}mib"], style, label=f"{r['mode']} "
                        f"{kind[:-1].upper() or 'PSS'}: {r[f'{kind}slope_mib_per_step']:+.2f} "
                        f"MiB/step [{low:+.2f}, {high:+.2f}]")
    ax.axvline(args.warmup, color="grey", lw=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("host memory of the run's processes (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(args.out) / "memory_soak.png", dpi=120)
    for r in results:
        for kind, _ in KINDS:
            if f"{kind}mib" in r:
                low, high = r[f"{kind}slope_interval"]
                print(f"{r['mode']} {kind[:-1].upper() or 'PSS'}: "
                      f"{r[f'{kind}slope_mib_per_step']:+.3f} MiB a step after step "
                      f"{args.warmup} [{low:+.3f}, {high:+.3f}], "
                      f"{r[f'{kind}first_after_warmup_mib']:.0f} -> {r[f'{kind}last_mib']:.0f} MiB")
        for key, value in r.get("logged_slope_mib_per_step", {}).items():
            if value is not None:
                print(f"{r['mode']} {key}: {value:+.3f} MiB a step after step {args.warmup}")


if __name__ == "__main__":
    main()
