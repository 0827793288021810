"""Responses scored per second by tools/score.py in dapo mode, on one core.

    python benchmarks/score_throughput.py [--rows 50000]

Writes a JSONL of realistic responses (a few hundred characters of working, then an Answer:
line; half correct), runs ``tools/score.py`` on it as a subprocess pinned to one core with
``taskset`` when available, and prints rows per second from the tool's own summary.
"""

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_rows(n, seed=0):
    rng = random.Random(seed)
    for i in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        answer = a + b if rng.random() < 0.5 else a + b + 1
        work = " ".join(f"step {k}: we add {a} and {b} carefully." for k in range(rng.randint(3, 12)))
        yield {"response": f"{work}\nSo ${a} + {b} = {answer}$.\nAnswer: ${answer:,}$",
               "ground_truth": str(a + b)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--mode", default="dapo")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        with open(src, "w") as f:
            for row in make_rows(args.rows):
                f.write(json.dumps(row) + "\n")
        pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
        done = subprocess.run([*pin, sys.executable, str(ROOT / "tools" / "score.py"), str(src),
                               "--mode", args.mode, "-o", str(dst)],
                              capture_output=True, text=True, check=True)
        summary = json.loads(done.stderr.strip().splitlines()[-1])
    rate = summary["rows"] / summary["seconds"]
    print(json.dumps({**summary, "rows_per_second": round(rate), "one_core": bool(pin)}))


if __name__ == "__main__":
    main()
