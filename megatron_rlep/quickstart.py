"""The built-in model answers a few built-in task questions; each question's answers are
printed with their verdicts as soon as they are sampled, then the pass rate.

    python -m megatron_rlep.quickstart [experiment=quickstart] [samples=4] [questions=6]

Without an ``experiment`` the ``quickstart`` preset applies (short answers, the transformers
engine): the first answers print within seconds of the model loading.
"""

from __future__ import annotations

import sys
import time

from megatron_rlep import tasks
from megatron_rlep.cli import hydra_entry
from megatron_rlep.config import Config
from megatron_rlep.data import load_examples, problem_of
from megatron_rlep.rollout import TransformersEngine, encode_prompt
from megatron_rlep.reward.scorer import Item, Scorer


def run(cfg: Config) -> float:
    examples = load_examples(cfg.data.eval[0], split="test", data_dir=cfg.data.data_dir,
                             **tasks.loader_kwargs(cfg.data.eval[0], cfg.data.levels,
                                                   cfg.questions, cfg.seed))[: cfg.questions]
    engine = TransformersEngine(cfg.model.path, batch_size=cfg.rollout.batch_size)
    verifier = Scorer(cfg.verifier, sandbox=cfg.sandbox)
    start = time.time()
    correct = total = 0
    for index, example in enumerate(examples):
        print(f"\n=== {example.id} [{example.data_source}] {problem_of(example.question)}"
              f"  (ground truth {example.ground_truth})", flush=True)
        group = engine.generate([encode_prompt(engine.tokenizer, example.prompt)], n=cfg.samples,
                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                max_tokens=cfg.rollout.max_response_length,
                                seed=cfg.seed * 1009 + index)[0]
        for completion in group:
            score = verifier.score([Item(example.data_source, completion.text,
                                         example.ground_truth, example.extra_info)])[0]
            correct += score.correct
            total += 1
            verdict = "CORRECT" if score.correct else "wrong  "
            answer = " ".join(completion.text.split())[-100:]
            print(f"  {verdict} pred={score.pred!s:<8} | {answer}", flush=True)
    rate = correct / max(total, 1)
    print(f"\npass rate: {correct}/{total} = {rate:.1%} "
          f"({cfg.verifier.mode} rule, {time.time() - start:.0f}s generating)")
    verifier.close()
    return rate


if __name__ == "__main__":
    if not any(a.lstrip("+").startswith("experiment=") for a in sys.argv[1:]):
        sys.argv.insert(1, "experiment=quickstart")  # short answers unless asked otherwise
    hydra_entry(run)
