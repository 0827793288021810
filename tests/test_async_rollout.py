"""Asynchronous rollout for real (megatron_rlep/rollout/stream.py, megatron_rlep/rollout/remote_stream.py):
the synchronous trainer unchanged, bit for bit, against a pinned earlier commit; the rollout stream through a kill -9 and a resume with every prompt of the stream trained
exactly once and no token past the bound; disaggregated placement under torchrun (two learners,
one rollout rank) that runs, checks its weight broadcast, and ends in one sentence when the
rollout rank dies (its resume on both sides: tests/test_slurm_rollout_nodes.py's requeue)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402
from launch import env, launcher, why  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# the commit that made each answer's seed its place in the prompt stream (the synchronous
# trainer's figures changed then, once; the one before asynchronous rollout was 5458e49)
BEFORE = "3d7d2ec00dd216927ab9aef465ecd39457f0995c"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny.make_model(tmp_path_factory.mktemp("async") / "model")


def tiny_args(model, run_dir, steps, *extra) -> list[str]:
    return [f"model.path={model}", "data.train_size=16", "data.levels=[1,2]", "data.eval_size=4",
            "algorithm.prompts_per_rollout=4", "algorithm.prompts_per_update=2",
            "algorithm.rollouts_per_prompt=3", "algorithm.replay_per_prompt=0",
            f"algorithm.total_steps={steps}", "algorithm.lr=1e-3", "algorithm.warmup_steps=0",
            "algorithm.overlong_buffer=4", "rollout.engine=transformers",
            "rollout.max_response_length=12", "logging.wandb=disabled",
            "logging.dump_batches=true", "logging.eval_every=0", "logging.save_every=1",
            "logging.progress=false", f"run_dir={run_dir}", *extra]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_the_synchronous_trainer_writes_the_same_metrics_as_before(tmp_path):
    """max_staleness 0, colocated: the demo's job (2 steps, a validation on 16 of its held-out
    questions) by this checkout and by the pinned commit, side by side, one thread each (two threads' sums are not reproducible run to run on a CPU); every figure but
    times and memory the same."""
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE}^{{commit}}"], cwd=REPO).returncode:
        pytest.fail(f"commit {BEFORE} is not in this clone; fetch the whole history")
    before = tmp_path / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), BEFORE], cwd=REPO,
                   check=True, capture_output=True)
    try:
        # log-probs whole, as the CPU jobs computed them then (the chunks came later: the same
        # log-probs, the output layer's gradient summed in another order)
        args = ["experiment=cpu_demo", "algorithm.replay_per_prompt=0", "algorithm.total_steps=2",
                "parallel.logprob_chunk_tokens=0",
                "data.eval_size=16", "logging.eval_every=2", "logging.save_every=0",
                "logging.wandb=disabled", "logging.progress=false"]
        runs = []
        for where, run in ((before, "old"), (REPO, "new")):
            argv = [sys.executable, "-m", "megatron_rlep.train", *args,
                    f"run_dir={tmp_path / run}"]
            runs.append(subprocess.Popen(argv, cwd=where, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True,
                                         env=dict(env(argv), OMP_NUM_THREADS="1")))
        for proc in runs:
            out, err = proc.communicate(timeout=scaled(900))
            assert proc.returncode == 0, out[-2000:] + err[-3000:]
    finally:
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO)
    old, new = rows(tmp_path / "old"), rows(tmp_path / "new")
    assert len(old) == len(new) == 3 and any("val/acc" in r for r in new)

    def figures(row):
        return {k: v for k, v in row.items() if not k.startswith(("time", "perf/"))}
    assert [figures(r) for r in new] == [figures(r) for r in old]
    assert "asynchronous rollout" not in out


@pytest.mark.e2e
def test_an_asynchronous_run_repeats_to_the_digit_and_trains_tokens_two_versions_old(model,
                                                                                     tmp_path):
    """The staleness study's settings at N = 2 (colocated, partial rollouts, two steps' prompts
    over-provisioned), the same command twice, one thread each: every figure but times and
    memory the same (each answer's seed is its place, not an engine call's count); tokens two
    versions old are trained, none older, and every step logs its lags."""
    extra = ("algorithm.max_staleness=2", "rollout.partial=true", "rollout.segment_tokens=4",
             "rollout.extra_prompts=8", "logging.save_every=0", "logging.dump_batches=false")
    runs = []
    for name in ("one", "two"):
        argv = [*launcher(1), "-m", "megatron_rlep.train", *tiny_args(model, tmp_path / name, 4,
                                                                        *extra)]
        runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(env(argv), OMP_NUM_THREADS="1")))
    for proc in runs:
        out = proc.communicate(timeout=scaled(600))[0]
        assert proc.returncode == 0, out[-3000:]
    assert "stale tokens weighted by pi_old / pi_behaviour (token-level, truncated at 2" in out

    def figures(row):
        return {k: v for k, v in row.items() if not k.startswith(("time", "perf/"))}
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert len(one) == 4 and [figures(r) for r in one] == [figures(r) for r in two]
    assert [r["stale/lag_versions_max"] for r in one] == [0, 1, 2, 0]
    assert max(r["rollout/staleness_max"] for r in one) == 2
    # two updates a step: the second update's tokens are one more behind
    assert [r["stale/lag_updates_max"] for r in one] == [1, 3, 5, 1]
    assert one[2]["stale/lag_2/kl_behaviour_proximal"] >= 0
    assert "correction/fresh/is_weight_mean" in one[2]


def killed_after_step_2(argv: list[str], run_dir: Path) -> str:
    """The output of the trainer run by ``argv``, killed with SIGKILL once step 2's checkpoint
    is the latest."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(argv), start_new_session=True)
    deadline = time.time() + scaled(600)
    while proc.poll() is None and time.time() < deadline and not (
            (run_dir / "checkpoints" / "latest").exists() and
            (run_dir / "checkpoints" / "latest").read_text().strip() >= "step-000002"):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[0]


def resumed(argv: list[str]) -> None:
    """The same command again, which resumes and runs to its end."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600),
                          env=env(argv))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "resuming from" in done.stdout


@pytest.mark.e2e
def test_every_prompt_trains_once_across_a_kill_9_within_the_bound_with_the_engines_routes(
        tmp_path):
    """Partial rollouts of 3 tokens, 2 prompts over-provisioned, N = 1, a replay from a pool
    beside each group's fresh answers, a checkpoint every step: killed with SIGKILL after a
    checkpoint, the same command resumes; the trained groups' stream positions are each used
    once and, with those in flight at the end, are exactly the positions handed out; no fresh
    token trained more than 1 version behind.

    The model is the tiny Qwen3-MoE with MoE routing replay R3 (actor.routing_replay=rollout):
    the learning rate is 0, so the actor's routers, fed the engine's routes token for token,
    choose the same experts (but near ties); a route misplaced by a token (prompt, segment or
    replay offsets) agrees with them by chance, 1 in 6 (2 experts of 4). Each step replays the
    routes given (R3's first passes, then R2's) and the routers get a gradient."""
    model = tiny.make_model(tmp_path / "moe", "qwen3_moe")
    pool = tiny.make_pool(tmp_path / "pool.parquet", 16, [1, 2], 1)
    run_dir = tmp_path / "run"
    argv = [*launcher(1), "-m", "megatron_rlep.train", *tiny_args(
        model, run_dir, 6, "algorithm.max_staleness=1", "rollout.partial=true",
        "rollout.segment_tokens=3", "rollout.extra_prompts=2", "actor.routing_replay=rollout",
        "algorithm.lr=0", "algorithm.replay_per_prompt=1", f"algorithm.pool={pool}")]
    out = killed_after_step_2(argv, run_dir)
    assert "asynchronous rollout: colocated engines, partial rollouts in segments of 3" in out
    assert "MoE routing replay: actor.routing_replay=rollout (R3)" in out
    resumed(argv)
    trained, lags = [], []
    for step in range(6):
        groups = json.loads((run_dir / "batches" / f"step-{step:06d}.json").read_text())
        assert len(groups) == 4
        for g in groups:
            trained.append(g["position"])
            assert len(g["samples"]) == 4  # whole groups: G' = 3 + 1
            lags += [step - v for s in g["samples"] if not s["replay"] for v in s["versions"]]
        assert any(s["replay"] for g in groups for s in g["samples"])
    assert len(trained) == len(set(trained))  # none twice
    extra_state = json.loads((run_dir / "checkpoints" / "step-000006" /
                              "actor_checkpoint.json").read_text())["extra"]
    assert sorted(trained + extra_state["in_flight"]) == list(range(extra_state["cursor"]))
    assert max(lags) <= 1 and min(lags) >= 0
    logged = rows(run_dir)
    last = logged[-1]
    assert last["rollout/staleness_max"] <= 1 and last["rollout/stale_regenerated"] >= 0
    assert abs(last["rollout/tokens_lag_0"] + last["rollout/tokens_lag_1"] - 1) < 1e-9
    assert [r["step"] for r in logged][-4:] == [3, 4, 5, 6]  # rows after the resume
    for r in logged:
        assert all(r[f"moe/rollout_route_agreement_l{i}"] > 0.9 for i in range(2)), r
        assert r["moe/route_agreement"] == 1.0 and r["moe/router_grad_norm"] > 0, r


@pytest.mark.e2e
def test_replay_dynamic_sampling_and_the_live_pool_with_groups_landing_out_of_order(model,
                                                                                   tmp_path):
    """M = 2 from a release-format pool, the rescue strategy, dynamic sampling and a live pool,
    with partial rollouts of 2 tokens, N = 2 and 3 extra prompts: each trained group holds its
    fresh answers and its replays as planned, is informative, and trains once; the live pool
    grows from the verified answers of groups in whatever order they finished."""
    pool = tiny.make_pool(tmp_path / "pool.parquet", 16, [1, 2], 1)
    run_dir = tmp_path / "run"
    argv = [*launcher(1), "-m", "megatron_rlep.train", *tiny_args(
        model, run_dir, 4, "algorithm.replay_per_prompt=2", f"algorithm.pool={pool}",
        "algorithm.replay.strategy=rescue", "algorithm.replay.refresh=true",
        "algorithm.dynamic_sampling=true", "algorithm.short_batch=train",
        "algorithm.max_gen_batches=3", "algorithm.max_staleness=2", "rollout.partial=true",
        "rollout.segment_tokens=2", "rollout.extra_prompts=3", "algorithm.lr=1e-2")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600),
                          env=env(argv))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    positions = []
    for step in range(4):
        for g in json.loads((run_dir / "batches" / f"step-{step:06d}.json").read_text()):
            positions.append(g["position"])
            fresh = [s for s in g["samples"] if not s["replay"]]
            replays = [s for s in g["samples"] if s["replay"]]
            assert len(fresh) == g["fresh_requested"] and len(replays) == len(g["replays"])
            assert len(replays) <= 2 and (not replays or not any(s["correct"] for s in fresh))
            assert len({s["correct"] for s in g["samples"]}) == 2  # informative
            assert all(max(0, step - min(s["versions"])) <= 2 for s in fresh)
    assert len(positions) == len(set(positions))
    logged = rows(run_dir)
    # every prompt handed out (the next step's sent out at a step's end included) trained, was
    # dropped as uninformative, or is in flight at the end
    assert sum(r["train/prompts_drawn"] for r in logged) == logged[-1]["rollout/in_flight"] + \
        sum(r["train/groups"] + r["train/groups_dropped"] for r in logged)
    answers = [r["pool/answers"] for r in logged]
    assert answers == sorted(answers)  # the live pool only grows


def torchrun(model, run_dir, steps, *extra, timeout=600):
    argv = [*launcher(3), "-m", "megatron_rlep.train",
            *tiny_args(model, run_dir, steps, "rollout.placement=disaggregated", "rollout.ranks=1",
                       "algorithm.max_staleness=1", "rollout.check_sync=true", *extra)]
    return argv, env(argv)


@pytest.mark.e2e
def test_disaggregated_runs_and_a_dead_rollout_rank_ends_it_in_one_sentence(
        model, tmp_path):
    """The first run is the tiny Qwen3-MoE with R3 (actor.routing_replay=rollout) and partial
    rollouts: the rollout rank's routes reach the learners over the bridge."""
    run_dir = tmp_path / "run"
    moe = tiny.make_model(tmp_path / "moe", "qwen3_moe")
    argv, environment = torchrun(moe, run_dir, 2, "actor.routing_replay=rollout",
                                 "rollout.partial=true", "rollout.segment_tokens=4")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(900),
                          env=environment)
    assert done.returncode == 0, why(done)
    assert "asynchronous rollout: disaggregated engines" in done.stdout
    host = socket.gethostname()  # the bridge's layout, as it is
    assert f"learner 0: the bridge met: learner 0 (job rank 0) on {host}; rollout rank 0 (job " \
        f"rank 2) on {host}" in done.stdout
    first = rows(run_dir)
    assert [r["step"] for r in first] == [1, 2]
    for r in first:  # right after each broadcast the rollout rank's engine is the actor
        assert r["sync/max_logprob_diff"] < 1e-3 and r["sync/mean_logprob_diff"] < 1e-4, r
        assert r["rollout/staleness_max"] <= 1
        # both sides' memory: the learner's own and the rollout rank's, as it reported it
        assert r["perf/host_memory_gib"] > 0.1 and r["perf/rollout_host_memory_gib"] > 0.1, r
        assert r["moe/rollout_route_agreement"] > 0.9, r  # by chance: 1 in 6
    # a rollout rank killed mid-run: the learners stop in one sentence, well within the timeout
    argv, environment = torchrun(model, tmp_path / "dies", 40, "rollout.timeout_s=300")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=environment, start_new_session=True)
    metrics = tmp_path / "dies" / "metrics.jsonl"
    deadline = time.time() + scaled(600)
    while proc.poll() is None and time.time() < deadline and not (
            metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.2)
    rollout = rollout_rank_pid(proc.pid)
    os.kill(rollout, signal.SIGKILL)
    killed = time.time()
    out = proc.communicate(timeout=scaled(300))[0]
    took = time.time() - killed
    # one sentence for the job, by learner 0 alone, naming the rank as the job does (on 4eafd73
    # each learner said it, as "rollout rank 1": the bridge's numbering)
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    assert errors[0].startswith(f"error: rollout rank 0 (job rank 2 on {host}) is gone: the "
                                "bridge to it broke") and errors[0].endswith("its log says why")
    assert took < scaled(120), took


def rollout_rank_pid(torchrun_pid: int) -> int:
    """The worker torchrun started as the last rank (RANK=2 in its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except OSError:
            continue
        if b"RANK=2" in environ and b"LOCAL_RANK=2" in environ and parent == torchrun_pid:
            return int(entry.name)
    raise AssertionError("no rollout rank found under torchrun")


@pytest.mark.e2e
def test_a_synchronous_and_an_asynchronous_run_draw_the_same_answers_at_step_0(model, tmp_path):
    """What lets a staleness study pair its arms: a synchronous run and a colocated asynchronous
    one (N = 1, two prompts over-provisioned) of one seed train the same prompts at step 0 with
    the same answers, token for token, as both sample them with the base weights."""
    runs = {}
    for name, extra in (("sync", ()), ("async", ("algorithm.max_staleness=1",
                                                  "rollout.extra_prompts=2"))):
        argv = [*launcher(1), "-m", "megatron_rlep.train",
                *tiny_args(model, tmp_path / name, 1, "logging.save_every=0", *extra)]
        runs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=dict(env(argv), OMP_NUM_THREADS="1"))
    for proc in runs.values():
        out = proc.communicate(timeout=scaled(600))[0]
        assert proc.returncode == 0, out[-3000:]

    def answers(name):
        groups = json.loads((tmp_path / name / "batches" / "step-000000.json").read_text())
        return {g["id"]: [s["response_ids"] for s in g["samples"] if not s["replay"]]
                for g in groups}
    sync, stale = answers("sync"), answers("async")
    assert len(sync) == 4 and sum(len(a) for a in sync.values()) == 12
    assert stale == sync
