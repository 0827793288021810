"""Pass rate of the built-in model on each level of the built-in task (test split).

    python benchmarks/arithmetic_levels.py [--questions 32] [--samples 4] [--max-tokens 64] \
        [--engine auto|vllm|transformers]

Samples at temperature 1.0, top-p 1.0 with the rollout engine (``auto``: vLLM where it imports),
scores with the DAPO rule, prints a Markdown table (level, pass rate, standard error, seconds)
and writes it as JSON.
"""

import argparse
import json
import math
import re
import time

import torch

from megatron_rlep import arithmetic
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.config import RolloutConfig
from megatron_rlep.rollout import encode_prompt, make_engine
from megatron_rlep.verifier import Verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", type=int, nargs="*", default=sorted(arithmetic.LEVELS))
    parser.add_argument("--json", default="arithmetic_levels.json")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"])
    args = parser.parse_args()
    engine = make_engine(RolloutConfig(engine=args.engine), resolve_model_path("smollm2-135m"),
                         torch.float32, seed=0, max_model_len=512)
    verifier = Verifier("dapo")
    rows = []
    print("| level | example | pass rate | std. error | samples | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for level in args.levels:
        examples = arithmetic.examples("test", levels=[level], n=args.questions, seed=0)
        start = time.time()
        prompts = [encode_prompt(engine.tokenizer, e.prompt) for e in examples]
        groups = engine.generate(prompts, n=args.samples, temperature=1.0,
                                 top_p=1.0, max_tokens=args.max_tokens, seed=level)
        verdicts = [verifier.score(c.text, e.ground_truth).correct
                    for e, group in zip(examples, groups) for c in group]
        rate = sum(verdicts) / len(verdicts)
        stderr = math.sqrt(rate * (1 - rate) / len(verdicts))
        seconds = time.time() - start
        problem = re.search(r"\$(.+?)\$", examples[0].question).group(1)
        rows.append(dict(level=level, example=problem, pass_rate=rate, stderr=stderr,
                         samples=len(verdicts), seconds=seconds))
        print(f"| {level} | ${problem}$ | {rate:.1%} | {stderr:.1%} | {len(verdicts)} | "
              f"{seconds:.0f} |", flush=True)
    with open(args.json, "w") as f:
        json.dump(dict(args=vars(args), levels=rows), f, indent=2)


if __name__ == "__main__":
    main()
