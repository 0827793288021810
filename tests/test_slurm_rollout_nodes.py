"""The cluster rehearsal of the disaggregated placement on the test Slurm, with two nodes (two
slurmd on this host): learners on one, a vLLM engine of tensor parallelism 2 (its CPU build) on
the other, through late learners, a save longer than the bridge's timeout, validation, and a
killed rollout rank. Apart from tests/test_slurm.py so that the suite's workers share the two
files' minutes."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import slurm_cluster  # noqa: E402
import tiny  # noqa: E402
from test_slurm import REPO, WHY_NOT, overrides, steps_logged, submit  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    WHY_NOT is not None and not os.environ.get("CI"), reason=f"no Slurm here: {WHY_NOT}")]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout-nodes-assets")
    return tiny.make_model(root / "model"), tiny.make_pool(root / "pool.parquet", 8, [1, 2], 1)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two Slurm nodes on this host (a slurmd each): one to train, one for the rollout ranks."""
    if WHY_NOT is not None:
        pytest.fail(f"CI must run the Slurm tests, but {WHY_NOT}")
    root = tmp_path_factory.mktemp("slurm2")
    os.chmod(root, 0o700)
    cluster = slurm_cluster.Cluster(root, nodes=2).start()
    yield cluster
    cluster.stop()


def disaggregated(assets, steps, *extra):
    """The rehearsal's job: on the second node two rollout ranks form one vLLM engine of tensor
    parallelism 2; partial rollouts, N = 2, replays from the pool, the weight-sync check."""
    engine = overrides(assets, steps, "data.train_size=16", "rollout.tensor_parallel=2",
                       "algorithm.max_staleness=2", "rollout.partial=true",
                       "rollout.segment_tokens=3", "rollout.extra_prompts=4",
                       "rollout.check_sync=true", *extra)
    return [a.replace("rollout.engine=transformers", "rollout.engine=vllm") for a in engine
            if a != "data.train_size=8"]


def rank_pid(cluster, rank: int) -> int | None:
    """The process torchrun started as ``rank`` in this cluster's job."""
    marker = f"SLURM_CONF={cluster.conf}".encode()
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if marker in environ and f"RANK={rank}".encode() in environ and any(
                e.startswith(b"TORCHELASTIC_RUN_ID=") for e in environ):
            return int(entry.name)
    return None


def test_a_disaggregated_job_on_two_nodes_outlives_late_learners_a_long_save_and_preemption(
        two_nodes, assets, tmp_path):
    """The cluster rehearsal: ROLLOUT_NODES=1 of sbatch -N 2, two learners on one node and two
    rollout ranks on the other forming one vLLM engine of tensor parallelism 2. The learners
    start 30 s after the rollout ranks (3x rollout.timeout_s: the rollout ranks wait, as their
    log says), and learner 0's first checkpoint save lasts 30 s longer (3x rollout.timeout_s:
    its heartbeats keep the bridge up, and its engine's reader keeps the TP group's). After step 3 the job is
    preempted as Slurm does it (`scontrol requeue`: SIGTERM to every process, the job requeued):
    the rollout ranks serve on, the learners finish their step and checkpoint, then tell the
    rollout ranks to stop, and the requeued job resumes on both sides (on a49faf2 the rollout
    ranks left at once and the job failed: "rollout rank 0 failed: stopped by SIGTERM"). Both
    TP ranks load each version with the same prompts in flight, the engine's weights match the
    actor's after every load, tokens are at most two versions old, and validation runs through
    the rollout ranks."""
    import time

    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(REPO / "tests" / "helpers" / "slow_trainer"), "ROLLOUT_NODES": "1",
           "SLOW_SECONDS": "30", "SLOW_WHEN": "learner0", "SLOW_METHOD": "save",
           "LATE_RANKS": "0,1", "LATE_SECONDS": "30"}
    job, log = submit(two_nodes, "train.sbatch", run_dir, disaggregated(
        assets, 6, "rollout.timeout_s=10", "logging.save_every=2", "logging.eval_every=2"),
        nproc=2, sbatch=("-N", "2"), env=env)
    deadline = time.time() + scaled(900)
    while 3 not in steps_logged(run_dir) and time.time() < deadline:
        assert two_nodes.job_state(job) in ("PENDING", "RUNNING"), log.read_text()[-3000:]
        time.sleep(0.3)
    two_nodes.run("scontrol", "requeue", job)
    state = two_nodes.wait(job)
    text = log.read_text()
    assert state == "COMPLETED", text[-5000:]
    assert "placement: disaggregated, 1 of 2 nodes (ranks 2-3) run the rollout engines, the " \
           "other 1 train" in text
    # the nodes as they are: which node the rendezvous made the rollout node, learner 0 logs
    met = re.search(r"learner 0: the bridge met: learner 0 \(job rank 0\) on (node\d); rollout "
                    r"ranks 0-1 \(job ranks 2-3\) on (node\d)$", text, re.M)
    assert met and {met[1], met[2]} == {"node1", "node2"}, text[-5000:]
    assert "test: rank 0 starts 30 s late" in text and "rollout rank 0: waiting up to 1800 s " \
           "(rollout.connect_timeout_s)" in text
    assert "test: the first Trainer.save lasts 30 s longer" in text
    # preempted: the learners checkpoint the step under way, the rollout ranks wait for them
    stopped = re.search(r"stopping on SIGTERM: saved step-0*(\d+)", text)
    assert stopped and int(stopped[1]) >= 4, text[-5000:]
    assert "rollout rank 1: received SIGTERM: serving the learners" in text
    assert f"at step {stopped[1]}" in text and two_nodes.job_field(job, "Restarts") == "1"
    assert not [line for line in text.splitlines() if line.startswith("error: ")], text[-5000:]
    loads = {}
    for rank, rest in re.findall(r"rollout rank (\d+): (weights of version .*?\])", text):
        loads.setdefault(int(rank), []).append(rest)
    assert sorted(loads) == [0, 1] and loads[0] == loads[1] and len(loads[0]) >= 6, loads
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "actor/loss" in r] == [1, 2, 3, 4, 5, 6], logged
    for r in (r for r in logged if "actor/loss" in r):
        assert r["sync/max_logprob_diff"] < 1e-3 and r["stale/lag_versions_max"] <= 2, r
    assert [r["step"] for r in logged if r.get("val/acc") is not None] == [0, 2, 4, 6], logged


def test_a_rollout_rank_killed_mid_step_ends_the_job_in_one_sentence(two_nodes, assets,
                                                                     tmp_path):
    """The same layout, and the engine's second TP rank (which learner 0 never sends work to)
    killed during the run: learner 0 finds its link broken (before its engine's reader reports
    the broken collective) and ends the job in one sentence, naming it, well within
    rollout.timeout_s, with no hang; the other ranks say nothing."""
    import time

    run_dir = tmp_path / "dies"
    job, log = submit(two_nodes, "train.sbatch", run_dir, disaggregated(
        assets, 40, "rollout.timeout_s=300", "logging.save_every=0", "logging.eval_every=0"),
        nproc=2, sbatch=("-N", "2"), env={"ROLLOUT_NODES": "1"})
    deadline = time.time() + scaled(600)
    while steps_logged(run_dir) == [] and time.time() < deadline:
        assert two_nodes.job_state(job) in ("PENDING", "RUNNING"), log.read_text()[-3000:]
        time.sleep(0.5)
    victim = rank_pid(two_nodes, 3)
    assert victim is not None, log.read_text()[-3000:]
    node = next(e.split(b"=", 1)[1].decode() for e in Path(f"/proc/{victim}/environ")
                .read_bytes().split(b"\0") if e.startswith(b"SLURMD_NODENAME="))
    os.kill(victim, 9)
    killed = time.time()
    state = two_nodes.wait(job)
    took = time.time() - killed
    text = log.read_text()
    assert state == "FAILED", text[-3000:]
    # one sentence for the job, naming the killed rank as the job does and its node (on
    # 4eafd73 each learner said it, by the bridge's numbering: "rollout rank 2")
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-4000:]
    assert errors[0].startswith(f"error: rollout rank 1 (job rank 3 on {node}) is gone: "), errors
    assert "Traceback" not in text, text[-4000:]  # a known fault: no rank's, no launcher's
    assert took < scaled(120), (took, errors)
