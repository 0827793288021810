"""A training step with the Python tool in the loop, in two trees taken in turn: what the sandbox
costs a tools run.

    python benchmarks/tools_step.py --trees DIR_A DIR_B [--rounds 3] [--steps 4] [--out DIR]

Each round trains the calculator demo's preset (``experiment=cpu_demo_calculator``: the built-in
model, answers of up to 64 tokens with up to 2 ``python`` calls) for ``--steps`` steps in each
tree in turn (a new process with that tree first on the path, the same seed), without
validation. Both trees sample the same answers (checked: each step's reward and calls per answer
must agree), so they make the same calls. Reports each tree's median over rounds of the mean
step time and the mean time in tools (the first step left out: it warms up), and B / A with the
range of the per-round ratios. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(tree: str, steps: int, run_dir: str) -> list[dict]:
    """The steps' logged metrics of one run in ``tree``."""
    cmd = [sys.executable, "-m", "megatron_rlep.train", "experiment=cpu_demo_calculator",
           f"algorithm.total_steps={steps}", "logging.eval_every=0", "logging.save_every=0",
           "logging.wandb=disabled", "logging.progress=false", f"run_dir={run_dir}"]
    subprocess.run(cmd, env={**os.environ, "PYTHONPATH": os.path.abspath(tree)}, check=True,
                   cwd=os.path.abspath(tree), stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as lines:
        rows = [json.loads(line) for line in lines]
    return [r for r in rows if "time/step_s" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, metavar=("A", "B"), required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary "
                                                   "folder, removed after)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="tools-step-")
    keys = ("time/step_s", "time/tools_s")
    rounds = {tree: [] for tree in args.trees}
    try:
        for r in range(args.rounds):
            logged = {}
            for i, tree in enumerate(args.trees):
                run_dir = os.path.join(out, f"round{r}-{'AB'[i]}")
                steps = run(tree, args.steps, run_dir)
                logged[tree] = steps
                rounds[tree].append({k: statistics.mean(s[k] for s in steps[1:]) for k in keys})
                shutil.rmtree(run_dir, ignore_errors=True)
            pairs = zip(*logged.values())
            for a, b in pairs:  # the same answers: the same rewards and calls
                for key in ("train/reward_fresh", "train/response_length_fresh",
                            "tools/calls_per_answer"):
                    assert a.get(key) == b.get(key), (key, a.get(key), b.get(key))
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    a, b = args.trees
    report = {"cpus": os.cpu_count(), "rounds": args.rounds, "steps": args.steps, "A": a, "B": b}
    for key in keys:
        ratios = [rb[key] / ra[key] for ra, rb in zip(rounds[a], rounds[b])]
        report[key] = {"A": statistics.median(x[key] for x in rounds[a]),
                       "B": statistics.median(x[key] for x in rounds[b]),
                       "B_over_A": statistics.median(ratios),
                       "B_over_A_range": [min(ratios), max(ratios)]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
