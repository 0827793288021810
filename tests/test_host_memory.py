"""megatron_rlep/host_memory.py on real processes: a grandchild's pages count in the trees above it,
and the heap's live and free bytes under tcmalloc (preloaded, as the trainer runs on a CPU) and
under glibc's allocator."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rlep import host_memory
from megatron_rlep.cli import cpu_runtime_libraries

# 384 MiB allocated and touched, then freed; the heap read at each point
HEAP = """
import json
from megatron_rlep.host_memory import heap_bytes
before = heap_bytes()
block = bytearray(384 << 20)
during = heap_bytes()
del block
print(json.dumps([before, during, heap_bytes()]))
"""


@pytest.mark.parametrize("children_files", [True, False], ids=["children-files", "parents"])
def test_a_grandchilds_pages_count_in_each_tree_above_it(children_files, monkeypatch):
    if not children_files:  # each process's parent read from /proc instead
        monkeypatch.setattr(host_memory, "CHILDREN_FILES", False)
    grandchild = "import time; b = bytearray(256 << 20); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              f"subprocess.run([sys.executable, '-c', {grandchild!r}])"],
                             stdout=subprocess.PIPE, text=True)
    try:
        alone = host_memory.tree_sizes(child.pid)  # may be read before the pages are touched
        assert child.stdout.readline().strip() == "1"
        pss, uss = host_memory.tree_sizes(child.pid)
        assert uss >= 256 << 20 > min(alone)  # the block's pages are the grandchild's alone
        assert pss >= uss
        mine = host_memory.tree_bytes()
        assert mine >= pss + (16 << 20)  # this interpreter, with torch imported, and the tree
    finally:
        subprocess.run(["pkill", "-9", "-P", str(child.pid)])
        child.kill()
        child.wait()


def heaps(env: dict) -> tuple[dict, dict, dict]:
    done = subprocess.run([sys.executable, "-c", HEAP], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parent.parent, check=True)
    return tuple(json.loads(done.stdout))


def test_tcmalloc_keeps_a_freed_block_as_free_heap_not_live_bytes():
    tcmalloc = [lib for lib in cpu_runtime_libraries() if "tcmalloc" in lib]
    if not tcmalloc:
        pytest.skip("tcmalloc is not installed here (scripts/env.sh installs it)")
    before, during, after = heaps({"LD_PRELOAD": tcmalloc[0], "PATH": "/usr/bin:/bin"})
    assert during["in_use"] - before["in_use"] >= 384 << 20
    assert after["in_use"] - before["in_use"] < 16 << 20  # live bytes back where they were
    assert after["free"] - before["free"] >= 300 << 20  # the block kept, free, for later


def test_glibc_reports_a_large_block_while_it_lives():
    before, during, after = heaps({"MEGATRON_RLEP_MALLOC": "glibc", "PATH": "/usr/bin:/bin"})
    assert during["in_use"] - before["in_use"] >= 384 << 20
    assert after["in_use"] - before["in_use"] < 16 << 20  # mmap'd: handed back to the kernel
    assert after["free"] < 64 << 20


def test_metrics_name_each_figure_under_the_prefix():
    got = host_memory.metrics("perf/rollout_")
    assert set(got) <= {"perf/rollout_host_memory_gib", "perf/rollout_heap_in_use_gib",
                        "perf/rollout_heap_free_gib"}
    assert got["perf/rollout_host_memory_gib"] > 0.01
