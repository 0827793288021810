"""Pass rate of the built-in model on each level of a built-in task (test split).

    python studies/task_levels.py [--task arithmetic|calculator|chain|code|logic] \
        [--questions 32] [--samples 4] [--max-tokens 64] [--engine auto|vllm|transformers] \
        [--json FILE] [--tool-format fence|chat|none] [--max-turns 2]

Samples at temperature 1.0, top-p 1.0 with the rollout engine (``auto``: vLLM where it imports),
scores with the task's own rule (``megatron_rlep/tasks/<task>.py``: the DAPO rule, the code
checker in the sandbox, the logic checker through the plug-in path), prints a Markdown table
(level, an example, pass rate, standard error, tool calls per answer, the share of calls that
failed, the answers right after a failed call of those with one, seconds) and writes it as
JSON. A task whose prompt shows a tool call (``calculator``, ``chain``) runs with the
``python`` tool, up to ``--max-turns`` calls an answer, in ``--tool-format`` (``chat``: with the
project's Hermes template; ``none``: the fenced prompt and no tool, so what the model writes as
output is its own).
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
from megatron_rlep.rollout import engine_prompt, make_engine


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="arithmetic", choices=tasks.BUILTIN)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", type=int, nargs="*", default=None)
    parser.add_argument("--json", default=None, help="default: <task>_levels.json")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"])
    parser.add_argument("--tool-format", default="fence", choices=["fence", "chat", "none"])
    parser.add_argument("--max-turns", type=int, default=2)
    args = parser.parse_args()
    task = tasks.module(args.task)
    shows = getattr(task, "SHOWS_TOOL_CALL", False)
    tools = shows and args.tool_format != "none"
    rollout = RolloutConfig(engine=args.engine, **(dict(
        tools=["python"], max_turns=args.max_turns, tool_format=args.tool_format,
        chat_template="hermes" if args.tool_format == "chat" else None) if tools else {}))
    engine = make_engine(rollout, resolve_model_path("smollm2-135m"), torch.float32, seed=0,
                         max_model_len=1024)
    extra = {"tool_format": "chat" if args.tool_format == "chat" else "fence"} if shows else {}
    scorer = Scorer(settings(**task.VERIFIER) if hasattr(task, "VERIFIER") else settings("dapo"))
    rows = []
    print(f"task {args.task}: {scorer.describe()}")
    print("| level | example | pass rate | std. error | samples | calls per answer | calls "
          "failed | right after a failed call | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for level in args.levels or sorted(task.LEVELS):
        examples = task.examples("test", levels=[level], n=args.questions, seed=0, **extra)
        start = time.time()
        prompts = [engine_prompt(engine, e.prompt) for e in examples]
        groups = engine.generate(prompts, n=args.samples, temperature=1.0,
                                 top_p=1.0, max_tokens=args.max_tokens, seed=level)
        scores = scorer.score([Item(e.data_source, c.text, e.ground_truth, e.extra_info)
                               for e, group in zip(examples, groups) for c in group])
        verdicts = [s.correct for s in scores]
        rate = sum(verdicts) / len(verdicts)
        stderr = math.sqrt(rate * (1 - rate) / len(verdicts))
        answers = [c for group in groups for c in group]
        n_calls = sum(len(c.calls) for c in answers)
        calls = n_calls / len(verdicts)
        failed_share = sum(s != "ok" for c in answers for s in c.calls) / max(1, n_calls)
        # answers with a failed call, and how many of them end right all the same
        hit = [v for c, v in zip(answers, verdicts) if any(s != "ok" for s in c.calls)]
        seconds = time.time() - start
        problem = examples[0].question.replace("$", "").replace("|", "/")
        rows.append(dict(level=level, example=problem, pass_rate=rate, stderr=stderr,
                         samples=len(verdicts), calls_per_answer=calls, seconds=seconds,
                         failures=sum(s.status != "ok" for s in scores),
                         failed_call_share=failed_share,
                         answers_with_failed_call=len(hit), recovered=sum(hit)))
        print(f"| {level} | {problem} | {rate:.1%} | {stderr:.1%} | {len(verdicts)} | "
              f"{calls:.2f} | {failed_share:.0%} | "
              f"{sum(hit)}/{len(hit)} | {seconds:.0f} |", flush=True)
    scorer.close()
    with open(args.json or f"{args.task}_levels.json", "w") as f:
        json.dump(dict(args=vars(args), levels=rows), f, indent=2)


if __name__ == "__main__":
    main()
