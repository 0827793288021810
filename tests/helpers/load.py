"""A CPU kept busy, for tests that a loaded machine changes no verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

from megatron_rlep.reward.equivalence import _cpu_seconds


@contextmanager
def one_busy_cpu(hogs: int):
    """This process, and what it starts, on one CPU that ``hogs`` spinning processes share,
    each in a session of its own at nice 19 as a sandboxed program runs: whether the kernel
    shares a CPU between sessions (autogroup) or by priority, a sandboxed program started here
    gets about 1 / (hogs + 1) of it."""
    cpu = min(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                              preexec_fn=lambda: (os.sched_setaffinity(0, {cpu}), os.nice(19)))
             for _ in range(hogs)]
    mask = os.sched_getaffinity(0)
    try:
        while min(_cpu_seconds(p.pid) or 0.0 for p in procs) < 0.02:  # all of them spinning
            time.sleep(0.05)
        os.sched_setaffinity(0, {cpu})
        yield
    finally:
        os.sched_setaffinity(0, mask)
        for p in procs:
            p.kill()
            p.wait()
