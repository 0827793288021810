"""Pass rate of the built-in model on each level of a built-in task (test split).

    python studies/task_levels.py [--task arithmetic|code|logic] [--questions 32] \
        [--samples 4] [--max-tokens 64] [--engine auto|vllm|transformers] [--json FILE]

Samples at temperature 1.0, top-p 1.0 with the rollout engine (``auto``: vLLM where it imports),
scores with the task's own rule (``megatron_rlep/tasks/<task>.py``: the DAPO rule, the code
checker in the sandbox, the logic checker through the plug-in path), prints a Markdown table
(level, an example, pass rate, standard error, seconds) and writes it as JSON.
"""

import argparse
import json
import math
import time

import torch

from megatron_rlep import tasks
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.config import RolloutConfig
from megatron_rlep.reward.scorer import Item, Scorer, settings
from megatron_rlep.rollout import encode_prompt, make_engine


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="arithmetic", choices=tasks.BUILTIN)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", type=int, nargs="*", default=None)
    parser.add_argument("--json", default=None, help="default: <task>_levels.json")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"])
    args = parser.parse_args()
    task = tasks.module(args.task)
    engine = make_engine(RolloutConfig(engine=args.engine), resolve_model_path("smollm2-135m"),
                         torch.float32, seed=0, max_model_len=768)
    scorer = Scorer(settings(**task.VERIFIER) if hasattr(task, "VERIFIER") else settings("dapo"))
    rows = []
    print(f"task {args.task}: {scorer.describe()}")
    print("| level | example | pass rate | std. error | samples | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for level in args.levels or sorted(task.LEVELS):
        examples = task.examples("test", levels=[level], n=args.questions, seed=0)
        start = time.time()
        prompts = [encode_prompt(engine.tokenizer, e.prompt) for e in examples]
        groups = engine.generate(prompts, n=args.samples, temperature=1.0,
                                 top_p=1.0, max_tokens=args.max_tokens, seed=level)
        scores = scorer.score([Item(e.data_source, c.text, e.ground_truth, e.extra_info)
                               for e, group in zip(examples, groups) for c in group])
        verdicts = [s.correct for s in scores]
        rate = sum(verdicts) / len(verdicts)
        stderr = math.sqrt(rate * (1 - rate) / len(verdicts))
        seconds = time.time() - start
        problem = examples[0].question.replace("$", "").replace("|", "/")
        rows.append(dict(level=level, example=problem, pass_rate=rate, stderr=stderr,
                         samples=len(verdicts), seconds=seconds,
                         failures=sum(s.status != "ok" for s in scores)))
        print(f"| {level} | {problem} | {rate:.1%} | {stderr:.1%} | {len(verdicts)} | "
              f"{seconds:.0f} |", flush=True)
    scorer.close()
    with open(args.json or f"{args.task}_levels.json", "w") as f:
        json.dump(dict(args=vars(args), levels=rows), f, indent=2)


if __name__ == "__main__":
    main()
