"""What MoE routing replay R3 (actor.routing_replay=rollout) does to the gap between a rollout
engine in lower precision and the update: the engine samples in bfloat16, the actor scores the
same answers in float32, twice on one actor: routed by the engine's experts (R3) and by its own
routers (none). The two arms differ in the routes alone.

    python studies/routing_precision.py [--seeds 5] [--first 1] [--sequences 16] [--prompt 64]
                                        [--response 128] [--json FILE]

The random Qwen3-MoE of studies/routing_cost.py (4 layers, 16 experts, 4 a token) with
SmolLM2's tokenizer, on the transformers engine (top-p 1, temperature 1, so the engine's
log-probs are the actor's quantity). Per seed: random prompts, one answer each. Per arm, over
the response tokens: the trainer's mismatch metrics (``loss.rollout_mismatch``: mean and max
|log p_actor - log p_engine|, the k3 KL); the share of tokens whose ratio p_actor / p_engine
lies outside the clip band [1 - clip_low, 1 + clip_high] (0.8, 1.28), and beyond 1% of 1 (a
finer band); the share whose experts in the pass (the actor's record,
``Actor.sequence_routes``) were the engine's. A token counts as on its experts where every
layer's experts at the position that predicts it are the engine's (as sets). Prints each seed
and the R3 / none ratio of each figure with a 95% t-interval over seeds.
"""

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_cost import T95, make_model  # noqa: E402

from megatron_rlep.actor.batch import SequenceBatch  # noqa: E402
from megatron_rlep.config import AlgorithmConfig  # noqa: E402
from megatron_rlep.loss import rollout_mismatch  # noqa: E402


def with_tokenizer(path: Path) -> None:
    """SmolLM2's tokenizer beside the random model (its ids below 4,096 are the model's)."""
    from megatron_rlep.builtin_model import resolve_model_path

    source = Path(resolve_model_path("smollm2-135m"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, path / name)


def arm(engine_logp: list, actor_logp: list, clip_low: float, clip_high: float) -> dict:
    out = {k.split("/")[1]: v for k, v in rollout_mismatch(engine_logp, actor_logp).items()}
    d = torch.cat([a.float() - torch.tensor(b) for b, a in zip(engine_logp, actor_logp)])
    ratio = d.exp()
    out["outside_clip"] = float(((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean())
    out["beyond_1pct"] = float(((ratio - 1).abs() > 0.01).float().mean())  # a finer band
    return out


def flipped(engine_routes: list, own_routes: list, prompt: int) -> torch.Tensor:
    """Per response token (all sequences, in order): whether the actor's own experts at the
    position predicting it differ from the engine's in some layer."""
    out = []
    for given, own in zip(engine_routes, own_routes):
        rows = slice(prompt - 1, len(given) - 1)
        same = (given[rows].long().sort(-1).values == own[rows].long().sort(-1).values)
        out.append(~same.all(-1).all(-1))
    return torch.cat(out)


def one_seed(engine, actor, seed: int, args, clip) -> dict:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 4096, (args.prompt,), generator=g).tolist()
               for _ in range(args.sequences)]
    completions = [c for (c,) in engine.generate(prompts, 1, temperature=1.0, top_p=1.0,
                                                 max_tokens=args.response, seed=seed)]
    tokens = [p + list(c.token_ids) for p, c in zip(prompts, completions)]
    lengths = [args.prompt] * len(tokens)
    behaviour = [list(c.logprobs) for c in completions]
    given = SequenceBatch(tokens, lengths, advantages=torch.zeros(len(tokens)),
                          routes=[c.routes for c in completions])
    r3 = actor.logprobs(given, routes="r3")[0]
    used = actor.sequence_routes(given, "r3")  # the experts the R3 pass sent each token to
    counts = actor.forget_routes()
    own = SequenceBatch(tokens, lengths, advantages=torch.zeros(len(tokens)))
    none = actor.logprobs(own, routes="own")[0]  # no routes given: each router's own choice
    own_routes = actor.sequence_routes(own, "own")
    actor.forget_routes()
    flips = flipped([c.routes for c in completions], own_routes, args.prompt)
    replayed = flipped([c.routes for c in completions], used, args.prompt)
    d_none = torch.cat([a - torch.tensor(b) for b, a in zip(behaviour, none)]).abs()
    d_r3 = torch.cat([a - torch.tensor(b) for b, a in zip(behaviour, r3)]).abs()
    given_tokens = counts[:, 0].sum()
    return {"seed": seed, "response_tokens": int(len(flips)),
            "layer_agreement": float(counts[:, 1].sum() / given_tokens),
            "flipped_share": float(flips.float().mean()),
            # the share of response tokens whose experts in the pass were the engine's, each arm
            "engines_experts": {"none": 1 - float(flips.float().mean()),
                                "r3": 1 - float(replayed.float().mean())},
            "none": arm(behaviour, none, *clip), "r3": arm(behaviour, r3, *clip),
            "diff_on_flipped": {"none": float(d_none[flips].mean()) if flips.any() else None,
                                "r3": float(d_r3[flips].mean()) if flips.any() else None},
            "diff_on_rest": {"none": float(d_none[~flips].mean()),
                             "r3": float(d_r3[~flips].mean())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args()
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.rollout.transformers_engine import TransformersEngine

    folder = tempfile.TemporaryDirectory()
    model = Path(folder.name) / "moe"
    make_model(model)
    with_tokenizer(model)
    algorithm = AlgorithmConfig(lr=1e-6, warmup_steps=0)
    clip = (algorithm.clip_low, algorithm.clip_high)
    engine = TransformersEngine(str(model), dtype=torch.bfloat16, batch_size=args.sequences,
                                routes=True)
    actor = Actor(str(model), algorithm, micro_batch_size=4, routing_replay="rollout")
    seeds = [one_seed(engine, actor, seed, args, clip)
             for seed in range(args.first, args.first + args.seeds)]
    for s in seeds:
        print(f"seed {s['seed']}: {s['response_tokens']} tokens, {s['flipped_share']:.1%} "
              f"flipped (layer agreement {s['layer_agreement']:.1%}); on the engine's experts "
              f"none {s['engines_experts']['none']:.1%}, R3 {s['engines_experts']['r3']:.1%}; "
              f"mean |d| none "
              f"{s['none']['logp_diff_mean']:.4f}, R3 {s['r3']['logp_diff_mean']:.4f}; outside "
              f"the clip none {s['none']['outside_clip']:.2%}, R3 {s['r3']['outside_clip']:.2%}; "
              f"on flipped tokens none {s['diff_on_flipped']['none']:.3f}, "
              f"R3 {s['diff_on_flipped']['r3']:.3f}", flush=True)
    summary = {}
    for key in ("logp_diff_mean", "logp_diff_max", "kl_k3", "outside_clip", "beyond_1pct"):
        ratios = [s["r3"][key] / s["none"][key] for s in seeds if s["none"][key] > 0]
        if not ratios:  # none of the arm's tokens: no ratio
            summary[key] = {"none": 0.0, "r3": statistics.mean(s["r3"][key] for s in seeds)}
            print(f"{key}: none 0 in every seed, R3 {summary[key]['r3']:.4g}")
            continue
        mean = statistics.mean(ratios)
        half = T95.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / math.sqrt(len(ratios)) \
            if len(ratios) > 1 else float("nan")
        summary[key] = {"none": statistics.mean(s["none"][key] for s in seeds),
                        "r3": statistics.mean(s["r3"][key] for s in seeds),
                        "ratio_mean": mean, "ratio_low": mean - half, "ratio_high": mean + half,
                        "seeds_counted": len(ratios)}
        print(f"{key}: none {summary[key]['none']:.4g}, R3 {summary[key]['r3']:.4g}; R3 / none "
              f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] (95% t-interval over "
              f"{len(ratios)} seeds)")
    result = {"first_seed": args.first, "sequences": args.sequences, "prompt": args.prompt,
              "response": args.response,
              "engine_dtype": "bfloat16", "actor_dtype": "float32", "clip": list(clip),
              "threads": torch.get_num_threads(), "seeds": seeds, "summary": summary}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    folder.cleanup()


if __name__ == "__main__":
    main()
