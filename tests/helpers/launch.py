"""How the tests start the project's commands: one process, or torchrun with N of them.

Each process gets an equal share of the machine's cores as torch threads, so a one-process
run uses the whole machine and two ranks do not oversubscribe it; the two pytest workers' processes
share the cores with passive OpenMP waits (``wait_passively``).
"""

import os
import sys


def launcher(nproc: int = 1) -> list[str]:
    """The argv prefix that starts a script or module on ``nproc`` local ranks."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(nproc)]


def wait_passively() -> None:
    """Run in each worker before the tests: OpenMP threads of whatever its tests start sleep while
    they wait (an explicit OMP_WAIT_POLICY wins). Spinning threads of two workers' processes on
    the same two cores made small torch steps wait on each other sevenfold (a 6-token generation
    on the built-in model: 12 s, against 1.8 s with passive waits and 1.7 s with one thread)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def env(argv: list[str] | None = None, **extra: str) -> dict:
    """The environment for ``argv``: torch threads per process from its rank count."""
    argv = list(map(str, argv or []))
    nproc = int(argv[argv.index("--nproc_per_node") + 1]) if "--nproc_per_node" in argv else 1
    threads = max(1, (os.cpu_count() or 1) // nproc)
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", **extra)
