"""A process's host memory, as the trainer logs it every step: the pages its process tree holds
(``tree_bytes``) and how much of its own allocator's heap is in live allocations and how much
is held free for later (``heap_bytes``). The second tells a leak (live bytes that grow) from an
allocator keeping the high-water mark of its largest step (free bytes that grow once, then
stay). ``FreePageSettle`` brings the process to the memory a long run holds after its first
steps, where it stays."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


# whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN, on in most kernels)
CHILDREN_FILES = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started, from its threads' ``children`` files where the kernel
    keeps them, else by each process's parent in /proc (slower: every process is read)."""
    if CHILDREN_FILES:
        out = []
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                out += [int(c) for c in task.read_text().split()]
            except OSError:
                continue  # the thread ended
        return out
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name, in parentheses, may hold spaces: the fields after it are plain
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def tree_sizes(pid: int | None = None) -> tuple[int, int, int]:
    """The proportional and the unique set sizes (PSS, USS) and the anonymous pages of process
    ``pid`` (this one) and its descendants, summed (bytes). PSS is the tree's whole footprint,
    each shared page split among the processes that map it; USS counts the pages no other
    process maps. Both move when processes outside the tree that map the same library pages
    start or end (two soaks side by side: one's end raised the other's PSS by 143 MiB, its USS
    by 215). The anonymous pages (heaps, stacks, tensors) are no other process's, so they do not
    move. Where /proc has no ``smaps_rollup`` all three are a process's resident size."""
    pss = uss = anon = 0
    todo = [pid or os.getpid()]
    while todo:
        current = todo.pop()
        todo += _children(current)
        try:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in
                      Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()[1:]}
            pss += fields["Pss"]
            uss += fields["Private_Clean"] + fields["Private_Dirty"]
            anon += fields["Anonymous"]
        except (OSError, KeyError, ValueError, IndexError):
            try:
                rss = int(Path(f"/proc/{current}/statm").read_text().split()[1]) * \
                    os.sysconf("SC_PAGE_SIZE")
            except OSError:
                continue  # the process ended
            pss, uss, anon = pss + rss, uss + rss, anon + rss
    return pss, uss, anon


def tree_bytes(pid: int | None = None) -> int:
    """The PSS of process ``pid`` (this one) and its descendants (``tree_sizes``)."""
    return tree_sizes(pid)[0]


class _MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (glibc 2.33 and later)
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_bytes() -> dict[str, int]:
    """This process's allocator, asked directly: ``in_use``, the bytes of live allocations, and
    ``free``, the bytes it holds without an allocation in them (tcmalloc: its page heap, central
    and thread caches and fragmentation, the pages it gave back to the kernel left out; glibc:
    its arenas' free chunks). Only this process, not its children. Empty where the allocator is
    neither (or glibc older than 2.33). Neither figure is resident memory: pages taken from the
    kernel and never written count in both but are not resident until written (a freed
    ``torch.empty`` that was never filled adds its size to ``free`` and nothing to the RSS)."""
    process = ctypes.CDLL(None)
    ask = getattr(process, "MallocExtension_GetNumericProperty", None)  # tcmalloc, preloaded
    if ask is not None:
        ask.restype, ask.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]

        def read(name: str) -> int:
            value = ctypes.c_size_t(0)
            return value.value if ask(name.encode(), ctypes.byref(value)) else 0
        in_use = read("generic.current_allocated_bytes")
        held = read("generic.heap_size") - read("tcmalloc.pageheap_unmapped_bytes")
        return {"in_use": in_use, "free": max(held - in_use, 0)}
    mallinfo2 = getattr(process, "mallinfo2", None)
    if mallinfo2 is None:
        return {}
    mallinfo2.restype, mallinfo2.argtypes = _MallInfo2, []
    info = mallinfo2()
    return {"in_use": info.uordblks + info.hblkhd, "free": info.fordblks}


def resident_anonymous() -> int | None:
    """This process's resident anonymous pages (bytes): ``RssAnon`` in /proc/self/status, or None
    where the kernel does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class FreePageSettle:
    """Called once a step: after the ``warmup``-th call, hands every page tcmalloc holds free back
    to the kernel, once (``MallocExtension_ReleaseFreeMemory``), and reports what went
    (``{prefix}heap_released_gib``, 0 at every other call).

    tcmalloc keeps the pages a step frees for the next step (which is why the trainer preloads
    it), and counts a page as held whether or not it was ever written; the kernel makes it
    resident only when written. Without the release, steps wrote pages held since the warm-up a
    few at a time for hundreds of steps (the asynchronous soak's learner: 0.3 MiB a step for 170
    steps, docs/host_memory.md, "Host memory over a long run"). After it, steps start from no free
    pages and write every page they take: the process comes at once to the memory a long run
    holds (that learner: flat from the step after). Once only: every later release measured
    was followed by more memory than before it (the learner, +135 MiB; a rollout rank, +53 and
    +86), the steps after it writing pages of the free pool that had stayed unwritten.
    ``warmup`` is MEGATRON_RLEP_HEAP_SETTLE (10 unless set; 0 keeps every free page). Does
    nothing where tcmalloc is not the allocator or /proc does not give ``RssAnon``."""

    def __init__(self, prefix: str = "perf/"):
        setting = os.environ.get("MEGATRON_RLEP_HEAP_SETTLE", "10")
        if not setting.isdigit():
            raise ValueError(f"MEGATRON_RLEP_HEAP_SETTLE={setting!r} is not a number of steps: "
                             "set it to the steps after which tcmalloc's free pages go back "
                             "once (10 unless set) or 0 to keep every free page")
        self.left, self.prefix = int(setting), prefix  # calls before the release; 0: done or off
        self.release = getattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory", None)
        if self.release is not None:
            self.release.restype, self.release.argtypes = None, []
        if resident_anonymous() is None:
            self.release = None
        self.on = self.release is not None and self.left > 0

    def __call__(self) -> dict[str, float]:
        if not self.on:
            return {}
        released = 0
        if self.left:
            self.left -= 1
            if not self.left:
                before = resident_anonymous()
                self.release()
                released = max(before - resident_anonymous(), 0)
        return {f"{self.prefix}heap_released_gib": released / 2**30}


def metrics(prefix: str = "perf/") -> dict[str, float]:
    """``{prefix}host_memory_gib`` (``tree_bytes``) and ``{prefix}heap_in_use_gib`` and
    ``{prefix}heap_free_gib`` (``heap_bytes``), where the allocator tells."""
    out = {f"{prefix}host_memory_gib": tree_bytes() / 2**30}
    out.update({f"{prefix}heap_{k}_gib": v / 2**30 for k, v in heap_bytes().items()})
    return out
