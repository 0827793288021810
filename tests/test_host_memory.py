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
        pss, uss, anon = host_memory.tree_sizes(child.pid)
        assert uss >= 256 << 20 > min(alone)  # the block's pages are the grandchild's alone
        assert pss >= uss and anon >= 256 << 20
        mine = host_memory.tree_bytes()
        assert mine >= pss + (16 << 20)  # this interpreter, with torch imported, and the tree
    finally:
        subprocess.run(["pkill", "-9", "-P", str(child.pid)])
        child.kill()
        child.wait()


@pytest.fixture
def tcmalloc() -> str:
    """The tcmalloc library the trainer preloads on a CPU host."""
    found = [lib for lib in cpu_runtime_libraries() if "tcmalloc" in lib]
    if not found:
        pytest.skip("tcmalloc is not installed here (scripts/env.sh installs it)")
    return found[0]


def heaps(env: dict) -> tuple[dict, dict, dict]:
    done = subprocess.run([sys.executable, "-c", HEAP], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parent.parent, check=True)
    return tuple(json.loads(done.stdout))


def test_tcmalloc_keeps_a_freed_block_as_free_heap_not_live_bytes(tcmalloc):
    before, during, after = heaps({"LD_PRELOAD": tcmalloc, "PATH": "/usr/bin:/bin"})
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


# six steps, each freeing a block of the given MiB; with MEGATRON_RLEP_HEAP_CAP=2 the second hands
# every free page back and the third and fourth set the cap
CAP = """
import json
from megatron_rlep.host_memory import FreePageCap, heap_bytes
cap, seen = FreePageCap(), []
for mib in (64, 64, 64, 64, 320, 64):
    block = bytearray(mib << 20)
    del block
    seen.append([cap().get("perf/heap_released_gib"), heap_bytes().get("free", 0) / 2**20])
print(json.dumps(seen))
"""


# six steps, each freeing a 320 MiB block, written only in the fifth: tcmalloc counts the block's
# pages as free from the first step on, the kernel makes them resident only in the fifth
UNWRITTEN = """
import ctypes, json
from megatron_rlep.host_memory import FreePageCap, heap_bytes, resident_anonymous
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
cap, seen, size = FreePageCap(), [], 320 << 20
for write in (False, False, False, False, True, False):
    block = libc.malloc(size)
    if write:
        ctypes.memset(block, 1, size)
    libc.free(block)
    seen.append([cap().get("perf/heap_released_gib"), heap_bytes()["free"] / 2**20,
                 resident_anonymous() / 2**20])
print(json.dumps(seen))
"""


# steps each writing and freeing a block of the MiB given on the command line
WRITTEN = """
import ctypes, json, sys
from megatron_rlep.host_memory import FreePageCap
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
cap, seen = FreePageCap(), []
for mib in json.loads(sys.argv[1]):
    block = libc.malloc(mib << 20)
    ctypes.memset(block, 1, mib << 20)
    libc.free(block)
    seen.append(cap().get("perf/heap_released_gib"))
print(json.dumps(seen))
"""


def capped(env: dict, script: str = CAP, *args: str) -> list:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **env},
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_free_pages_above_the_warm_ups_most_go_back_to_the_kernel(tcmalloc):
    warm, settle, *learn, large, after = capped({"LD_PRELOAD": tcmalloc,
                                                 "MEGATRON_RLEP_HEAP_CAP": "2"})
    assert warm[0] == 0.0  # the warm-up notes what it holds, and at its end ...
    assert settle[0] * 1024 >= 48 and settle[1] <= 16  # ... hands every free page back once
    assert [step[0] for step in learn] == [0.0, 0.0]  # the steps after it set the cap
    assert large[0] * 1024 >= 200  # the larger block's extra pages handed back ...
    assert large[1] <= warm[1] + 16  # ... down to the warm-up's free pages
    assert after == [0.0, pytest.approx(after[1])] and after[1] <= warm[1] + 16
    kept = capped({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_CAP": "0"})
    assert [k[0] for k in kept] == [None] * 6 and kept[4][1] >= 300  # off: all kept


def test_pages_counted_free_but_first_written_after_the_warm_up_go_back_too(tcmalloc):
    """A step that first writes pages tcmalloc has held (and counted free) since the warm-up
    grows the process with tcmalloc's figures unchanged: the cap goes by the resident pages."""
    warm, _, _, learnt, written, after = capped({"LD_PRELOAD": tcmalloc,
                                                 "MEGATRON_RLEP_HEAP_CAP": "2"}, UNWRITTEN)
    assert warm[0] == 0.0 and warm[1] >= 300  # counted free, never written
    assert learnt[0] == 0.0 and learnt[1] >= 300  # taken again after the release, not written
    assert written[0] * 1024 >= 300  # written in the fifth step: handed back after it
    assert written[2] <= warm[2] + 16  # the process's resident pages back at the warm-up's
    assert after[0] == 0.0 and after[2] <= warm[2] + 16


def test_a_working_set_that_grew_for_good_is_released_once_not_every_other_step(tcmalloc):
    """Steps that need 320 MiB from the fifth on: the 320 MiB the fifth leaves go back, the
    sixth writes them again, and what the sixth leaves, starting from no free pages, sets the
    cap: nothing goes back after it (a release each step would fault them in again each step)."""
    released = capped({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_CAP": "2"}, WRITTEN,
                      "[64, 64, 64, 64, 320, 320, 320, 320]")
    assert released[2:4] == [0.0, 0.0] and released[4] * 1024 >= 200
    assert released[5:] == [0.0, 0.0, 0.0]


def test_steps_that_need_less_right_after_a_release_do_not_make_it_release_every_other_step(
        tcmalloc):
    """After a release a step needs 200 MiB, the next 320, and so on (a soak's learner after a
    release: its first step held 180 MiB less than the second): the cap is learnt again over
    the steps after a release, so the pages go back once, not after every step of 320."""
    released = capped({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_CAP": "3"}, WRITTEN,
                      "[64, 64, 64, 64, 64, 64, 320, 200, 320, 200, 320, 200, 320, 200, 320, 200]")
    assert released[3:6] == [0.0] * 3 and released[6] * 1024 >= 200
    assert released[7:] == [0.0] * 9  # the rule before: 320 MiB after every step of 320


def test_the_end_of_the_warm_up_hands_every_free_page_back_once(tcmalloc):
    """Whatever the warm-up held: its steps may have left pages counted free but never written,
    which later steps write for the first time, a few a step, for hundreds of steps (the
    asynchronous soak); after one release every step writes what it takes, so the cap is
    learnt from the memory a long run comes to."""
    released = capped({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_CAP": "3"}, WRITTEN,
                      "[64, 64, 64, 64, 64, 64, 64, 64, 64]")
    assert released[:2] == [0.0, 0.0] and released[2] * 1024 >= 48
    assert released[3:] == [0.0] * 6


def test_the_cap_leaves_other_allocators_alone_and_names_a_bad_setting():
    assert [s[0] for s in capped({})] == [None] * 6  # nothing preloaded: glibc's allocator
    done = subprocess.run([sys.executable, "-c", CAP], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MEGATRON_RLEP_HEAP_CAP": "ten"},
                          cwd=Path(__file__).resolve().parent.parent)
    assert "MEGATRON_RLEP_HEAP_CAP='ten' is not a number of steps" in done.stderr
