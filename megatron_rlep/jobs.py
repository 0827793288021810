"""Tools that run as data-parallel ranks: one process, or N under torchrun / srun.

The work is cut into fixed units (a unit's content and seed never depend on the number of
ranks); unit u goes to engine u mod E, and a unit whose output file already exists is not
redone, so a killed job resumes where it stopped. An engine is one rank, or with a vLLM engine
of tensor parallel size T the T consecutive ranks that run it together (``engines``): they
sample the same units and the first of them writes the outputs. The settings a job started with are pinned
in a JSON file of its output directory; a rerun with other settings is refused.

Used by tools/build_pool.py and tools/evaluate.py. No model or data logic here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep.errors import ConfigError


def start() -> tuple[int, int]:
    """(rank, world size); starts the process group when launched with several ranks and
    gives each rank its own GPU."""
    from megatron_rlep import platform

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        dist.init_process_group(platform.backend())
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def pin_settings(path: Path, wanted: dict, rank: int) -> None:
    """Write ``wanted`` to ``path`` on the first run; on a rerun, refuse other settings (a key
    an earlier version did not write counts as None: a new key's default keeps the behaviour
    from before it existed)."""
    from megatron_rlep.files import write_json_atomic

    if rank == 0 and not path.is_file():
        write_json_atomic(wanted, path)
    barrier()
    previous = json.loads(path.read_text())
    changed = next((k for k in wanted if previous.get(k) != wanted[k]), None)
    if changed is not None:
        raise ConfigError(
            f"output directory {path.parent} was started with other settings ({changed}: "
            f"{previous.get(changed)!r} there, {wanted[changed]!r} now); rerun with the same "
            "settings to resume, or give a new out=")


def engines(rank: int, world: int, tensor_parallel: int) -> tuple[int, int, bool]:
    """(this rank's engine k, the number of engines, whether this rank writes engine k's
    outputs): ranks [k * tp, (k + 1) * tp) run engine k."""
    if world % tensor_parallel:
        raise ConfigError(f"rollout.tensor_parallel={tensor_parallel} does not divide the "
                          f"{world} ranks; launch a multiple of it (torchrun --nproc_per_node) "
                          "or pick a divisor")
    return rank // tensor_parallel, world // tensor_parallel, rank % tensor_parallel == 0


def my_units(n_units: int, rank: int, world: int, done) -> list[int]:
    """The units rank (or engine) ``rank`` of ``world`` still has to do: u mod world == rank
    and not ``done(u)``."""
    return [u for u in range(n_units) if u % world == rank and not done(u)]
