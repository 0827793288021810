"""The actor's update before and after a checkpoint save, under GNU and under Intel OpenMP.

A checkpoint save gathers tensors over gloo, and gloo runs a parallel torch operation in its
own thread, which keeps an OpenMP team of its own from then on. Under GNU OpenMP (torch's own)
the process then has more OpenMP threads than cores, and GNU's threads sleep between parallel
operations instead of spinning: every later update is slower. The trainer therefore runs with
Intel's runtime preloaded on a CPU host (``cli.with_cpu_runtime``). Each runtime runs in its
own process, one after the other: ``--repeats`` updates of the demo's mini-batch (12 answers in
groups of 6 on a 76-token prompt), a full checkpoint save, and ``--repeats`` updates again.
Both keep the trainer's allocator (tcmalloc where installed), so only the OpenMP runtime differs.

    python benchmarks/openmp_runtime.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(repeats: int, sequences: int, prompt: int, response: int, group: int) -> dict:
    """This process's update times before and after one checkpoint save (seconds)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from actor_step import make_batch

    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.config import AlgorithmConfig

    actor = Actor("smollm2-135m", AlgorithmConfig(lr=1e-6, warmup_steps=0), 1, 1,
                  micro_batch_size=8, share_prompts=True)
    batch = make_batch(sequences, prompt, response, actor.hf_config.vocab_size, group=group)
    batch.old_logp, _ = actor.logprobs(batch)

    def updates(n):
        times = []
        for _ in range(n):
            start = time.perf_counter()
            actor.train_step(batch)
            times.append(time.perf_counter() - start)
        return times

    updates(1)  # warm-up
    before = updates(repeats)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        actor.save(Path(tmp) / "checkpoint")
        save_s = time.perf_counter() - start
    after = updates(repeats)
    maps = Path("/proc/self/maps").read_text()
    return {"before_s": before, "after_s": after, "save_s": save_s,
            "intel_openmp_loaded": "libiomp5" in maps}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sequences", type=int, default=12)
    p.add_argument("--prompt", type=int, default=76)
    p.add_argument("--response", type=int, default=24)
    p.add_argument("--group", type=int, default=6)
    p.add_argument("--json", type=Path, help="write the figures here too")
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # one runtime, here
    args = p.parse_args(argv)
    shape = (args.repeats, args.sequences, args.prompt, args.response, args.group)
    if args.run:
        from megatron_rlep.cli import with_cpu_runtime

        with_cpu_runtime()  # Intel's OpenMP unless MEGATRON_RLEP_OPENMP=gnu
        print(json.dumps(measure(*shape)))
        return 0
    result = {"date": time.strftime("%Y-%m-%d"), "shape": dict(zip(
        ("repeats", "sequences", "prompt", "response", "group"), shape)), "runtimes": {}}
    for runtime in ("gnu", "intel"):
        env = {**os.environ, "MEGATRON_RLEP_OPENMP": runtime}
        out = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), "--run"],
                             env=env, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
        run = json.loads(out.stdout.strip().splitlines()[-1])
        run["before_median_s"] = statistics.median(run["before_s"])
        run["after_median_s"] = statistics.median(run["after_s"])
        run["after_over_before"] = run["after_median_s"] / run["before_median_s"]
        result["runtimes"][runtime] = run
        print(f"{runtime:6s} OpenMP (Intel's loaded: {run['intel_openmp_loaded']}): update "
              f"{run['before_median_s']:.2f} s before a save, {run['after_median_s']:.2f} s "
              f"after: {run['after_over_before']:.2f}x", flush=True)
    gnu, intel = result["runtimes"]["gnu"], result["runtimes"]["intel"]
    print(f"after a save, GNU's update / Intel's: {gnu['after_median_s'] / intel['after_median_s']:.2f}x; "
          f"before: {gnu['before_median_s'] / intel['before_median_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
