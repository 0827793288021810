"""benchmarks/peer_trl.py at a tiny size, so it cannot silently rot: this trainer (transformers
engine) and TRL's GRPOTrainer each train one step of the same tiny job on a tiny random model
(SmolLM2's tokenizer and chat template) in their own process, their policies are evaluated by
tools/evaluate.py, and the table, JSON and picture are written; and the two sides are
configured alike, through the functions the benchmark itself builds them with."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled
from tiny import make_model

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "peer_trl.py"
sys.path.insert(0, str(BENCH.parent))
import peer_trl  # noqa: E402

# 512 MiB touched, a forked child that keeps it (shared, copy-on-write), then 256 MiB more
FORKED = """
import os, time
a = bytearray(512 << 20)
if os.fork() == 0:
    time.sleep(1.5)
    os._exit(0)
b = bytearray(256 << 20)
time.sleep(1.5)
os.wait()
"""


@pytest.mark.parametrize("reading", ["cgroup", "pss"])
def test_a_forked_childs_shared_pages_count_once_in_the_peak(tmp_path, monkeypatch, reading):
    if reading == "pss":
        monkeypatch.setattr(peer_trl, "memory_cgroup", lambda: None)
    else:
        probe = peer_trl.memory_cgroup()
        if probe is None:
            pytest.skip("no memory cgroup can be made here (not root, or no cgroup v1)")
        probe.rmdir()
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    code, wall, peak, how = peer_trl.watched([sys.executable, str(script)], tmp_path / "log")
    assert code == 0 and wall > 1.5
    assert how == {"cgroup": "cgroup anonymous + shared", "pss": "proportional set sizes"}[reading]
    # 0.75 GiB and the interpreter; counted twice the shared 512 MiB would make it 1.25
    assert 0.75 <= peak < 1.0, peak


def test_a_failed_runs_reason_is_the_trainers_sentence_not_the_wrapping_exception():
    log = ("checkpoints: 1.5 GiB each\n"
           "error: /tmp/run has 0.4 GiB free but the run needs 2.5 GiB: free space or set run_dir\n"
           "Traceback (most recent call last):\n"
           "subprocess.CalledProcessError: Command '['python', '-m', 'megatron_rlep.train']' "
           "returned non-zero exit status 2.\n")
    assert peer_trl.failure(log, 1).startswith("error: /tmp/run has 0.4 GiB free")
    assert peer_trl.failure("Traceback\nValueError: bad shape\n", 1) == "ValueError: bad shape"
    assert peer_trl.failure("nothing said\n", 137) == "exit status 137"


def test_a_job_that_does_not_divide_into_updates_is_refused_in_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--prompts", "3", "--per-update", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--prompts must be a multiple of --per-update" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before anything ran


def test_reuse_reads_a_finished_round_and_runs_one_whose_settings_changed(tmp_path, monkeypatch):
    ran = []

    def run(argv, log):  # stands in for the mode's own process: writes what it would
        out = Path(argv[len(argv) - argv[::-1].index("--out")]) / argv[-1]  # the last --out
        out.mkdir(parents=True, exist_ok=True)
        (out / "timing.json").write_text(json.dumps({
            "steps": [{"step_s": 2.0, "generation_s": 1.0, "generated_tokens": 10, "answers": 2,
                       "trained_tokens": 30}] * 2, "seed": int(argv[-3]),
            "policies": {}, "precision": "float32", "setup": "-"}))
        ran.append(argv)
        return 0, 5.0, 1.5, "proportional set sizes"

    monkeypatch.setattr(peer_trl, "watched", run)

    def record(*extra, modes=("ours",)):  # round 2 (index 1) of every mode, as main runs it
        argv = ["--modes", *modes, "--steps", "2", "--eval-at", "2", "--out", str(tmp_path),
                *extra]
        args, result = peer_trl.parse_args(argv), {}
        whole = args.reuse and all(peer_trl.kept_run(args, m, 1) for m in modes)
        for mode in modes:
            peer_trl.record(args, argv, mode, 1, result.setdefault(mode, {}), whole)
        return result

    first = record("--seed-per-round")
    assert len(ran) == 1 and first["ours"]["rounds"][0]["seed"] == 2
    assert first["ours"]["wall_s"] == 5.0
    assert record("--seed-per-round", "--reuse") == first and len(ran) == 1  # read, not run
    record("--seed-per-round")  # without --reuse a round runs again
    assert len(ran) == 2
    record("--reuse")  # another seed for the round: run again
    assert len(ran) == 3
    (tmp_path / "round-1" / "ours" / "timing.json").unlink()  # a round half written
    record("--reuse")
    assert len(ran) == 4
    # a round with a mode missing runs whole: ours again beside trl, not read from earlier
    record("--reuse", modes=("ours", "trl"))
    assert [a[-1] for a in ran[4:]] == ["ours", "trl"]
    record("--reuse", modes=("ours", "trl"))
    assert len(ran) == 6


@pytest.mark.parametrize("job, precision", [("short", "fp32"), ("short", "bf16"),
                                            ("long", "fp32")])
def test_the_two_trainers_are_configured_alike(tmp_path, job, precision):
    """The benchmark's own configurations of both sides (``trl_config``, ``trl_optimizer``,
    ``ours_overrides`` composed as the trainer composes them): no activation recompute on either
    side, the same optimizer steps per RL step, group size, prompts in the same order, lengths,
    precision and optimizer settings."""
    pytest.importorskip("trl")
    import torch

    from megatron_rlep import tasks
    from megatron_rlep.config import compose
    from megatron_rlep.data import load_examples
    from megatron_rlep.producer import PromptStream

    args = peer_trl.parse_args(["--job", job, "--precision", precision, "--out", str(tmp_path)])
    trl = peer_trl.trl_config(args, tmp_path / "trl")
    ours = compose(peer_trl.ours_overrides(args, tmp_path / "ours", "ours"))
    a = ours.algorithm
    # gradient checkpointing off on both: TRL's own default is on (trl/trainer/base_config.py);
    # this trainer recomputes only its output layer, 64 answer tokens at a time (the CPU jobs')
    assert trl.gradient_checkpointing is False
    assert ours.parallel.recompute == "none" and ours.parallel.logprob_chunk_tokens == 64
    # the same optimizer steps per RL step, group size and prompts a step
    assert trl.steps_per_generation * trl.num_iterations // trl.gradient_accumulation_steps == \
        a.prompts_per_rollout // a.prompts_per_update * a.epochs == 2
    assert trl.num_generations == a.rollouts_per_prompt == 6
    assert trl.generation_batch_size // trl.num_generations == a.prompts_per_rollout == 4
    assert trl.per_device_train_batch_size == a.prompts_per_update * a.rollouts_per_prompt == \
        ours.parallel.micro_batch_size  # an update's answers as one micro-batch on both sides
    # the same prompts in the same order: TRL's list against the trainer's own stream
    train = load_examples(ours.data.train, "train", ours.data.data_dir,
                          **tasks.loader_kwargs(ours.data.train, ours.data.levels,
                                                ours.data.train_size, ours.seed))
    stream = PromptStream(train, ours.seed)
    mine = [stream.at(p) for p in stream.take(args.steps * a.prompts_per_rollout)]
    assert [(e.id, e.prompt) for e in peer_trl.trl_prompts(args)] == \
        [(e.id, e.prompt) for e in mine]
    if job == "long":
        assert mine[0].prompt[:1] == peer_trl.LONG_PROMPT and len(mine[0].prompt) == 2
    # the same lengths: answers, and prompts that neither side cuts
    assert trl.max_completion_length == ours.rollout.max_response_length == \
        {"short": 32, "long": 512}[job]
    assert getattr(trl, "max_prompt_length", None) is None  # TRL 1.16 does not cut prompts
    assert a.overlong_buffer == 8
    # the same precision
    assert trl.bf16 == (ours.model.dtype == "bfloat16") == (precision == "bf16")
    assert not trl.fp16
    # the same optimizer: a fused AdamW, its settings and weight decay off one-dimensional
    # parameters, and the same schedule (the first RL step's updates at lr / 2)
    assert (trl.learning_rate, trl.adam_beta1, trl.adam_beta2, trl.adam_epsilon,
            trl.weight_decay, trl.max_grad_norm) == (a.lr, 0.9, 0.999, a.adam_eps,
                                                     a.weight_decay, a.grad_clip)
    assert not a.weight_decay_all
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer, schedule = peer_trl.trl_optimizer(model, trl, 2, a.warmup_steps)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == \
        [(1, a.weight_decay), (3, 0.0)]
    assert schedule.get_last_lr() == [a.lr / 2] * 2
    # the loss: clip range, dual clip, token-level aggregation, no KL
    assert (trl.epsilon, trl.epsilon_high, trl.delta, trl.beta, trl.loss_type) == \
        (a.clip_low, a.clip_high, a.dual_clip, a.kl_coef, "dapo")
    assert a.loss_agg == "token-mean" and not trl.shuffle_dataset


@pytest.mark.e2e
@pytest.mark.parametrize("precision, rounds", [("fp32", 2), ("bf16", 1)])
def test_both_trainers_train_the_same_tiny_job_and_are_measured_and_evaluated(tmp_path, precision,
                                                                             rounds):
    out = tmp_path / "peer"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--precision", precision, "--modes", "ours-transformers",
         "trl", "--rounds", str(rounds), "--steps", "1",
         "--eval-at", "1", "--group", "2", "--prompts", "2", "--per-update", "1",
         "--max-tokens", "8", "--eval-questions", "6", "--eval-samples", "1",
         "--eval-engine", "transformers", "--model", str(make_model(tmp_path / "model")),
         "--out", str(out), *(["--seed-per-round"] if rounds == 2 else [])],
        capture_output=True, text=True, timeout=scaled(900))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "peer_trl.json").read_text())
    assert result["modes"] == ["ours-transformers", "trl"]
    # each trainer ran in the precision asked for: its own record of it
    assert result["runs"]["ours-transformers"]["precision"] == \
        {"fp32": "float32", "bf16": "bfloat16"}[precision]
    assert result["runs"]["trl"]["precision"] == \
        {"fp32": "float32", "bf16": "float32 weights, bf16 autocast"}[precision]
    # what each side ran with, from the trainers themselves: no recompute on either side, TRL's
    # fused AdamW, and the answers' tokens within 20% of each other in every round
    assert result["runs"]["trl"]["setup"]["gradient_checkpointing"] is False
    assert result["runs"]["trl"]["setup"]["optimizer_fused"] is True
    assert result["runs"]["ours-transformers"]["setup"]["activation_recompute"] == "none"
    for ours, trl in zip(result["runs"]["ours-transformers"]["rounds"],
                         result["runs"]["trl"]["rounds"]):
        generated = [sum(s["generated_tokens"] for s in each["steps"]) for each in (ours, trl)]
        assert abs(generated[1] - generated[0]) <= 0.2 * generated[0], generated
    assert result["runs"]["ours-transformers"]["trl_over_this"]["rounds"] == rounds
    for mode in result["modes"]:
        run = result["runs"][mode]
        f = run["figures"]
        assert 0 < f["generation_s"] < f["step_s"], (mode, f)
        # the modes took turns: each trained once a round, its figures over every round
        assert len(run["rounds"]) == f["steps_timed"] == rounds, (mode, f)
        if rounds == 2:
            assert (out / "round-1" / mode / "timing.json").is_file(), mode
        for each in run["rounds"]:
            # one step: 2 prompts x 2 answers of at most 8 tokens, generated and trained
            step = each["steps"][0]
            assert 4 <= step["generated_tokens"] == step["trained_tokens"] <= 32, (mode, step)
            assert 0.1 < each["peak_gib"] <= run["peak_gib"] < 20, (mode, run["peak_gib"])
            assert each["wall_s"] > step["step_s"], (mode, each["wall_s"])
        # --seed-per-round with two rounds: seeds 1 and 2, each round's policy evaluated
        assert [each["seed"] for each in run["rounds"]] == [1, 2][:rounds], mode
        assert result["curves"][mode]["seeds"] == [1, 2][:rounds], mode
        for r, each in enumerate(run["rounds"]):
            policy = Path(each["policies"]["1"])
            assert (policy / "config.json").is_file() and \
                (policy / "tokenizer_config.json").is_file()
            samples = (out / "eval" / ("" if r == 0 else f"round-{r}") / f"{mode}-1" /
                       "samples.jsonl").read_text().splitlines()
            assert len(samples) == 6, mode  # 6 held-out questions x 1 answer
    assert result["curve_steps"] == [0, 1]
    assert set(result["curves"]) == {"ours-transformers", "trl"}
    assert result["curves"]["ours-transformers"]["acc"][0] == result["curves"]["trl"]["acc"][0]
    area = result["curves"]["ours-transformers"]["area_vs_reference"]  # minus TRL's
    assert result["curve_reference"] == "trl"
    assert result["curves"]["trl"]["area_vs_reference"] is None
    assert area["low"] <= area["mean"] <= area["high"] and area["seeds"] == rounds
    table = (out / "peer_trl.md").read_text()
    assert "| ours-transformers | " in table and "| trl | " in table
    assert (out / "peer_trl.png").stat().st_size > 1000
    # TRL trained on this trainer's schedule: the first step's updates at lr / 2 (a 2-step
    # warm-up); TRL's own default would log 1e-05
    trl_log = (out / "trl.log").read_text()
    assert "'learning_rate': '5e-06'" in trl_log
