"""How the tests start the project's commands: one process, or torchrun with N of them.

Each process gets an equal share of the machine's cores as torch threads, so a one-process
run uses the whole machine and two ranks do not oversubscribe it.
"""

import os
import sys


def launcher(nproc: int = 1) -> list[str]:
    """The argv prefix that starts a script or module on ``nproc`` local ranks."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(nproc)]


def env(argv: list[str] | None = None, **extra: str) -> dict:
    """The environment for ``argv``: torch threads per process from its rank count."""
    argv = list(map(str, argv or []))
    nproc = int(argv[argv.index("--nproc_per_node") + 1]) if "--nproc_per_node" in argv else 1
    threads = max(1, (os.cpu_count() or 1) // nproc)
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", **extra)
