"""The trainer's RL step under tcmalloc, its free pages kept or capped, and glibc's allocator.

    python benchmarks/allocator.py [--rounds 2] [--steps 6] [--variants ...] [--json FILE]

On a CPU host the trainer preloads gperftools' tcmalloc where it is installed
(``cli.with_cpu_runtime``; MEGATRON_RLEP_MALLOC=glibc keeps glibc's allocator). This runs the job of
``benchmarks/peer_trl.py`` (the demo's baseline: 4 prompts x 6 answers of up to 32 tokens, 2
updates a step, fp32, vLLM rollouts, a checkpoint at half way) with each variant in turn,
``--rounds`` times, alternating so drift of the machine hits all alike. Figures per variant:
the median over its runs of each run's median step (steps after the first), the same for the
rollout, update and weight-sync parts, the process's system (kernel) CPU seconds and the MiB a
step ``host_memory.FreePageSettle`` handed back; then the ratio of each variant's step to
the first's. Every run keeps Intel's OpenMP, as the trainer does. The variants:

- ``tcmalloc``: every free page kept (MEGATRON_RLEP_HEAP_SETTLE=0);
- ``tcmalloc-settle1``: every free page handed back once, after the first step
  (MEGATRON_RLEP_HEAP_SETTLE=1; the trainer's default waits 10 steps);
- ``glibc``: glibc's allocator (MEGATRON_RLEP_MALLOC=glibc).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_trl import ROOT, ours_overrides  # noqa: E402

PARTS = {"step_s": "time/step_s", "rollout_s": "time/rollout_s", "update_s": "time/update_s",
         "sync_s": "time/sync_s"}
VARIANTS = {"tcmalloc": {"MEGATRON_RLEP_MALLOC": "tcmalloc", "MEGATRON_RLEP_HEAP_SETTLE": "0"},
            "tcmalloc-settle1": {"MEGATRON_RLEP_MALLOC": "tcmalloc",
                                 "MEGATRON_RLEP_HEAP_SETTLE": "1"},
            "glibc": {"MEGATRON_RLEP_MALLOC": "glibc"}}


def trainer_overrides(args, out: Path) -> list[str]:
    """The TRL benchmark's job (``peer_trl.ours_overrides``, its short job) for ``args``."""
    job = argparse.Namespace(job="short", model=args.model, seed=args.seed, steps=args.steps,
                             group=6, prompts=4, per_update=2, max_tokens=32, precision="fp32",
                             eval_at=[max(1, args.steps // 2)])
    return ours_overrides(job, out, "ours")


def one_run(args, variant: str, out: Path) -> dict:
    env = {**os.environ, **VARIANTS[variant]}
    env.pop("LD_PRELOAD", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run([sys.executable, "-m", "megatron_rlep.train",
                        *trainer_overrides(args, out)], cwd=ROOT, env=env, check=True,
                       stdout=log, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r][1:]
    for heavy in ("checkpoints", "hf"):  # about 2 GB a run; the figures are in metrics.jsonl
        shutil.rmtree(out / heavy, ignore_errors=True)
    return {**{k: statistics.median(r[m] for r in rows) for k, m in PARTS.items()},
            "released_mib": statistics.fmean(r.get("perf/heap_released_gib", 0) * 1024
                                             for r in rows),
            "system_cpu_s": after.ru_stime - before.ru_stime,
            "user_cpu_s": after.ru_utime - before.ru_utime}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m", help="as benchmarks/peer_trl.py takes it")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "allocator")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["tcmalloc", "glibc"],
                   help="the first is the one the others are compared with")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    from megatron_rlep.cli import cpu_runtime_libraries

    if not any("libtcmalloc" in lib for lib in cpu_runtime_libraries()):
        p.error("tcmalloc is not installed here: apt-get install libtcmalloc-minimal4 "
                "(scripts/env.sh does where it runs as root)")
    runs: dict[str, list] = {v: [] for v in args.variants}
    for round_ in range(args.rounds):
        for variant in runs:
            out = (args.out / f"{variant}-{round_}").resolve()
            shutil.rmtree(out, ignore_errors=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            runs[variant].append(one_run(args, variant, out))
            print(f"round {round_ + 1}/{args.rounds} {variant:13s} " + " ".join(
                f"{k} {v:.2f}" for k, v in runs[variant][-1].items()), flush=True)
    figures = {a: {k: statistics.median(r[k] for r in rs)
                   for k in (*PARTS, "released_mib", "system_cpu_s")} for a, rs in runs.items()}
    first = args.variants[0]
    result = {"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "steps": args.steps,
              "runs": runs, "figures": figures,
              **{f"{v}_over_{first}": figures[v]["step_s"] / figures[first]["step_s"]
                 for v in args.variants[1:]}}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
