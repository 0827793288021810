"""What the CPU shims' device rewrite (shim 4, a TorchFunctionMode every torch call passes
through) cost a rollout engine's generation, now that the engines pause it.

    python benchmarks/device_rewrite.py [--pairs 8] [--model smollm2-135m] [--max-tokens 32]
        [--engines vllm transformers] [--json docs/records/cpu_speed/device_rewrite.json]

In one process with the CPU shims installed, per engine: the demo's rollout (4 prompts x 6
samples, up to 32 tokens, T = 1, the built-in task's prompts) timed as the engines run it
(the mode paused) and with the mode on (a second one pushed above the paused one), in ABBA
pairs; the ratio on / paused with a 95% t-interval over the pairs' log ratios. The answers are
the same token for token in both arms (checked). Beside other work, give it one thread
(``OMP_NUM_THREADS=1``): OpenMP threads that outnumber the free cores make every run several
times as long, whatever the arm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_trl import ratio_over_rounds  # noqa: E402 - a geometric mean with its t-interval


def measure(kind: str, pairs: int, model: str, longest: int) -> dict:
    from megatron_rlep import platform
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.platform.shims import _CudaToCpu
    from megatron_rlep.rollout import TransformersEngine, encode_prompt
    from megatron_rlep.tasks import arithmetic

    platform.install_cpu_shims()
    path = resolve_model_path(model)
    if kind == "vllm":
        from megatron_rlep.rollout.vllm_engine import VllmEngine
        engine = VllmEngine(path, max_model_len=1024, dtype="float32")
    else:
        engine = TransformersEngine(path)
    prompts = [encode_prompt(engine.tokenizer, e.prompt)
               for e in arithmetic.examples("train", [1, 2, 3], 4, 1)]

    def run(mode_on: bool):
        start = time.perf_counter()
        # a second mode above the paused one: the engine's pause leaves it on
        with _CudaToCpu() if mode_on else nullcontext():
            out = engine.generate(prompts, n=6, temperature=1.0, max_tokens=longest, seed=1)
        return time.perf_counter() - start, [[c.token_ids for c in group] for group in out]

    _, reference = run(False)  # warm-up
    times = {"paused": [], "on": []}
    for p in range(pairs):
        order = (False, True) if p % 2 == 0 else (True, False)  # ABBA
        seconds = {}
        for mode_on in order:
            seconds[mode_on], tokens = run(mode_on)
            if tokens != reference:
                raise SystemExit(f"{kind}: the answers changed with the mode "
                                 f"{'on' if mode_on else 'paused'}")
        print(f"{kind} pair {p + 1}: on {seconds[True]:.2f} s, paused {seconds[False]:.2f} s",
              file=sys.stderr, flush=True)
        times["paused"].append(seconds[False])
        times["on"].append(seconds[True])
    ratio = ratio_over_rounds(times["on"], times["paused"])
    return {"engine": kind, "median_s": {k: statistics.median(v) for k, v in times.items()},
            "on_over_paused": ratio, "per_pair": ratio["by_round"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["vllm", "transformers"],
                        choices=["vllm", "transformers"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(kind, args.pairs, args.model, args.max_tokens) for kind in args.engines]
    for r in results:
        x = r["on_over_paused"]
        print(f"{r['engine']}: the demo's rollout with the mode on takes {x['ratio']:.3f}x as long "
              f"as paused [{x['low']:.3f}, {x['high']:.3f}] ({x['rounds']} pairs; medians "
              f"{r['median_s']['on']:.2f} s and {r['median_s']['paused']:.2f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
