"""Where the test suite's CPU goes: every Python process a command starts, its CPU seconds, the
test that started it, and the machine's idle share while it ran.

    python benchmarks/suite_census.py --out DIR [-- COMMAND ...]    # default: bash scripts/test.sh
    python benchmarks/suite_census.py --out DIR --summary           # the tables again

A ``sitecustomize`` in DIR/hook (on ``PYTHONPATH``) makes each Python process append one line to
DIR/processes.jsonl as it exits: its CPU seconds (user + system, its own), its wall seconds,
what it ran, the modules it imported that cost a start-up (Megatron-Core, vLLM), and the test
that started it (``PYTEST_CURRENT_TEST``, which a subprocess inherits with the environment). The
machine's CPU is sampled every 5 s (``/proc/stat``). Not counted: a process killed by a signal
it does not handle (SIGKILL), and one whose environment was rebuilt without ``PYTHONPATH``;
a test's own work in its pytest worker is counted in the worker's line, not the test's. Prints
the CPU by kind of process and by test file, and writes DIR/census.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOOK = '''import atexit, json, os, sys, time
_START = time.time()


def _census():
    t = os.times()
    line = {"argv": sys.argv[:2], "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "cpu": round(t.user + t.system, 2), "wall": round(time.time() - _START, 2),
            "megatron": "megatron.core" in sys.modules, "vllm": "vllm" in sys.modules}
    with open(os.environ["SUITE_CENSUS"], "a") as f:
        f.write(json.dumps(line) + "\\n")


if os.environ.get("SUITE_CENSUS"):
    atexit.register(_census)
'''


def kind(argv: list[str]) -> str:
    """What a process ran: its script or module's file (``python -m`` names the module's file;
    a torchrun worker its script), ``python -c`` for a command."""
    if not argv or argv[0] in ("", "-c"):
        return "python -c"
    script = Path(argv[0])
    return f"{script.parent.name}/{script.name}"


def idle_share(samples: list[list[int]]) -> float | None:
    """The share of CPU time idle or waiting on I/O between the first and the last sample."""
    if len(samples) < 2:
        return None
    delta = [b - a for a, b in zip(samples[0], samples[-1])]
    total = sum(delta)
    return (delta[3] + delta[4]) / total if total else None


def summary(lines: list[dict], idle: float | None) -> dict:
    def table(key):
        out = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
        for line in lines:
            row = out[key(line)]
            row["processes"] += 1
            row["cpu_s"] = round(row["cpu_s"] + line["cpu"], 2)
        return dict(sorted(out.items(), key=lambda item: -item[1]["cpu_s"]))
    return {"processes": len(lines), "cpu_s": round(sum(x["cpu"] for x in lines), 2),
            "idle_share": idle, "megatron_processes": sum(x["megatron"] for x in lines),
            "vllm_processes": sum(x["vllm"] for x in lines),
            "by_kind": table(lambda x: kind(x["argv"])),
            "by_test_file": table(lambda x: x["test"].split("::")[0] or "(no test)")}


def show(result: dict, top: int = 25) -> None:
    idle = result["idle_share"]
    print(f"{result['processes']} processes, {result['cpu_s']:.0f} CPU s; "
          f"{result['megatron_processes']} imported Megatron-Core, {result['vllm_processes']} "
          f"vLLM; the CPU idle {'-' if idle is None else f'{idle:.1%}'} of the time")
    for name in ("by_kind", "by_test_file"):
        print(f"\n| {name.replace('_', ' ')} | processes | CPU s |\n| --- | --- | --- |")
        for key, row in list(result[name].items())[:top]:
            print(f"| {key} | {row['processes']} | {row['cpu_s']:.0f} |")


def cpu_times() -> list[int]:
    """The machine's CPU time so far, by state (``/proc/stat``'s first line)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def sample_cpu(into: list, stop: threading.Event) -> None:
    while True:
        into.append(cpu_times())
        if stop.wait(5):
            into.append(cpu_times())
            return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", action="store_true", help="tabulate DIR's census again")
    parser.add_argument("command", nargs="*", default=["bash", "scripts/test.sh"])
    args = parser.parse_args()
    out = args.out.resolve()
    processes, record = out / "processes.jsonl", out / "census.json"
    samples = []
    if not args.summary:
        (out / "hook").mkdir(parents=True, exist_ok=True)
        (out / "hook" / "sitecustomize.py").write_text(HOOK)
        processes.unlink(missing_ok=True)
        path = os.pathsep.join(filter(None, [str(out / "hook"), os.environ.get("PYTHONPATH")]))
        stop = threading.Event()
        sampler = threading.Thread(target=sample_cpu, args=(samples, stop), daemon=True)
        sampler.start()
        code = subprocess.run(args.command, cwd=REPO, env=dict(
            os.environ, PYTHONPATH=path, SUITE_CENSUS=str(processes))).returncode
        stop.set()
        sampler.join()
    elif not record.is_file():
        sys.exit(f"error: {record} is not there: run the census into {out} first")
    lines = [json.loads(x) for x in processes.read_text().splitlines()] if processes.is_file() \
        else []
    if args.summary:  # the run's own command, exit code and idle share
        before = json.loads(record.read_text())
        result = {**before, **summary(lines, before["idle_share"])}
    else:
        result = {"command": args.command, "exit_code": code, **summary(lines, idle_share(samples))}
    record.write_text(json.dumps(result, indent=1) + "\n")
    show(result)
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
