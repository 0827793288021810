"""Side by side with TRL's GRPOTrainer: the demo's baseline job in both trainers, in one run.

    pip install -e ".[bench]"     # TRL, pinned; never one of the trainer's own dependencies
    python benchmarks/peer_trl.py [--steps 8] [--eval-at 4 8] \
        [--modes ours trl ours-transformers ours-rollout-logp ours-compiled trl-vllm] \
        [--rounds 1] [--out runs/peer-trl] [--seed 1] \
        [--model smollm2-135m] [--precision fp32]

The job (``experiment=cpu_demo`` without replay): the built-in model (``--model``), arithmetic
levels 3, 4, 6, G = 6 answers to each of 4 prompts a step in 2 updates of 2 prompts, answers up
to 32 tokens, lr 1e-5 after a 2-step linear warm-up, AdamW (0.9, 0.999, 1e-8, weight decay
0.1 off norms), gradient clipping 1.0, clip 0.2/0.28 with a dual clip at 10, token-level loss,
group-normalised advantages, no KL, the DAPO rule with the overlong penalty (8-token buffer), fp32, temperature 1.
``--precision bf16`` runs the same job in bf16 mixed precision in both trainers: this trainer with
``model.dtype=bfloat16`` (bf16 weights and rollouts, fp32 master weights and Adam state), TRL with
``bf16=True`` (fp32 weights and Adam state, bf16 autocast where accelerate applies it).
Both trainers see the same prompts in the same order (the trainer's seeded order, given to TRL
unshuffled), and TRL gets this project's reward function and learning-rate schedule, so the
jobs differ only where the docstring's DIFFERENCES say.

Modes: ``ours`` (vLLM rollouts), ``ours-transformers`` (the transformers engine),
``ours-rollout-logp`` (vLLM rollouts, the second update's old log-probs from vLLM's sampling
instead of a forward pass: ``algorithm.old_logp=rollout``), ``ours-compiled`` (the same with
vLLM's model compiled: ``rollout.cpu_compile=true``), ``trl`` (its transformers
generation), ``trl-vllm`` (its colocated vLLM mode). Each runs as a process of its
own, one after another in the order given with nothing else running (``--rounds``: the modes in
turn, so many times, each mode's figures over all its rounds), and its whole process
tree's memory is sampled (the peak): in a memory cgroup of its own where one can be made,
the anonymous and shared memory charged to it, each page once, every 0.05 s; elsewhere the
sum of the processes' proportional set sizes every 0.2 s, which slows the trainer measured
(``watched``). Figures per mode:
seconds per RL step (median after the first; a step is one generation and its updates), split
into generation with scoring and the rest (old log-probs, updates, weight sync), generated and
trained tokens/s (the answers' tokens, over generation and over the rest), peak memory, the whole
run's seconds (start-up, compilation and exports included); then each mode's policy at
``--eval-at`` steps (and the shared base model) is evaluated by ``tools/evaluate.py`` on the
demo's 128 held-out questions, and each curve is compared with the first mode's by a paired
bootstrap over questions (megatron_rlep/paired.py). A mode that fails is recorded with its
error's last line and the rest go on. Writes ``OUT/peer_trl.json``, ``OUT/peer_trl.md`` and
``OUT/peer_trl.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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

TRL_VERSION = "1.16.0"  # setup.py's bench extra
MODES = ("ours", "trl", "ours-transformers", "ours-rollout-logp", "ours-compiled", "trl-vllm")
OURS = {"ours": ("vllm", []), "ours-transformers": ("transformers", []),  # engine, overrides
        "ours-rollout-logp": ("vllm", ["algorithm.old_logp=rollout"]),
        "ours-compiled": ("vllm", ["algorithm.old_logp=rollout", "rollout.cpu_compile=true"])}
# what the two jobs still do differently, and which way it leans
DIFFERENCES = [
    ("old log-probs", "TRL computes them for all answers before the first update; this trainer "
     "takes the first update's from its own forward pass", "this trainer: one forward less"),
    ("old log-probs, mode ours-rollout-logp", "the second update's come from vLLM's sampling "
     "(algorithm.old_logp=rollout), not a forward pass", "this trainer: two forwards less than "
     "TRL; pi_old is the engine's numerics"),
    ("vLLM compiled, mode ours-compiled", "vLLM's model runs torch.compile'd "
     "(rollout.cpu_compile=true; TRL's generation runs eagerly): the engine compiles as the run "
     "starts, counted in the whole run's seconds, not in the step's", "this trainer: faster "
     "rollouts, a longer start"),
    ("micro-batch", "both run an update's answers as one micro-batch (TRL's "
     "per_device_train_batch_size, this trainer's parallel.micro_batch_size; the demo's own runs "
     "use 8)", "neither"),
    ("loss normaliser", "TRL divides each update's token sum by the step's tokens / 2; this "
     "trainer by the update's own tokens", "neither: the same in expectation"),
    ("advantage epsilon", "TRL divides by std + 1e-4, this trainer by std + 1e-6", "neither"),
    ("prompt sharing", "this trainer computes a group's prompt once per update "
     "(parallel.share_prompts); TRL computes every sequence whole", "this trainer: less work"),
    ("stop tokens", "each trainer stops at its own reading of the model's end tokens", "neither"),
    ("CPU runtime", "both run under Intel's OpenMP and tcmalloc (where installed), preloaded "
     "(cli.with_cpu_runtime): this trainer always does on a CPU host, and TRL gets the same "
     "here; under torch's own GNU OpenMP this trainer's updates after a checkpoint save are "
     "about 20% slower (benchmarks/openmp_runtime.py), under glibc's allocator its steps about "
     "10% (benchmarks/allocator.py)", "neither"),
    ("bf16 (--precision bf16)", "TRL keeps fp32 weights and Adam state and runs the model under "
     "accelerate's bf16 autocast; this trainer keeps bf16 weights (rollouts in bf16 too) with fp32 "
     "master weights and Adam state in its optimizer", "this trainer: half the weight bytes read"),
]


def job(args) -> dict:
    """The job's numbers, for both trainers."""
    return {"group": args.group, "prompts": args.prompts, "per_update": args.per_update,
            "max_tokens": args.max_tokens, "lr": 1e-5, "warmup_steps": 2, "weight_decay": 0.1,
            "grad_clip": 1.0, "clip_low": 0.2, "clip_high": 0.28, "dual_clip": 10.0,
            "overlong_buffer": min(8, args.max_tokens - 1), "levels": [3, 4, 6],
            "train_size": 32, "seed": args.seed, "precision": args.precision}


def ours_overrides(args, out: Path, engine: str, extra: tuple = ()) -> list[str]:
    j = job(args)
    return ["experiment=cpu_demo", f"model.path={args.model}", f"seed={args.seed}",
            f"run_dir={out}", f"rollout.engine={engine}", f"algorithm.total_steps={args.steps}",
            f"algorithm.rollouts_per_prompt={j['group']}", f"algorithm.prompts_per_rollout={j['prompts']}",
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
    py = sys.executable
    subprocess.run([py, "-m", "megatron_rlep.train", *ours_overrides(args, out, *OURS[mode])],
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
                      "generated_tokens": tokens, "trained_tokens": tokens})
    dtype = json.loads((out / "config.json").read_text())["model"]["dtype"]
    return {"steps": steps, "precision": dtype,
            "policies": {s: str(out / ("hf" if s == args.steps else f"policy-{s}"))
                         for s in args.eval_at}}


def trl_prompts(args) -> list:
    """The trainer's training examples in the order its seeded stream hands them out."""
    from megatron_rlep.data import load_examples
    from megatron_rlep.train import PromptStream

    j = job(args)
    examples = load_examples("arithmetic", "train", levels=j["levels"], n=j["train_size"],
                             seed=args.seed)
    return PromptStream(examples, args.seed).take(args.steps * args.prompts)


def run_trl(args, out: Path, use_vllm: bool) -> dict:
    """TRL's GRPOTrainer on the same job, in this process (``--run trl``)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.reward.scorer import Item, Scorer, settings

    j = job(args)
    if use_vllm:  # the colocated mode wants a (one-process) torch.distributed world
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    path = resolve_model_path(args.model)
    examples = trl_prompts(args)
    data = Dataset.from_list([{"prompt": list(e.prompt), "ground_truth": e.ground_truth,
                               "data_source": e.data_source} for e in examples])
    scorer = Scorer(settings("dapo"), max_length=j["max_tokens"],
                    overlong_buffer=j["overlong_buffer"], overlong_factor=1.0)
    record = {"steps": [], "generation_s": 0.0, "tokens": 0}

    def reward(prompts, completions, completion_ids, ground_truth, data_source, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = scorer.score([Item(s, t, g, None, len(ids)) for s, t, g, ids
                               in zip(data_source, texts, ground_truth, completion_ids)])
        record["tokens"] += sum(len(ids) for ids in completion_ids)
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
                                        "generated_tokens": 0, "trained_tokens": 0})
            row = record["steps"][-1]
            row["step_s"] += time.perf_counter() - self.began
            row["generation_s"] += record["generation_s"]
            row["generated_tokens"] += record["tokens"]
            row["trained_tokens"] += record["tokens"]
            record["generation_s"], record["tokens"] = 0.0, 0

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": j["weight_decay"]},
                                   {"params": rest, "weight_decay": 0.0}], lr=j["lr"],
                                  betas=(0.9, 0.999), eps=1e-8)
    # this trainer's schedule: RL step k (from 1) at lr * min(1, k / warm-up), all its updates
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i // per_step + 1) / j["warmup_steps"]))
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps * per_step, seed=args.seed,
        per_device_train_batch_size=args.per_update * args.group, steps_per_generation=per_step,
        gradient_accumulation_steps=1, num_generations=args.group,
        max_completion_length=j["max_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=j["clip_low"], epsilon_high=j["clip_high"], delta=j["dual_clip"],
        loss_type="dapo", scale_rewards="group", max_grad_norm=j["grad_clip"],
        shuffle_dataset=False, use_cpu=True, bf16=j["precision"] == "bf16", fp16=False,
        report_to="none",
        logging_steps=1, save_strategy="steps", save_steps=min(args.eval_at) * per_step,
        save_only_model=True, dataloader_num_workers=0, disable_dropout=True,
        use_vllm=use_vllm, vllm_mode="colocate", vllm_max_model_length=1024)
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=data,
                    processing_class=tokenizer, optimizers=(optimizer, schedule),
                    callbacks=[StepClock()])
    try:
        trainer.train()
    finally:
        scorer.close()
    mixed = trainer.accelerator.mixed_precision
    return {"steps": record["steps"],
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


def tree_pss(pid: int) -> int:
    """The sum of the proportional set sizes of ``pid`` and its descendants."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)]
               if p.is_running())


def watched(argv: list[str], log: Path) -> tuple[int, float, float, str]:
    """(exit status, wall seconds, peak memory in GiB of the process and its descendants, how it
    was read). Where a memory cgroup can be made (``memory_cgroup``) the process starts in one
    and the peak is of the memory charged to it (``cgroup_resident``), read every 0.05 s at
    about 15 us a read. Elsewhere it is the sum of their proportional set sizes, read every
    0.2 s; those reads walk each process's page tables under its memory lock and slowed the
    trainer measured by about 8% (2026-11-26). The kernel's per-process counts (peak or
    resident anonymous memory) count a forked worker's shared pages again in every worker."""
    import psutil

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
                    peak = max(peak, cgroup_resident(group) if group else tree_pss(child.pid))
                except (psutil.Error, OSError):
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


def record(args, argv, mode: str, round_: int, run: dict) -> None:
    """Train ``mode`` once more (its round ``round_``) in a process of its own, and fold it
    into ``run``: the step figures over the timed steps of every round so far, the largest peak,
    the median whole run; the first round's policies are the ones evaluated."""
    if "error" in run:
        return
    out = args.out if round_ == 0 else args.out / f"round-{round_}"
    print(f"[peer] {mode}: training {args.steps} steps (round {round_ + 1} of {args.rounds})",
          flush=True)
    log = out / f"{mode}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    code, wall, peak, memory = watched([sys.executable, __file__, *(argv or sys.argv[1:]),
                                        "--out", str(out), "--run", mode], log)
    timing = out / mode / "timing.json"
    if code or not timing.is_file():
        lines = log.read_text(errors="replace").splitlines()
        errors = [ln.strip() for ln in lines if re.search(r"\w+(Error|Exception)\b:", ln)]
        run.clear()
        run.update(error=errors[-1] if errors else f"exit status {code}", log=str(log))
        print(f"[peer] {mode} failed: {run['error']}", flush=True)
        return
    done = json.loads(timing.read_text())
    rounds = run.setdefault("rounds", [])
    rounds.append({"steps": done["steps"], "peak_gib": peak, "wall_s": wall})
    run.update(figures=figures([r["steps"] for r in rounds]), memory=memory,
               peak_gib=max(r["peak_gib"] for r in rounds),
               wall_s=statistics.median(r["wall_s"] for r in rounds),
               precision=done["precision"], policies=run.get("policies", done["policies"]))


def evaluate(args, policy: str, out: Path) -> dict[str, float]:
    """{question id: accuracy} of a policy on the demo's held-out questions."""
    from megatron_rlep import paired

    j = job(args)
    if not (out / "samples.jsonl").is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "evaluate.py"), f"model.path={policy}",
                        "datasets=[arithmetic]", f"levels=[{','.join(map(str, j['levels']))}]",
                        f"limit={args.eval_questions}", f"samples={args.eval_samples}",
                        "temperature=1.0", "top_p=1.0", f"max_tokens={j['max_tokens']}",
                        f"rollout.engine={args.eval_engine}", f"seed={args.seed}", f"out={out}",
                        "logging.wandb=disabled", "progress=false"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return paired.question_accuracy(rows)


def figures(rounds: list[list[dict]]) -> dict:
    """Medians over every round's steps after its first (which pays for start-up work)."""
    later = [s for steps in rounds for s in (steps[1:] or steps)]
    med = {k: statistics.median(s[k] for s in later) for k in later[0]}
    rest = med["step_s"] - med["generation_s"]
    return {"step_s": med["step_s"], "generation_s": med["generation_s"], "rest_s": rest,
            "generated_tokens_per_s": med["generated_tokens"] / max(med["generation_s"], 1e-9),
            "trained_tokens_per_s": med["trained_tokens"] / max(rest, 1e-9),
            "steps_timed": len(later)}


def table(result: dict) -> str:
    first = result["modes"][0]
    lines = ["| mode | s / RL step | generation + scoring s | rest s | generated tok/s | "
             "trained tok/s | peak memory GiB | whole run s | step vs " + first + " |",
             "|" + "---|" * 9]
    base = result["runs"].get(first, {}).get("figures", {}).get("step_s")
    for mode in result["modes"]:
        run = result["runs"][mode]
        if "figures" not in run:
            lines.append(f"| {mode} | failed: {run.get('error', '?')} |" + " |" * 7)
            continue
        f = run["figures"]
        ratio = f"{f['step_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {mode} | {f['step_s']:.1f} | {f['generation_s']:.1f} | {f['rest_s']:.1f} | "
                     f"{f['generated_tokens_per_s']:.0f} | {f['trained_tokens_per_s']:.0f} | "
                     f"{run['peak_gib']:.2f} | {run['wall_s']:.0f} | {ratio} |")
    lines += ["", "| mode | " + " | ".join(f"step {s}" for s in result["curve_steps"]) +
              " | area minus " + first + " (95%) |", "|" + "---|" * (len(result["curve_steps"]) + 2)]
    for mode, curve in result["curves"].items():
        area = curve.get("area_vs_first")
        note = "-" if area is None else \
            f"{area['diff']:+.3f} [{area['low']:+.3f}, {area['high']:+.3f}]"
        lines.append(f"| {mode} | " + " | ".join(f"{v:.3f}" for v in curve["acc"]) + f" | {note} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, curve in result["curves"].items():
        ax.plot(result["curve_steps"], curve["acc"], marker="o", label=mode)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"held-out accuracy ({result['eval']['samples']} answers per question)")
    ax.set_title("The demo's baseline job: this trainer and TRL")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--eval-at", type=int, nargs="+", default=[4, 8])
    p.add_argument("--group", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4, help="prompts a step")
    p.add_argument("--per-update", type=int, default=2, help="prompts an update")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--eval-questions", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--eval-engine", default="auto")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m",
                   help="the built-in model (default) or a Hugging Face model directory")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="both trainers: fp32, or bf16 mixed precision")
    p.add_argument("--rounds", type=int, default=1,
                   help="train every mode this many times, the modes in turn each round")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "peer-trl")
    p.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.prompts % args.per_update or max(args.eval_at) > args.steps or \
            any(s % min(args.eval_at) for s in args.eval_at) or args.steps % min(args.eval_at):
        p.error("--prompts must be a multiple of --per-update, and --steps and every --eval-at "
                "a multiple of the smallest --eval-at, none above --steps")
    args.out = args.out.resolve()
    if args.run:
        from megatron_rlep.cli import with_cpu_runtime

        with_cpu_runtime()  # what the trainer does for itself: both run under the same runtime
        out = args.out / args.run
        result = run_ours(args, out, args.run) if args.run in OURS else \
            run_trl(args, out, args.run == "trl-vllm")
        (out / "timing.json").write_text(json.dumps(result, indent=1))
        return 0
    try:
        import trl
    except ImportError:
        p.error('TRL is not installed: pip install -e ".[bench]" (TRL ' + TRL_VERSION + ")")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"job": job(args), "modes": args.modes, "rounds": args.rounds,
              "trl": trl.__version__, "runs": {},
              "differences": DIFFERENCES, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "eval": {"questions": args.eval_questions, "samples": args.eval_samples}}
    for round_ in range(args.rounds):  # the modes in turn, round after round
        for mode in args.modes:
            record(args, argv, mode, round_, result["runs"].setdefault(mode, {}))
    print("[peer] evaluating the policies", flush=True)
    from megatron_rlep import paired
    from megatron_rlep.builtin_model import resolve_model_path

    base = evaluate(args, resolve_model_path(args.model), args.out / "eval" / "base")
    result["curve_steps"] = [0, *args.eval_at]
    records = {}
    for mode in args.modes:
        if "policies" not in result["runs"][mode]:
            continue
        records[mode] = {0: base, **{int(s): evaluate(args, path, args.out / "eval" / f"{mode}-{s}")
                                     for s, path in result["runs"][mode]["policies"].items()}}
    result["curves"] = {}
    first = next(iter(records), None)
    for mode, rec in records.items():
        acc = [sum(rec[s].values()) / len(rec[s]) for s in result["curve_steps"]]
        result["curves"][mode] = {"acc": acc, "area_vs_first": None if mode == first else
                                  paired.curves(records[first], rec, 0.5)["area"]}
    (args.out / "peer_trl.json").write_text(json.dumps(result, indent=1))
    text = table(result)
    (args.out / "peer_trl.md").write_text(text + "\n")
    if result["curves"]:
        plot(result, args.out / "peer_trl.png")
    print(text)
    return 0 if all("figures" in r for r in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
