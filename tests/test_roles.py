"""A rank's side and GPU (megatron_rlep/roles.py): chosen from the environment as the process
starts, and, through the real entry point under torchrun, each rank of a disaggregated job on a
GPU of its own (scripts/gpu_devices.sh on a fake node whose CUDA, like the real one, reads
CUDA_VISIBLE_DEVICES once, when it starts)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from launch import env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_a_rollout_rank_keeps_only_its_node_local_gpu_visible(monkeypatch):
    from megatron_rlep import roles

    variables = {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    roles.own_device(variables)
    assert variables == {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7", "NCCL_CUMEM_ENABLE": "0"}
    variables = {"SLURM_LOCALID": "2"}
    monkeypatch.setattr(roles.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    roles.own_device(variables)
    assert variables["CUDA_VISIBLE_DEVICES"] == "2" and variables["LOCAL_RANK"] == "0"
    monkeypatch.setattr(roles.os.path, "exists", lambda path: False)  # a CPU node
    variables = {"LOCAL_RANK": "1"}
    roles.own_device(variables)
    assert variables == {"LOCAL_RANK": "1"}


@pytest.mark.parametrize("rank, role", [("0", ("learner", 0, 2)), ("1", ("learner", 1, 2)),
                                        ("3", ("rollout", 1, 2))])
def test_the_last_ranks_are_rollout_ranks_and_the_learners_a_world_of_their_own(
        monkeypatch, rank, role):
    from megatron_rlep import roles
    from megatron_rlep.config import ConfigError, compose

    cfg, colocated = compose(["rollout.placement=disaggregated", "rollout.ranks=2"]), compose([])
    monkeypatch.setattr(roles.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    for name in ("CUDA_VISIBLE_DEVICES", "NCCL_CUMEM_ENABLE"):  # own_device sets them: unset
        monkeypatch.setenv(name, "")  # here, and restored after (delenv of an unset name would
        monkeypatch.delenv(name)  # restore nothing)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LOCAL_RANK", rank)
    assert roles.take_role([cfg]) == role
    if role[0] == "learner":
        assert (os.environ["WORLD_SIZE"], os.environ["RANK"]) == ("2", rank)
        assert "CUDA_VISIBLE_DEVICES" not in os.environ  # every device, its own by LOCAL_RANK
    else:
        assert (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["LOCAL_RANK"]) == (rank, "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="rollout.ranks=2 leaves no rank to train"):
        roles.take_role([cfg])
    assert roles.take_role([colocated, colocated]) is None  # every rank learns
    with pytest.raises(ConfigError, match="sweep of 2 jobs in one launch cannot use"):
        roles.take_role([colocated, cfg])


@pytest.mark.e2e
def test_each_rank_of_a_disaggregated_job_takes_a_gpu_of_its_own_from_the_entry_point(tmp_path):
    """Finding 1 of issue 76, through ``python -m megatron_rlep.train`` under torchrun (three
    ranks: a learner, two rollout ranks) for the needs_gpu preset model=qwen3-8b, with
    CUDA_VISIBLE_DEVICES unset on a fake node of four GPUs: the learner on GPU 0 (LOCAL_RANK),
    the rollout ranks on GPUs 1 and 2, whose CUDA saw only that GPU when it started. (Before,
    the GPU check started CUDA in every rank with the four GPUs visible, before a rollout rank
    narrowed them, and every rollout rank's engine went to GPU 0.)"""
    out = tmp_path / "devices"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_devices.sh"), str(out)], capture_output=True,
        text=True, timeout=scaled(600), cwd=REPO,
        env=env(["--nproc_per_node", "3"], FAKE_CUDA_DEVICES="4",
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
    log = (out / "log.txt").read_text()[-3000:] if (out / "log.txt").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert "DEVICES OK" in done.stdout
    events = [json.loads(line) for line in (out / "devices.jsonl").read_text().splitlines()]
    taken = {e["rank"]: e["device"] for e in events if e["event"] == "device taken"}
    assert taken == {"0": 0, "1": 1, "2": 2}, done.stdout
    started = {e["rank"]: e["visible"] for e in events if e["event"] == "cuda started"}
    assert started == {"0": [0, 1, 2, 3], "1": [1], "2": [2]}, done.stdout


def test_the_slurm_scripts_launcher_is_torchrun_less_its_traceback():
    """Issue 76, item 4: a failed rank has said why in one sentence; the node's launcher
    (``python -m megatron_rlep.launch``, as slurm/common.sh starts it) adds one line and no
    traceback, where torchrun adds its ChildFailedError traceback on every node."""
    launch = [sys.executable, "-m", "megatron_rlep.launch", "--standalone", "--nproc_per_node",
              "1", "--no-python", "false"]
    done = subprocess.run(launch, capture_output=True, text=True, timeout=scaled(120), cwd=REPO)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "launch: rank 0 of this node's ranks exited with status 1; the job's log says why" \
        in done.stderr
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", *launch[3:]],
                              capture_output=True, text=True, timeout=scaled(120), cwd=REPO)
    assert torchrun.returncode == 1 and "ChildFailedError" in torchrun.stderr  # what it spares



def test_a_node_that_loses_the_rendezvous_says_so_in_one_line():
    """A two-node job whose first node's rank fails: that node's launcher ends and its
    rendezvous store with it, and the second node's launcher, watching the rendezvous while its
    rank runs, loses it. It says so in one line and exits 1, with no traceback (on f6a37d0 it
    printed RendezvousConnectionError's, which CI's two-node killed-rank test caught) and none
    of its store's C++ stacks, while its rank keeps the C++ log level it was given."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def node(keeper: bool, program: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "megatron_rlep.launch", "--nnodes", "2", "--nproc_per_node",
             "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
             "--rdzv_id", "lost", "--rdzv_conf", f"is_host={int(keeper)}", "--no-python",
             *program], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "TORCH_CPP_LOG_LEVEL": "WARNING"})

    first = node(True, ["false"])
    second = node(False, ["sh", "-c", "echo rank sees $TORCH_CPP_LOG_LEVEL; sleep 60"])
    said = second.communicate(timeout=scaled(120))[0]
    first.communicate(timeout=scaled(60))
    assert second.returncode == 1 and "Traceback" not in said and "frame #" not in said, said
    assert "rank sees WARNING" in said, said
    assert "launch: this node lost the job's rendezvous" in said, said
