"""The trainer for real: a tiny Llama (SmolLM2's tokenizer) trained for a few steps with M = 2
from a release-format pool, checked from the batches the trainer itself dumped; the same with
two processes (TP = 2, and DP = 2); resume continues the same streams."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402
from launch import env, launcher  # noqa: E402


G, M, PROMPTS, STEPS = 3, 2, 4, 2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    model = tiny.make_model(root / "model")
    pool = tiny.make_pool(root / "pool.parquet", 8, [1, 2], 1)
    return model, pool


def train(assets, run_dir, *extra, nproc=1, steps=STEPS, timeout=scaled(900), pool=None,
          engine="transformers"):
    """The trainer on the tiny model; ``extra`` overrides come last (no warm-up unless given)."""
    if not any(e.startswith("algorithm.warmup_steps=") for e in extra):
        extra = ("algorithm.warmup_steps=0", *extra)
    model, pool = assets[0], pool or assets[1]
    args = [f"model.path={model}", "data.train_size=8", "data.levels=[1,2]", "data.eval_size=4",
            f"algorithm.prompts_per_rollout={PROMPTS}", "algorithm.prompts_per_update=2",
            f"algorithm.rollouts_per_prompt={G}", f"algorithm.replay_per_prompt={M}",
            f"algorithm.pool={pool}", f"algorithm.total_steps={steps}", "algorithm.lr=1e-3",
            "algorithm.overlong_buffer=4", f"rollout.engine={engine}",
            "rollout.max_response_length=12", "logging.wandb=offline", "logging.dump_batches=true",
            "logging.eval_every=2", "logging.save_every=1", "logging.progress=false",
            "rollout.check_sync=true", f"run_dir={run_dir}", *extra]
    flags = [a for a in args if a.startswith("-")]  # Hydra's -m goes before the overrides
    args = flags + [a for a in args if not a.startswith("-")]
    argv = [*launcher(nproc), "-m", "megatron_rlep.train", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env(argv))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Traceback" not in result.stderr, result.stderr[-5000:]  # a clean end, vLLM's included
    return result


def check_batches(run_dir: Path, model: Path, pool: Path, steps=STEPS, prompt_length=None):
    from transformers import AutoTokenizer

    from megatron_rlep.data import load_parquet

    tokenizer = AutoTokenizer.from_pretrained(model)
    pool_answers = {ex.question.strip(): ex.candidates for ex in load_parquet(pool)}
    for step in range(steps):
        groups = json.loads((run_dir / "batches" / f"step-{step:06d}.json").read_text())
        assert len(groups) == PROMPTS
        for g in groups:
            if prompt_length:  # left-truncated, and the engine sampled after exactly these ids
                assert len(g["prompt_ids"]) == prompt_length
            fresh = [s for s in g["samples"] if not s["replay"]]
            replay = [s for s in g["samples"] if s["replay"]]
            question = tokenizer.decode(g["prompt_ids"])
            answers = next((a for q, a in pool_answers.items() if q in question), ())
            expected_replays = min(M, len(answers))
            assert len(replay) == expected_replays, (len(replay), answers)
            assert len(set(g["replays"])) == len(g["replays"]) and set(g["replays"]) <= set(answers)
            # the engine was asked for the fresh slots only: G, or more where the pool ran short
            assert g["fresh_requested"] == G + M - expected_replays == len(fresh)
            assert all(len(s["logprobs"]) == len(s["response_ids"]) for s in fresh)
            assert all(s["logprobs"] == [] for s in replay)
            for s, text in zip(replay, g["replays"]):
                ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                assert s["response_ids"] == ids[:12]
                assert s["finished"] == (len(ids) <= 12)
            rewards = [s["reward"] for s in g["samples"]]
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
            for s in g["samples"]:
                expected = 0.0 if std == 0 else (s["reward"] - mean) / (std + 1e-6)
                assert s["advantage"] == pytest.approx(expected, abs=1e-5)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0] + list(range(1, steps + 1))
    for x in lines[1:]:
        assert x["sync/max_logprob_diff"] < 1e-4, "the engine's log-probs differ from the actor's"
        # behaviour log-probs of the fresh samples against the actor's before its update
        assert x["rollout/logp_diff_max"] < 1e-3 and abs(x["rollout/kl_k3"]) < 1e-6
        assert x["train/replay_fraction"] > 0 and x["actor/grad_norm"] > 0
    return lines


def test_a_steps_record_times_each_phase_and_gathers_what_the_step_says():
    """Trainer.run keeps the step's verbs and its metrics apart (StepRecord): the rollout is
    timed from the step's start, the update from the rollout's end, the stream's waits and the
    step itself at the end; the stream's staleness and the pool's replays are read for the step
    that ran; the scorer's counts and the producer's unscored answers are taken once."""
    from types import SimpleNamespace

    from megatron_rlep.train import StepRecord

    ticks, waits = iter([10.0, 12.0, 15.0, 16.5, 17.0]), []
    producer = SimpleNamespace(unscored=3, pool=object(),
                               staleness_metrics=lambda groups, step: {"stale/step": step},
                               replay_metrics=lambda groups, step: {"replay/step": step})
    trainer = SimpleNamespace(
        step=4, tool_seconds=lambda: None, stream=object(), producer=producer,
        rollout=SimpleNamespace(waits=lambda *args: waits.append(args) or {"wait/s": 1.0}),
        scorer=SimpleNamespace(take_counts=lambda: {"reward/errors": 2}))
    record = StepRecord(trainer, lambda: {"memory/released_gib": 0.0}, clock=lambda: next(ticks))
    record.rolled_out([], {"prompts_drawn": 2, "groups_dropped": 0, "gen_batches": 1,
                           "groups_short": 0, "generating_s": 1.5})
    record.updated([], {"rollout/logp_diff_max": 0.1})
    record.add({"time/sync_s": 0.5})
    out = record.finish()
    assert (out["time/rollout_s"], out["time/update_s"], out["time/step_s"]) == (2.0, 3.0, 7.0)
    assert waits == [(2.0, 1.5, 4.5)]  # rollout, the engine's generating, the rest of the step
    assert (out["stale/step"], out["replay/step"]) == (4, 4)
    assert out["reward/errors"] == 2 and out["reward/unscored"] == 3 and producer.unscored == 0
    assert out["rollout/logp_diff_max"] == 0.1 and out["time/sync_s"] == 0.5
    assert out["wait/s"] == 1.0 and out["memory/released_gib"] == 0.0
    assert out["train/prompts_drawn"] == 2 and out["train/groups"] == 0


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_rlep_steps_from_the_trainers_own_batches(assets, tmp_path, engine):
    # prompts (about 74 tokens) are cut to 60: engine and actor must see the same ids
    # with the gradient buffers freed between updates: every check below holds as without
    result = train(assets, tmp_path / "run", "validation.n=2", "data.max_prompt_length=60",
                   "logging.keep_checkpoints=1", "parallel.offload_during_rollout=true",
                   engine=engine)
    lines = check_batches(tmp_path / "run", *assets, prompt_length=60)
    assert "val/acc" in lines[0] and "val/acc" in lines[-1]
    # held-out sets through megatron_rlep.metrics: per set and, for several sources, per source
    for key in ("val/arithmetic/mean@2", "val/arithmetic/pass@2", "val/arithmetic/maj@2",
                "val/arithmetic/arithmetic-L1/pass@2", "val/arithmetic/arithmetic-L2/mean@2"):
        assert key in lines[-1], key
    assert lines[-1]["val/arithmetic/pass@2"] >= lines[-1]["val/arithmetic/mean@2"]
    assert lines[-1]["val/acc"] == lines[-1]["val/arithmetic/mean@2"]
    # every validation's verdicts, per answer, for paired statistics: the same questions each time
    from megatron_rlep.paired import question_accuracy

    for line in (lines[0], lines[-1]):
        rows = [json.loads(r) for r in (tmp_path / "run" / "validation" /
                                        f"step-{line['step']:06d}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 2 and {r["sample_index"] for r in rows} == {0, 1}
        acc = question_accuracy(rows)
        assert len(acc) == 4 and sum(acc.values()) / 4 == line["val/acc"]
        spread = sum((a - line["val/acc"]) ** 2 for a in acc.values()) / 3
        assert line["val/acc_stderr"] == pytest.approx(math.sqrt(spread / 4))
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    # a checkpoint every step, the newest kept (logging.keep_checkpoints=1), and the weights of
    # the best validation step (the first of equal bests)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "latest", "step-000002"]
    best = json.loads((checkpoints / "best" / "actor_checkpoint.json").read_text())
    accuracies = [(x["val/acc"], -x["step"]) for x in lines if "val/acc" in x]
    assert (best["step"], best["extra"]["val/acc"]) == (-max(accuracies)[1], max(accuracies)[0])
    assert best["weights_only"] and "val/best_kept" not in lines[1]
    assert lines[-1]["val/best_kept"] == float(lines[-1]["val/acc"] > lines[0]["val/acc"])
    # the start-up line: a checkpoint's size as it lands on disk (12 bytes a parameter in fp32)
    said = next(line for line in result.stdout.splitlines() if line.startswith("checkpoints: "))
    size = sum(f.stat().st_size for f in (checkpoints / "step-000002").rglob("*") if f.is_file())
    value, unit = said.split()[1:3]
    assert float(value) * {"MiB": 2**20, "GiB": 2**30}[unit] == pytest.approx(size, rel=0.1), \
        (said, size)
    assert "the newest 1 kept" in said and "the run holds at most" in said
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["algorithm"]["replay_per_prompt"] == M and config["run_dir"] == str(tmp_path / "run")
    record = next((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"replay_per_prompt" in record  # the resolved config
    assert b"experience-pool" in record  # the pool, logged as an artifact (by reference)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").config.num_hidden_layers == 2


def import_release(release: Path, out: Path) -> Path:
    tool = Path(__file__).resolve().parent.parent / "tools" / "pool.py"
    subprocess.run([sys.executable, str(tool), "import-release", str(release), "-o", str(out),
                    "--shard-size", "2"], check=True, capture_output=True, timeout=scaled(300))
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("layout,engine", [
    (["parallel.tensor_parallel=2"], "transformers"), ([], "transformers"),
    (["parallel.tensor_parallel=2", "rollout.tensor_parallel=2"], "vllm"), ([], "vllm")],
    ids=["tp2", "dp2", "tp2-vllm-tp2", "dp2-vllm"])
def test_rlep_steps_under_two_processes(assets, tmp_path, layout, engine):
    # DP = 2 trains from the release imported as a pool directory (tools/pool.py import-release);
    # vLLM: the actor at TP 2 feeds one engine at TP 2, or each DP rank its own engine at TP 1
    pool = import_release(assets[1], tmp_path / "pool") if not layout else None
    train(assets, tmp_path / "run", *layout, nproc=2, pool=pool, engine=engine)
    check_batches(tmp_path / "run", *assets)


@pytest.mark.e2e
def test_dynamic_sampling_keeps_whole_aligned_groups(assets, tmp_path):
    # the random tiny model never answers right: only groups holding replays have mixed rewards
    train(assets, tmp_path / "run", "algorithm.dynamic_sampling=true",
          "algorithm.max_gen_batches=4", "algorithm.short_batch=train", steps=1)
    groups = json.loads((tmp_path / "run" / "batches" / "step-000000.json").read_text())
    assert groups, "dynamic sampling kept no group"
    for g in groups:
        assert len(g["samples"]) == G + M
        assert len({s["correct"] for s in g["samples"]}) > 1, "a group of equal accuracy was kept"
        assert any(s["replay"] for s in g["samples"])
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["train/groups_dropped"] > 0 and line["train/prompts_drawn"] > PROMPTS
    assert line["train/groups"] == len(groups)


@pytest.mark.e2e
def test_sigterm_checkpoints_at_the_step_end_and_the_same_command_resumes(assets, tmp_path):
    import signal
    import time

    # with the replay state that resume must restore: priority's pass rates and a live pool
    model, pool = assets
    run_dir = tmp_path / "run"

    def cmd(steps, run_dir=run_dir):
        return [sys.executable, "-m", "megatron_rlep.train", f"model.path={model}",
                "data.train_size=8", "data.eval_size=4", "data.levels=[1,2]",
                "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
                "algorithm.rollouts_per_prompt=2", "algorithm.replay_per_prompt=1",
                f"algorithm.pool={pool}", f"algorithm.total_steps={steps}",
                "rollout.engine=transformers", "rollout.max_response_length=8",
                "logging.wandb=disabled", "logging.eval_every=0", "logging.save_every=0",
                "algorithm.replay.strategy=priority", "algorithm.replay.refresh=true",
                "logging.progress=false", "logging.dump_batches=true", f"run_dir={run_dir}"]

    proc = subprocess.Popen(cmd(40), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env())
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + scaled(300)
    while proc.poll() is None and time.time() < deadline and not (
            metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 0, out[-3000:]
    stopped = int(out.split("saved step-")[1][:6])
    assert 2 <= stopped < 40 and "stopping on SIGTERM" in out
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{stopped:06d}"
    assert not (run_dir / "hf").exists()  # not finished
    # as a version before the layout named EP wrote it (test_rundir.py: its RNG states load)
    meta_file = run_dir / "checkpoints" / f"step-{stopped:06d}" / "actor_checkpoint.json"
    meta = json.loads(meta_file.read_text())
    assert meta["layout"].pop("ep") == 1
    meta_file.write_text(json.dumps(meta))
    result = subprocess.run(cmd(stopped + 2), capture_output=True, text=True, env=env(), timeout=scaled(300))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"at step {stopped}" in result.stdout
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, stopped + 3))
    # each start recorded the code it ran (a study checks its arms ran the same)
    from megatron_rlep.rundir import code_identity

    starts = [json.loads(x) for x in (run_dir / "code.jsonl").read_text().splitlines()]
    assert [s["step"] for s in starts] == [0, stopped]
    assert {s["code"] for s in starts} == {code_identity()["code"]} != {None}
    # the same as a run never stopped: prompts, replays, sampled answers and the last loss
    straight = tmp_path / "straight"
    result = subprocess.run(cmd(stopped + 2, straight), capture_output=True, text=True, env=env(),
                            timeout=scaled(300))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for step in range(stopped + 2):
        a, b = (json.loads((run / "batches" / f"step-{step:06d}.json").read_text())
                for run in (straight, run_dir))
        assert [(g["prompt_ids"], g["replays"], [s["response_ids"] for s in g["samples"]])
                for g in a] == \
               [(g["prompt_ids"], g["replays"], [s["response_ids"] for s in g["samples"]])
                for g in b], step
    last = [json.loads(x) for x in metrics.read_text().splitlines()][-1]
    last_straight = json.loads((straight / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["actor/loss"] == pytest.approx(last_straight["actor/loss"], rel=1e-4)


@pytest.mark.e2e
def test_non_finite_gradients_skip_their_update_and_too_many_in_a_row_stop_the_run(assets,
                                                                                   tmp_path):
    """Updates 1, 3, 4 and 5 get NaN gradients (two updates a step): steps 0 and 1 skip one
    each and go on; in step 2 both are skipped, the third in a row: the run checkpoints the
    weights before them and stops in one sentence."""
    run_dir = tmp_path / "run"
    argv = [*launcher(1), "-m", "megatron_rlep.train", f"model.path={assets[0]}",
            "data.train_size=8", "data.levels=[1,2]", "data.eval_size=4",
            "algorithm.prompts_per_rollout=4",
            "algorithm.prompts_per_update=2", "algorithm.rollouts_per_prompt=2",
            "algorithm.replay_per_prompt=0", "algorithm.total_steps=5", "algorithm.warmup_steps=0",
            "rollout.engine=transformers", "rollout.max_response_length=8",
            "logging.wandb=disabled", "logging.eval_every=0", "logging.progress=false",
            "algorithm.max_skipped_updates=3", f"run_dir={run_dir}"]
    helper = Path(__file__).parent / "helpers" / "nan_grads"
    result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600),
                            env=env(argv, PYTHONPATH=str(helper), NAN_UPDATES="1,3,4,5"))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: 3 updates in a row had non-finite gradients (the last at step 2) and were "
        "skipped; checkpoints/step-000003 holds the weights before them: lower algorithm.lr or "
        "algorithm.grad_clip or look at the step's batch (logging.dump_batches=true), then "
        "resume (algorithm.max_skipped_updates sets how many in a row stop the run)")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["actor/skipped_updates"]) for x in lines] == [(1, 1), (2, 1)]
    assert all(math.isfinite(x["actor/grad_norm"]) for x in lines)  # the applied ones only
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000003"
    from safetensors.torch import load_file

    export = tmp_path / "export"
    done = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "tools" /
                                               "export_hf.py"), str(run_dir), "-o", str(export)],
                          capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stderr[-2000:]
    weights = {}
    for f in export.glob("*.safetensors"):
        weights.update(load_file(f))
    assert all(bool(t.isfinite().all()) for t in weights.values())  # no NaN was applied


@pytest.mark.e2e
def test_a_run_stopped_before_any_applied_update_resumes(assets, tmp_path):
    """Updates 0-2 get NaN gradients: the run stops in step 1 with a checkpoint written before
    Adam had any state (the distributed optimizer could not write one; a plain one's would not
    load); the same command without the NaNs resumes from it, here with the plain optimizer."""
    run_dir = tmp_path / "run"

    def argv(*extra):
        return [*launcher(1), "-m", "megatron_rlep.train", f"model.path={assets[0]}",
                "data.train_size=8", "data.levels=[1,2]", "data.eval_size=4",
                "algorithm.prompts_per_rollout=4", "algorithm.prompts_per_update=2",
                "algorithm.rollouts_per_prompt=2", "algorithm.replay_per_prompt=0",
                "algorithm.total_steps=3", "algorithm.warmup_steps=0",
                "rollout.engine=transformers", "rollout.max_response_length=8",
                "logging.wandb=disabled", "logging.eval_every=0", "logging.progress=false",
                "algorithm.max_skipped_updates=3", f"run_dir={run_dir}", *extra]

    helper = Path(__file__).parent / "helpers" / "nan_grads"
    first = argv("parallel.distributed_optimizer=true")
    result = subprocess.run(first, capture_output=True, text=True, timeout=scaled(600),
                            env=env(first, PYTHONPATH=str(helper), NAN_UPDATES="0,1,2"))
    assert result.returncode == 2 and "checkpoints/step-000002 holds the weights before them" \
        in result.stderr, result.stdout[-2000:] + result.stderr[-3000:]
    meta = json.loads((run_dir / "checkpoints" / "step-000002" / "actor_checkpoint.json")
                      .read_text())
    assert meta["optimizer_state"] is False and meta["distributed_optimizer"] is True
    again = argv("parallel.distributed_optimizer=false")
    result = subprocess.run(again, capture_output=True, text=True, timeout=scaled(600), env=env(again))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "at step 2" in result.stdout
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 3 and lines[-1]["actor/skipped_updates"] == 0


@pytest.mark.e2e
def test_local_multirun_sweep_gives_each_job_its_own_run_dir(assets, tmp_path):
    base = tmp_path / "sweep"
    # seed 2 draws other built-in questions than the pool's: coverage is not this test's point
    train(assets, base, "-m", "seed=1,2", "logging.eval_every=0", "logging.dump_batches=false",
          "rollout.check_sync=false", "algorithm.pool_min_coverage=0", steps=1)
    for job, seed in ((0, 1), (1, 2)):
        run = base / "multirun" / str(job)
        assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
        assert (run / "checkpoints" / "latest").is_file()
        record = next((run / "wandb").glob("offline-run-*/run-*.wandb"))
        assert f"seed={seed}".encode() in record.read_bytes()  # named after its overrides
    assert not (base / "metrics.jsonl").exists()


@pytest.mark.e2e
def test_replay_strategies_and_corrections_resume_the_same_streams(assets, tmp_path):
    # one process runs each setting straight for 2 steps, and stopped after step 1 then resumed:
    # the same prompts, replays and sampled answers, and the same learning rates
    model, pool = assets
    sampled = tiny.with_sampled_logprobs(pool, tmp_path / "sampled", model)
    settings = {
        # warm-up counted in rollout steps: both updates of a step alike, resumed or not; a
        # replay's advantage centred on its group's fresh answers alone
        "uniform-fresh-baseline": ["algorithm.warmup_steps=2",
                                   "algorithm.correction.baseline=fresh"],
        "rescue-token-is": ["algorithm.replay.strategy=rescue", "algorithm.correction.is_level=token",
                            "algorithm.correction.rs_level=token",
                            "algorithm.correction.rs_threshold=1.5"],
        "priority-down-weight": ["algorithm.replay.strategy=priority",
                                 "algorithm.replay.priority_floor=0.3",
                                 "algorithm.correction.replay=down_weight",
                                 "algorithm.old_logp=rollout"],  # 2nd update: the engine's log-probs
        "recent-stored-live": ["algorithm.replay.strategy=recent", "algorithm.replay.refresh=true",
                               "algorithm.correction.replay=stored", f"algorithm.pool={sampled}"],
        # a live pool from nothing that the random policy never fills: saved empty, resumed
        "live-from-empty": ["algorithm.replay.refresh=true", "algorithm.pool="]}
    script = Path(__file__).parent / "helpers" / "replay_runs.py"
    argv = [sys.executable, str(script), str(tmp_path), str(model), str(pool), json.dumps(settings)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(900), env=env(argv))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    def batches(name, run):
        return [json.loads((tmp_path / name / run / "batches" / f"step-{s:06d}.json").read_text())
                for s in range(2)]

    def metrics(name, run):
        return [json.loads(x) for x in (tmp_path / name / run / "metrics.jsonl").read_text().splitlines()]

    for name in settings:
        straight, resumed = batches(name, "straight"), batches(name, "resumed")
        for a, b in zip(straight, resumed):
            assert [g["prompt_ids"] for g in a] == [g["prompt_ids"] for g in b], name
            assert [g["replays"] for g in a] == [g["replays"] for g in b], name
            assert [[s["response_ids"] for s in g["samples"]] for g in a] == \
                   [[s["response_ids"] for s in g["samples"]] for g in b], name
        steps = [x["step"] for x in metrics(name, "resumed")]
        assert steps == [1, 2], (name, steps)  # one line per step, none repeated on resume
        for run in ("straight", "resumed"):
            lrs = [x["actor/lr"] for x in metrics(name, run)]
            assert lrs == pytest.approx([5e-4, 1e-3] if name.startswith("uniform") else
                                        [1e-3, 1e-3])
        last = metrics(name, "resumed")[-1]
        assert last["actor/loss"] == pytest.approx(metrics(name, "straight")[-1]["actor/loss"], rel=1e-4)
        groups = [g for step in straight for g in step]
        if name.startswith("uniform"):  # fresh answers as plain, replays on the fresh mean
            for g in groups:
                rewards = [s["reward"] for s in g["samples"]]
                fresh = [s["reward"] for s in g["samples"] if not s["replay"]]
                mean, centre = sum(rewards) / len(rewards), sum(fresh) / len(fresh)
                std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
                for s in g["samples"]:
                    expected = s["reward"] - (centre if s["replay"] else mean)
                    assert s["advantage"] == pytest.approx(expected / (std + 1e-6), abs=1e-5)
            assert any(s["replay"] and s["advantage"] != 0 for g in groups for s in g["samples"])
        if name == "live-from-empty":
            assert not any(g["replays"] for g in groups)
        if name.startswith("rescue"):  # replays only after G fresh answers, none of them right
            assert any(g["replays"] for g in groups)
            for g in groups:
                if g["replays"]:
                    assert g["fresh_requested"] == G
                    assert not any(s["correct"] for s in g["samples"] if not s["replay"])
            assert "correction/fresh/is_weight_mean" in last and last["correction/fresh/rejected_fraction"] < 0.5
        if name.startswith("priority"):
            assert last["correction/replay/is_weight_mean"] == 0.5
            state = json.loads((tmp_path / name / "resumed" / "checkpoints" / "step-000002" /
                                "actor_checkpoint.json").read_text())
            seen = sum(n for _, n in state["extra"]["pass_rates"]["counts"].values())
            assert seen == sum(len([s for s in g["samples"] if not s["replay"]]) for g in groups)
        if name.startswith("recent"):
            for g in groups:
                for s in g["samples"]:
                    if s["replay"]:  # the ids and log-probs the pool recorded
                        assert s["logprobs"] == [-0.5] * len(s["response_ids"])
            # the random policy gives each token about 1/49152, far below the recorded e^-0.5
            assert 0 < last["correction/replay/is_ratio_max"] < 1e-2
            # the live pool is in the checkpoint (the random policy added nothing) and reads as
            # a built one
            from megatron_rlep.pool import ExperiencePool

            live = tmp_path / name / "resumed" / "checkpoints" / "pool-000002"
            assert ExperiencePool.load(live).entries == ExperiencePool.load(sampled).entries
            assert last["train/replay_age_mean"] == 2  # built answers: from before step 0
            stats = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "tools" /
                                                         "pool.py"), "stats", str(live)],
                                   capture_output=True, text=True, timeout=scaled(300))
            assert stats.returncode == 0 and "questions" in stats.stdout, stats.stderr[-2000:]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: tiny.make_model(root / f, f) for f in ("llama3", "qwen2", "qwen3", "qwen3_moe")}


@pytest.mark.e2e
@pytest.mark.parametrize("family, layout", [
    ("llama3", []), ("qwen2", []), ("qwen3", []),
    ("qwen3_moe", ["parallel.expert_parallel=2", "actor.routing_replay=actor",
                   "algorithm.lr=0"])])
def test_each_model_family_takes_rlep_steps(assets, family_models, tmp_path, family, layout):
    """A step with replays per family on vLLM, whose log-probs after the weight sync equal the
    actor's (check_batches); Qwen3-MoE with its experts over two ranks and its routes replayed
    (R2). Its learning rate is 0, so the second update's routers see the weights of the
    old-log-prob pass and must choose, token for token, the routes replayed to them: 100% by
    layer (a route put on another token agrees by chance with 1 in 6: 2 experts of 4), and they
    still get a gradient."""
    model = family_models[family]
    result = train((model, assets[1]), tmp_path / "run", *layout, nproc=2 if layout else 1,
                   steps=1, engine="vllm")
    check_batches(tmp_path / "run", model, assets[1], steps=1)
    if layout:
        assert "MoE routing replay: actor.routing_replay=actor (R2)" in result.stdout
        line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
        layers = [line[f"moe/route_agreement_l{i}"] for i in range(2)]
        assert layers == [1.0, 1.0], line
        assert line["moe/router_grad_norm"] > 0


RANDOM_REWARD = '''import random


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return random.choice([1.0, -1.0])  # each worker process seeds itself: ranks would differ
'''


def random_task(tmp_path: Path) -> tuple[Path, Path]:
    """(a verl parquet of built-in questions under a data source no rule claims, a reward
    file whose every answer's reward is a coin flip)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rlep.tasks import arithmetic

    rows = [{"data_source": "coin_flips", "prompt": list(ex.prompt),
             "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
             "extra_info": {"index": i}}
            for i, ex in enumerate(arithmetic.examples("train", [1, 2], 8, 1))]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "coins.parquet")
    (tmp_path / "coin.py").write_text(RANDOM_REWARD)
    return tmp_path / "coins.parquet", tmp_path / "coin.py"


@pytest.mark.e2e
def test_a_random_reward_is_the_same_on_every_rank(assets, tmp_path):
    """Rewards are scored once and gathered (reward/scorer.py): with a reward that flips a coin
    in each worker, both ranks still hold the same rewards, advantages and, under dynamic
    sampling, the same groups (before, each rank scored for itself: different advantages for
    one sequence at TP 2, different groups kept at DP 2, then mismatched collectives). The
    gather spans the whole world whatever the layout, so DP 2 alone checks it (TP 2 was 39 s
    more of the suite)."""
    data, coin = random_task(tmp_path)
    train(assets, tmp_path / "run", f"data.train={data}", f"data.eval=[{data}]",
          "algorithm.replay_per_prompt=0", "verifier=custom", f"verifier.function={coin}:compute_score",
          "algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=3",
          "algorithm.short_batch=train", nproc=2, steps=2)
    for step in range(2):
        mine = json.loads((tmp_path / "run" / "batches" / f"step-{step:06d}.json").read_text())
        other = json.loads((tmp_path / "run" / "batches" / "rank-1" /
                            f"step-{step:06d}.json").read_text())
        assert mine == other, f"step {step}: the ranks hold different groups or rewards"
        rewards = [s["reward"] for g in mine for s in g["samples"]]
        assert len(set(rewards)) >= 2  # coin flips (the overlong penalty shifts some)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(x.get("reward/errors", 0) == 0 for x in lines)
