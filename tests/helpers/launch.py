"""How the tests start the project's commands: one process, or torchrun with N of them.

Each pytest worker has an equal share of the machine's cores (``share_cores``), and each
process it starts an equal share of those as torch threads, so two workers, or two ranks, do not
oversubscribe the machine.
"""

import os
import re
import signal
import sys
from pathlib import Path


def launcher(nproc: int = 1) -> list[str]:
    """The argv prefix that starts a script or module on ``nproc`` local ranks."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(nproc)]


def kill_job(pid: int) -> None:
    """SIGKILL to process ``pid`` and every process under it, as a lost node ends a job:
    torchrun starts each worker in a session of its own, out of reach of ``os.killpg``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except OSError:  # gone
            continue
        children.setdefault(parent, []).append(int(entry.name))
    doomed = [pid]
    for each in doomed:
        doomed += children.get(each, [])
    for each in doomed:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def worker_cores() -> int:
    """This pytest worker's share of the machine's cores: all of them in one process, half each
    for two xdist workers."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


def share_cores() -> None:
    """Run in each worker before the tests: whatever its tests start inherits the worker's share
    as OpenMP threads (an explicit OMP_NUM_THREADS wins), and OpenMP threads that sleep while
    they wait. Two workers with two spinning threads each on two cores made small torch steps
    wait on each other sevenfold (a 6-token generation on the built-in model: 12 s, against
    1.7 s with one thread each and 1.8 s with passive waits)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(worker_cores()))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "torch" in sys.modules:  # the tests' own steps in this process
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def env(argv: list[str] | None = None, **extra: str) -> dict:
    """The environment for ``argv``: torch threads per process from its rank count."""
    argv = list(map(str, argv or []))
    nproc = int(argv[argv.index("--nproc_per_node") + 1]) if "--nproc_per_node" in argv else 1
    threads = max(1, worker_cores() // nproc)
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", **extra)


def why(done) -> str:
    """What a failed run printed: its first error lines (a torchrun job's tail is its workers'
    C++ frames, which hide them), then the tails of its output."""
    text = f"{done.stdout or ''}\n{done.stderr or ''}"
    errors = [line for line in text.splitlines()
              if re.match(r"(error: |([\w.]+\.)?\w*(Error|Exception)\b)", line)]
    return "\n".join(errors[:6]) + "\n...\n" + (done.stdout or "")[-3000:] + \
        (done.stderr or "")[-3000:]
