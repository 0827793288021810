"""A user's own tools (``module:function``) in their worker processes
(megatron_rlep/rollout/tool_workers.py): whatever a tool does becomes a short observation and the
run goes on; hung calls end at their own deadlines, side by side; no process is left behind."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.errors import RunError
from megatron_rlep.rollout.tools import Result, Toolbox, observation

HOSTILE = '''
import ctypes, os, subprocess, sys, time

class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text")

class Shapeless:
    def __str__(self):
        raise ValueError("no text")
    def __repr__(self):
        raise ValueError("no repr either")

def exits(text): raise SystemExit(3)
def interrupts(text): raise KeyboardInterrupt
def unprintable(text): raise Unprintable("x")
def shapeless(text): return Shapeless()
def nothing(text): return None
def mapping(text): return {"a": 1}
def raw(text): return "café".encode()
def huge(text): return "x" * 10_000_000 + "\\n"
def loud(text):
    print("x" * 50_000_000)
    sys.stderr.write("y" * 1_000_000)
    os.write(1, b"z" * 1000)
    subprocess.run(["echo", "from a child"])
    return "done"
def verdict(text):
    from megatron_rlep.rollout.tools import Result
    return Result("no such constant", "error")
def quits(text): os._exit(3)
def crashes(text): ctypes.string_at(0)
def wait(text):
    time.sleep(float(text))
    return "awake"
def spawns(text):
    child = subprocess.Popen(["sleep", "60"])
    with open(text, "w") as f:
        f.write(str(child.pid))
    child.wait()
'''
NAMES = ("exits", "interrupts", "unprintable", "shapeless", "nothing", "mapping", "raw", "huge",
         "verdict", "loud", "quits", "crashes", "wait", "spawns")


def workers_of(pid: int) -> list[int]:
    """The tool worker processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and b"tool_workers.py" in cmdline:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder on the Python path holding ``hostile.py``."""
    folder = tmp_path_factory.mktemp("tools")
    (folder / "hostile.py").write_text(HOSTILE)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def hostile(folder):
    return [f"hostile:{name}" for name in NAMES]


@pytest.fixture(scope="module")
def box(hostile):
    with Toolbox(hostile, timeout_s=5.0, output_chars=40, workers=4) as box:
        yield box
    assert not workers_of(os.getpid())


ANSWERS = {
    "exits": Result("SystemExit: 3", "error"),
    "interrupts": Result("KeyboardInterrupt", "error"),
    "unprintable": Result("Unprintable", "error"),  # its message fails: its type's name
    "shapeless": Result("Shapeless", "ok"),  # neither str nor repr works: its type's name
    "nothing": Result("None"),
    "mapping": Result("{'a': 1}"),
    "raw": Result("café"),
    "huge": Result("x" * 40, more=10_000_000 - 40),  # cut in the worker, the cut counted
    "verdict": Result("no such constant", "error"),  # a Result of its own: its status kept
}


@pytest.mark.parametrize("tool", ANSWERS)
def test_whatever_a_users_tool_raises_or_returns_is_a_short_observation(box, tool):
    assert box.run([(tool, "")]) == [ANSWERS[tool]]
    assert len(observation(ANSWERS[tool], 40)) < 100


def test_what_a_users_tool_prints_reaches_no_log_and_the_call_answers(box, capfd):
    assert box.run([("loud", "")]) == [Result("done")]
    out, err = capfd.readouterr()
    assert out == err == ""


def test_a_tool_that_ends_its_process_is_an_error_and_the_next_call_runs(box):
    quits, crashes, after = box.run([("quits", ""), ("crashes", ""), ("wait", "0")])
    assert quits == Result("the tool's process ended before it answered (exit status 3)",
                           "error")
    assert crashes == Result("the tool's process ended before it answered (SIGSEGV)", "error")
    assert after == Result("awake")


def test_hung_calls_end_side_by_side_within_one_time_out(hostile):
    with Toolbox(hostile, timeout_s=1.0, workers=4) as box:
        start = time.monotonic()
        results = box.run([("wait", "30")] * 4)
        took = time.monotonic() - start
    assert results == [Result("TimeoutError: the tool ran longer than 1 s", "timeout")] * 4
    assert took < 1.0 + scaled(1000) / 1000  # one after another: 4 s


def test_a_quick_call_queued_behind_hung_ones_is_ok(hostile):
    """Two workers, both hung: the quick call waits for one, and its time-out counts from its
    own start, not from the batch's."""
    with Toolbox(hostile, timeout_s=1.0, workers=2) as box:
        start = time.monotonic()
        results = box.run([("wait", "30"), ("wait", "30"), ("wait", "0.5")])
        took = time.monotonic() - start
    assert [r.status for r in results] == ["timeout", "timeout", "ok"]
    assert took < 1.5 + scaled(1000) / 1000


def test_no_process_is_left_after_a_time_out_a_close_or_the_trainers_end(folder, hostile,
                                                                               tmp_path):
    marker, others = tmp_path / "child", set(workers_of(os.getpid()))  # the module's box's
    with Toolbox(hostile, timeout_s=1.0, workers=2) as box:
        (hung,) = box.run([("spawns", str(marker))])
        assert hung.status == "timeout"
        child, deadline = int(marker.read_text()), time.monotonic() + scaled(5)
        while alive(child) and time.monotonic() < deadline:  # SIGKILL lands a moment later
            time.sleep(0.05)  # under load (a suite run on EPYC-512 saw it still running)
        assert not alive(child)  # what the tool started went with it
        assert set(workers_of(os.getpid())) == others  # its worker killed and waited for
        assert box.run([("wait", "0")]) == [Result("awake")]  # in a new one, idle after
        assert len(set(workers_of(os.getpid())) - others) == 1
    assert set(workers_of(os.getpid())) == others

    # a trainer killed mid-call: its workers, the hung one and an idle one, go in a second or so
    trainer = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(folder)!r})
        from megatron_rlep.rollout.tools import Toolbox
        box = Toolbox({hostile!r}, timeout_s=100, workers=2)
        threading.Thread(target=box.run, args=([("wait", "1000")],)).start()
        time.sleep(0.5)
        box.processes.start()
        print("ready", flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        workers = workers_of(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert len(workers) == 2
    deadline = time.monotonic() + scaled(5)
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, workers))


def test_a_tool_that_does_not_import_stops_the_run_at_once(tmp_path, monkeypatch):
    (tmp_path / "leaves.py").write_text("import os\nos._exit(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    others = set(workers_of(os.getpid()))
    with pytest.raises(RunError, match=r"entries leaves:f do not import \(the process ended "
                                       r"while importing the tools \(exit status 5\)\)"):
        Toolbox(["leaves:f"])
    assert set(workers_of(os.getpid())) == others
