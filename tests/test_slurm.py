"""slurm/ on a real one-node Slurm cluster started on this host: the training script runs its
preflight and two ranks through srun + torchrun and writes its checkpoint and metrics; a job
preempted mid-run checkpoints on SIGTERM, and in its restart a time-limit warning during a step
longer than torchrun's grace stops it through the stop file; each restart resumes from the
checkpoint; a Hydra sweep runs as an array job; ROLLOUT_NODES splits the allocation into learner
and rollout nodes, and a split that is not whole nodes or leaves no node to train is refused.
The cluster rehearsal of the disaggregated placement is tests/test_slurm_rollout_nodes.py."""

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

REPO = Path(__file__).resolve().parent.parent
WHY_NOT = slurm_cluster.available()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    WHY_NOT is not None and not os.environ.get("CI"), reason=f"no Slurm here: {WHY_NOT}")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from slurm_cluster.for_tests(tmp_path_factory, WHY_NOT)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-assets")
    return tiny.make_model(root / "model"), tiny.make_pool(root / "pool.parquet", 8, [1, 2], 1)


def overrides(assets, steps, *extra):
    model, pool = assets
    return [f"model.path={model}", "data.train_size=8", "data.eval_size=4", "data.levels=[1,2]",
            "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
            "algorithm.rollouts_per_prompt=2", "algorithm.replay_per_prompt=1",
            f"algorithm.pool={pool}", f"algorithm.total_steps={steps}",
            "rollout.engine=transformers", "rollout.max_response_length=8",
            "logging.wandb=offline", "logging.progress=false", *extra]


def submit(cluster, script, run_dir, args, nproc=1, sbatch=(), cpus=None, env=(), preflight=False):
    env = {"MEGATRON_RLEP_VENV": sys.prefix, "NPROC_PER_NODE": str(nproc), "RUN_DIR": str(run_dir),
           "PYTHONWARNINGS": "ignore", "PREFLIGHT": str(int(preflight)), **dict(env)}
    exports = "ALL," + ",".join(f"{k}={v}" for k, v in env.items())
    array = any(a.startswith("--array") for a in sbatch)
    out = run_dir.parent / f"{run_dir.name}-{'%A_%a' if array else '%j'}.out"
    job = cluster.run("sbatch", "--parsable", f"--export={exports}", f"--chdir={REPO}",
                      f"--output={out}", f"--cpus-per-task={cpus or cluster.cpus}",
                      "--gpus-per-node=0", *sbatch,
                      str(REPO / "slurm" / script), *args)
    job = job.split(";")[0]
    return job, Path(str(out).replace("%j", job).replace("%A", job))


def steps_logged(run_dir):
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_training_job_on_two_ranks_writes_checkpoint_and_metrics(cluster, assets, tmp_path):
    """The default run directory is RUNS_ROOT/<job name>: a second job of that name is refused
    while the first runs, and one submitted after it ends resumes its run."""
    import time

    run_dir, env = tmp_path / "rlep-named", {"RUNS_ROOT": str(tmp_path), "RUN_DIR": ""}
    named = ("--job-name=rlep-named", "--oversubscribe")
    job, log = submit(cluster, "train.sbatch", run_dir, overrides(assets, 2, "logging.eval_every=2",
                                                                  "logging.save_every=1"),
                      nproc=2, preflight=True, sbatch=named, cpus=1, env=env)
    while cluster.job_state(job) == "PENDING" or not (run_dir / ".slurm-job").is_file():
        time.sleep(0.3)
    twin, twin_log = submit(cluster, "train.sbatch", tmp_path / "twin", overrides(assets, 2),
                            sbatch=named, cpus=1, env=env)
    assert cluster.wait(twin) == "FAILED"
    assert f"error: {run_dir} is in use by job {job}, which is still queued or running" in \
        twin_log.read_text()
    state = cluster.wait(job)
    text = log.read_text()
    assert state == "COMPLETED", text[-4000:]
    assert f"job {job} (restart 0) on 1 node(s) x 2 rank(s)" in text
    assert "] no CUDA device: CPU run" in text and "] versions: torch 2.13.0" in text
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert steps_logged(run_dir) == [0, 1, 2]
    assert (run_dir / "hf" / "config.json").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    # resubmitted under the same name, a longer run resumes where the first ended
    again, again_log = submit(cluster, "train.sbatch", run_dir, overrides(assets, 3), sbatch=named,
                              env=env)
    assert cluster.wait(again) == "COMPLETED", again_log.read_text()[-3000:]
    assert "at step 2" in again_log.read_text() and steps_logged(run_dir) == [0, 1, 2, 3]
    runs = list((run_dir / "wandb").glob("offline-run-*"))  # one wandb run, resumed: one id
    assert len(runs) == 2 and len({p.name.rsplit("-", 1)[1] for p in runs}) == 1


def test_a_gpu_preset_asks_for_gpus_and_stops_on_a_node_without_them(cluster, tmp_path):
    # the scripts ask for 8 GPUs a node: this cluster has none, so sbatch refuses at once
    import subprocess

    refused = subprocess.run(["sbatch", "--parsable", str(REPO / "slurm" / "train.sbatch"),
                              "experiment=dapo_nodyn_bs64"], env=cluster.env(),
                             capture_output=True, text=True, timeout=scaled(60))
    assert refused.returncode != 0 and "Invalid generic resource" in refused.stderr
    # with --gpus-per-node=0 it runs, and the preflight stops the 7B preset on this CPU node
    job, log = submit(cluster, "train.sbatch", tmp_path / "run", ["experiment=dapo_nodyn_bs64"],
                      nproc=8, preflight=True)
    assert cluster.wait(job) == "FAILED"
    text = log.read_text()
    assert "PROBLEM: the model /checkpoints/Qwen2.5-Math-7B needs a GPU (model.needs_gpu=true) " \
           "but torch sees none here" in text
    assert "Megatron-Core" not in text  # stopped before any rank started


def test_a_time_limited_job_finishes_its_step_checkpoints_requeues_and_resumes(cluster, assets,
                                                                             tmp_path):
    """The time-limit warning (USR1 to the batch shell only, as --signal=B:USR1@300 sends it)
    during a step that lasts longer than torchrun's 30-second grace: the stop file lets that
    step finish, the job checkpoints, requeues itself, resumes and completes. (Preemption,
    `scontrol requeue`'s SIGTERM to every process: tests/test_slurm_rollout_nodes.py, whose
    learners stop as these ranks do.)"""
    import time

    run_dir = tmp_path / "run"
    total, mark = 5, tmp_path / "slow-step-started"
    env = {"PYTHONPATH": str(REPO / "tests" / "helpers" / "slow_trainer"), "SLOW_SECONDS": "40",
           "SLOW_MARK": str(mark), "SLOW_WHEN": "learner0", "SLOW_METHOD": "update"}
    job, log = submit(cluster, "train.sbatch", run_dir,
                      overrides(assets, total, "logging.eval_every=0", "logging.save_every=0"),
                      env=env)
    deadline = time.time() + scaled(300)
    while not mark.exists() and time.time() < deadline:
        assert cluster.job_state(job) in ("PENDING", "RUNNING"), log.read_text()[-3000:]
        time.sleep(0.3)
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    state = cluster.wait(job)
    text = log.read_text()
    assert state == "COMPLETED", text[-4000:]
    assert cluster.job_field(job, "Restarts") == "1"
    limited = int(text.split("saved step-")[1][:6])
    assert limited == 1, text[-3000:]  # the slow first step, finished past torchrun's grace
    assert f"stopping on the stop file {run_dir}/STOP" in text
    assert "received SIGUSR1 (time limit near)" in text and "requeueing job" in text
    assert f"at step {limited}" in text, text[-3000:]
    assert "(restart 1)" in text and not (run_dir / "STOP").exists()
    assert steps_logged(run_dir) == list(range(1, total + 1))
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{total:06d}"


def test_rollout_nodes_split_the_allocation_into_learner_and_rollout_nodes(tmp_path):
    """ROLLOUT_NODES=2 in an 8-node job: the trainer gets the disaggregated placement with 2
    nodes' 16 ranks, the job's last, as rollout ranks; a split that is not whole nodes is refused before
    srun. This cluster has one node, so the batch script runs under bash, with stand-ins for
    srun (it prints its command), scontrol and squeue."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("srun", 'echo "srun $*"'), ("scontrol", "echo node1"), ("squeue", "")):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    (stubs / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this env's
    (stubs / "python").chmod(0o755)
    job = {"PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NUM_NODES": "8", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NAME": "split", "SLURM_JOB_NODELIST": "node[1-8]", "NPROC_PER_NODE": "8",
           "MEGATRON_RLEP_REPO": str(REPO), "MEGATRON_RLEP_VENV": str(tmp_path / "none"),
           "PREFLIGHT": "0", "RUN_DIR": str(tmp_path / "run")}

    def train(*args, script="train.sbatch", **env):
        import subprocess

        base = {k: v for k, v in os.environ.items()
                if not k.startswith("SLURM_") and k != "MASTER_PORT"}
        return subprocess.run(["bash", str(REPO / "slurm" / script), *args],
                              env={**base, **job, **env}, capture_output=True,
                              text=True, timeout=scaled(60), check=False)

    split = train("experiment=x", ROLLOUT_NODES="2")
    assert split.returncode == 0, split.stderr
    assert "2 of 8 nodes (ranks 48-63) run the rollout engines, the other 6 train; learner 0's " \
        'line "the bridge met" names the nodes' in split.stdout
    # the rendezvous port: 20007 from the job's id, or the next free one on this host
    assert re.search(r"--nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint node1:2\d{4} "
                     r"--rdzv_id 7 -m megatron_rlep.train run_dir=\S+ experiment=x "
                     r"rollout.placement=disaggregated rollout.ranks=16$",
                     split.stdout.splitlines()[-1]), split.stdout
    # an array task of a sweep is split the same way
    sweep = train("experiment=cpu_demo", "seed=1,2", script="sweep.sbatch", ROLLOUT_NODES="2",
                  SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_JOB_ID="7")
    assert sweep.returncode == 0, sweep.stderr
    assert sweep.stdout.splitlines()[-1].endswith(
        "experiment=cpu_demo seed=2 rollout.placement=disaggregated rollout.ranks=16"), sweep.stdout
    for refused, args, env in (
            ("error: ROLLOUT_NODES=1.5 is not a whole number of nodes; give how many",
             (), {"ROLLOUT_NODES": "1.5"}),
            (("error: rollout.ranks=12 is not whole nodes of 8 ranks; on Slurm the rollout "
              "ranks are whole nodes: give ROLLOUT_NODES=N instead"), ("rollout.ranks=12",), {})):
        done = train("experiment=x", *args, **env)
        assert done.returncode == 2 and refused in done.stderr, done.stderr
        assert "srun" not in done.stdout


def test_a_split_without_a_training_node_is_refused_before_srun(cluster, tmp_path):
    job, log = submit(cluster, "train.sbatch", tmp_path / "run", ["experiment=cpu_baseline"],
                      nproc=2, preflight=True, env={"ROLLOUT_NODES": "1"})
    assert cluster.wait(job) == "FAILED"
    text = log.read_text()
    assert "error: ROLLOUT_NODES=1 leaves no training node in a job of 1 node(s); submit with " \
           "more nodes (sbatch -N) or fewer rollout nodes" in text, text
    assert "] versions:" not in text  # the preflight (the first srun) never ran


def test_sweep_runs_as_an_array_job(cluster, assets, tmp_path):
    base = tmp_path / "sweep"
    job, log = submit(cluster, "sweep.sbatch", base,
                      overrides(assets, 1, "logging.eval_every=0",
                                "algorithm.pool_min_coverage=0") + ["seed=1,2"],
                      sbatch=("--array=0-1", "--oversubscribe"), cpus=1)  # the two tasks at once
    for index, seed in ((0, 1), (1, 2)):
        task_log = Path(str(log).replace("%a", str(index)))
        assert cluster.wait(f"{job}_{index}") == "COMPLETED", task_log.read_text()[-3000:]
        assert steps_logged(base / str(index)) == [1]
        record = next((base / str(index) / "wandb").glob("offline-run-*/run-*.wandb"))
        assert f"seed={seed}".encode() in record.read_bytes()  # named after its overrides


def test_pipeline_chains_baseline_pool_rlep_and_evaluation(cluster, tmp_path):
    import subprocess

    env = dict(cluster.env(), OUT=str(tmp_path / "pipeline"), SBATCH_ARGS="--hold")
    result = subprocess.run(["bash", str(REPO / "slurm" / "pipeline.sh"), "cpu"], env=env,
                            capture_output=True, text=True, timeout=scaled(120))
    assert result.returncode == 0, result.stderr
    base, pool, rlep, eval_base, eval_rlep = re.search(
        r"baseline (\d+) -> pool (\d+) -> rlep (\d+); evaluation (\d+), (\d+)", result.stdout).groups()
    try:
        expected = {pool: base, rlep: pool, eval_base: base, eval_rlep: rlep}
        for job, after in expected.items():
            assert cluster.job_field(job, "Dependency").startswith(f"afterok:{after}")
        scripts = {base: "train.sbatch", pool: "build_pool.sbatch", rlep: "train.sbatch",
                   eval_base: "evaluate.sbatch", eval_rlep: "evaluate.sbatch"}
        for job, script in scripts.items():
            assert cluster.job_field(job, "Command").endswith(f"slurm/{script}")
            assert cluster.job_field(job, "StdOut").startswith(str(tmp_path / "pipeline"))
    finally:
        cluster.run("scancel", base, pool, rlep, eval_base, eval_rlep, check=False)


def test_a_stopped_cluster_leaves_no_job_process_behind(tmp_path):
    """What a test that stops early (a failure, pytest's timeout) runs in its teardown: a job
    whose step ignores SIGTERM is killed with its batch script, srun and slurmstepd processes,
    so nothing of it outlives the cluster (before, all five were still there after the daemons
    had stopped)."""
    import time

    os.chmod(tmp_path, 0o700)
    own = slurm_cluster.Cluster(tmp_path, cpus=1).start()
    try:
        job = own.run("sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", "--wrap",
                      "srun bash -c 'trap \"\" TERM; sleep 600'")
        deadline = time.time() + scaled(60)
        while len(own.leftovers()) < 5 and time.time() < deadline:  # script, srun, steps, sleep
            time.sleep(0.5)
        assert own.job_state(job) == "RUNNING" and len(own.leftovers()) >= 5, own.leftovers()
    finally:
        own.stop()
    assert own.leftovers() == []
