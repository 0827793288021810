"""A rollout with a Python tool, its calls run at once against one after another.

    python benchmarks/tool_calls.py [--model smollm2-135m] [--engine auto] [--questions 16] \
        [--samples 4] [--max-tokens 64] [--workers 8] [--repeats 3]

The built-in calculator task's prompts (megatron_rlep/tasks/calculator.py), ``--samples``
multi-turn answers each (rollout/tools.py), sampled with the same seeds each time, so both ways
draw the same answers and make the same calls (checked): ``--workers`` threads running a turn's
calls at once, then one thread running them one after another, in turn, ``--repeats`` times.
The update of a training step is the same either way; the rollout is what differs. Prints one
JSON object: for each way the rollout's seconds and the seconds in tools (median, min, max), the
calls made, and the ratios serial / parallel of both medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.rollout import encode_prompt, engine_kind
    from megatron_rlep.rollout.tools import ToolEngine, Toolbox
    from megatron_rlep.tasks import calculator

    path, kind = resolve_model_path(args.model), engine_kind(args.engine)
    if kind == "vllm":
        from megatron_rlep.rollout.vllm_engine import VllmEngine
        engine = VllmEngine(path, max_model_len=1024, dtype="float32")
    else:
        from megatron_rlep.rollout import TransformersEngine
        engine = TransformersEngine(path)
    questions = calculator.examples("train", (1, 2, 3, 4), args.questions, seed=0)
    prompts = [encode_prompt(engine.tokenizer, q.prompt) for q in questions]
    ways = {"parallel": args.workers, "serial": 1}
    times = {way: {"rollout_s": [], "tools_s": []} for way in ways}
    answers = {}
    for _ in range(args.repeats):
        for way, workers in ways.items():
            tools = Toolbox(["python"], workers=workers)
            start = time.perf_counter()
            out = ToolEngine(engine, tools, max_turns=2).generate(
                prompts, args.samples, temperature=1.0, max_tokens=args.max_tokens, seed=1)
            times[way]["rollout_s"].append(time.perf_counter() - start)
            times[way]["tools_s"].append(tools.seconds)
            answers.setdefault(way, [c.token_ids for group in out for c in group])
            calls = sum(len(c.calls) for group in out for c in group)
    assert answers["parallel"] == answers["serial"], "the two ways sampled different answers"
    report = {"engine": kind, "cpus": os.cpu_count(), "answers": len(answers["serial"]),
              "calls": calls, "workers": args.workers, "repeats": args.repeats}
    for way in ways:
        for key, values in times[way].items():
            report[f"{way}_{key}"] = {"median": statistics.median(values), "min": min(values),
                                      "max": max(values)}
    for key in ("rollout_s", "tools_s"):
        report[f"{key}_serial_over_parallel"] = report[f"serial_{key}"]["median"] / \
            max(report[f"parallel_{key}"]["median"], 1e-9)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
