"""One training step of the Megatron-Core actor against a plain transformers + torch step.

Both steps do the same work on the same batch of SmolLM2-135M (the built-in model): forward,
response-token log-probs at the sampling temperature, entropy (for the metrics), the clipped
token-mean GRPO loss, backward, gradient clipping and an Adam step. The two alternate so drift
of the machine hits both alike; the result is the ratio of their token throughputs.

    python benchmarks/actor_step.py [--sequences 8 --prompt 64 --response 192 --repeats 3]
        [--model smollm2-135m] [--peak-size 4096]

With ``--compile`` it times the Megatron-Core step twice instead: with ``torch.compile`` on
(Megatron-Core's ``jit_fuser`` compiles its fused functions) and off (what the CPU shims do),
and reports the first, compiling, step of each too. With ``--short-prompt N`` it times the
Megatron-Core step on the batch against the same batch with N-token prompts (the answers
unchanged): what a shorter prompt saves per update. With ``--share-prompts G`` the batch is
groups of G sequences repeating one prompt (GRPO's groups), and it times the Megatron-Core step
with ``parallel.share_prompts`` (each prompt computed once per micro-batch row) against without.
Every run also counts the Megatron-Core step's floating-point work (``step_flops``: what it
computes, so a shared prompt counts once per micro-batch row) and divides its rate by this
CPU's measured peak (``peak_flops``: the best of five 4096 x 4096 fp32 matrix products on the
same threads, by MKL or oneDNN; ``--peak-size`` sets the size). ``--model`` takes another
model's directory (tests/test_benchmarks.py runs it on a tiny one).

With ``--fused-adam`` it times the Megatron-Core step with torch's fused CPU Adam kernel
(platform.fused_cpu_adam) against torch's default CPU Adam, and reports the largest difference of
the weights the two give from the same start. With ``--wgrad-fusion`` it times the step with the
linear layers' weight gradients added into the gradient buffer by the GEMM (gradient
accumulation fusion, platform shim 11, the CPU default) against without (a gradient tensor,
added by DDP's hook). With ``--swiglu`` it times the step with the CPU's two-pass SwiGLU backward
(platform shim 12, the CPU default) against Megatron-Core's own. With ``--onednn`` it times the
step with the linear layers' products by oneDNN (platform shim 13, on by default on a CPU not
Intel's) against Megatron-Core's own function (MKL), and reports the largest difference of the
weights the two give from the same start. With ``--chunk C`` it times the step with the response
rows through the output layer and the softmax C at a time (``parallel.logprob_chunk_tokens``,
each chunk recomputed in backward) against all at once.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch


def make_batch(sequences: int, prompt: int, response: int, vocab: int, seed: int = 0,
               group: int = 1):
    """Random tokens; each run of ``group`` sequences repeats one prompt."""
    from megatron_rlep.actor.batch import SequenceBatch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (sequences, prompt + response), generator=g)
    tokens[:, :prompt] = tokens[::group, :prompt].repeat_interleave(group, 0)[:sequences]
    batch = SequenceBatch(tokens.tolist(), [prompt] * sequences)
    batch.advantages = torch.randn(sequences, generator=g)
    return batch


def plain_step(model, optimizer, batch, algorithm):
    """What a transformers user writes: the same loss, torch's own clipping and AdamW."""
    from megatron_rlep import loss as objective

    tokens = torch.tensor(batch.tokens)
    p = batch.prompt_lengths[0]
    logits = model(tokens).logits[:, p - 1:-1].float()
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, tokens[:, p:, None])[..., 0]
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    old = torch.stack(batch.old_logp)
    token_loss, _, _ = objective.policy_token_loss(logp, old, batch.advantages[:, None],
                                                   algorithm.clip_low, algorithm.clip_high,
                                                   algorithm.dual_clip)
    total, count = objective.aggregate(token_loss, torch.ones_like(logp, dtype=torch.bool))
    (total / count).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), algorithm.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(entropy.mean())


def step_flops(config, sequences: int, prompt: int, response: int, micro_batch_size: int,
               group: int) -> float:
    """FLOPs of one training step (forward and backward: 3x the forward's) of ``sequences``
    sequences in groups of ``group`` sharing a prompt (1: none shared), dealt to micro-batches
    in order. Matrix products: 2 FLOPs per parameter per token through the decoder, and through
    the output layer for response tokens only (the actor's log-probs); attention: 2 L^2 x
    hidden a layer for a causal row of L tokens. A row is a prompt and the responses of its
    group in that micro-batch."""
    h, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * h // config.num_attention_heads
    inter = config.intermediate_size
    body = layers * (2 * h * h + 2 * h * kv + 3 * h * inter)
    out = config.vocab_size * h
    forward = 0.0
    for start in range(0, sequences, micro_batch_size):
        members = range(start, min(start + micro_batch_size, sequences))
        for prompt_of in sorted({i // group for i in members}):
            answers = sum(1 for i in members if i // group == prompt_of)
            rows = [prompt + answers * response] if group > 1 else [prompt + response] * answers
            for length in rows:
                forward += 2 * body * length + 2 * layers * length * length * h
            forward += 2 * out * answers * response
    return 3 * forward


def peak_flops(repeats: int = 5, size: int = 4096) -> float:
    """The best fp32 matrix-product rate of this CPU on torch's threads (FLOP/s), by MKL
    (``torch.mm``) or oneDNN, whichever is faster here (on AMD CPUs oneDNN, platform shim 13),
    on products of two ``size`` x ``size`` matrices."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    products = [lambda: torch.mm(a, b)]
    if torch.backends.mkldnn.is_available():
        from megatron_rlep.platform import _onednn

        products.append(lambda: _onednn(a, b))
    best = math.inf
    for product in products:
        product()
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def adam(actor, batch, fused: bool):
    actor.fused_adam = fused
    return actor.train_step(batch)


def wgrad_fusion(actor, batch, on: bool):
    for module in actor.module.modules():
        if hasattr(module, "gradient_accumulation_fusion"):
            module.gradient_accumulation_fusion = on
    return actor.train_step(batch)


def swiglu(actor, batch, backward):
    from megatron.core.fusions import fused_bias_swiglu

    fused_bias_swiglu.swiglu_back = backward
    return actor.train_step(batch)


def linear_function(actor, batch, function):
    from megatron.core.tensor_parallel import layers

    layers.linear_with_grad_accumulation_and_async_allreduce = function
    return actor.train_step(batch)


def weights_after(actor, steps) -> float:
    """The largest weight difference after one step by each of the two ``steps``, both from
    the same weights and optimizer state."""
    import copy

    params = list(actor.model.parameters())
    inner = [part.optimizer for part in getattr(actor.optimizer, "chained_optimizers",
                                                [actor.optimizer])]
    start = [p.detach().clone() for p in params]
    states = [copy.deepcopy(o.state_dict()) for o in inner]
    after = []
    for _, run in steps:
        for p, s in zip(params, start):
            p.data.copy_(s)
        for o, state in zip(inner, states):
            o.load_state_dict(copy.deepcopy(state))
        run()
        after.append([p.detach().clone() for p in params])
    return max(float((a - b).abs().max()) for a, b in zip(*after))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=192)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m",
                        help="the built-in model's name or a Hugging Face model directory")
    parser.add_argument("--peak-size", type=int, default=4096,
                        help="the size of the square matrices the CPU's peak is measured on")
    parser.add_argument("--compile", action="store_true",
                        help="Megatron-Core step with torch.compile on against off")
    parser.add_argument("--short-prompt", type=int, default=None,
                        help="Megatron-Core step with --prompt tokens against this many")
    parser.add_argument("--fused-adam", action="store_true",
                        help="Megatron-Core step with torch's fused CPU Adam against its default")
    parser.add_argument("--wgrad-fusion", action="store_true",
                        help="Megatron-Core step with gradient accumulation fusion against without")
    parser.add_argument("--swiglu", action="store_true",
                        help="Megatron-Core step with the CPU's SwiGLU backward against its own")
    parser.add_argument("--onednn", action="store_true",
                        help="Megatron-Core step with the products by oneDNN against MKL")
    parser.add_argument("--share-prompts", type=int, default=None, metavar="G",
                        help="groups of G sequences share a prompt: the step with "
                             "parallel.share_prompts against without")
    parser.add_argument("--chunk", type=int, default=None, metavar="C",
                        help="the step with parallel.logprob_chunk_tokens=C against 0")
    args = parser.parse_args()

    from megatron.core.fusions import fused_bias_swiglu
    from transformers import AutoModelForCausalLM

    megatron_swiglu_back = fused_bias_swiglu.swiglu_back  # before the actor's shims replace it
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.config import AlgorithmConfig

    algorithm = AlgorithmConfig(lr=1e-6, warmup_steps=0)
    actor = Actor(args.model, algorithm, 1, 1, micro_batch_size=args.micro_batch_size,
                  share_prompts=bool(args.share_prompts))
    model = AutoModelForCausalLM.from_pretrained(actor.hf_path, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1, eps=1e-8)
    batch = make_batch(args.sequences, args.prompt, args.response, actor.hf_config.vocab_size,
                       group=args.share_prompts or 1)
    batch.old_logp, _ = actor.logprobs(batch)
    tokens = args.sequences * (args.prompt + args.response)

    def with_dynamo(disable):
        import torch._dynamo

        torch._dynamo.config.disable = disable
        return actor.train_step(batch)

    def shared(on):
        actor.share_prompts = on
        return actor.train_step(batch)

    def chunked(rows):
        actor.logprob_chunk_tokens = rows
        return actor.train_step(batch)

    if args.chunk:
        steps = ((f"chunk_{args.chunk}", lambda: chunked(args.chunk)), ("whole", lambda: chunked(0)))
    elif args.fused_adam:
        steps = (("fused_adam", lambda: adam(actor, batch, True)),
                 ("default_adam", lambda: adam(actor, batch, False)))
    elif args.wgrad_fusion:
        steps = (("wgrad_fusion", lambda: wgrad_fusion(actor, batch, True)),
                 ("wgrad_unfused", lambda: wgrad_fusion(actor, batch, False)))
    elif args.swiglu:
        two_pass = fused_bias_swiglu.swiglu_back
        steps = (("swiglu_two_pass", lambda: swiglu(actor, batch, two_pass)),
                 ("swiglu_megatron", lambda: swiglu(actor, batch, megatron_swiglu_back)))
    elif args.onednn:
        from megatron.core.tensor_parallel import layers
        from megatron_rlep import platform

        megatron_linear = layers.linear_with_grad_accumulation_and_async_allreduce
        megatron_linear = getattr(megatron_linear, "megatron", megatron_linear)
        if megatron_linear is layers.linear_with_grad_accumulation_and_async_allreduce:
            platform._linear_products_through_onednn()  # off by default: Intel, or ONEDNN=0
        onednn = layers.linear_with_grad_accumulation_and_async_allreduce
        steps = (("onednn", lambda: linear_function(actor, batch, onednn)),
                 ("mkl", lambda: linear_function(actor, batch, megatron_linear)))
    elif args.share_prompts:
        steps = (("shared", lambda: shared(True)), ("plain", lambda: shared(False)))
    elif args.compile:
        steps = (("compiled", lambda: with_dynamo(False)), ("eager", lambda: with_dynamo(True)))
    elif args.short_prompt:
        short = make_batch(args.sequences, args.short_prompt, args.response,
                           actor.hf_config.vocab_size)
        short.old_logp, _ = actor.logprobs(short)
        steps = ((f"prompt_{args.prompt}", lambda: actor.train_step(batch)),
                 (f"prompt_{args.short_prompt}", lambda: actor.train_step(short)))
    else:
        steps = (("megatron", lambda: actor.train_step(batch)),
                 ("transformers", lambda: plain_step(model, optimizer, batch, algorithm)))
    times = {name: [] for name, _ in steps}
    first = {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, run in steps:
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            if repeat:
                times[name].append(elapsed)
            else:
                first[name] = elapsed
    result = {name: {"median_s": statistics.median(t), "tokens_per_s": tokens / statistics.median(t),
                     "first_step_s": first[name]} for name, t in times.items()}
    (a, _), (b, _) = steps
    result[f"ratio_{a}_over_{b}"] = result[a]["tokens_per_s"] / result[b]["tokens_per_s"]
    result[f"seconds_{a}_over_{b}"] = result[a]["median_s"] / result[b]["median_s"]
    rounds = sorted(x / y for x, y in zip(times[a], times[b]))  # the two alternate: one pair a round
    result[f"seconds_{a}_over_{b}_rounds"] = {"min": rounds[0], "median": statistics.median(rounds),
                                              "max": rounds[-1]}
    flops = step_flops(actor.hf_config, args.sequences, args.prompt, args.response,
                       args.micro_batch_size, args.share_prompts or 1)
    peak = peak_flops(size=args.peak_size)
    first_megatron = steps[0][0]
    result["flops"] = {"step_gflop": flops / 1e9, "of_step": first_megatron,
                       "gflop_per_s": flops / result[first_megatron]["median_s"] / 1e9,
                       "peak_gflop_per_s": peak / 1e9,
                       "share_of_peak": flops / result[first_megatron]["median_s"] / peak}
    if args.fused_adam or args.onednn or args.chunk:
        result["weights_max_difference"] = weights_after(actor, steps)
    result["batch"] = {"sequences": args.sequences, "prompt": args.prompt,
                       "response": args.response, "micro_batch_size": args.micro_batch_size,
                       "threads": torch.get_num_threads(), "repeats": args.repeats,
                       "group": args.share_prompts}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
