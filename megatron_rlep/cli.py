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
