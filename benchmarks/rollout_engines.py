"""Rollout engines compared on this machine: vLLM (its CPU build here) against the transformers
engine on the built-in model, fp32.

    python benchmarks/rollout_engines.py [--repeats 3] [--json docs/records/rollout_engines/rollout_engines.json]
        [--model smollm2-135m] [--max-tokens 32]

Each engine runs in its own child process (vLLM changes torch's thread settings), with the
same prompts, counts, lengths and seeds: engine start-up, a weight sync (the model's own
Hugging Face-named tensors, lm_head left out as the actor's export does), and generated tokens
per second on
- `demo rollout`: one training step of the demo (4 prompts x 6 samples, up to 32 tokens, T = 1);
- `evaluation`: 32 held-out questions x 4 samples, up to 32 tokens (the demo's evaluation until 2026-11-24);
- `pool`: 8 training questions x 8 samples, up to 32 tokens, T = 0.7.
Prompts are the built-in task's (levels 1-3). Tokens/s is the median over ``--repeats`` runs.
``--model`` takes another model's directory and ``--max-tokens`` shortens every workload's answers
(tests/test_benchmarks.py runs it on a tiny model with answers of 4 tokens).

With ``--vllm-blocks 128 32`` it compares vLLM with those KV block sizes instead (the CPU
backend's default is 128; the prefix cache reuses whole blocks only), plus
- `validation`: 128 held-out questions (levels 3, 4, 6) x 2 samples, up to 32 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = {  # name: (split, questions, samples, max tokens, temperature)
    "demo rollout": ("train", 4, 6, 32, 1.0),
    "evaluation": ("test", 32, 4, 32, 1.0),
    "pool": ("train", 8, 8, 32, 0.7),
}
VALIDATION = ("test", 128, 2, 32, 1.0, (3, 4, 6))


def measure(kind: str, repeats: int, model: str = "smollm2-135m", longest: int = 32) -> dict:
    import torch

    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.rollout import TransformersEngine, encode_prompt

    torch.set_num_threads(os.cpu_count() or 1)
    path = resolve_model_path(model)
    start = time.perf_counter()
    if kind.startswith("vllm"):  # vllm or vllm:BLOCK
        from megatron_rlep.rollout.vllm_engine import VllmEngine

        block = {"cpu_block_size": int(kind[5:])} if ":" in kind else {}
        engine = VllmEngine(path, max_model_len=1024, dtype="float32", **block)
    else:
        engine = TransformersEngine(path)
    out = {"engine": kind, "start_s": time.perf_counter() - start, "threads": torch.get_num_threads()}
    from safetensors.torch import load_file

    weights = [(n, t) for n, t in load_file(str(Path(path) / "model.safetensors")).items()
               if n != "lm_head.weight"]
    syncs = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.load_weights([weights])
        syncs.append(time.perf_counter() - start)
    out["sync_s"] = statistics.median(syncs)
    workloads = {name: (*w, (1, 2, 3)) for name, w in WORKLOADS.items()}
    if ":" in kind:
        workloads["validation"] = VALIDATION
    for name, (split, questions, samples, max_tokens, temperature, levels) in workloads.items():
        examples = arithmetic.examples(split, levels, questions, seed=0)
        prompts = [encode_prompt(engine.tokenizer, e.prompt) for e in examples]
        rates, tokens = [], 0
        for r in range(repeats):
            start = time.perf_counter()
            groups = engine.generate(prompts, samples, temperature=temperature,
                                     max_tokens=min(max_tokens, longest), seed=r)
            seconds = time.perf_counter() - start
            tokens = sum(len(c.token_ids) for g in groups for c in g)
            rates.append(tokens / seconds)
        out[name] = {"tokens_per_s": statistics.median(rates), "tokens": tokens,
                     "seconds": tokens / statistics.median(rates),
                     "prompt_tokens": len(prompts[0])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--vllm-blocks", type=int, nargs="+", default=None, metavar="N",
                        help="compare vLLM with these KV block sizes instead of the engines")
    parser.add_argument("--model", default="smollm2-135m",
                        help="the built-in model's name or a Hugging Face model directory")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="answers up to this many tokens in every workload (at most 32)")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # the child process's own
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(measure(args.engine, args.repeats, args.model, args.max_tokens)))
        return
    results = {}
    kinds = [f"vllm:{b}" for b in args.vllm_blocks] if args.vllm_blocks else ["transformers", "vllm"]
    for kind in kinds:
        child = subprocess.run([sys.executable, __file__, "--engine", kind, "--repeats",
                                str(args.repeats), "--model", args.model, "--max-tokens",
                                str(args.max_tokens)], capture_output=True, text=True,
                               env=dict(os.environ, PYTHONWARNINGS="ignore"))
        if child.returncode != 0:
            sys.exit(f"the {kind} run failed:\n{child.stderr[-3000:]}")
        results[kind] = json.loads(child.stdout.strip().splitlines()[-1])
    if args.vllm_blocks:
        first, last = results[kinds[0]], results[kinds[-1]]
        print("| workload | " + " | ".join(f"block {b}: s (tokens/s)" for b in args.vllm_blocks)
              + f" | block {args.vllm_blocks[-1]} / block {args.vllm_blocks[0]} (tokens/s) |")
        print("| --- " * (len(kinds) + 2) + "|")
        for name in (*WORKLOADS, "validation"):
            cells = " | ".join(f"{results[k][name]['seconds']:.1f} ({results[k][name]['tokens_per_s']:.1f})"
                               for k in kinds)
            ratio = last[name]["tokens_per_s"] / first[name]["tokens_per_s"]
            print(f"| {name} | {cells} | {ratio:.2f}x |")
    else:
        t, v = results["transformers"], results["vllm"]
        print("| workload | transformers tokens/s | vLLM tokens/s | vLLM / transformers |")
        print("| --- | --- | --- | --- |")
        for name in WORKLOADS:
            a, b = t[name]["tokens_per_s"], v[name]["tokens_per_s"]
            print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
        print(f"| engine start-up (s) | {t['start_s']:.1f} | {v['start_s']:.1f} | |")
        print(f"| weight sync (s) | {t['sync_s']:.2f} | {v['sync_s']:.2f} | |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
