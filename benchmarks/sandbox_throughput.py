"""Programs per second through the code sandbox, one at a time and through the scorer's workers.

    python benchmarks/sandbox_throughput.py [--programs 60] [--workers 1 2]

Three kinds of program, each run ``--programs`` times: a trivial one (``print(1)``: the cost of
the sandbox itself: namespaces, tmpfs, Landlock, two interpreter starts), one that computes for
about 0.5 s of CPU, and a code answer checked against four literal asserts by the code checker
(the built-in code task's case). The first two go straight through ``Sandbox.run``; the third
through a ``Scorer`` with ``--workers`` worker processes. Prints one JSON object: programs per
second and seconds per program, with the machine's isolation line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

HALF_SECOND = "n = 0\nfor i in range(7_000_000):\n    n += i\nprint(n)\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=60)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    args = parser.parse_args()
    from megatron_rlep.reward.sandbox import Sandbox
    from megatron_rlep.reward.scorer import Item, Scorer, settings

    sandbox = Sandbox()
    report = {"isolation": sandbox.probe(), "cpus": os.cpu_count(), "programs": args.programs}
    for name, source in (("trivial", "print(1)\n"), ("half_second", HALF_SECOND)):
        count = args.programs if name == "trivial" else max(4, args.programs // 6)
        start = time.perf_counter()
        for _ in range(count):
            assert sandbox.run({"main.py": source}).status == "ok"
        seconds = time.perf_counter() - start
        report[name] = {"programs": count, "per_s": count / seconds, "s_each": seconds / count}
    truth = json.dumps({"assert_case": [f"assert plus_two({x}) == {x + 2}" for x in (1, 5, 9, 12)]})
    answer = "```python\ndef plus_two(x):\n    return x + 2\n```"
    for workers in args.workers:
        scorer = Scorer(settings("code", workers=workers))
        start = time.perf_counter()
        scores = scorer.score([Item("code", answer, truth)] * args.programs)
        seconds = time.perf_counter() - start
        scorer.close()
        assert all(s.correct for s in scores)
        report[f"code_answers_{workers}_workers"] = {"per_s": args.programs / seconds,
                                                      "s_each": seconds / args.programs}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
