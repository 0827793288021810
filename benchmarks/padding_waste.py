"""Padding and micro-batch size of the actor's grouping on realistic lengths, per strategy.

    python benchmarks/padding_waste.py --data-dir DIR [--updates 200] [--per-rank 32] [--seed 1]

``DIR`` holds ``dapo/*.parquet`` (DAPO-format prompts), ``eval/math500.jsonl`` (the shipped
``data/eval/math500.jsonl``) and ``train/gsm8k_train.jsonl`` (GSM8K's training answers).

Sequences are a DAPO-format prompt (from dapo/*.parquet, with its chat template) followed by a
written solution as the answer (MATH-500's solutions and GSM8K's train answers, two
distributions), tokenized with the built-in model's tokenizer. Each update gives one rank
``--per-rank`` sequences drawn at random (the paper's preset: 64 prompts x 16 answers over 32
data-parallel ranks = 32 per rank), grouped by ``megatron_rlep.actor.batch.micro_batches``
(longest first, as the actor does) or in arrival order (what a trainer without sorting does),
padded to each micro-batch's longest sequence or packed end to end (``parallel.pack_sequences``).
Prints, per strategy: padded tokens as a share of real tokens, micro-batches per update and
the largest micro-batch in tokens (what sets activation memory), over all updates.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from megatron_rlep.actor.batch import micro_batches
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.data import load_examples
from megatron_rlep.rollout import encode_prompt

STRATEGIES = {  # name: (sorted, sequences per micro-batch, token budget, packed)
    "4 per micro-batch, arrival order": (False, 4, 0, False),
    "4 per micro-batch, longest first": (True, 4, 0, False),
    "4 and token budget 8192, longest first (the paper presets)": (True, 4, 8192, False),
    "token budget 8192, longest first": (True, 10**6, 8192, False),
    "token budget 16384, longest first": (True, 10**6, 16384, False),
    "packed, token budget 8192": (True, 10**6, 8192, True),
    "packed, token budget 16384": (True, 10**6, 16384, True),
}


def arrival_order(lengths: list[int], size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]


def measure(lengths: list[int], is_sorted: bool, size: int, budget: int,
            packed: bool) -> tuple[int, int, int]:
    """(padded tokens, micro-batches, largest micro-batch in tokens) of one update."""
    groups = micro_batches(list(range(len(lengths))), lengths, size, budget, packed) \
        if is_sorted else arrival_order(lengths, size)
    tokens = [sum(lengths[i] for i in g) if packed else len(g) * max(lengths[i] for i in g)
              for g in groups]
    return sum(tokens) - sum(lengths), len(groups), max(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--per-rank", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", required=True, help="see above")
    parser.add_argument("--json", help="write the table here too")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    data = Path(args.data_dir)
    prompts = [len(encode_prompt(tokenizer, e.prompt)) for parquet in sorted((data / "dapo").glob("*.parquet"))
               for e in load_examples(str(parquet), "train")]
    answers = {
        "MATH-500 solutions": [json.loads(line)["solution"] for line in
                               (data / "eval" / "math500.jsonl").read_text().splitlines()],
        "GSM8K train answers": [json.loads(line)["answer"] for line in
                                (data / "train" / "gsm8k_train.jsonl").read_text().splitlines()],
    }
    rows = []
    for source, texts in answers.items():
        answer_lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        rng = random.Random(args.seed)
        updates = [[rng.choice(prompts) + rng.choice(answer_lengths) for _ in range(args.per_rank)]
                   for _ in range(args.updates)]
        real = sum(map(sum, updates))
        mean = real / (args.updates * args.per_rank)
        for name, (is_sorted, size, budget, packed) in STRATEGIES.items():
            results = [measure(u, is_sorted, size, budget, packed) for u in updates]
            rows.append({"answers": source, "mean_sequence_tokens": round(mean, 1),
                         "strategy": name,
                         "padding_share": sum(r[0] for r in results) / real,
                         "micro_batches_per_update": sum(r[1] for r in results) / len(results),
                         "largest_micro_batch_tokens": max(r[2] for r in results)})
    print(f"{args.updates} updates x {args.per_rank} sequences per rank, prompts from "
          f"{len(prompts)} DAPO-format questions, seed {args.seed}\n")
    print("| answers | mean tokens | grouping | padding / real tokens | micro-batches per update | "
          "largest micro-batch (tokens) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['answers']} | {r['mean_sequence_tokens']} | {r['strategy']} | "
              f"{r['padding_share']:.1%} | {r['micro_batches_per_update']:.1f} | "
              f"{r['largest_micro_batch_tokens']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
