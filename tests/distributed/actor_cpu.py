"""The actor on one layout, run alone or under torchrun (tests/test_actor.py drives it).

    actor_cpu.py make MODEL_DIR KIND tied|untied   # KIND: see make()
    actor_cpu.py step MODEL_DIR TP PP OUT [EP [full|light]]  # checks, one update, save
    actor_cpu.py load MODEL_DIR OUT...        # at TP=1 PP=1: load each OUT/ckpt, compare
    actor_cpu.py offload MODEL_DIR            # two updates with the buffers offloaded between
    actor_cpu.py resume MODEL_DIR OUT         # the distributed optimizer: update, save, resume
    actor_cpu.py export MODEL_DIR TP EP OUT   # the export's order, its memory, a failed consumer
    actor_cpu.py routes MODEL_DIR TP PP EP OUT  # MoE routing replay (see routes())

Commands chain with ``+`` and run one after another in one process (one process group, with
Megatron's parallel state rebuilt for each actor), so the imports are paid once:
``actor_cpu.py make M llama untied + step M 1 1 OUT``.

``step`` asserts logits and log-probs equal transformers' (1e-4) and a bit-exact export, then
does one optimiser update on a fixed batch and writes OUT/weights.safetensors (exported after
the update), OUT/metrics.json, OUT/logits.pt, the distributed checkpoint OUT/ckpt, a
weights-only one OUT/best and the Hugging Face export OUT/hf. Two more updates then check that the seq-mean loss modes, too, are
exact over micro-batches and data-parallel shares, and one more that micro-batches cut by a
token budget (``max_tokens_per_micro_batch``) change neither log-probs nor the loss, and that
full recompute with log-probs in chunks changes neither log-probs nor gradients; at TP > 1,
neither does sequence parallelism. Last, on a batch of groups that repeat their prompts, shared
prompts (``share_prompts``: each prompt packed once per row) and packed sequences
(``pack_sequences``: the THD layout, sequences end to end) give transformers' log-probs and the
plain actor's gradients (with sequence parallelism at TP > 1), and an update that takes its old
log-probs from its own forward pass gives the gradients of one handed the same log-probs.
``light`` (a family's mapping: the newer dense families) skips those mechanics and keeps
the comparison with transformers, the round trip, the update, the saves and, at TP > 1, sequence
parallelism. Every check raises; the last line printed by rank 0 is "OK ...".
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import platform

VOCAB = 256


def make(path, kind, tied):
    """A tiny random checkpoint of ``kind``: llama, llama3 (RoPE scaling of type llama3), qwen2,
    qwen3 (QK norms, head size 24 apart from hidden / heads), qwen3_moe (four experts, two a
    token, top-k renormalised) or qwen3_moe_raw (the same, top-k not renormalised)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, tie_word_embeddings=tied == "tied", rope_theta=5000.0)
    # Llama 3.1's scaling; a base of 5e5 puts the head's frequencies on both sides of its bands
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    moe = dict(head_dim=24, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    config = {
        "llama": lambda: tf.LlamaConfig(**common),
        "llama3": lambda: tf.LlamaConfig(**{**common, "rope_parameters": llama3,
                                            "max_position_embeddings": 131072}),
        "qwen2": lambda: tf.Qwen2Config(**common),
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=24),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**common, **moe, norm_topk_prob=True),
        "qwen3_moe_raw": lambda: tf.Qwen3MoeConfig(**common, **moe, norm_topk_prob=False),
    }[kind]()
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # norms and biases random too, so a wrong mapping shows
    model.save_pretrained(path)


def algorithm():
    """Adam's epsilon 1e-6, not 1e-8: its first step moves an element by lr * g / (|g| + eps),
    so fp32 rounding of 1e-9 in a gradient element near 1e-9 (other kernels on another layout)
    moved it 1e-3 apart at eps 1e-8 (llama3 at TP 2); at 1e-6 by at most 1e-5."""
    from megatron_rlep.config import AlgorithmConfig

    return AlgorithmConfig(lr=1e-2, warmup_steps=0, weight_decay=0.1, grad_clip=1.0,
                           clip_low=0.2, clip_high=0.28, dual_clip=3.0, adam_eps=1e-6)


def fixed_batch(logp_of):
    """Eight sequences of different lengths; old log-probs shifted so some ratios clip."""
    from megatron_rlep.actor.batch import SequenceBatch

    g = torch.Generator().manual_seed(1)
    tokens, prompts = [], []
    for n in range(8):
        p, r = 3 + n % 4, 2 + (5 * n) % 9
        tokens.append(torch.randint(0, VOCAB, (p + r,), generator=g).tolist())
        prompts.append(p)
    batch = SequenceBatch(tokens, prompts)
    shifts = [torch.randn(len(t) - p, generator=g) * 0.3 for t, p in zip(tokens, prompts)]
    batch.old_logp = [lp + s for lp, s in zip(logp_of(batch), shifts)]
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -2.0, 1.5, -0.5, 0.0, 1.0])
    return batch


def grouped_batch(logp_of):
    """Three prompts repeated by 3, 3 and 2 sequences of different response lengths."""
    from megatron_rlep.actor.batch import SequenceBatch

    g = torch.Generator().manual_seed(2)
    tokens, prompts = [], []
    for p, answers in ((4, 3), (7, 3), (5, 2)):
        prompt = torch.randint(0, VOCAB, (p,), generator=g).tolist()
        for n in range(answers):
            tokens.append(prompt + torch.randint(0, VOCAB, (2 + (3 * n + p) % 7,), generator=g).tolist())
            prompts.append(p)
    batch = SequenceBatch(tokens, prompts)
    batch.old_logp = [lp + torch.randn(len(lp), generator=g) * 0.3 for lp in logp_of(batch)]
    batch.advantages = torch.randn(len(tokens), generator=g)
    return batch


def reference_logp(model_dir, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids, p in zip(batch.tokens, batch.prompt_lengths):
            logits = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            out.append(logits[p - 1:-1].gather(-1, torch.tensor(ids[p:])[:, None])[:, 0])
    return out, model


def step(model_dir, tp, pp, out, ep=1, mode="full"):
    from safetensors.torch import load_file, save_file

    from megatron_rlep.actor.actor import Actor

    out, full = Path(out), mode == "full"
    # Megatron-Core's MoE layer trains at TP > 1 only with sequence parallelism
    moe_sp = tp > 1 and json.loads((Path(model_dir) / "config.json").read_text())[
        "model_type"].endswith("_moe")
    actor = Actor(model_dir, algorithm(), tp, pp, micro_batch_size=3, expert_parallel=ep,
                  sequence_parallel=moe_sp)
    rank = dist.get_rank() if dist.is_initialized() else 0
    batch = fixed_batch(lambda b: reference_logp(model_dir, b)[0])
    expected, hf_model = reference_logp(model_dir, batch)

    probe = torch.tensor(batch.tokens[0])[None]
    diff = (actor.logits(probe) - hf_model(probe).logits).abs().max().item()
    assert diff < 1e-4, f"logits differ from transformers by {diff}"
    ours, entropy = actor.logprobs(batch, with_entropy=True)
    for a, b in zip(ours, expected):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-4, (a, b)
    assert all(e.shape == a.shape and (e >= 0).all() for e, a in zip(entropy, ours))

    source = {}
    for f in Path(model_dir).glob("*.safetensors"):
        source.update(load_file(f))
    exported = {k: v for bucket in actor.export_hf(list, 1 << 14) for k, v in bucket}
    assert exported.keys() == source.keys(), exported.keys() ^ source.keys()
    for k in source:
        assert torch.equal(exported[k], source[k]), f"{k} changed in the round trip"

    metrics = actor.train_step(batch)
    # the loss over micro-batches of 3 (and DP shares) equals the one-batch token mean
    from megatron_rlep import loss as objective

    pairs = [objective.policy_token_loss(lp, old, adv, 0.2, 0.28, 3.0)[0].sum()
             for lp, old, adv in zip(expected, batch.old_logp, batch.advantages)]
    whole = sum(pairs) / sum(len(lp) for lp in expected)
    assert abs(metrics["loss"] - whole.item()) < 1e-5, (metrics["loss"], whole.item())
    weights = {k: v.contiguous() for bucket in actor.export_hf(list) for k, v in bucket}
    logits = actor.logits(torch.tensor(batch.tokens[1])[None])
    actor.save(out / "ckpt", extra={"note": "step test"})
    actor.save_weights(out / "best", 1, {"val/acc": 0.5})  # weights only, as the trainer's best
    actor.save_hf(out / "hf")
    if rank == 0:
        save_file(weights, str(out / "weights.safetensors"))
        torch.save(logits, out / "logits.pt")
        (out / "metrics.json").write_text(json.dumps(metrics))
    if full:  # the mechanics: loss modes, token budgets, recompute and chunks
        # verl's seq-mean modes, exact over the same micro-batches of 3 and DP shares; only now,
        # as the exported tensors above share storage with the weights these updates change
        for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
            actor.algorithm = dataclasses.replace(actor.algorithm, loss_agg=mode)
            now, _ = actor.logprobs(batch)
            reported = actor.train_step(batch)["loss"]
            per_seq = [objective.policy_token_loss(lp, old, adv, 0.2, 0.28, 3.0)[0]
                       for lp, old, adv in zip(now, batch.old_logp, batch.advantages)]
            per_seq = [t.mean() if mode == "seq-mean-token-mean" else t.sum() for t in per_seq]
            expected = (sum(per_seq) / len(per_seq)).item()
            assert abs(reported - expected) < 1e-5 * max(1.0, abs(expected)), (mode, reported, expected)
        # a token budget per micro-batch (as long as the longest sequence: it goes alone, shorter
        # ones share) regroups the micro-batches; log-probs and the token-mean loss stay the same
        actor.algorithm = dataclasses.replace(actor.algorithm, loss_agg="token-mean")
        plain, _ = actor.logprobs(batch)
        actor.max_tokens_per_micro_batch = max(len(t) for t in batch.tokens)
        now, _ = actor.logprobs(batch)
        assert all((a - b).abs().max() < 1e-5 for a, b in zip(now, plain))
        reported = actor.train_step(batch)["loss"]
        expected = (sum(objective.policy_token_loss(lp, old, adv, 0.2, 0.28, 3.0)[0].sum()
                        for lp, old, adv in zip(now, batch.old_logp, batch.advantages)) /
                    sum(len(lp) for lp in now)).item()
        assert abs(reported - expected) < 1e-5 * max(1.0, abs(expected)), ("budget", reported, expected)
        # the memory settings change no number: with full recompute and log-probs taken 5 response
        # tokens at a time (each chunk recomputed in backward), log-probs and gradients stay the same
        plain, plain_grads = actor.logprobs(batch)[0], gradients(actor, batch)
        config = actor.config
        config.recompute_granularity, config.recompute_method, config.recompute_num_layers = \
            "full", "uniform", 1
        actor.logprob_chunk_tokens = 5
        now, _ = actor.logprobs(batch)
        assert all((a - b).abs().max() < 1e-5 for a, b in zip(now, plain))
        diff = max((a - b).abs().max().item() for a, b in zip(gradients(actor, batch), plain_grads))
        assert diff < 1e-5, f"gradients differ by {diff} with full recompute and log-prob chunks"
    if tp > 1 and not moe_sp:  # sequence parallelism: transformers' log-probs, a plain actor's gradients
        grads = []
        for sequence_parallel in (False, True):
            platform.reset_model_parallel()
            fresh = Actor(model_dir, algorithm(), tp, pp, micro_batch_size=3,
                          sequence_parallel=sequence_parallel, expert_parallel=ep)
            grads.append(gradients(fresh, batch))
        assert fresh.config.sequence_parallel
        now, _ = fresh.logprobs(batch)
        reference = reference_logp(model_dir, batch)[0]
        assert all((a - b).abs().max() < 1e-4 for a, b in zip(now, reference))
        diff = max((a - b).abs().max().item() for a, b in zip(*grads))
        assert diff < 1e-5, f"gradients differ by {diff} with sequence parallelism"
    if full:  # shared prompts, packed sequences, old log-probs from the update's forward
        grouped = grouped_batch(lambda b: reference_logp(model_dir, b)[0])
        reference = reference_logp(model_dir, grouped)[0]
        grads = []
        for mode in ("plain", "pack", "share"):
            platform.reset_model_parallel()
            fresh = Actor(model_dir, algorithm(), tp, pp, micro_batch_size=3, expert_parallel=ep,
                          share_prompts=mode == "share", pack_sequences=mode == "pack",
                          sequence_parallel=(mode != "plain" or moe_sp) and tp > 1)
            grads.append(gradients(fresh, grouped))
            micros = fresh._micros(grouped)
            assert all((m.attention_mask is not None) == (mode == "share") and
                       (m.cu_seqlens is not None) == (mode == "pack") for m in micros)
            now, _ = fresh.logprobs(grouped)
            assert all(a.shape == b.shape and (a - b).abs().max() < 1e-4 for a, b in zip(now, reference))
            diff = max((a - b).abs().max().item() for a, b in zip(grads[0], grads[-1]))
            assert diff < 1e-5, f"gradients differ by {diff} with {mode}"
            if mode == "pack":  # a budget of the longest sequence's tokens regroups the rows
                fresh.max_tokens_per_micro_batch = max(map(len, grouped.tokens))
                assert len(fresh._micros(grouped)) > len(micros)
                diff = max((a - b).abs().max().item() for a, b in zip(grads[0], gradients(fresh, grouped)))
                assert diff < 1e-5, f"gradients differ by {diff} with packed rows under a token budget"
        # before a step's first update the old log-probs may come from the update's own forward
        # (train_step without old_logp): the same gradients, and those log-probs handed back
        from megatron_rlep.actor.batch import SequenceBatch

        on_policy = SequenceBatch(grouped.tokens, grouped.prompt_lengths, grouped.advantages, now)
        fused = SequenceBatch(grouped.tokens, grouped.prompt_lengths, grouped.advantages)
        diff = max((a - b).abs().max().item()
                   for a, b in zip(gradients(fresh, on_policy), gradients(fresh, fused)))
        assert diff < 1e-5, f"gradients differ by {diff} with old log-probs from the update's forward"
        fresh.train_step(fused)
        assert all((a - b).abs().max() < 1e-5 for a, b in zip(fresh.fused_old_logp, now))
    if rank == 0:
        print(f"OK step tp={tp} pp={pp} ep={ep} logit_diff={diff:.2e} loss={metrics['loss']:.6f}")


def hf_routes(model, batch, forced=None):
    """transformers' log-probs of ``batch``'s responses and the experts each token went to
    (per sequence, [tokens, layers, top-k] sorted); with ``forced`` (routes in that form) the
    routers send each token to those experts instead, their probabilities gathered there."""
    gates = [layer.mlp.gate for layer in model.model.layers]
    current, used = {}, {}

    def route(layer, gate, hidden):
        logits = torch.nn.functional.linear(hidden, gate.weight)
        probs = logits.float().softmax(-1)
        index = probs.topk(gate.top_k, -1).indices if forced is None else \
            current["routes"][:, layer].long()
        values = probs.gather(1, index)
        if gate.norm_topk_prob:
            values = values / values.sum(-1, keepdim=True)
        used[layer] = index
        return logits, values.to(logits.dtype), index

    for layer, gate in enumerate(gates):
        gate.forward = lambda hidden, layer=layer, gate=gate: route(layer, gate, hidden)
    logps, routes = [], []
    with torch.no_grad():
        for n, (ids, p) in enumerate(zip(batch.tokens, batch.prompt_lengths)):
            current["routes"] = forced[n] if forced is not None else None
            logits = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            logps.append(logits[p - 1:-1].gather(-1, torch.tensor(ids[p:])[:, None])[:, 0])
            routes.append(torch.stack([used[i] for i in range(len(gates))], 1).sort(-1).values)
    for gate in gates:
        del gate.forward
    return logps, routes


def routes(model_dir, tp, pp, ep, out):
    """Routing replay (actor.routing_replay=actor) on a MoE model at one layout: the routes the
    actor records are transformers' own, under shared prompts and packing too (single process);
    with the routers negated (each token's own top-2 of 4 experts become its last two) the
    recorded routes given back are the ones used, the log-probs equal transformers' with those
    experts forced, those without replay differ, routes given with the batch (R3) are used where
    given, and an update with the kept ones routes the same and still gives the routers a
    gradient. Writes OUT (rank 0): per pass kind, the replayed
    log-probs and the update's metrics, for the comparison across layouts."""
    from transformers import AutoModelForCausalLM

    from megatron_rlep.actor import routing
    from megatron_rlep.actor.actor import Actor

    results = {}
    single = tp * pp * ep * dist.get_world_size() == 1 if dist.is_initialized() else True
    for kind in ("plain", "pack", "share") if single else ("plain",):
        platform.reset_model_parallel()
        actor = Actor(model_dir, algorithm(), tp, pp, micro_batch_size=3, expert_parallel=ep,
                      sequence_parallel=tp > 1, routing_replay="actor",
                      share_prompts=kind == "share", pack_sequences=kind == "pack")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        batch = grouped_batch(lambda b: [torch.zeros(len(t) - p) for t, p in
                                         zip(b.tokens, b.prompt_lengths)])
        actor.logprobs(batch, routes="old")  # the first pass under a key keeps its routes
        recorded = actor.sequence_routes(batch, "old")
        _, own = hf_routes(model, batch)
        for n, (mine, theirs) in enumerate(zip(recorded, own)):
            assert torch.equal(mine.long().sort(-1).values, theirs), (kind, "recorded", n)
        assert actor.route_counts.sum() == 0  # nothing given: nothing compared
        for layer in actor.module.decoder.layers:
            layer.mlp.router.weight.data.neg_()
        for layer in model.model.layers:
            layer.mlp.gate.weight.data.neg_()
        replayed, _ = actor.logprobs(batch, routes="old")  # a later one replays them
        used = actor.sequence_routes(batch)
        assert all(torch.equal(a, b) for a, b in zip(used, recorded)), kind
        agree = routing.agreement(actor.route_counts)
        assert agree["moe/route_agreement"] == 0.0, (kind, agree)
        forced, _ = hf_routes(model, batch, recorded)
        diff = max((a - b).abs().max().item() for a, b in zip(replayed, forced))
        assert diff < 1e-4, f"{kind}: replayed log-probs differ from the forced ones by {diff}"
        free, _ = actor.logprobs(batch)
        apart = max((a - b).abs().max().item() for a, b in zip(free, forced))
        assert apart > 1e-2, f"{kind}: the routers' own choice changed log-probs by {apart} only"
        # routes given with the batch (the rollout's, R3), but none for the last prompt's two
        # sequences: those route as the routers choose, the others as given
        given = dataclasses.replace(batch, routes=recorded[:6] + [None, None])
        mixed, _ = actor.logprobs(given, routes="given")
        used, own = actor.sequence_routes(given), hf_routes(model, given)[1]
        assert all(torch.equal(a.long().sort(-1).values, b) for a, b in zip(used[6:], own[6:])) \
            and all(torch.equal(a, b) for a, b in zip(used[:6], recorded[:6])), kind
        assert all((a - b).abs().max() < 1e-4 for a, b in zip(mixed, forced[:6] + free[6:])), kind
        assert routing.agreement(actor.route_counts)["moe/route_agreement"] == 0.0
        # every token given routes, counted once a layer (a shared prompt once for its row)
        prompts = 4 + 7 if kind == "share" else sum(given.prompt_lengths[:6])
        given_tokens = actor.hf_config.num_hidden_layers * (
            prompts + sum(given.response_lengths()[:6]))
        assert actor.route_counts[:, 0].sum() == given_tokens, (kind, actor.route_counts)
        batch.old_logp = replayed
        metrics = actor.train_step(batch, routes="old")
        assert all(torch.equal(a, b) for a, b in zip(actor.sequence_routes(batch), recorded)), kind
        assert metrics["router_grad_norm"] > 1e-6, metrics
        assert routing.agreement(metrics["route_counts"])["moe/route_agreement"] == 0.0
        after, _ = actor.logprobs(batch)
        # the step's first passes ("old", "given") counted the routes given, the replays not
        assert actor.forget_routes()[:, 0].sum() == given_tokens and not actor._kept
        results[kind] = {"replayed": [x.tolist() for x in replayed],
                         "after": [x.tolist() for x in after],
                         **{k: metrics[k] for k in ("loss", "grad_norm", "router_grad_norm")}}
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results))
        print(f"OK routes tp={tp} pp={pp} ep={ep}")


def gradients(actor, batch):
    """This rank's gradients of the policy loss on ``batch``, without an optimiser step."""
    actor.model.train()
    actor.model.zero_grad_buffer()
    actor.optimizer.zero_grad()  # the last step left param.grad aliasing the gradient buffer
    actor._schedule(actor._micros(batch), actor._policy_loss, forward_only=False)
    return [p.main_grad.clone() for p in actor.model.parameters()]


def offload(model_dir):
    """Two updates with the gradient buffers offloaded between them (parallel.offload_during_
    rollout) give the weights of two updates without; the buffers are freed while offloaded."""
    from megatron.core import parallel_state

    from megatron_rlep.actor.actor import Actor

    weights = {}
    for offloaded in (False, True):
        if parallel_state.model_parallel_is_initialized():
            platform.reset_model_parallel()
        actor = Actor(model_dir, algorithm(), 1, 1, micro_batch_size=3)
        batch = fixed_batch(lambda b: reference_logp(model_dir, b)[0])
        actor.train_step(batch)
        if offloaded:
            actor.offload()
            buffers = actor.model.buffers
            assert buffers and all(b.grad_data.untyped_storage().size() == 0 for b in buffers)
            actor.logits(torch.tensor(batch.tokens[0])[None])  # the rollout's forward passes
        actor.train_step(batch)
        assert not actor.offloaded and all(b.grad_data.untyped_storage().size() > 0
                                           for b in actor.model.buffers)
        weights[offloaded] = {k: v.clone() for bucket in actor.export_hf(list) for k, v in bucket}
    for k, v in weights[False].items():
        assert torch.equal(v, weights[True][k]), f"{k} differs after an offloaded update"
    print("OK offload")


def resume(model_dir, out):
    """The distributed optimizer (Adam's state sharded over the data-parallel ranks): one update
    (written as in ``step``, for the test to hold against the plain optimizer's), then a save,
    and a fresh actor that loads it takes the second update exactly as the run that went on."""
    from safetensors.torch import save_file

    from megatron_rlep.actor.actor import Actor

    out, batch = Path(out), fixed_batch(lambda b: reference_logp(model_dir, b)[0])

    def weights(actor):
        return {k: v.clone().contiguous() for bucket in actor.export_hf(list) for k, v in bucket}

    actor = Actor(model_dir, algorithm(), 1, 1, micro_batch_size=3, distributed_optimizer=True)
    kinds = [type(o).__name__ for o in actor.optimizer.chained_optimizers]
    assert kinds == ["DistributedOptimizer"], kinds
    metrics, first = actor.train_step(batch), weights(actor)
    actor.save(out / "ckpt")
    actor.train_step(batch)
    went_on = weights(actor)
    platform.reset_model_parallel()
    resumed = Actor(model_dir, algorithm(), 1, 1, micro_batch_size=3, distributed_optimizer=True)
    resumed.load(out / "ckpt")
    assert resumed.step == 1
    resumed.train_step(batch)
    for k, v in weights(resumed).items():
        assert torch.equal(v, went_on[k]), f"{k} differs after a resumed update"
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_file(first, str(out / "weights.safetensors"))
        (out / "metrics.json").write_text(json.dumps(metrics))
        print(f"OK resume dp={resumed.dp_size}")


def export(model_dir, tp, ep, out):
    """The export's order and memory as vLLM's layer-wise reload takes it: every arrived tensor
    of a layer is kept until the layer is whole. Writes OUT (rank 0): the layer of each exported
    name in order, each layer's bytes not shared with a parameter (copies, gathers, another
    rank's experts), and the most such bytes alive at once, counted by weak references to every
    exported tensor while the stand-in consumer holds each layer until it is complete."""
    import re
    import weakref
    from collections import Counter

    from megatron_rlep.actor.actor import Actor

    def layer_of(name):
        m = re.match(r"model\.layers\.(\d+)\.", name)
        return int(m.group(1)) if m else None

    actor = Actor(model_dir, algorithm(), tp, 1, micro_batch_size=3, expert_parallel=ep,
                  sequence_parallel=tp > 1)
    order = [layer_of(k) for bucket in actor.export_hf(list, 1) for k, _ in bucket]
    expected = Counter(layer for layer in order if layer is not None)
    params = {p.untyped_storage().data_ptr() for p in actor.module.parameters()}
    held, arrived, extra, alive, peak = {}, Counter(), Counter(), [], 0

    def consume(buckets):
        nonlocal peak
        for bucket in buckets:
            for name, tensor in bucket:
                layer = layer_of(name)
                if layer is None:
                    continue
                if tensor.untyped_storage().data_ptr() not in params:
                    nbytes = tensor.numel() * tensor.element_size()
                    extra[layer] += nbytes
                    alive.append((weakref.ref(tensor), nbytes))
                held.setdefault(layer, []).append(tensor)
                arrived[layer] += 1
                peak = max(peak, sum(n for ref, n in alive if ref() is not None))
                if arrived[layer] == expected[layer]:
                    del held[layer]  # the layer is whole: loaded, its tensors freed
            del bucket, name, tensor
    actor.export_hf(consume, 1)

    # A consumer that fails after one bucket on rank 0, none on the others: the export still
    # completes its collectives on every rank, so the all-reduce below meets its peers' (were
    # the export left undrained, it would meet the export's next all-gather or broadcast).
    first = not dist.is_initialized() or dist.get_rank() == 0

    def fail_after_one(buckets):
        next(buckets)
        raise OSError("no space left on device")
    try:
        actor.export_hf(fail_after_one if first else None, 1)
        assert not first, "the consumer's error was lost"
    except OSError:
        assert first
    if dist.is_initialized():
        ranks = torch.ones(1)
        dist.all_reduce(ranks)
        assert ranks.item() == dist.get_world_size()
    if first:
        Path(out).write_text(json.dumps({"order": order, "layer_bytes": extra, "peak": peak,
                                         "held_at_end": len(held)}))
        print(f"OK export tp={tp} ep={ep} peak={peak}")


def load(model_dir, outs):
    from safetensors.torch import load_file

    from megatron_rlep.actor.actor import Actor

    actor = Actor(model_dir, algorithm(), 1, 1, micro_batch_size=3)
    probe = torch.tensor(fixed_batch(lambda b: [torch.zeros(len(t) - p) for t, p in
                                               zip(b.tokens, b.prompt_lengths)]).tokens[1])[None]
    for out in map(Path, outs):
        extra = actor.load(out / "ckpt")
        assert actor.step == 1 and extra == {"note": "step test"}, (actor.step, extra)
        weights = load_file(out / "weights.safetensors")
        loaded = {k: v for bucket in actor.export_hf(list) for k, v in bucket}
        assert loaded.keys() == weights.keys()
        for k in weights:
            assert torch.equal(loaded[k], weights[k]), f"{k} differs after loading {out}"
        # same weights; the saving layout summed its TP/PP partial results in another order
        diff = (actor.logits(probe) - torch.load(out / "logits.pt")).abs().max().item()
        assert diff < 1e-5, f"logits differ by {diff} after loading {out}"
        print(f"OK load {out} logit_diff={diff:.1e}")


if __name__ == "__main__":
    argv, commands = sys.argv[1:], [[]]
    for arg in argv:
        if arg == "+":
            commands.append([])
        else:
            commands[-1].append(arg)
    for command, *args in commands:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            platform.reset_model_parallel()
        if command == "make":
            make(*args)
        elif command == "step":
            step(args[0], int(args[1]), int(args[2]), args[3], *map(int, args[4:5]), *args[5:])
        elif command == "load":
            load(args[0], args[1:])
        elif command == "offload":
            offload(args[0])
        elif command == "resume":
            resume(args[0], args[1])
        elif command == "routes":
            routes(args[0], *map(int, args[1:4]), args[4])
        elif command == "export":
            export(args[0], int(args[1]), int(args[2]), args[3])
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
