"""Asynchronous rollout against the synchronous trainer on this machine, the modes in turn.

    python benchmarks/async_speed.py [--job demo|long] [--steps 6] [--rounds 2] \
        [--modes sync partial disaggregated] [--out runs/async-speed] [--seed 1] [--check-sync] \
        [training overrides for every mode ...]

The job: ``demo`` is the demo's baseline job (``experiment=cpu_demo``, M = 0: 4 prompts of 6
answers a step, answers up to 32 tokens); ``long`` is the same with its arithmetic problems asked
to show the working (benchmarks/peer_trl.py's ``LONG_PROMPT``) and answers up to 512 tokens, whose
lengths run long and long-tailed (mean about 240 tokens, a quarter at the limit). The modes, each
a process of its own on the same cores:

* ``sync``: today's trainer (colocated, N = 0): a step waits for its longest answer;
* ``partial``: colocated, N = 1, partial rollouts (segments of 16 tokens on the demo job, 64 on
  the long one) and as many prompts again in flight (``rollout.extra_prompts``): the first groups
  to finish train, the rest go on under the next weights;
* ``disaggregated``: one learner and one rollout rank under torchrun (a core each), N = 1,
  partial rollouts: the engine samples the next groups while the learner trains.

Figures per mode (steps 2 and later of every round): seconds per step (the mean: with
over-provisioning the steps alternate, one that generates for two and one that trains what the
other left, so a median would show the short ones only), the answers' tokens generated per second
(all timed steps' tokens over their seconds), the learner's and the engines' idle seconds a step
(``time/learner_idle``, ``time/rollout_idle``; the synchronous run's from its phases), the
tokens' staleness, and every step's seconds. Each mode's step time against ``sync``'s: the
ratio of the means with a 95% interval from a bootstrap over each round's steps. ``--reuse``
reads the runs already in ``--out`` instead of running them again (a run missing is run).
``--check-sync`` runs every mode with ``rollout.check_sync=true`` and reports, beside the rest,
how far the engine's log-probs are from the actor's right after each weight sync (the largest and
the mean of ``sync/max_logprob_diff`` and ``sync/mean_logprob_diff`` over the timed steps): the
colocated load against the disaggregated broadcast in buckets.
Training overrides (``key=value``) go to every mode's run after the job's own
(tests/test_async_speed.py runs it on a tiny model). Writes ``OUT/async_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))


def mode_overrides(mode: str, job: str) -> tuple[int, list[str]]:
    """(ranks, overrides) of a mode."""
    segment = 16 if job == "demo" else 64
    asynchronous = ["algorithm.max_staleness=1", "rollout.partial=true",
                    f"rollout.segment_tokens={segment}"]
    return {"sync": (1, []),
            "partial": (1, [*asynchronous, "rollout.extra_prompts=4"]),
            "disaggregated": (2, [*asynchronous, "rollout.placement=disaggregated",
                                  "rollout.ranks=1"])}[mode]


def job_overrides(args) -> list[str]:
    common = ["experiment=cpu_demo", "algorithm.replay_per_prompt=0", f"seed={args.seed}",
              f"algorithm.total_steps={args.steps}", "logging.eval_every=0",
              "logging.save_every=0", "logging.wandb=disabled", "logging.progress=false",
              "resume=false"]
    if args.job == "demo":
        return common
    from peer_trl import job_data

    train, _ = job_data(SimpleNamespace(job="long", seed=args.seed, out=Path(args.out),
                                        eval_questions=1, group=6, prompts=4, per_update=2,
                                        max_tokens=512, precision="fp32"))
    return [*common, f"data.train={train}", "data.eval=[]", "rollout.max_response_length=512",
            "algorithm.overlong_buffer=64"]


def run(mode: str, args, round_: int) -> list[dict]:
    ranks, overrides = mode_overrides(mode, args.job)
    run_dir = Path(args.out) / f"{mode}-{round_}"
    launcher = [sys.executable] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
        str(ranks)]
    argv = [*launcher, "-m", "megatron_rlep.train", *job_overrides(args), *args.overrides,
            *overrides, *(["rollout.check_sync=true"] if args.check_sync else []),
            f"run_dir={run_dir}"]
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    if not (args.reuse and (run_dir / "metrics.jsonl").exists()):
        with open(Path(args.out) / f"{mode}-{round_}.log", "w") as log:
            code = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, OMP_NUM_THREADS=threads)).returncode
        if code:
            raise SystemExit(f"{mode}, round {round_}: the run failed (exit status {code}); see "
                             f"{Path(args.out) / f'{mode}-{round_}.log'}")
    from plot import timeline

    phases = {r["step"]: r for r in timeline(run_dir, args.steps)}
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "time/step_s" not in r or r["step"] < 2:
            continue
        fresh = r["train/response_length_fresh"] * r["train/sequences"]  # M = 0: all fresh
        out.append({"step_s": r["time/step_s"], "tokens_per_s": fresh / r["time/step_s"],
                    "learner_idle_s": phases[r["step"]]["learner_idle_s"],
                    "rollout_idle_s": phases[r["step"]]["rollout_idle_s"],
                    "staleness_mean": r.get("rollout/staleness_mean") or 0.0,
                    **({"sync_max_logprob_diff": r["sync/max_logprob_diff"],
                        "sync_mean_logprob_diff": r["sync/mean_logprob_diff"]}
                       if args.check_sync else {})})
    return out


def ratio_interval(base: list[list[float]], other: list[list[float]], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """mean(base) / mean(other) over all rounds' steps, with a 95% bootstrap interval that
    resamples each round's steps."""
    rng = random.Random(seed)

    def ratio(b, o):
        return statistics.fmean(x for r in b for x in r) / \
            statistics.fmean(x for r in o for x in r)
    values = sorted(ratio([rng.choices(r, k=len(r)) for r in base],
                          [rng.choices(r, k=len(r)) for r in other]) for _ in range(draws))
    return ratio(base, other), values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=("demo", "long"), default="demo")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["sync", "partial", "disaggregated"],
                        choices=("sync", "partial", "disaggregated"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="runs/async-speed")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs already in --out instead of running them again")
    parser.add_argument("--check-sync", action="store_true",
                        help="the engine's log-probs against the actor's after every sync")
    parser.add_argument("overrides", nargs="*", help="training overrides for every mode")
    args = parser.parse_args()
    if args.modes[0] != "sync":
        raise SystemExit("--modes must start with sync: the others are compared with it")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    steps = {m: [] for m in args.modes}
    for round_ in range(args.rounds):
        for mode in args.modes:
            steps[mode].append(run(mode, args, round_))
            print(f"round {round_ + 1}, {mode}: "
                  f"{statistics.fmean(s['step_s'] for s in steps[mode][-1]):.1f} s a step",
                  flush=True)
    report = {"job": args.job, "steps": args.steps, "rounds": args.rounds, "cpus": os.cpu_count(),
              "command": " ".join(sys.argv), "modes": {}}
    for mode, rounds in steps.items():
        every = [s for r in rounds for s in r]
        row = {k: statistics.fmean(s[k] for s in every) for k in every[0]}
        row["tokens_per_s"] = sum(s["tokens_per_s"] * s["step_s"] for s in every) / \
            sum(s["step_s"] for s in every)
        value, low, high = ratio_interval([[s["step_s"] for s in r] for r in steps["sync"]],
                                          [[s["step_s"] for s in r] for r in rounds])
        row["sync_step_over_this"] = {"ratio": value, "interval": [low, high]}
        row["per_round_step_s"] = [statistics.fmean(s["step_s"] for s in r) for r in rounds]
        row["steps_s"] = [[s["step_s"] for s in r] for r in rounds]
        if args.check_sync:  # over the timed steps: the worst and the mean
            row["sync_max_logprob_diff"] = max(s["sync_max_logprob_diff"] for s in every)
            row["sync_mean_logprob_diff"] = statistics.fmean(s["sync_mean_logprob_diff"]
                                                             for s in every)
        report["modes"][mode] = row
    (Path(args.out) / "async_speed.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["modes"], indent=1))


if __name__ == "__main__":
    main()
