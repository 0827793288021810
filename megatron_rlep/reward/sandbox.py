"""Running untrusted programs: a model's answer is hostile input, so it never runs in a trainer's
or a scorer's process, only here, one program per sandbox.

``Sandbox.run(files, stdin)`` writes ``files`` into a fresh work directory and runs
``python -I -S main.py`` there through ``sandbox_init.py`` (its docstring says what each layer
does): user, PID, network and mount namespaces, a private tmpfs work directory, Landlock rules
(read only the interpreter's files, write only the work directory, no TCP, no signals out),
resource limits (CPU time, memory, processes, file size), a wall-clock limit, and stdout and
stderr read here up to ``Limits.output_bytes`` (more kills the program). The verdict is never
this process's to take from the program's exit status alone: callers compare its output.

Why these layers: they need no root and no extra package (bubblewrap and nsjail are not on a
cluster node by default; seccomp filters need libseccomp or a hand-written BPF program), and
each is enforced by the kernel. ``Sandbox.probe()`` runs one trivial program and returns the
line saying which isolation is in force on this node; ``require=True`` (the default) makes a
sandbox that cannot isolate fail every run as an infrastructure failure rather than run code
unconfined.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).with_name("sandbox_init.py")
INFRA_EXIT, TIMEOUT_EXIT = 125, 124


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # the program's wall clock
    cpu_s: int = 10  # its CPU seconds (RLIMIT_CPU)
    memory_mb: int = 1024  # its address space (RLIMIT_AS)
    nproc: int = 32  # processes of its user (RLIMIT_NPROC; counted inside its user namespace)
    fsize_mb: int = 16  # the largest file it may write (RLIMIT_FSIZE)
    tmpfs_mb: int = 64  # its whole work directory
    output_bytes: int = 1 << 20  # stdout and stderr each; more kills the program


@dataclass(frozen=True)
class Outcome:
    status: str  # ok (it ran and ended; see exit_code) | timeout | output (too much) | infra
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    reason: str = ""  # infra: what could not be set up


def interpreter() -> str:
    """The real Python binary (a virtual environment's python is a link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def read_paths() -> list[str]:
    """What a program may read: the interpreter's installation and the system's shared
    libraries, and nothing else (not the run directory, not $HOME)."""
    python = Path(interpreter())
    roots = {sys.base_prefix, str(python.parent.parent)}
    return sorted(roots) + ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache",
                            "/dev/null", "/dev/urandom", "/dev/zero"]


class Sandbox:
    def __init__(self, limits: Limits = Limits(), require: bool = True):
        self.limits, self.require = limits, require
        self.python = interpreter()
        self.reads = read_paths()

    def run(self, files: dict[str, str], stdin: str = "", script: str = "main.py") -> Outcome:
        """Run ``python -I -S script`` among ``files`` with ``stdin``; never raises for anything
        the program does."""
        workdir = tempfile.mkdtemp(prefix="rlep-sandbox-")
        lim = self.limits
        config = {"workdir": workdir, "files": files, "argv": [self.python, "-I", "-S", script],
                  "read_paths": self.reads, "require": self.require, "wall_s": lim.wall_s,
                  "cpu_s": lim.cpu_s, "memory_mb": lim.memory_mb, "nproc": lim.nproc,
                  "fsize_mb": lim.fsize_mb, "tmpfs_mb": lim.tmpfs_mb}
        start = time.monotonic()
        try:
            proc = subprocess.Popen([self.python, "-I", "-S", str(RUNNER), json.dumps(config)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as err:
            shutil.rmtree(workdir, ignore_errors=True)
            return Outcome("infra", None, "", "", 0.0, f"the sandbox did not start: {err}")
        try:
            out, err, flooded = self._communicate(proc, stdin.encode(), start + lim.wall_s + 5)
        finally:
            _kill(proc)
            shutil.rmtree(workdir, ignore_errors=True)
        seconds = time.monotonic() - start
        notes = [line for line in err.splitlines() if line.startswith("sandbox: ")]
        err = "\n".join(line for line in err.splitlines() if not line.startswith("sandbox: "))
        setup = [n for n in notes if n.startswith(("sandbox: cannot", "sandbox: setup failed"))]
        if proc.returncode == INFRA_EXIT and setup:
            return Outcome("infra", None, out, err, seconds, setup[-1][len("sandbox: "):])
        if flooded:
            return Outcome("output", None, out, err, seconds)
        if proc.returncode == TIMEOUT_EXIT or seconds > lim.wall_s + 5:
            return Outcome("timeout", None, out, err, seconds)
        return Outcome("ok", proc.returncode, out, err, seconds, notes[0][9:] if notes else "")

    def _communicate(self, proc, data: bytes, deadline: float) -> tuple[str, str, bool]:
        """stdin written, stdout and stderr read, each up to the output limit; past it, or past
        the backstop deadline, the sandbox is stopped (SIGTERM: its runner kills the PID
        namespace)."""
        limit = self.limits.output_bytes
        chunks = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
        sizes = dict.fromkeys(chunks, 0)
        selector = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it did not read its input
        flooded = False
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.2):
                block = os.read(key.fd, 65536)
                if not block:
                    selector.unregister(key.fileobj)
                    continue
                sizes[key.fd] += len(block)
                if sizes[key.fd] <= limit:
                    chunks[key.fd].append(block)
                elif not flooded:
                    flooded = True
                    proc.send_signal(signal.SIGTERM)
        selector.close()
        decode = lambda fd: b"".join(chunks[fd])[:limit].decode(errors="replace")  # noqa: E731
        return decode(proc.stdout.fileno()), decode(proc.stderr.fileno()), flooded

    def probe(self) -> str:
        """One line: which isolation a program gets on this node."""
        outcome = self.run({"main.py": "print('ok')\n"})
        if outcome.status == "infra":
            return f"code sandbox unusable here ({outcome.reason}): code answers count as " \
                   "infrastructure failures"
        return f"code sandbox: {outcome.reason or 'no isolation but resource limits'}"


def _kill(proc: subprocess.Popen) -> None:
    """The runner and anything in its session, after a polite SIGTERM (it kills the PID
    namespace on it)."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream and not stream.closed:
            stream.close()
