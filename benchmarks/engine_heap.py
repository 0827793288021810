"""The rollout engine alone: does its live heap grow step by step, and only with new batch shapes?

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 OMP_NUM_THREADS=1 \
        python benchmarks/engine_heap.py --steps 150 --prompts varied [--no-reload]

``VllmEngine`` on the built-in model. Each step: 4 prompts with 6 answers each (``fixed``: the
same 4 prompts every step) or 3-6 answers each (``varied``: 40-140 random tokens, new each
step), sampled in two segments of 16 tokens with per-request seeds as the rollout rank samples
them, then a reload of the weights from the model's files (unless ``--no-reload``). After each
step one JSON line: the live and free heap (``host_memory.heap_bytes``; tcmalloc's figures where
it is preloaded). Set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to see what oneDNN's kernel cache
holds (docs/scaling.md, "Host memory over 300 steps").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--prompts", choices=("fixed", "varied"), default="varied")
    parser.add_argument("--reload", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

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
        for _ in range(2):
            asked = [prompts[i // each] + tuple(a) for i, a in enumerate(answers)]
            seeds = [request_seed(calls, i) for i in range(len(asked))]
            out = engine.generate(asked, 1, seed=seeds, max_tokens=16)
            calls += 1
            for answer, completions in zip(answers, out):
                answer += list(completions[0].token_ids)
        if args.reload:
            engine.load_weights([list(weights.items())])
        heap = host_memory.heap_bytes()
        print(json.dumps({"step": step, "in_use_mib": round(heap["in_use"] / 2**20, 2),
                          "free_mib": round(heap["free"] / 2**20, 2)}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
