"""A rank's side in a disaggregated job (``rollout.placement=disaggregated``), learner or rollout
rank, and a rollout rank's GPU: chosen once, when the process starts, before anything in it
starts CUDA.

CUDA reads CUDA_VISIBLE_DEVICES once, when it starts: at the first ``torch.cuda.is_available()``,
the first tensor on a GPU, or an import that asks for the device (importing Transformer Engine
did, NVIDIA/TransformerEngine#872). A device narrowed after that changes nothing. So the entry
point (``train.py``) calls ``take_role`` before its heavy imports, and this module must import
nothing heavier than the standard library (no torch).

Learners keep every device of their node visible and take theirs by LOCAL_RANK
(``torch.cuda.set_device`` in ``platform.init_distributed``, torchrun's convention): that holds
whenever CUDA starts.
"""

from __future__ import annotations

import os

from megatron_rlep.errors import ConfigError


def split(cfg) -> tuple[str, int, int]:
    """("learner" | "rollout", this rank's place on its side, the learners' count), from
    torchrun's or srun's variables: the last ``rollout.ranks`` ranks are rollout ranks. A
    learner's WORLD_SIZE and RANK become the learners' (their process group holds only them)."""
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    rollout = cfg.rollout.ranks

    if rollout >= world:
        raise ConfigError(f"config key rollout.ranks={rollout} leaves no rank to train in a job "
                          f"of {world}; start more ranks (torchrun --nproc_per_node, sbatch -N) "
                          "or lower rollout.ranks")
    learners = world - rollout
    if rank < learners:
        os.environ["WORLD_SIZE"], os.environ["RANK"] = str(learners), str(rank)
        return "learner", rank, learners
    return "rollout", rank - learners, learners


def own_device(env=os.environ) -> None:
    """A rollout rank's GPU: only its node-local device stays visible, as device 0. Otherwise
    vLLM's single-process executor (tensor parallelism 1) takes device 0, and every engine of a
    node lands on one GPU (out of memory, or NCCL's duplicate GPU). Where CUDA_VISIBLE_DEVICES
    is unset the node's devices are 0..n-1 (a node without /dev/nvidiactl has none, and keeps
    its environment)."""
    local = int(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or 0)
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if not visible and not os.path.exists("/dev/nvidiactl"):
        return
    env["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)] if visible else str(local)
    env["LOCAL_RANK"] = "0"  # its one device, for vLLM's launcher and the bridge's NCCL group
    # NCCL's cuMem allocations do not mix with vLLM's own memory pool when weights are
    # broadcast into a running engine (verl sets it for the same path)
    env.setdefault("NCCL_CUMEM_ENABLE", "0")


def take_role(jobs: list) -> tuple[str, int, int] | None:
    """This process's side of a disaggregated job (``split``), a rollout rank's device
    narrowed to its own (``own_device``); None for a colocated job, where every rank learns.
    ``jobs``: the configs of the command line (a ``-m`` sweep has several, run in this process
    one after another, so they share its side and device: a disaggregated one runs alone)."""
    if all(cfg.rollout.placement != "disaggregated" for cfg in jobs):
        return None
    if len(jobs) > 1:
        raise ConfigError(f"a sweep of {len(jobs)} jobs in one launch cannot use "
                          "rollout.placement=disaggregated, whose ranks take their side and GPU "
                          "as the process starts; submit it as an array job "
                          "(slurm/sweep.sbatch), one job per task")
    role = split(jobs[0])
    if role[0] == "rollout":
        own_device()
    return role
