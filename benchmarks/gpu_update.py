"""The actor's update at a real load on one device, against a plain PyTorch reference run in the
same process (issue 51).

    python benchmarks/gpu_update.py --shape qwen2.5-1.5b [--json FILE] [--sync-debug]
    python benchmarks/gpu_update.py --shape qwen2.5-math-7b-slice [--layers auto|N]
    python benchmarks/gpu_update.py --shape tiny        # the CPU check (tests/test_gpu_update.py)

scripts/gpu_update.sh runs both real shapes on a GPU in one command.

One update is what the trainer's ``update`` does with a rollout step of two mini-batches, as the
paper's presets take them: the old log-probs of the second mini-batch (a forward pass; the first
mini-batch takes its own from its update's forward: ``train_step`` without old log-probs), then
one optimizer step on each mini-batch. The settings are the preset's (``--experiment``, default
dapo_nodyn_bs64): micro-batches of at most 4 sequences and 8,192 tokens, selective recompute,
log-probs 2,048 response tokens at a time, its loss and AdamW settings; on one device TP 1, no
sequence parallelism, and the distributed optimizer (the presets' data-parallel runs use it; on
one device it shards nothing but runs its own code). The layers are Transformer Engine's where
it imports, else Megatron-Core's local specs with torch's SDPA (what a bare checkout gets).

The load: ``--tokens`` per optimizer step (65,536 on a GPU, 1,024 on the CPU) in sequences of
``--prompt`` + ``--response`` tokens (512 + 1,536 on a GPU, 32 + 96 on the CPU), random token ids
and advantages, and seeded random weights of the shape's configuration: ``qwen2.5-1.5b``
(Qwen2.5-1.5B's config.json), ``qwen2.5-math-7b-slice`` (Qwen2.5-Math-7B's width with ``--layers``
of its 28 layers; ``auto``: the most that tools/memory_plan.py fits on this device with 6 GiB
spare, an 80 GB H100 on the CPU), or ``tiny`` (2 layers of width 64).

The reference: transformers' model of the same configuration and weights with SDPA attention,
doing the same work on the same micro-batches: the old log-probs' forward, then per mini-batch
the forward, the response tokens' log-probs (and their entropy, detached, as the actor's metrics
take it), the same clipped loss (megatron_rlep.loss), backward, gradient clipping and torch's
fused AdamW, its loss and gradient norm read once a step. Its weights, gradients and Adam state
are bf16 on a GPU (the lightest plain loop; the actor keeps fp32 master weights and gradients)
and fp32 on the CPU (fused AdamW where torch has the CPU kernel; the JSON says which).

FLOPs (model FLOPs, the same count for both: padding and recomputation are not counted): the
forward of a sequence of L tokens, R of them response tokens, is

    2 N L  +  2 V h R  +  2 layers q L^2

with N the decoder layers' linear weights (q, k, v, o and the gated MLP; biases and norms left
out), V h the output layer (at response positions only, as the actor applies it), and causal
attention's QK^T and AV products (4 L^2 q a layer for full attention, halved; q = heads x head
size). A training pass is 3 forwards (backward: 2), so an update is 1 forward of the second
mini-batch (old log-probs) and 3 of each mini-batch: 6 N tokens for the dense parts plus the
attention products, forward and backward (benchmarks/actor_step.py ``step_flops``). MFU is the
achieved FLOP/s over the device's dense bf16 peak (scripts/gpu_smoke.py ``PEAK_FLOPS``, by device
name, or ``--peak-tflops``); the CPU has no table: not applicable unless ``--peak-tflops``.

Timing: ``--warmup`` updates (not timed), then ``--steps`` timed updates, each between device
synchronisations (also between its phases); tokens/s = the update's prompt and response tokens
over its median seconds. Then one more update under torch.profiler (not timed; the actor's,
``--profile both``: the reference's too): the top ``--top`` operators by self device time (self
CPU time on the CPU), ``--trace`` its Chrome trace. ``--sync-debug`` (CUDA): the timed
updates run under ``torch.cuda.set_sync_debug_mode("warn")`` and its warnings are counted by the
source line that caused them: the host-device stalls left in the hot path. After the updates,
``export``: learner 0's side of a weight broadcast, the actor's bucketed export with each bucket
flattened for the wire (scripts/gpu_smoke.py ``export_speed``, the faster of two passes).
Prints the JSON and writes it to ``--json`` (also once the actor's part is done: a run stopped
later keeps it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "scripts"), str(REPO / "tools")]

import gpu_smoke  # noqa: E402  (random_model, QWEN25_1_5B, device_peak_flops, free_device)
from actor_step import make_batch, step_flops  # noqa: E402

# Qwen2.5-Math-7B's configuration (its config.json); --layers keeps that many of its 28 layers
QWEN25_MATH_7B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                  "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                  "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                  "hidden_act": "silu", "max_position_embeddings": 4096, "rope_theta": 10000.0,
                  "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 512,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True}
SHAPES = {"tiny": TINY, "qwen2.5-1.5b": gpu_smoke.QWEN25_1_5B,
          "qwen2.5-math-7b-slice": QWEN25_MATH_7B}
SPARE = 6 * 2**30  # what --layers auto leaves free (tools/memory_plan.py fitting_layout's)
FLOP_FORMULA = ("update = forward(mini-batch 2, old log-probs) + 3 x forward(mini-batch 1) + "
                "3 x forward(mini-batch 2); forward of a sequence of L tokens, R of them response "
                "tokens = 2 N L + 2 V h R + 2 layers q L^2 (N: decoder linear weights; V h: the "
                "output layer at response positions; causal QK^T and AV, q = heads x head size = h "
                "for these shapes); padding and recomputation not counted")


def clock(device: torch.device) -> float:
    """Seconds, once the device has finished what was queued (not counted as a stall)."""
    if device.type == "cuda":
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(mode)
    return time.perf_counter()


def micro_shape(args, parallel) -> tuple[int, int]:
    """(tokens, response tokens) of the largest micro-batch the preset's settings make."""
    length = args.prompt + args.response
    per_micro = parallel.micro_batch_size
    if parallel.max_tokens_per_micro_batch:
        per_micro = max(1, min(per_micro, parallel.max_tokens_per_micro_batch // length))
    return per_micro * length, per_micro * args.response


def fitting_layers(config: dict, args, parallel, device_bytes: float) -> int:
    """The most layers of ``config`` whose update tools/memory_plan.py fits in ``device_bytes``
    with ``SPARE`` left (one device, the distributed optimizer, the preset's settings)."""
    import memory_plan

    tokens, response = micro_shape(args, parallel)
    arch = memory_plan.Arch.from_hf(config)
    fits = 1
    for layers in range(1, config["num_hidden_layers"] + 1):
        arch.layers = layers
        plan = memory_plan.plan(arch, 1, 1, 1, tokens, response, parallel.recompute, False,
                                True, parallel.bf16_grads, parallel.logprob_chunk_tokens, 0.0,
                                device_bytes)
        if plan["update_peak"] + SPARE <= device_bytes:
            fits = layers
    return fits


class PlainStep:
    """The reference: transformers' model on the actor's micro-batches (batch.py), the same
    loss, torch's gradient clipping and fused AdamW."""

    def __init__(self, model, algorithm, temperature: float, parallel, device: torch.device):
        self.model, self.a, self.temperature = model, algorithm, temperature
        self.parallel, self.device = parallel, device
        fused = device.type == "cuda" or _cpu_fused_adamw()
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=algorithm.lr, betas=(0.9, 0.999), eps=algorithm.adam_eps,
            weight_decay=algorithm.weight_decay, fused=fused or None)
        self.optimizer_name = "torch AdamW, fused" if fused else \
            "torch AdamW, default (this torch has no fused CPU kernel)"

    def micros(self, batch) -> list:
        from megatron_rlep.actor.batch import collate, micro_batches

        lengths = [len(t) for t in batch.tokens]
        groups = micro_batches(list(range(len(batch))), lengths, self.parallel.micro_batch_size,
                               self.parallel.max_tokens_per_micro_batch)
        return [collate(batch, group, self.device) for group in groups]

    def scored(self, mb, entropy: bool):
        """(log-probs, entropies or None) of the micro-batch's response tokens, flat."""
        hidden = self.model.model(input_ids=mb.tokens, use_cache=False).last_hidden_state
        rows = hidden.reshape(-1, hidden.shape[-1])[mb.loss_index]
        logits = self.model.lm_head(rows).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        log_probs = torch.log_softmax(logits, -1)
        targets = mb.labels.reshape(-1)[mb.loss_index]
        logp = log_probs.gather(-1, targets[:, None])[:, 0]
        if not entropy:
            return logp, None
        with torch.no_grad():
            return logp, -(log_probs.exp() * log_probs).sum(-1)

    @torch.no_grad()
    def logprobs(self, micros: list) -> list[torch.Tensor]:
        return [self.scored(mb, False)[0] for mb in micros]

    def step(self, micros: list, old: list | None = None) -> tuple[float, float]:
        """One optimizer step on a mini-batch (``old``: its old log-probs per micro-batch; None:
        this forward's own); (token-mean loss, gradient norm before clipping)."""
        from megatron_rlep import loss as objective

        a = self.a
        tokens = sum(mb.loss_index.numel() for mb in micros)
        total = torch.zeros((), device=self.device)
        for i, mb in enumerate(micros):
            logp, _ = self.scored(mb, True)
            before = logp.detach() if old is None else old[i]
            advantages = mb.advantages.expand(mb.loss_mask.shape).reshape(-1)[mb.loss_index]
            pg, _, _ = objective.policy_token_loss(logp, before, advantages, a.clip_low,
                                                   a.clip_high, a.dual_clip)
            loss = pg.sum() / tokens
            loss.backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total), float(norm)


def _cpu_fused_adamw() -> bool:
    """Whether this torch has AdamW's fused kernel for CPU tensors."""
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.zeros(2)
    try:
        torch.optim.AdamW([param], fused=True).step()
        return True
    except RuntimeError:
        return False


def mini_batches(args, vocab: int, seed: int):
    """The two mini-batches of an update, fresh (no old log-probs)."""
    from megatron_rlep.actor.batch import SequenceBatch

    n = max(1, round(args.tokens / (args.prompt + args.response)))
    batch = make_batch(2 * n, args.prompt, args.response, vocab, seed)
    return [SequenceBatch(batch.tokens[k * n:(k + 1) * n], batch.prompt_lengths[k * n:(k + 1) * n],
                          advantages=batch.advantages[k * n:(k + 1) * n]) for k in range(2)]


def ours_update(actor, batches, device) -> dict:
    """The actor's update; seconds of each phase, its metrics and the old log-probs it took."""
    first, second = (type(b)(b.tokens, b.prompt_lengths, advantages=b.advantages) for b in batches)
    start = clock(device)
    second.old_logp, _ = actor.logprobs(second)
    old = clock(device)
    one = actor.train_step(first)  # old log-probs from its own forward
    mid = clock(device)
    two = actor.train_step(second)
    end = clock(device)
    return {"seconds": end - start, "phases": [old - start, mid - old, end - mid],
            "loss": [one["loss"], two["loss"]], "grad_norm": [one["grad_norm"], two["grad_norm"]],
            "tokens_counted": one["tokens"] + two["tokens"], "old_logp": second.old_logp}


def reference_update(plain: PlainStep, batches, device) -> dict:
    first, second = batches
    start = clock(device)
    micros = [plain.micros(first), plain.micros(second)]
    old = plain.logprobs(micros[1])
    logprobs_done = clock(device)
    one = plain.step(micros[0])
    mid = clock(device)
    two = plain.step(micros[1], old)
    end = clock(device)
    return {"seconds": end - start,
            "phases": [logprobs_done - start, mid - logprobs_done, end - mid],
            "loss": [one[0], two[0]], "grad_norm": [one[1], two[1]],
            "tokens_counted": sum(mb.loss_index.numel() for m in micros for mb in m),
            "old_logp": lambda: per_sequence(micros[1], old)}  # read only for the agreement


def per_sequence(micros: list, flat: list) -> list[torch.Tensor]:
    """The reference's old log-probs per sequence, on the host, in the batch's order."""
    rows = {}
    for mb, values in zip(micros, flat):
        rows.update(zip(mb.index, values.float().cpu().split(mb.loss_counts)))
    return [rows[i] for i in range(len(rows))]


def measure(run, args, device, flops: float, tokens: int, peak: float | None) -> dict:
    """Warm-up, timed updates (under the sync debug mode with ``--sync-debug``), a profiled one
    (``args.profile``: true or false here)."""
    updates = [run() for _ in range(args.warmup)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.sync_debug and device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            timed = [run() for _ in range(args.steps)]
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
    seconds = [u["seconds"] for u in timed]
    median = statistics.median(seconds)
    out = {"warmup_updates": args.warmup, "timed_updates": len(timed), "update_s": seconds,
           "median_s": median, "phases_median_s": {
               name: statistics.median(u["phases"][k] for u in timed)
               for k, name in enumerate(("old_logprobs", "step_1", "step_2"))},
           "tokens_per_s": tokens / median, "achieved_tflops": flops / median / 1e12,
           "mfu": flops / median / peak if peak else None,
           "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
           if device.type == "cuda" else None,
           "sync_debug": sync_report(caught, args, device, len(timed))}
    if args.profile:
        out["profile"] = profiled(run, device, args.top, args.trace)
    out["first_update"] = (updates or timed)[0]
    return out


def sync_report(caught: list, args, device, updates: int) -> dict:
    """The sync debug mode's warnings by the source line that caused them."""
    if not args.sync_debug or device.type != "cuda":
        return {"counted": False, "why": "--sync-debug not given" if args.sync_debug is False
                else "no CUDA device: a CPU has no host-device stalls to count"}
    places: dict[str, int] = {}
    for w in caught:
        if "synchroniz" in str(w.message):
            where = Path(w.filename)
            where = where.relative_to(REPO) if where.is_relative_to(REPO) else \
                Path(*where.parts[-3:])
            places[f"{where}:{w.lineno}"] = places.get(f"{where}:{w.lineno}", 0) + 1
    total = sum(places.values())
    return {"counted": True, "syncs": total, "per_update": total / max(updates, 1),
            "by_place": dict(sorted(places.items(), key=lambda kv: -kv[1]))}


def profiled(run, device, top: int, trace: Path | None) -> dict:
    """One update under torch.profiler: the ``top`` operators by self device (CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
    if trace:
        prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    # torch before 2.4 names the device's time after CUDA
    key = "self_cpu_time_total" if not cuda else "self_device_time_total" \
        if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    events = sorted(events, key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in events) or 1.0
    return {"by": "self device time" if cuda else "self CPU time", "total_ms": total / 1e3,
            "top": [{"name": e.key, "self_ms": round(getattr(e, key) / 1e3, 3),
                     "share": round(getattr(e, key) / total, 4), "calls": e.count}
                    for e in events[:top]]}


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def agreement(ours: dict, reference: dict) -> dict:
    """The first update of each, from the same weights on the same batch."""
    diffs = torch.cat([(a - b).abs() for a, b in zip(ours["old_logp"], reference["old_logp"]())])
    return {"old_logp_max_abs_diff": diffs.max().item(),
            "old_logp_mean_abs_diff": diffs.mean().item(),
            "loss": {"ours": ours["loss"], "reference": reference["loss"],
                     "relative_diff": [relative(a, b) for a, b in
                                       zip(ours["loss"], reference["loss"])]},
            "grad_norm": {"ours": ours["grad_norm"], "reference": reference["grad_norm"],
                          "relative_diff": [relative(a, b) for a, b in
                                            zip(ours["grad_norm"], reference["grad_norm"])]}}


def main(argv: list[str] | None = None) -> dict:
    parser = arguments()
    args = parser.parse_args(argv)

    from megatron_rlep import platform
    from megatron_rlep.config import compose

    cuda, device = platform.has_cuda(), platform.device()
    for key, gpu, cpu in (("tokens", 65536, 1024), ("prompt", 512, 32), ("response", 1536, 96)):
        if getattr(args, key) is None:
            setattr(args, key, gpu if cuda else cpu)
    cfg = compose([f"experiment={args.experiment}", "parallel.tensor_parallel=1",
                   "parallel.sequence_parallel=false"])
    config = dict(SHAPES[args.shape])
    if args.shape == "qwen2.5-math-7b-slice":
        memory = torch.cuda.get_device_properties(0).total_memory if cuda else h100_bytes()
        if args.layers == "auto":
            config["num_hidden_layers"] = fitting_layers(config, args, cfg.parallel, memory)
        elif args.layers.isdigit() and 1 <= int(args.layers) <= config["num_hidden_layers"]:
            config["num_hidden_layers"] = int(args.layers)
        else:
            parser.error(f"--layers {args.layers}: give auto or a number of layers from 1 to "
                         f"{config['num_hidden_layers']}")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else \
        gpu_smoke.device_peak_flops(name) if cuda else None
    batches = mini_batches(args, config["vocab_size"], args.seed)
    report = header(args, cfg.parallel, config, name, len(batches[0]), peak)
    flops, tokens = report["flops"]["per_update"], report["tokens"]["per_update"]
    with tempfile.TemporaryDirectory(prefix="gpu_update-") as tmp:
        model = gpu_smoke.random_model(config, report["dtype"], str(device))
        model.save_pretrained(tmp)
        if cuda:  # the reference's model waits in host memory while the actor runs
            model.to("cpu")
            torch.cuda.empty_cache()
        report["ours"] = run_ours(tmp, batches, args, cfg, device, flops, tokens, peak,
                                  report["dtype"])
    save(report, args.json)  # a run stopped in the reference keeps the actor's figures
    if args.reference:
        report["reference"] = run_reference(model, batches, args, cfg, device, flops, tokens,
                                            peak)
    del model
    ours, reference = report["ours"], report.get("reference")
    if reference and "error" not in ours and "error" not in reference:
        report["ratio_ours_over_reference"] = ours["tokens_per_s"] / reference["tokens_per_s"]
        report["agreement"] = agreement(ours["first_update"], reference["first_update"])
    print(save(report, args.json))
    return report


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--layers", default="auto",
                        help="qwen2.5-math-7b-slice: layers kept of 28, or auto (what fits)")
    parser.add_argument("--experiment", default="dapo_nodyn_bs64",
                        help="the preset whose parallel and algorithm settings the update takes")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per optimizer step (default 65536 on a GPU, 1024 on the CPU)")
    parser.add_argument("--prompt", type=int, default=None, help="default 512 (GPU), 32 (CPU)")
    parser.add_argument("--response", type=int, default=None, help="default 1536 (GPU), 96 (CPU)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto")
    parser.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction,
                        default=True)
    parser.add_argument("--warmup", type=int, default=1, help="updates before the timed ones")
    parser.add_argument("--steps", type=int, default=2, help="timed updates")
    parser.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--profile", choices=("ours", "both", "none"), default="ours",
                        help="whose update (one more, untimed) runs under torch.profiler")
    parser.add_argument("--top", type=int, default=15, help="operators listed from the profile")
    parser.add_argument("--trace", type=Path, default=None,
                        help="also write the actor's profiled update as a Chrome trace here")
    parser.add_argument("--sync-debug", action="store_true",
                        help="CUDA: count the synchronisations of the timed updates")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak for MFU instead of the table's (the CPU's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


def header(args, parallel, config: dict, name: str, sequences: int, peak: float | None) -> dict:
    """What the run measures: the device, shape, settings, tokens and FLOPs of an update."""
    from megatron_rlep import platform

    per_step = step_flops(_hf_config(config), sequences, args.prompt, args.response, 1, 1)
    tokens = 2 * sequences * (args.prompt + args.response)
    return {
        "device": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "shape": args.shape, "config": config, "parameters": _parameters(config),
        "dtype": str(platform.compute_dtype(args.dtype)).removeprefix("torch."),
        "experiment": args.experiment,
        "settings": {"micro_batch_size": parallel.micro_batch_size,
                     "max_tokens_per_micro_batch": parallel.max_tokens_per_micro_batch,
                     "recompute": parallel.recompute,
                     "logprob_chunk_tokens": parallel.logprob_chunk_tokens,
                     "distributed_optimizer": args.distributed_optimizer,
                     "sequences_per_step": sequences, "prompt": args.prompt,
                     "response": args.response, "optimizer_steps_per_update": 2},
        "tokens": {"per_update": tokens, "response_per_update": 2 * sequences * args.response},
        "flops": {"formula": FLOP_FORMULA, "per_update": 2 * per_step + per_step / 3,
                  "per_step": per_step, "old_logprobs": per_step / 3},
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_source": "--peak-tflops" if args.peak_tflops else
        "scripts/gpu_smoke.py PEAK_FLOPS" if peak else None,
        "mfu_note": None if peak else "not applicable: no peak for this device (--peak-tflops)",
    }


def save(report: dict, path: Path | None) -> str:
    """The report as JSON (the first updates' log-probs left out), written to ``path``."""
    shown = {k: v for k, v in report.items() if k not in ("ours", "reference")}
    for side in ("ours", "reference"):
        if side in report:
            shown[side] = {k: v for k, v in report[side].items() if k != "first_update"}
            first = report[side].get("first_update")
            if first:
                shown[side]["tokens_counted"] = first["tokens_counted"]
                shown[side]["first_update"] = {"loss": first["loss"],
                                               "grad_norm": first["grad_norm"]}
    text = json.dumps(shown, indent=1)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text


def run_ours(path: str, batches, args, cfg, device, flops, tokens, peak, dtype: str) -> dict:
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.actor.checkpoint import hf_parameters

    p = cfg.parallel
    try:
        actor = Actor(path, cfg.algorithm, 1, 1, micro_batch_size=p.micro_batch_size,
                      dtype=dtype, temperature=cfg.rollout.temperature, seed=args.seed,
                      transformer_impl=cfg.model.transformer_impl,
                      max_tokens_per_micro_batch=p.max_tokens_per_micro_batch,
                      recompute=p.recompute, bf16_grads=p.bf16_grads,
                      logprob_chunk_tokens=p.logprob_chunk_tokens, share_prompts=p.share_prompts,
                      pack_sequences=p.pack_sequences,
                      distributed_optimizer=args.distributed_optimizer)
        actor.begin_step(cfg.algorithm.warmup_steps)  # the full learning rate
        mine = argparse.Namespace(**{**vars(args), "profile": args.profile != "none"})
        out = measure(lambda: ours_update(actor, batches, device), mine, device, flops, tokens,
                      peak)
        out["optimizer_steps"] = actor.step
        out["layer_specs"] = "transformer_engine" if actor.transformer_engine else \
            "local (Megatron-Core's torch layers, SDPA attention)"
        out["optimizer"] = [type(o).__name__ for o in
                            getattr(actor.optimizer, "chained_optimizers", [actor.optimizer])]
        out["export"] = gpu_smoke.export_speed(actor, hf_parameters(path))
    except torch.cuda.OutOfMemoryError as err:
        out = {"error": f"out of memory: {str(err).splitlines()[0]}"}
    finally:
        actor = None
        gpu_smoke.free_device()
    return out


def run_reference(model, batches, args, cfg, device, flops, tokens, peak) -> dict:
    try:
        model.to(device).train()
        plain = PlainStep(model, cfg.algorithm, cfg.rollout.temperature, cfg.parallel, device)
        theirs = argparse.Namespace(**{**vars(args), "trace": None,
                                       "profile": args.profile == "both"})
        out = measure(lambda: reference_update(plain, batches, device), theirs, device, flops,
                      tokens, peak)
        out["attention"] = model.config._attn_implementation
        out["optimizer"] = plain.optimizer_name
        out["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    except torch.cuda.OutOfMemoryError as err:
        out = {"error": f"out of memory: {str(err).splitlines()[0]}"}
    finally:
        model.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def h100_bytes() -> float:
    """An 80 GB H100's usable memory: what ``--layers auto`` plans for without a GPU."""
    import memory_plan

    return memory_plan.H100_80GB * memory_plan.GIB


def _hf_config(config: dict):
    from transformers import AutoConfig

    config = dict(config)
    return AutoConfig.for_model(config.pop("model_type"), **config)


def _parameters(config: dict) -> int:
    import memory_plan

    return memory_plan.Arch.from_hf(config).params()


if __name__ == "__main__":
    main()
