"""How much slower this machine is than the developers' machine the suite's time limits were set
on, and those limits scaled by it.

``factor()`` times a fixed CPU workload (single-threaded float matrix products and a Python
loop, the two kinds of work the suite waits on) against the same workload's time on the
developers' machine, ``REFERENCE_SECONDS``: 1.0 there or on anything faster, 3.0 on a machine
three times slower, or as loaded as that when the suite starts. The controller measures it once
(``tests/conftest.py``) and passes it to the workers and every test's subprocesses in
``MEGATRON_RLEP_TEST_SPEED``; pytest's per-test timeout and the tests' own waits are scaled by
it (``scaled``), so the time limits stay in the order they were set in (a test's own waits
inside pytest's timeout) on any machine.
"""

from __future__ import annotations

import os
import time

VARIABLE = "MEGATRON_RLEP_TEST_SPEED"
REFERENCE_SECONDS = 0.44  # the developers' 2-core machine, 2026-11-25 (the best of five)


def workload_seconds(repeats: int = 3) -> float:
    """The best of ``repeats`` timings of the workload, in seconds."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(192, 192, generator=torch.Generator().manual_seed(0))
    best = float("inf")
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            b = a
            for _ in range(1200):
                b = torch.tanh(b @ a)
            sum(i * i for i in range(6_000_000))
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best


def factor() -> float:
    """This machine's slowness against the developers' machine, at least 1 (measured once)."""
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = f"{max(1.0, workload_seconds() / REFERENCE_SECONDS):.2f}"
    return float(os.environ[VARIABLE])


def scaled(seconds: float) -> int:
    """A time limit set on the developers' machine, for this one."""
    return int(seconds * factor())
