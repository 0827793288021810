"""Programs per second through the code sandbox, one at a time and through the scorer's workers.

    python benchmarks/sandbox_throughput.py [--programs 60] [--workers 1 2]

Three kinds of program, each run ``--programs`` times: a trivial one (``print(1)``: the cost of
the sandbox itself: namespaces, tmpfs, Landlock, two interpreter starts), one that computes for
about 0.5 s of CPU, and a code answer checked against four literal asserts by the code checker
(the built-in code task's case). The first two go straight through ``Sandbox.run``; the third
through a ``Scorer`` with ``--workers`` worker processes. Then the judge (``judge`` in the
output): a trivial answer and a 0.5 s one checked against a HumanEval-style ``check`` and a
KodCode pytest file, the two ways in turn: the judge's (tests in a sandbox of their own, the
answer in another, the channel between) and the earlier one, kept for patching tests (tests and
answer in one sandbox, a printed token). Prints one JSON object: programs per second and
seconds per program, with the machine's isolation line.
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
    report["judge"] = judge_rows(max(4, args.programs // 6))
    print(json.dumps(report, indent=1))


def judge_rows(count: int) -> dict:
    """Seconds per checked answer, the judge's way and the one-process way, in turn."""
    from megatron_rlep.reward.code import CodeChecker, parse_tests

    checker = CodeChecker()
    tests = {"check": parse_tests({"test_code": "def check(candidate):\n"
                                   "    assert candidate(2) == 4\n    assert candidate(3) == 5\n",
                                   "entry_point": "plus_two"}),
             "pytest": parse_tests({"test": "from solution import plus_two\n\n"
                                    "def test_one():\n    assert plus_two(2) == 4\n\n"
                                    "def test_two():\n    assert plus_two(3) == 5\n"})}
    answers = {"trivial": "def plus_two(x):\n    return x + 2\n",
               "half_second": "def plus_two(x):\n" + "".join(
                   "    " + line + "\n" for line in HALF_SECOND.splitlines()[:-1]) +
               "    return x + 2\n"}
    ways = {"judge": checker._judged, "one_process": checker._in_process}
    rows = {}
    for answer_name, program in answers.items():
        for test_name, spec in tests.items():
            times = {way: 0.0 for way in ways}
            for _ in range(count if answer_name == "trivial" else max(2, count // 3)):
                for way, check in ways.items():
                    start = time.perf_counter()
                    assert check(program, spec).correct, (way, answer_name, test_name)
                    times[way] += time.perf_counter() - start
            n = count if answer_name == "trivial" else max(2, count // 3)
            rows[f"{answer_name}_{test_name}"] = {
                way: {"per_s": n / t, "s_each": t / n} for way, t in times.items()}
    return rows


if __name__ == "__main__":
    main()
