"""Where the demo's RL step spends its time: torch's profiler over one actor update and one vLLM
rollout of the job `benchmarks/peer_trl.py` times, split into matrix products and the rest.

    python benchmarks/step_profile.py [--dtype float32] [--repeats 3] [--top 8] [--json FILE]
        [--model smollm2-135m]

- `update`: one Megatron-Core update of a mini-batch of the demo (12 answers of 24 tokens in
  groups of 6 sharing a 76-token prompt, `parallel.share_prompts`, micro-batches of 8);
- `old log-probs`: the forward pass over the same mini-batch that the step's second update needs;
- `rollout`: one vLLM generation of the demo's step, 4 prompts x 6 answers of up to 32 tokens at
  temperature 1 (vLLM's CPU build; left out where it does not import).
For each: the median wall seconds over ``--repeats`` (after one warm-up), then one profiled run:
the share of its CPU time in matrix products (``is_matmul``: by what an operator is, on any
CPU's kernels) and the ``--top``
other operators. Matrix products at this CPU's peak are the floor no change to the rest can
pass; the rest is what overhead work there is to remove. Prints JSON (and writes it to ``--json``).
``--model`` takes another model's directory (tests/test_step_profile.py runs it on a tiny one).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# a matrix product by what it is, whichever library this CPU's build dispatches it to: aten's mm,
# addmm, bmm, baddbmm, matmul and linear, oneDNN's and MKL's kernels (mkldnn::_linear_pointwise,
# _C::onednn_mm, mkl_linear, mkldnn_matmul), a GEMM
MATMUL = re.compile(r"(^|[:_])(mm|addmm|addmm_activation|bmm|baddbmm|matmul|linear|"
                    r"linear_pointwise|onednn_mm|mkldnn_matmul|mkl_linear|gemm)$", re.I)


def is_matmul(key: str) -> bool:
    """Whether the profiler's operator ``key`` is a matrix product."""
    return bool(MATMUL.search(key))


def timed(run, repeats: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    run()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops) or 1
    matmul = sum(e.self_cpu_time_total for e in ops if is_matmul(e.key))
    return {"median_s": statistics.median(seconds), "matmul_share": matmul / total,
            "other_ops": {e.key: round(e.self_cpu_time_total / total, 4)
                          for e in [e for e in ops if not is_matmul(e.key)][:top]}}


def rollout_run(dtype: str, model: str = "smollm2-135m"):
    """One demo rollout on vLLM, or None where vLLM does not import."""
    from megatron_rlep.rollout import vllm_unavailable

    if vllm_unavailable():
        return None
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.data import load_examples
    from megatron_rlep.rollout.base import encode_prompt
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(resolve_model_path(model), dtype=dtype, max_model_len=512)
    prompts = [encode_prompt(engine.tokenizer, e.prompt, 256) for e in
               load_examples("arithmetic", "train", levels=[3, 4, 6], n=4, seed=1)]
    return lambda: engine.generate(prompts, n=6, max_tokens=32, seed=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--model", default="smollm2-135m",
                        help="the built-in model's name or a Hugging Face model directory")
    args = parser.parse_args()

    from actor_step import make_batch

    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.config import AlgorithmConfig

    actor = Actor(args.model, AlgorithmConfig(lr=1e-6, warmup_steps=0), 1, 1,
                  micro_batch_size=8, share_prompts=True, dtype=args.dtype)
    batch = make_batch(12, 76, 24, actor.hf_config.vocab_size, group=6)
    batch.old_logp, _ = actor.logprobs(batch)
    result = {"dtype": args.dtype, "threads": torch.get_num_threads(),
              "update": timed(lambda: actor.train_step(batch), args.repeats, args.top),
              "old log-probs": timed(lambda: actor.logprobs(batch), args.repeats, args.top)}
    rollout = rollout_run(args.dtype, args.model)
    if rollout is not None:
        result["rollout"] = timed(rollout, args.repeats, args.top)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
