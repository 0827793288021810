"""The GPU path in a few minutes, on one CUDA device (scripts/gpu_smoke.sh sets it up).

    python scripts/gpu_smoke.py OUT [--model PATH] [--allow-cpu]

1. Log-prob parity: the Megatron-Core actor (bf16 on a GPU; TE layer specs when Transformer
   Engine imports, local ones otherwise, said in one line) against transformers on a fixed
   sequence. bf16 is judged against bf16: the actor's distance to transformers in fp32 may be
   at most twice transformers-bf16's own distance to fp32, plus 0.02 nats.
   Packed sequences (parallel.pack_sequences: the THD layout, Transformer Engine's packed
   attention with TE) against padded rows on three sequences of different lengths: at most 0.02
   nats apart on average in bf16 (1e-4 in fp32).
   The NaN guard: an update whose advantages are NaN (so its gradients are) is skipped and
   leaves the weights as they were (Megatron-Core's own step would apply it in bf16).
   The same parity checks on a small random Qwen3-MoE (Megatron-Core's MoE layer and router),
   whose experts must run as Transformer Engine's grouped GEMM (TEGroupedMLP) where TE is in
   use, with an exact export through the grouped weights' names.
2. Two RL steps of the trainer (rollout.engine=auto: vLLM where it imports) with packed
   sequences and rollout.check_sync=true: after each weight sync the engine's log-probs of a
   fixed sequence must match the actor's (0.1 nats in bf16, 1e-3 in fp32).
3. Tokens/s of rollout and update, sync time and peak memory, from the run's metrics; the peak
   next to tools/memory_plan.py's prediction for the same shape and settings (two ratios: its
   tensors against torch's allocated peak, the whole plan with the CUDA context, NCCL and
   fragmentation against the device memory in use), and the update's MFU on a known GPU.
4. At a realistic shape (``--scale``: Qwen2.5-1.5B's configuration on a GPU, seeded random
   weights, the smoke model's tokenizer): the distributed optimizer takes an update, saves, and
   a fresh actor that loads the checkpoint takes the next update as the run that went on (its
   weights within 5% of that update's size of them; exact on the CPU), with the checkpoint's
   bytes against the planner's (actor/checkpoint.py disk_plan) and its write speed, and learner
   0's side of a weight broadcast timed (the bucketed export, each bucket flattened into the
   buffer that goes on the wire; the wire needs a second device); then two RL
   steps at that shape (distributed optimizer, selective recompute, chunked log-probs, packed
   sequences, 512 response tokens on a GPU) with the planner's ratio, tokens/s and MFU.
Prints each part's result and seconds as it ends and rewrites OUT/smoke.json after each (a
run stopped at a time limit keeps the parts it finished; each RL run's log is OUT/<run>.log as
it goes); exit status 1 when a check fails. --allow-cpu runs
the same in fp32 without CUDA (what the test suite does with a tiny model; ``--scale`` then
names a config.json to take, or none).

``--model shape:DIR`` takes a directory with a model's config and tokenizer but no weights
(what scripts/gpu_smoke_carry.sh puts in .smoke/ for the built-in model, whose 98 MB file does
not travel to a machine without network) and gives it seeded random weights: the shapes,
kernels, memory and every check stay meaningful, the rewards do not, so the two steps add an
entropy bonus that moves the weights whatever the rewards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_device() -> None:
    """After an actor is deleted: its process group gone, its memory back to the GPU (the next
    actor, or the training run's subprocess, wants it)."""
    import gc

    import torch

    from megatron_rlep import platform

    platform.destroy_distributed()
    gc.collect()  # a deleted actor frees itself (actor.py breaks its cycles); anything else too
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def logprob_parity(model: str, dtype: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_rlep import platform
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.config import AlgorithmConfig

    actor = Actor(model, AlgorithmConfig(), 1, 1, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(actor.hf_path)
    text = ("Question: what is 17 * 23 + 4? Think step by step.\n17 * 23 = 391, and 391 + 4 = "
            "395.\nAnswer: 395")
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    targets = ids[0, 1:, None]

    def logp(logits):
        return torch.log_softmax(logits[0, :-1].float().cpu(), -1).gather(-1, targets)[:, 0]

    ours = logp(actor.logits(ids))
    layout = expert_layout(actor)
    packing = packing_parity(actor, tokenizer, dtype)
    guard = nan_guard(actor, tokenizer)
    reference = {}
    for name, torch_dtype in (("float32", torch.float32), (dtype, actor.dtype)):
        hf = AutoModelForCausalLM.from_pretrained(actor.hf_path, dtype=torch_dtype)
        with torch.no_grad():
            reference[name] = logp(hf.to(platform.device())(ids.to(platform.device())).logits)
        del hf
    del actor
    free_device()
    exact = reference["float32"]
    result = {"tokens": len(targets), "dtype": dtype,
              "actor_vs_fp32_max": (ours - exact).abs().max().item(),
              "actor_vs_fp32_mean": (ours - exact).abs().mean().item(),
              "transformers_vs_fp32_mean": (reference[dtype] - exact).abs().mean().item()}
    allowed = 2 * result["transformers_vs_fp32_mean"] + (0.02 if dtype == "bfloat16" else 1e-4)
    result["allowed_mean"] = allowed
    result["packing"], result["nan_guard"] = packing, guard
    result["ok"] = result["actor_vs_fp32_mean"] <= allowed and packing["ok"] and guard["ok"]
    if layout is not None:
        result["experts"] = layout
        result["ok"] = result["ok"] and layout["ok"]
    return result


def expert_layout(actor) -> dict | None:
    """A MoE actor's expert module, which must be Transformer Engine's grouped GEMM
    (TEGroupedMLP) with TE's layers and SequentialMLP without, and whether its export (through
    the grouped weights' names) gives back the checkpoint's tensors exactly, in the actor's
    dtype. None for a dense model."""
    import torch
    from safetensors.torch import load_file

    experts = getattr(actor.module.decoder.layers[0].mlp, "experts", None)
    if experts is None:
        return None
    kind = type(experts).__name__
    want = "TEGroupedMLP" if actor.transformer_engine else "SequentialMLP"
    source = {k: v for f in Path(actor.hf_path).glob("*.safetensors") for k, v in load_file(f).items()}
    exported = {k: v.cpu() for bucket in actor.export_hf(list) for k, v in bucket}
    exact = exported.keys() == source.keys() and all(
        torch.equal(v, source[k].to(v.dtype)) for k, v in exported.items())
    return {"module": kind, "expected": want, "export_exact": exact, "ok": kind == want and exact}


def nan_guard(actor, tokenizer) -> dict:
    """One update with NaN advantages: skipped, the weights unchanged."""
    import torch

    from megatron_rlep.actor.batch import SequenceBatch

    ids = [tokenizer(t)["input_ids"] for t in ("Question: 1 + 1?\nAnswer: 2",
                                                 "Question: 3 * 3?\nAnswer: 9")]
    batch = SequenceBatch(ids, [3, 3], advantages=torch.full((2,), float("nan")))

    def weights():
        return {k: v.detach().cpu().clone() for bucket in actor.export_hf(list) for k, v in bucket}

    before = weights()
    skipped = actor.train_step(batch)["skipped"]
    unchanged = all(torch.equal(before[k], v) for k, v in weights().items())
    return {"skipped": skipped, "weights_unchanged": unchanged, "ok": skipped and unchanged}


def packing_parity(actor, tokenizer, dtype: str) -> dict:
    """Log-probs of three sequences of different lengths packed end to end against padded."""
    from megatron_rlep.actor.batch import SequenceBatch

    texts = ["Question: 2 + 2?\nAnswer: 4",
             "Question: what is 12 * 12? Think step by step.\n12 * 12 = 144.\nAnswer: 144",
             "Question: 9 - 3 - 1?\n9 - 3 = 6, 6 - 1 = 5.\nAnswer: 5"]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    batch = SequenceBatch(ids, [3] * len(ids))
    out = {}
    for pack in (False, True):
        actor.pack_sequences = pack
        out[pack] = actor.logprobs(batch)[0]
    actor.pack_sequences = False
    diffs = [(a - b).abs() for a, b in zip(out[False], out[True])]
    mean = (sum(d.sum() for d in diffs) / sum(len(d) for d in diffs)).item()
    return {"packed_vs_padded_mean": mean, "packed_vs_padded_max": max(d.max().item() for d in diffs),
            "ok": mean <= (0.02 if dtype == "bfloat16" else 1e-4)}


def moe_model(tokenizer_dir: str, out: Path) -> str:
    """A small random Qwen3-MoE (8 experts, 2 a token, QK norms) with ``tokenizer_dir``'s
    tokenizer: the MoE layer, its router and the dispatcher on this device."""
    from transformers import AutoTokenizer

    from megatron_rlep.builtin_model import resolve_model_path

    vocab = len(AutoTokenizer.from_pretrained(resolve_model_path(tokenizer_dir)))
    config = {"model_type": "qwen3_moe", "vocab_size": (vocab + 127) // 128 * 128,
              "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
              "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 2048}
    return scaled_model(config, tokenizer_dir, out, "float32")


def random_weights(shape_dir: Path, out: Path) -> str:
    """A checkpoint with ``shape_dir``'s config and tokenizer and seeded random weights."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape_dir),
                                             dtype=torch.float32)
    model.save_pretrained(out)
    for f in shape_dir.iterdir():
        if f.name != "config.json":
            shutil.copy(f, out / f.name)
    return str(out)


def two_steps(model: str, dtype: str, run_dir: Path, entropy_coef: float,
              response_tokens: int = 32, extra: tuple[str, ...] = ()) -> dict:
    overrides = [f"model.path={model}", f"model.dtype={dtype}", "data.levels=[1,2]",
                 "data.max_prompt_length=128", "parallel.recompute=selective",
                 "parallel.logprob_chunk_tokens=64",
                 "data.train_size=16", "data.eval_size=4", "algorithm.total_steps=2",
                 "algorithm.rollouts_per_prompt=4", "algorithm.prompts_per_rollout=4",
                 "algorithm.prompts_per_update=2", "algorithm.warmup_steps=0",
                 "algorithm.replay.refresh=true",  # RLEP from an empty live pool
                 "parallel.pack_sequences=true",
                 f"algorithm.entropy_coef={entropy_coef}",
                 f"rollout.max_response_length={response_tokens}", "rollout.check_sync=true",
                 "rollout.gpu_memory_utilization=0.3", "logging.eval_every=0",
                 "logging.save_every=0", "logging.wandb=disabled", "logging.progress=false",
                 *extra, f"run_dir={run_dir}"]
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}  # the actor's above
    log = run_dir.parent / f"{run_dir.name}.log"  # written as it runs: a killed smoke keeps it
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "megatron_rlep.train", *overrides],
                              cwd=REPO, text=True, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        return {"ok": False, "error": log.read_text()[-3000:]}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) > 0]
    limit = 0.1 if dtype == "bfloat16" else 1e-3
    keys = ["sync/max_logprob_diff", "time/sync_s", "perf/rollout_tokens_per_s",
            "perf/update_tokens_per_s", "perf/peak_memory_gib", "perf/device_memory_used_gib",
            "time/step_s"]
    result = {k: [r.get(k) for r in rows] for k in keys}
    result["sync_limit"] = limit
    result["planner"] = planner_against_measured(model, overrides, result)
    result["ok"] = len(rows) == 2 and all(d is not None and d <= limit
                                          for d in result["sync/max_logprob_diff"])
    return result


# Qwen2.5-1.5B's configuration (its config.json): the realistic shape a GPU runs with --scale
QWEN25_1_5B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
               "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
               "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_act": "silu",
               "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True}


def random_model(config: dict, dtype: str, device: str = "cpu"):
    """transformers' model of ``config`` (a config.json's keys) with seeded random weights in
    ``dtype``, made on ``device`` (benchmarks/gpu_update.py makes its models on the GPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(1234)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype))


def scaled_model(config: dict, tokenizer_dir: str, out: Path, dtype: str) -> str:
    """Seeded random weights of ``config`` in ``dtype``, with ``tokenizer_dir``'s tokenizer."""
    import shutil

    from megatron_rlep.builtin_model import resolve_model_path

    random_model(config, dtype).save_pretrained(out)
    source = Path(resolve_model_path(tokenizer_dir))
    for f in source.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    return str(out)


def export_speed(actor, parameters: int) -> dict:
    """Learner 0's side of a weight broadcast without the wire (that needs a second device):
    the actor's bucketed export, each bucket flattened into the buffer the broadcast sends
    (bridge.flat_bucket); the faster of two passes, its bytes against the parameters'."""
    import torch

    from megatron_rlep.rollout.bridge import flat_bucket

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def count(stream):  # the export's consumer: each bucket copied flat, as the broadcast does
        size = buckets = 0
        for bucket in stream:
            size += flat_bucket(bucket, device).numel()
            buckets += 1
        return size, buckets

    seconds = []
    for _ in range(2):
        sync()
        start = time.perf_counter()
        size, buckets = actor.export_hf(count)
        sync()
        seconds.append(time.perf_counter() - start)
    width = torch.empty((), dtype=actor.dtype).element_size()
    return {"bytes": size, "parameter_bytes": parameters * width, "buckets": buckets,
            "seconds": min(seconds), "gb_per_s": size / 1e9 / min(seconds)}


def optimizer_resume(model: str, dtype: str, out: Path) -> dict:
    """The distributed optimizer's update, save and resume (see the module docstring)."""
    import torch
    from transformers import AutoTokenizer

    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.actor.batch import SequenceBatch
    from megatron_rlep.actor.checkpoint import disk_plan, hf_parameters
    from megatron_rlep.config import AlgorithmConfig

    algorithm = AlgorithmConfig(lr=1e-3, warmup_steps=0, grad_clip=1.0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [f"Question: what is {a} * {b}?\nAnswer: {a * b}" for a, b in ((3, 4), (12, 7), (9, 9))]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    batch = SequenceBatch(ids, [4] * len(ids), advantages=torch.tensor([1.0, -0.5, -0.5]))

    def actor():
        return Actor(model, algorithm, 1, 1, dtype=dtype, distributed_optimizer=True,
                     recompute="selective", logprob_chunk_tokens=64)

    def weights(a):
        return {k: v.detach().float().cpu() for bucket in a.export_hf(list) for k, v in bucket}

    first = actor()
    kinds = [type(o).__name__ for o in first.optimizer.chained_optimizers]
    before = weights(first)
    first.train_step(batch)
    after_one = weights(first)
    export = export_speed(first, hf_parameters(model))
    start = time.perf_counter()
    first.save(out / "ckpt")
    write_s = time.perf_counter() - start
    first.train_step(batch)
    went_on = weights(first)
    del first
    free_device()
    resumed = actor()
    resumed.load(out / "ckpt")
    resumed.train_step(batch)
    diff = sum((v - went_on[k]).abs().sum().item() for k, v in weights(resumed).items())
    step = sum((went_on[k] - after_one[k]).abs().sum().item() for k in went_on)
    moved = sum((after_one[k] - before[k]).abs().sum().item() for k in before)
    del resumed
    free_device()
    size = sum(f.stat().st_size for f in (out / "ckpt").rglob("*") if f.is_file())
    planned = disk_plan(hf_parameters(model), dtype == "bfloat16", 1, 1, 1, False,
                        distributed_optimizer=True)["checkpoint"]
    limit = 0.05 * step if torch.cuda.is_available() else 0.0
    return {"optimizers": kinds, "first_update_moved": moved, "second_update": step,
            "resumed_vs_went_on": diff, "checkpoint_gib": size / 2**30,
            "planned_checkpoint_gib": planned / 2**30, "checkpoint_ratio": size / planned,
            "write_s": write_s, "write_gb_per_s": size / 1e9 / write_s, "export": export,
            "ok": export["bytes"] == export["parameter_bytes"] and kinds == ["DistributedOptimizer"] and moved > 0 and step > 0 and diff <= limit}


def at_scale(config: dict, tokenizer_dir: str, dtype: str, out: Path) -> dict:
    """Part 4 of the module docstring: the realistic shape."""
    import torch

    model = scaled_model(config, tokenizer_dir, out / "scale-model", dtype)
    resume = optimizer_resume(model, dtype, out / "scale-resume")
    print(f"distributed optimizer, save and resume: {json.dumps(resume)}", flush=True)
    response = 512 if torch.cuda.is_available() else 32
    steps = two_steps(model, dtype, out / "scale-run", 0.01, response,
                      ("parallel.distributed_optimizer=true",))
    return {"resume": resume, "steps": steps, "ok": resume["ok"] and steps["ok"]}


# bf16 dense tensor-core peaks (NVIDIA's data sheets), for MFU; the first name that the
# device's name contains counts, so the PCIe and NVL cards come before the SXM ones
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H100": 989e12,
              "H200": 989e12, "A100": 312e12}


def device_peak_flops(name: str) -> float | None:
    """The dense bf16 peak (FLOP/s) of a device named ``name`` (torch's name for it), or None."""
    return next((f for k, f in PEAK_FLOPS.items() if k in name), None)


def planner_against_measured(model: str, overrides: list[str], result: dict) -> dict:
    """tools/memory_plan.py's update peak for this run's shape and settings (one GPU; with the
    transformers engine its bf16 model copy added, which the planner leaves to vLLM) against
    what the run measured, twice: its tensors (the plan less the CUDA context, NCCL and
    fragmentation) against torch's allocated peak (``ratio``), and the whole plan against the
    device memory in use after a step (``device_ratio``); and the update's MFU
    (6 x parameters x tokens/s)."""
    import torch

    sys.path.insert(0, str(REPO / "tools"))
    import memory_plan

    from megatron_rlep.config import compose
    from megatron_rlep.rollout import engine_kind

    cfg = compose([o for o in overrides if not o.startswith("run_dir=")])
    p, longest = cfg.parallel, cfg.data.max_prompt_length + cfg.rollout.max_response_length
    arch = memory_plan.Arch.from_hf(json.loads((Path(model) / "config.json").read_text()))
    vllm = cfg.rollout.gpu_memory_utilization if engine_kind("auto") == "vllm" else 0.0
    gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else \
        memory_plan.H100_80GB * memory_plan.GIB
    plan = memory_plan.plan(arch, 1, 1, 1, p.micro_batch_size * longest,
                            p.micro_batch_size * cfg.rollout.max_response_length, p.recompute,
                            False, False, p.bf16_grads, p.logprob_chunk_tokens, vllm, gpu)
    predicted = plan["update_peak"] + (0.0 if vllm else 2 * arch.params())
    tensors = predicted - plan["cuda_context"] - plan["nccl"] - plan["fragmentation"]
    measured = max((m for m in result["perf/peak_memory_gib"] if m is not None), default=None)
    used = max((m for m in result["perf/device_memory_used_gib"] if m is not None), default=None)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    peak = device_peak_flops(name)
    speed = [t for t in result["perf/update_tokens_per_s"] if t]
    return {"predicted_update_peak_gib": predicted / 2**30,
            "predicted_tensors_gib": tensors / 2**30, "measured_peak_gib": measured,
            "ratio": measured * 2**30 / tensors if measured else None,
            "device_used_gib": used, "device_ratio": used * 2**30 / predicted if used else None,
            "parameters": arch.params(),
            "mfu": 6 * arch.params() * max(speed) / peak if peak and speed else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default=os.environ.get("SMOKE_MODEL", "smollm2-135m"))
    parser.add_argument("--allow-cpu", action="store_true", help="fp32 on the CPU (tests)")
    parser.add_argument("--scale", default="auto",
                        help="the realistic shape: qwen2.5-1.5b, a config.json, or none "
                             "(auto: qwen2.5-1.5b on a GPU, none on the CPU)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("error: no CUDA device is visible; run this on a GPU machine "
              "(or with --allow-cpu to check the script itself in fp32)", file=sys.stderr)
        return 2
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    args.out.mkdir(parents=True, exist_ok=True)
    entropy_coef = 0.0
    if args.model.startswith("shape:"):
        args.model, entropy_coef = random_weights(Path(args.model[6:]), args.out / "model"), 0.01
    from megatron_rlep import platform
    from megatron_rlep.rollout import engine_kind

    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "model": args.model, "engine": engine_kind("auto"),
              "transformer_engine": platform.transformer_engine_unavailable() or "used",
              "seconds": {}}
    scale = args.scale if args.scale != "auto" else \
        "qwen2.5-1.5b" if torch.cuda.is_available() else "none"
    config = None if scale == "none" else QWEN25_1_5B if scale == "qwen2.5-1.5b" else \
        json.loads(Path(scale).read_text())
    parts = [("parity", "log-prob parity", lambda: logprob_parity(args.model, dtype)),
             ("moe_parity", "Qwen3-MoE log-prob parity",
              lambda: logprob_parity(moe_model(args.model, args.out / "moe"), dtype)),
             ("steps", "two RL steps",
              lambda: two_steps(args.model, dtype, args.out / "run", entropy_coef))]
    if config is not None:
        parts.append(("scale", f"at scale ({scale})",
                      lambda: at_scale(config, args.model, dtype, args.out)))
    for key, title, part in parts:  # smoke.json after each part: a killed run keeps what ran
        start = time.perf_counter()
        report[key] = part()
        report["seconds"][key] = round(time.perf_counter() - start, 1)
        shown = report[key]["steps"] if key == "scale" else report[key]
        print(f"{title} ({dtype}, {report['seconds'][key]} s): {json.dumps(shown)}", flush=True)
        report["ok"] = all(report[k]["ok"] for k, _, _ in parts if k in report)
        (args.out / "smoke.json").write_text(json.dumps(report, indent=1))
    print("SMOKE OK" if report["ok"] else "SMOKE FAILED", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
