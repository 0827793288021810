"""The rollout engine alone: does its live heap grow step by step, and only with new batch shapes?

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 OMP_NUM_THREADS=1 \
        python benchmarks/engine_heap.py --steps 150 --prompts varied [--no-reload]
    python benchmarks/engine_heap.py --compare 1024 64 16 --rounds 3 --steps 60 [--json FILE]

``VllmEngine`` on the built-in model. Each step: 4 prompts with 6 answers each (``fixed``: the
same 4 prompts every step) or 3-6 answers each (``varied``: 40-140 random tokens, new each
step), sampled in two segments of 16 tokens with per-request seeds as the rollout rank samples
them, then a reload of the weights from the model's files (unless ``--no-reload``). After each
step one JSON line: the seconds its two segments of generation took and the live and free heap
(``host_memory.heap_bytes``; tcmalloc's figures where it is preloaded). Set
``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to see what oneDNN's kernel cache holds (docs/host_memory.md,
"Host memory over a long run").

``--compare`` runs the varied job once per capacity of that cache in each of ``--rounds``
rounds (the order turned by one each round, so that drift of the machine hits all alike), each
in a process of its own with one thread and the trainer's CPU runtime preloaded
(``cli.cpu_runtime_libraries``), as a rollout rank runs beside the learners on this machine.
The runs draw the same prompts step by step. Per capacity: the generation's mean seconds after
``--warmup`` steps as a ratio to the first capacity's, with a 95% bootstrap interval over the
steps of every round, and the live heap's slope after the warm-up with its interval
(benchmarks/memory_soak.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--prompts", choices=("fixed", "varied"), default="varied")
    parser.add_argument("--reload", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compare", type=int, nargs="+", metavar="CAPACITY",
                        help="oneDNN primitive-cache capacities to time against the first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", type=Path, help="with --compare: write the figures here too")
    args = parser.parse_args()
    if args.compare:
        return compare(args)

    from safetensors.torch import load_file

    from megatron_rlep import host_memory
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.rollout.base import request_seed
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    path = resolve_model_path("smollm2-135m")
    engine = VllmEngine(path, max_model_len=512, dtype="float32", cpu_kv_cache_gib=1.0)
    weights = {k: v for f in sorted(Path(path).glob("*.safetensors"))
               for k, v in load_file(str(f)).items()}
    rng, calls = random.Random(0), 0
    for step in range(1, args.steps + 1):
        if args.prompts == "varied":
            prompts = [tuple(rng.randrange(100, 20000) for _ in range(rng.randrange(40, 140)))
                       for _ in range(4)]
            each = rng.randrange(3, 7)
        else:
            prompts, each = [tuple(range(100 + 7 * i, 170 + 7 * i)) for i in range(4)], 6
        answers = [[] for _ in range(4 * each)]
        start = time.perf_counter()
        for _ in range(2):
            asked = [prompts[i // each] + tuple(a) for i, a in enumerate(answers)]
            seeds = [request_seed(calls, i) for i in range(len(asked))]
            out = engine.generate(asked, 1, seed=seeds, max_tokens=16)
            calls += 1
            for answer, completions in zip(answers, out):
                answer += list(completions[0].token_ids)
        seconds = time.perf_counter() - start
        if args.reload:
            engine.load_weights([list(weights.items())])
        heap = host_memory.heap_bytes()
        print(json.dumps({"step": step, "generate_s": round(seconds, 4),
                          "in_use_mib": round(heap["in_use"] / 2**20, 2),
                          "free_mib": round(heap["free"] / 2**20, 2)}), flush=True)
    engine.close()


def compare(args) -> None:
    from async_speed import ratio_interval
    from memory_soak import slope, slope_interval

    from megatron_rlep.cli import cpu_runtime_libraries

    if args.steps <= args.warmup + 1:
        raise SystemExit(f"--steps {args.steps} leaves nothing after --warmup {args.warmup}: "
                         "ask for more steps than the warm-up")
    preload = cpu_runtime_libraries() + [os.environ.get("LD_PRELOAD", "")]
    env = {"KMP_BLOCKTIME": "1", **os.environ, "OMP_NUM_THREADS": "1",
           "LD_PRELOAD": ":".join(preload).strip(":")}
    runs: dict[int, list[list[dict]]] = {c: [] for c in args.compare}
    for round_ in range(args.rounds):
        turn = round_ % len(args.compare)
        for capacity in args.compare[turn:] + args.compare[:turn]:
            done = subprocess.run(
                [sys.executable, __file__, "--steps", str(args.steps), "--prompts", "varied"],
                env={**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(capacity)},
                capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"the run at capacity {capacity} failed:\n{done.stderr[-3000:]}")
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            runs[capacity].append(rows[args.warmup:])
            print(f"round {round_ + 1}/{args.rounds}, capacity {capacity}: generation "
                  f"{statistics.fmean(r['generate_s'] for r in rows[args.warmup:]):.3f} s a step, "
                  f"live heap {rows[args.warmup]['in_use_mib']:.0f} -> "
                  f"{rows[-1]['in_use_mib']:.0f} MiB", flush=True)
    first = [[r["generate_s"] for r in rows] for rows in runs[args.compare[0]]]
    figures = {}
    for capacity, rounds in runs.items():
        ratio, low, high = ratio_interval([[r["generate_s"] for r in rows] for rows in rounds],
                                          first)
        heap = [([r["step"] for r in rows], [r["in_use_mib"] for r in rows]) for rows in rounds]
        figures[capacity] = {
            "generate_s": statistics.fmean(r["generate_s"] for rows in rounds for r in rows),
            "over_first": [round(ratio, 4), round(low, 4), round(high, 4)],
            "heap_slope_mib_per_step": [
                [round(slope(*h), 3), *(round(x, 3) for x in slope_interval(*h))] for h in heap]}
    result = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "warmup": args.warmup,
              "rounds": args.rounds, "first": args.compare[0], "figures": figures}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
