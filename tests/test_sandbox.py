"""Programs that exhaust resources in the code sandbox (megatron_rlep/reward/sandbox/), each for
real: it must end within its limit, leave no process and no file behind, and leave this process
(the trainer's stand-in) running. What a program can reach outside is tried kind by kind in
test_sandbox_threats.py. The suite requires every layer (the project's machines and CI have
them)."""

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from load import one_busy_cpu
from speed import scaled

from megatron_rlep.reward.sandbox import Limits, Sandbox

LIMITS = Limits(wall_s=4.0, cpu_s=3, memory_mb=512, nproc=8, fsize_mb=8, tmpfs_mb=32,
                output_bytes=1 << 16)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A sandbox whose work directories go under this test's tmp_path (checked empty after)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    yield Sandbox(LIMITS)
    assert list((tmp_path / "work").iterdir()) == [], "a work directory was left behind"


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run(sandbox, source: str, stdin: str = "", grace: float = 3):
    """The program's outcome; it must be over ``grace`` seconds after its wall clock at most
    (the kill and the reaping of what it started, on a loaded machine)."""
    start = time.monotonic()
    outcome = sandbox.run({"main.py": source}, stdin=stdin)
    took = time.monotonic() - start
    assert took < LIMITS.wall_s + scaled(grace), f"it took {took:.1f} s"
    return outcome


def test_this_node_isolates_programs(sandbox):
    line = sandbox.probe()
    assert line.startswith("sandbox: user, PID, network, IPC, UTS and cgroup namespaces; a root "
                           "of its own (32 MiB; its own /proc); Landlock ABI "), line
    assert "; no capabilities; seccomp (" in line and "; packages: numpy " in line, line
    ok = run(sandbox, "print(int(input()) * 2)\n", "21\n")
    assert (ok.status, ok.exit_code, ok.stdout) == ("ok", 0, "42\n")


def test_an_endless_loop_and_a_sigterm_ignorer_end_at_the_wall_clock(sandbox):
    spin = run(sandbox, "while True:\n    pass\n")
    assert spin.status in ("timeout", "ok") and spin.exit_code in (None, 128 + 9, 128 + 24)
    deaf = run(sandbox, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "time.sleep(1000)\n")
    assert deaf.status == "timeout" and deaf.seconds < LIMITS.wall_s + scaled(2)


def test_a_busy_cpu_does_not_shorten_a_program_s_wall_clock(tmp_path, monkeypatch):
    """On a CPU shared with four spinning processes, a program that needs 0.25 s of CPU takes
    more than its 1 s wall clock. It still ends ok, since time spent waiting for the CPU is not
    its own; a sleeping program still ends at 1 s."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    box = Sandbox(Limits(wall_s=1.0, cpu_s=3))
    with one_busy_cpu(4):
        busy = box.run({"main.py": "import time\nwhile time.process_time() < 0.25:\n    pass\n"
                                   "print('done')\n"})
        asleep = box.run({"main.py": "import time\ntime.sleep(100)\n"})
    assert busy.seconds > 1.0, f"the program was not slowed ({busy.seconds:.2f} s): no test"
    assert (busy.status, busy.stdout) == ("ok", "done\n"), busy
    assert asleep.status == "timeout" and asleep.seconds < 1.0 + scaled(2), asleep


def test_a_program_gets_no_more_processes_than_its_limit(sandbox):
    """200 forks, each child asleep: nproc processes with the sandbox's init and the program, so
    the first nproc - 2 succeed, when root starts the sandbox too: its programs are nobody's
    outside, whom RLIMIT_NPROC caps (the kernel exempts only the real root)."""
    forks = ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n"
             "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
             "        n += 1\n    except OSError:\n        break\nprint(n)\n")
    outcome = run(sandbox, forks, grace=1)
    assert (outcome.status, outcome.stdout) == ("ok", f"{LIMITS.nproc - 2}\n"), outcome


def test_a_fork_bomb_is_capped_and_leaves_no_process(sandbox, tmp_path):
    """It ends within a second of its wall clock: its own processes do not count as the busy
    machine its main process waits for (before, they stretched its clock up to ten times),
    and the verdict does not wait for them to be reaped."""
    marker = f"bomb-{tmp_path.name}"  # in every bomb process's command line, and no other's
    bomb = ("import os, sys, time\n"
            "if len(sys.argv) == 1:\n"
            f"    os.execv(sys.executable, [sys.executable, '-I', '-S', 'main.py', {marker!r}])\n"
            "for _ in range(10000):\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n"
            "while True:\n"
            "    pass\n")
    outcome = run(sandbox, bomb, grace=1)
    assert outcome.status in ("timeout", "ok")
    deadline = time.monotonic() + scaled(10)  # killed, they still take a while to exit under load
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == []
    assert processes_with(str(tmp_path)) == []  # no sandbox runner of this test left either


def test_a_memory_bomb_fails_inside_its_limit(sandbox):
    outcome = run(sandbox, "x = bytearray(4 << 30)\nprint('allocated')\n")
    assert outcome.status == "ok" and outcome.exit_code != 0 and "allocated" not in outcome.stdout
    assert "MemoryError" in outcome.stderr


def test_a_10_gb_file_and_1_gb_of_output_are_cut_off(sandbox, tmp_path):
    big = run(sandbox, "with open('big', 'wb') as f:\n    for _ in range(10 * 1024):\n"
                       "        f.write(b'x' * (1 << 20))\nprint('wrote')\n")
    assert big.status == "ok" and big.exit_code != 0 and "wrote" not in big.stdout
    loud = run(sandbox, "import sys\nblock = 'y' * (1 << 20)\nfor _ in range(1024):\n"
                        "    sys.stdout.write(block)\n")
    assert loud.status == "output" and len(loud.stdout) <= LIMITS.output_bytes
    assert loud.seconds < scaled(3)


def test_no_network_even_to_a_server_on_this_host(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    waiter = threading.Thread(target=accept)
    waiter.start()
    outcome = run(sandbox, f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), "
                           "timeout=2)\nprint('connected')\n")
    waiter.join()
    server.close()
    assert "connected" not in outcome.stdout and outcome.exit_code != 0
    assert accepted == []


def test_no_reading_the_run_or_home_and_no_writing_outside(sandbox, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"secret": "run settings"}')
    home_file = Path.home() / f".rlep-sandbox-test-{os.getpid()}"
    home_file.write_text("home secret")
    outside = tmp_path / "written-from-the-sandbox"
    try:
        for path in (run_dir / "config.json", home_file):
            outcome = run(sandbox, f"print(open({str(path)!r}).read())\n")
            assert outcome.exit_code != 0 and "secret" not in outcome.stdout, path
            assert "FileNotFoundError" in outcome.stderr  # not in the sandbox's root
        wrote = run(sandbox, f"open({str(outside)!r}, 'w').write('x')\n")
        assert wrote.exit_code != 0 and not outside.exists()
        here = run(sandbox, "open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())\n")
        assert here.stdout == "ok\n"  # its own directory it may use
    finally:
        home_file.unlink()


def test_killing_its_parent_or_leaving_a_setsid_child_changes_nothing_outside(sandbox):
    parent = run(sandbox, "import os\nos.kill(os.getppid(), 9)\nprint('sent')\n")
    assert parent.status == "ok"  # this process and the sandbox's runner both went on
    child = run(sandbox, "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                         "'import time; time.sleep(1234.5)'], start_new_session=True)\n"
                         "print('left it')\n")
    assert child.status == "ok" and child.stdout == "left it\n"
    time.sleep(0.5)
    assert processes_with("1234.5") == []


def test_a_sandbox_that_cannot_isolate_is_an_infrastructure_failure(sandbox, monkeypatch):
    """Where the setup fails after start-up (here: a work directory the runner cannot use), the
    run is reported as infra, never as the program's wrong answer."""
    broken = Sandbox(LIMITS)
    broken.reads = ["/nonexistent"]
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix="": "/proc/self/nonexistent")
    outcome = broken.run({"main.py": "print(1)\n"})
    assert outcome.status == "infra" and outcome.reason, outcome
