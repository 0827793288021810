"""Running untrusted programs: a model's answer is hostile input, so it never runs in a trainer's
or a scorer's process, only here, one program per sandbox.

``Sandbox.run(files, stdin)`` writes ``files`` into the work directory of a root of the
program's own and runs ``python -S -P main.py`` there through ``sandbox_init.py``, whose
docstring lists the layers: namespaces, a root holding only the interpreter, the system's
libraries and the allowed packages (read-only), Landlock, no capabilities, a seccomp filter,
resource limits and a wall clock that a busy node does not shorten. Stdout and stderr are read
here up to ``Limits.output_bytes`` (more kills the program). docs/sandbox_threat_model.md takes
every kind of kernel object a program could reach and names the layer that closes it. The
verdict is never this process's to take from the program's exit status alone: callers compare
its output.

Each layer is the kernel's, set up without root and without a package a cluster node may lack
(bubblewrap, nsjail, libseccomp). ``Sandbox.probe()`` runs one trivial program and returns the
line saying what a program gets on this node, or raises, naming the layer, where the kernel
refuses one that ``allow_missing`` does not name. After start-up a sandbox that cannot be set
up fails its run as an infrastructure failure: never a program run unconfined.

The package is the sandbox and what runs inside one: this module (the parent's side),
``sandbox_init.py`` (the layers, in the child), and the programs the code reward
(``reward/code.py``) sends in beside an answer: ``candidate_host.py`` (the answer as a module),
``judge.py`` and ``judge_pytest.py`` (its tests, outside it) and ``plain.py`` (the plain-data
channel between them, also used here).
"""

from __future__ import annotations

import marshal
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from megatron_rlep.errors import RunError

RUNNER = Path(__file__).with_name("sandbox_init.py")
LAYERS = ("namespaces", "landlock", "seccomp")  # what sandbox.allow_missing may name
PACKAGES = ("numpy", "sympy")  # what programs may import by default, where installed
INFRA_EXIT, TIMEOUT_EXIT = 125, 124
LINE_LIMIT = 64 << 20  # a Session's longest line: a call's arguments or result (10^6 numbers)
# a program's wall clock counts the time it runs or sleeps, not the time its one process waits
# for a CPU on a busy node; whatever the load, it ends at WALL_FACTOR times its wall clock
WALL_FACTOR = 10


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # the program's wall clock (time waiting for a CPU not counted)
    cpu_s: int = 10  # its CPU seconds (RLIMIT_CPU)
    memory_mb: int = 1024  # its address space (RLIMIT_AS)
    nproc: int = 32  # its processes, init's included (RLIMIT_NPROC)
    fsize_mb: int = 16  # the largest file it may write (RLIMIT_FSIZE)
    tmpfs_mb: int = 64  # its whole work directory
    output_bytes: int = 1 << 20  # stdout and stderr each; more kills the program

    @property
    def wall_max_s(self) -> float:
        return WALL_FACTOR * self.wall_s


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
    """What a program may read: the interpreter, its standard library and the directory of its
    shared library, and the system's shared libraries; nothing else (not the run directory,
    not $HOME, no other program)."""
    paths = {interpreter(), os.path.realpath(sysconfig.get_config_var("LIBDIR") or sys.base_prefix),
             os.path.realpath(os.path.dirname(os.__file__))}  # the standard library
    if sysconfig.get_config_var("DESTSHARED"):  # its compiled modules
        paths.add(os.path.realpath(sysconfig.get_config_var("DESTSHARED")))
    system = ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache"]
    inside = lambda path: any(path.startswith(d + "/") for d in paths | set(system))  # noqa: E731
    return sorted(p for p in paths if not inside(p)) + system


def installed_package_dirs() -> list[str]:
    """The interpreter's own package directories, shown empty inside (packages come in only by
    ``Sandbox(packages=...)``)."""
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    dirs = {os.path.realpath(paths[k]) for paths in (sysconfig.get_paths(vars=base),
                                                      sysconfig.get_paths())
            for k in ("purelib", "platlib")}
    return sorted(dirs | {"/usr/lib/python3/dist-packages"})


def package_paths(names) -> tuple[dict[str, str], str]:
    """The installed distributions ``names`` and those they require: {top-level entry (a package,
    a module, a directory of its libraries): its path}, and a few words naming them with their
    versions (and those not installed)."""
    from importlib import metadata

    entries, found, absent, todo, seen = {}, [], [], list(names), set()
    while todo:
        name = todo.pop(0)
        if name.lower().replace("_", "-") in seen:
            continue
        seen.add(name.lower().replace("_", "-"))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
            continue
        found.append(f"{dist.metadata['Name']} {dist.version}")
        for file in dist.files or []:
            top = file.parts[0]
            if top not in ("..", "__pycache__") and not top.endswith((".pth", ".dist-info")):
                entries[top] = os.path.realpath(dist.locate_file(top))
        for line in dist.requires or []:
            from packaging.requirements import Requirement

            needed = Requirement(line)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                todo.append(needed.name)
    words = ", ".join(found) or "none"
    return entries, words + (f" ({', '.join(absent)} not installed)" if absent else "")


def isolation(settings=None) -> dict:
    """``Sandbox``'s keyword arguments from the ``sandbox`` config (its dataclass or dict; None:
    the defaults)."""
    if settings is None:
        return {"allow_missing": [], "packages": list(PACKAGES)}
    get = settings.get if isinstance(settings, dict) else lambda key: getattr(settings, key)
    return {"allow_missing": list(get("allow_missing")), "packages": list(get("packages"))}


class Sandbox:
    """``allow_missing``: the layers (``LAYERS``) a program may run without where the kernel
    refuses them; ``packages``: installed distributions it may import, read-only, with what they
    require; ``unbuffered``: its standard output written as it prints (a tool call's output
    before a time-out is kept)."""

    def __init__(self, limits: Limits = Limits(), allow_missing=(), packages=PACKAGES,
                 unbuffered: bool = False):
        self.limits, self.allow_missing, self.unbuffered = limits, list(allow_missing), unbuffered
        self.python = interpreter()
        self.reads, self.hide = read_paths(), installed_package_dirs()
        self.packages, self.package_words = package_paths(packages)

    def run(self, files: dict[str, str], stdin: str = "", script: str = "main.py") -> Outcome:
        """Run ``python -I -S script`` among ``files`` with ``stdin``; never raises for anything
        the program does."""
        started = self._spawn(files, script)
        if isinstance(started, Outcome):
            return started
        proc, workdir, start = started
        try:
            out, err, flooded = self._communicate(proc, stdin.encode(),
                                                  start + self.limits.wall_max_s + 5)
        finally:
            _kill(proc)
            shutil.rmtree(workdir, ignore_errors=True)
        return self._outcome(proc.returncode, out, err, flooded, time.monotonic() - start)

    def start(self, files: dict[str, str], script: str = "main.py") -> "Session | Outcome":
        """The program started and left running, to talk to a line at a time (``Session``);
        an infrastructure Outcome when the sandbox could not start."""
        started = self._spawn(files, script)
        return started if isinstance(started, Outcome) else Session(self, *started)

    def _spawn(self, files: dict[str, str], script: str):
        workdir = tempfile.mkdtemp(prefix="rlep-sandbox-")
        lim = self.limits
        config = {"workdir": workdir, "files": files, "argv": [self.python, "-S", "-P", script],
                  "binds": self.reads, "hide": self.hide, "packages": self.packages,
                  "allow_missing": self.allow_missing, "unbuffered": self.unbuffered,
                  "wall_s": lim.wall_s, "wall_max_s": lim.wall_max_s,
                  "cpu_s": lim.cpu_s, "memory_mb": lim.memory_mb, "nproc": lim.nproc,
                  "fsize_mb": lim.fsize_mb, "tmpfs_mb": lim.tmpfs_mb}
        start = time.monotonic()
        read, write = os.pipe()  # the config goes by a pipe: a command line is anyone's to read
        try:
            proc = subprocess.Popen([self.python, "-I", "-S", str(RUNNER), str(read)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=(read,))
            os.close(read)
            with os.fdopen(write, "wb") as channel:
                channel.write(marshal.dumps(config))
        except OSError as err:
            for fd in (read, write):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(workdir, ignore_errors=True)
            return Outcome("infra", None, "", "", 0.0, f"the sandbox did not start: {err}")
        return proc, workdir, start

    def _outcome(self, code, out: str, err: str, flooded: bool, seconds: float) -> Outcome:
        notes = [line for line in err.splitlines() if line.startswith("sandbox: ")]
        err = "\n".join(line for line in err.splitlines() if not line.startswith("sandbox: "))
        setup = [n for n in notes if n.startswith(("sandbox: missing", "sandbox: setup failed"))]
        if code == INFRA_EXIT and setup:
            return Outcome("infra", None, out, err, seconds, setup[-1][len("sandbox: "):])
        if flooded:
            return Outcome("output", None, out, err, seconds)
        if code == TIMEOUT_EXIT or seconds > self.limits.wall_max_s + 5:
            return Outcome("timeout", None, out, err, seconds)
        return Outcome("ok", code, out, err, seconds, notes[0][9:] if notes else "")

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
            # the runner gone, what is in the pipes is all there is: processes of the program
            # being killed still hold their ends, and at the lowest priority on a busy machine
            # they may take seconds to exit
            over = proc.poll() is not None
            ready = selector.select(timeout=0 if over else 0.2)
            if over and not ready:
                break
            for key, _ in ready:
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
        """One line: what a program gets on this node. Raises RunError, in one sentence naming
        the layer and the key, where the kernel refuses a layer ``allow_missing`` does not
        name, or the sandbox cannot run at all."""
        outcome = self.run({"main.py": "print('ok')\n"})
        if outcome.status == "infra" and outcome.reason.startswith("missing "):
            layer = outcome.reason.split()[1].rstrip(":")
            raise RunError(f"the sandbox cannot isolate programs on this node: {outcome.reason}; "
                           f"run where the kernel allows it, or set sandbox.allow_missing=[{layer}] "
                           f"to run programs without it (docs/sandbox_threat_model.md)")
        if outcome.status != "ok" or outcome.stdout != "ok\n":
            raise RunError(f"the sandbox cannot run a program on this node "
                           f"({outcome.reason or outcome.status}: {outcome.stderr[-300:]!r}); "
                           "see docs/sandbox_threat_model.md")
        return f"sandbox: {outcome.reason}; packages: {self.package_words}"


class Session:
    """A sandboxed program that is talked to a line at a time: ``send`` a line to its standard
    input, ``receive`` one from its standard output (None at its end, its deadline, or for a
    line longer than the output limit); ``close`` ends it and gives its Outcome. Its standard
    error is read alongside, up to the same limit."""

    def __init__(self, sandbox: Sandbox, proc: subprocess.Popen, workdir: str, start: float):
        self.sandbox, self.proc, self.workdir, self.start = sandbox, proc, workdir, start
        self.deadline = start + sandbox.limits.wall_max_s + 5
        self.pending, self.out, self.err = b"", [], bytearray()
        self.flooded, self.ended = False, False
        self.selector = selectors.DefaultSelector()
        self.selector.register(proc.stdout, selectors.EVENT_READ)
        self.selector.register(proc.stderr, selectors.EVENT_READ)

    def send(self, line: str) -> bool:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, deadline: float | None = None) -> str | None:
        deadline = min(deadline or self.deadline, self.deadline)
        limit = LINE_LIMIT
        while b"\n" not in self.pending:
            if self.ended or self.flooded or time.monotonic() >= deadline:
                return None
            over = self.proc.poll() is not None  # then the pipes hold all there is (run)
            ready = self.selector.select(timeout=0 if over else
                                         min(0.2, max(0.0, deadline - time.monotonic())))
            if over and not ready:
                self.ended = True
            for key, _ in ready:
                block = os.read(key.fd, 65536)
                if key.fileobj is self.proc.stderr:
                    if not block:
                        self.selector.unregister(key.fileobj)
                    self.err += block[:max(0, limit - len(self.err))]
                    continue
                if not block:
                    self.ended = True
                    break
                self.pending += block
                if len(self.pending) > limit and b"\n" not in self.pending:
                    self.flooded = True  # one line past the limit: the whole channel's traffic
                    # is not capped, a call's arguments and results can be large
        line, _, self.pending = self.pending.partition(b"\n")
        self.out.append(line[:1000])  # the start of each line, for the Outcome
        return line.decode(errors="replace")

    def timed_out(self) -> bool:
        """Whether the program was stopped at its wall clock (its output ended, or the
        backstop passed)."""
        if time.monotonic() >= self.deadline - 5:
            return True
        try:
            return self.ended and self.proc.wait(timeout=1) == TIMEOUT_EXIT
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> Outcome:
        """The program ended (its input closed first, then killed), its work directory gone."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        limit = self.sandbox.limits.output_bytes
        stderr = [k.fileobj for k in self.selector.get_map().values()
                  if k.fileobj is self.proc.stderr]
        while stderr and len(self.err) < limit and select.select(stderr, [], [], 0.1)[0]:
            block = os.read(stderr[0].fileno(), 65536)
            if not block:
                break
            self.err += block[:limit - len(self.err)]
        self.selector.close()
        _kill(self.proc)
        shutil.rmtree(self.workdir, ignore_errors=True)
        seconds = time.monotonic() - self.start
        code = self.proc.returncode
        return self.sandbox._outcome(code if code is not None else None,
                                     b"\n".join(self.out).decode(errors="replace"),
                                     bytes(self.err).decode(errors="replace"), self.flooded,
                                     seconds)


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
