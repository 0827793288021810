"""A sandboxed program's latency and throughput, the way a tool call and a code answer meet it,
in one tree or in two trees taken in turn.

    python benchmarks/sandbox_latency.py [--calls 40] [--rounds 5] [--trees DIR_A DIR_B]

Per round: ``--calls`` trivial programs one after another through ``Sandbox.run`` (the cost of
the sandbox itself: the runner, its layers, two interpreter starts), as many tool calls
(``print(6 * 7)`` through ``Toolbox(["python"])``, one at a time: a call's latency) and then
all of them at once on ``rollout.tool_workers``' default of 8 threads (programs per second on
this machine). With ``--trees``, each round runs in each tree in turn (a new process with that
tree first on the path), so both see the same machine, and the report gives each tree's median
over rounds and B / A with the range of the per-round ratios. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(calls: int) -> dict:
    from megatron_rlep.reward.sandbox import Sandbox
    from megatron_rlep.rollout.tools import Toolbox

    sandbox, tools = Sandbox(), Toolbox(["python"])
    sandbox.run({"main.py": "print(1)\n"})  # warm: the interpreter's files in the page cache
    start = time.perf_counter()
    for _ in range(calls):
        assert sandbox.run({"main.py": "print(1)\n"}).stdout == "1\n"
    trivial = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(calls):
        assert tools.run([("python", "print(6 * 7)")])[0].output == "42\n"
    one = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    results = tools.run([("python", "print(6 * 7)")] * calls)
    at_once = time.perf_counter() - start
    assert all(r.output == "42\n" for r in results)
    return {"trivial_program_ms": 1e3 * trivial, "tool_call_ms": 1e3 * one,
            "tool_calls_per_s_8_workers": calls / at_once}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", nargs=2, metavar=("A", "B"))
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure or not args.trees:
        print(json.dumps(measure(args.calls)))
        return
    rounds = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure",
                                  "--calls", str(args.calls)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": os.path.abspath(tree)},
                                 cwd=os.path.abspath(tree), check=True)
            rounds[tree].append(json.loads(out.stdout))
    a, b = args.trees
    report = {"cpus": os.cpu_count(), "calls": args.calls, "rounds": args.rounds, "A": a, "B": b}
    for key in rounds[a][0]:
        ratios = [rb[key] / ra[key] for ra, rb in zip(rounds[a], rounds[b])]
        report[key] = {"A": statistics.median(r[key] for r in rounds[a]),
                       "B": statistics.median(r[key] for r in rounds[b]),
                       "B_over_A": statistics.median(ratios),
                       "B_over_A_range": [min(ratios), max(ratios)]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
