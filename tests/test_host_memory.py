"""megatron_rlep/host_memory.py on real processes: a grandchild's pages count in the trees above it,
and the heap's live and free bytes under tcmalloc (preloaded, as the trainer runs on a CPU) and
under glibc's allocator."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep import host_memory
from megatron_rlep.cli import cpu_runtime_libraries

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from launch import env  # noqa: E402
from tiny import make_model  # noqa: E402

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


# steps each freeing a block of the MiB given on the command line, written or not (``w``/``u``);
# after each: what went back, tcmalloc's free bytes and the resident anonymous pages (MiB)
STEPS = """
import ctypes, json, sys
from megatron_rlep.host_memory import FreePageSettle, heap_bytes, resident_anonymous
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
settle, seen = FreePageSettle(), []
for mib, how in json.loads(sys.argv[1]):
    block = libc.malloc(mib << 20)
    if how == "w":
        ctypes.memset(block, 1, mib << 20)
    libc.free(block)
    released = settle().get("perf/heap_released_gib")
    seen.append([None if released is None else released * 1024,
                 heap_bytes().get("free", 0) / 2**20, resident_anonymous() / 2**20])
print(json.dumps(seen))
"""


def settled(env: dict, steps: list) -> list:
    done = subprocess.run([sys.executable, "-c", STEPS, json.dumps(steps)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env},
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_after_the_warm_up_every_free_page_goes_back_once(tcmalloc):
    """The third step's written 64 MiB go back to the kernel after it, and nothing after that:
    not the later, larger step's 320 (a release after the warm-up was followed by more memory
    than before it, in every soak that made one)."""
    seen = settled({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_SETTLE": "3"},
                   [[64, "w"]] * 3 + [[320, "w"]] + [[64, "w"]] * 3)
    released, free, resident = zip(*seen)
    assert released[:2] == (0.0, 0.0) and released[2] >= 48 and free[2] <= 16
    assert resident[2] <= resident[1] - 48
    assert released[3:] == (0.0,) * 4 and min(free[3:]) >= 300  # kept for the next steps


def test_pages_counted_free_but_never_written_go_back_too(tcmalloc):
    """tcmalloc counts a block freed unwritten as free pages, which a later step would make
    resident by writing them for the first time: after the warm-up they go back as well."""
    seen = settled({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_SETTLE": "2"},
                   [[320, "u"]] * 2 + [[64, "w"]] * 2)
    assert seen[0][0] == 0.0 and seen[0][1] >= 300  # counted free, never written
    assert seen[1][1] <= 16  # handed back after the second step


def test_the_release_can_be_turned_off_and_leaves_other_allocators_alone(tcmalloc):
    steps = [[64, "w"]] * 3
    kept = settled({"LD_PRELOAD": tcmalloc, "MEGATRON_RLEP_HEAP_SETTLE": "0"}, steps)
    assert [k[0] for k in kept] == [None] * 3 and kept[2][1] >= 60  # off: all kept
    assert [k[0] for k in settled({}, steps)] == [None] * 3  # nothing preloaded: glibc's


def test_a_bad_setting_is_named():
    done = subprocess.run([sys.executable, "-c", STEPS, "[]"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MEGATRON_RLEP_HEAP_SETTLE": "ten"},
                          cwd=Path(__file__).resolve().parent.parent)
    assert "MEGATRON_RLEP_HEAP_SETTLE='ten' is not a number of steps" in done.stderr


# the heap (live and free bytes, MiB) after each update of a tiny model with SmolLM2's vocabulary
# on answers longer every step: 8 sequences of 8 to 64 response tokens (argv: model, chunk)
LONGER = """
import sys
import torch
from megatron_rlep.actor.actor import Actor
from megatron_rlep.actor.batch import SequenceBatch
from megatron_rlep.config import AlgorithmConfig
from megatron_rlep.host_memory import heap_bytes
actor = Actor(sys.argv[1], AlgorithmConfig(lr=0.0), micro_batch_size=8,
              logprob_chunk_tokens=int(sys.argv[2]))
for length in range(8, 72, 8):
    tokens = [[1, 2, 3, 4] + [5 + (i + j) % 50 for j in range(length)] for i in range(8)]
    actor.train_step(SequenceBatch(tokens, [4] * 8, advantages=torch.linspace(-1, 1, 8)))
    heap = heap_bytes()
    print("HEAP", (heap["in_use"] + heap["free"]) >> 20)
"""


def test_log_probs_in_chunks_keep_the_heap_from_growing_with_the_longest_micro_batch(tcmalloc,
                                                                                      tmp_path):
    """An update's largest tensors are its [response tokens x vocabulary] logits and their
    softmax; a micro-batch with more response tokens than any before takes new pages for them,
    which tcmalloc then keeps (the synchronous soak's jumps of about 110 MiB). With
    ``parallel.logprob_chunk_tokens`` (32 here) they come that many rows at a time, so the longer
    micro-batches grow the heap by a fraction of it (measured: 432 MiB without, 72 with, over
    448 more rows)."""
    model, grown = make_model(tmp_path / "m", "llama"), []
    for chunk in (0, 32):
        done = subprocess.run([sys.executable, "-c", LONGER, str(model), str(chunk)],
                              capture_output=True, text=True, timeout=scaled(600),
                              env={**env(), "LD_PRELOAD": tcmalloc},
                              cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stderr[-3000:]
        heap = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("HEAP")]
        grown.append(heap[-1] - heap[0])
    whole, chunked = grown
    assert whole >= 250, grown  # 448 more rows: 84 MiB for each [rows x 49,152] fp32 tensor
    assert chunked <= whole / 4, grown
