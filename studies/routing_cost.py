"""What MoE routing replay (actor.routing_replay=actor) costs the actor on this machine: the
time of a step's passes with and without it, and the bytes of routes it keeps.

    python studies/routing_cost.py [--pairs 8] [--sequences 16] [--length 256] [--json FILE]

A random Qwen3-MoE (hidden 256, 4 layers, 16 experts, 4 a token, vocab 4096) in one process.
One step: the old-log-prob pass over a batch, then two updates on it (as two epochs do), the
passes after the first replaying its routes. The arms alternate on the same actor (ABBA order,
so drift in the machine falls on both): without replay the routers carry no hook, as in a run
with actor.routing_replay=none. Prints the per-pair time ratio (replay / none) with a 95%
t-interval, and the routes kept against tokens x layers x top-k bytes.
"""

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megatron_rlep.actor import routing  # noqa: E402
from megatron_rlep.actor.batch import SequenceBatch  # noqa: E402
from megatron_rlep.config import AlgorithmConfig  # noqa: E402

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 15: 2.13, 19: 2.09}


def make_model(path: Path) -> None:
    import transformers as tf

    config = tf.Qwen3MoeConfig(vocab_size=4096, hidden_size=256, intermediate_size=512,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=64, moe_intermediate_size=256, num_experts=16,
                               num_experts_per_tok=4, norm_topk_prob=True,
                               max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)


def step(actor, batch, replay: bool) -> float:
    """Seconds of an old-log-prob pass and two updates, replaying routes or not."""
    key = "step" if replay else None
    start = time.perf_counter()
    batch.old_logp = actor.logprobs(batch, routes=key)[0]
    for _ in range(2):
        actor.train_step(batch, routes=key)
    actor.forget_routes()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args()
    from megatron_rlep.actor.actor import Actor

    folder = tempfile.TemporaryDirectory()
    model = Path(folder.name) / "moe"
    make_model(model)
    actor = Actor(str(model), AlgorithmConfig(lr=1e-6, warmup_steps=0), micro_batch_size=4,
                  routing_replay="actor")
    hooks = actor.routes
    routers = [layer.mlp.router for layer in actor.module.decoder.layers]
    g = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 4096, (args.length,), generator=g).tolist()
              for _ in range(args.sequences)]
    batch = SequenceBatch(tokens, [args.length // 4] * args.sequences,
                          advantages=torch.randn(args.sequences, generator=g))

    def arm(replay: bool) -> float:
        actor.routes = hooks if replay else {}
        for layer, router in enumerate(routers):
            router.router_replay = hooks[layer] if replay else None
        return step(actor, batch, replay)

    arm(True), arm(False)  # warm-up
    times = {True: [], False: []}
    for pair in range(args.pairs):
        for replay in ((True, False) if pair % 2 == 0 else (False, True)):
            times[replay].append(arm(replay))
    ratios = [a / b for a, b in zip(times[True], times[False])]
    mean = statistics.mean(ratios)
    half = T95.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    actor.routes = hooks
    for layer, router in enumerate(routers):
        router.router_replay = hooks[layer]
    actor.logprobs(batch, routes="size")
    kept = sum(t.numel() * t.element_size() for micro in actor._kept["size"] for t in micro.values())
    c = actor.hf_config
    padded = sum(len(t) for t in tokens)
    result = {
        "sequences": args.sequences, "length": args.length, "pairs": args.pairs,
        "threads": torch.get_num_threads(),
        "seconds_none": statistics.median(times[False]),
        "seconds_replay": statistics.median(times[True]),
        "ratio_mean": mean, "ratio_low": mean - half, "ratio_high": mean + half,
        "kept_bytes": kept,
        "bytes_per_token": kept / padded,
        "layers_x_topk": c.num_hidden_layers * c.num_experts_per_tok,
        "route_dtype": str(routing.route_dtype(c.num_experts)),
    }
    print(f"{args.sequences} sequences of {args.length} tokens, {args.pairs} pairs: a step "
          f"(old-log-prob pass and two updates) {result['seconds_none']:.2f} s without replay, "
          f"{result['seconds_replay']:.2f} s with it; ratio {mean:.3f} "
          f"[{mean - half:.3f}, {mean + half:.3f}] (95% t-interval over pairs)")
    print(f"routes kept: {kept:,} bytes, {kept / padded:.0f} a token "
          f"({c.num_hidden_layers} layers x top-{c.num_experts_per_tok}, "
          f"{result['route_dtype']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    folder.cleanup()


if __name__ == "__main__":
    main()
