"""The sandbox's own process: isolate, then run one candidate program. Standard library only;
run as ``python -I -S sandbox_init.py CONFIG_JSON`` by ``sandbox.py``, never imported.

Steps, each one the kernel enforces without root (where the kernel allows it):
0. as root only, whom the kernel exempts from RLIMIT_NPROC: this process moves into a pids
   cgroup of its own, capped at the sandbox's process limit, which all it starts inherits;
1. new user, mount, PID, network, IPC and UTS namespaces (``unshare``): the program sees no
   network device but a loopback that is down, no process outside, and mounts of its own;
   this uid maps to 0 inside, so nothing gains privilege outside;
2. ``fork``: the child is PID 1 of the new PID namespace (its init); when it exits the kernel
   kills every process left in the namespace (a ``setsid`` child, a fork bomb's survivors);
3. in init: a private tmpfs of ``tmpfs_mb`` at the work directory holding the program's files
   (gone with the namespace: nothing is left on disk); resource limits (CPU seconds, address
   space, processes, file size, open files, no core); Landlock: read and execute only under
   ``read_paths`` (the interpreter's own files), read and write only in the work directory,
   no TCP bind or connect, and (ABI 6) no signals to processes outside the sandbox;
4. init forks the program, waits for it and reaps orphans, and exits with its status (a
   signal's death as 128 + the signal); this process kills init (and with it the whole PID
   namespace) once the program has run or slept ``wall_s`` seconds (time its one process spent
   waiting for a CPU on a busy machine does not count, so load changes no verdict; once it has
   processes of its own, every second counts), or at ``wall_max_s`` seconds of wall clock
   whatever the load. The verdict does not wait for the killed processes to be reaped.
A setup step that cannot be done where ``require`` asks for it exits 125 with one line on
stderr (the harness counts that as an infrastructure failure, not a wrong answer); where it is
not required and the kernel refuses it, the step is skipped and reported on stderr's first
line as ``sandbox: ...`` (``sandbox.py probe`` reads it once at start-up).
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x4000, 0x40000, 0x2, 0x4
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH = 1
# filesystem rights by ABI: 1 has bits 0-12, 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV
FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}
READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read directory
WRITE_ALL = (1 << 13) - 1  # every right of ABI 1 (REFER and later are added below)
NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)
libc = ctypes.CDLL(None, use_errno=True)


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def fail(what: str) -> None:
    os.write(2, f"sandbox: cannot {what}: {os.strerror(ctypes.get_errno())}\n".encode())
    os._exit(125)


def note(line: str) -> None:
    os.write(2, f"sandbox: {line}\n".encode())


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def namespaces(require: bool) -> str:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if libc.unshare(flags) == 0:
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"0 {uid} 1")
        write("/proc/self/gid_map", f"0 {gid} 1")
        return "user, pid, net, mount namespaces"
    if require:
        fail("create user, PID, network and mount namespaces (unshare)")
    return ""


def landlock(config: dict) -> str:
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        if config["require"]:
            fail("use Landlock (landlock_create_ruleset)")
        return ""
    fs = (1 << FS_BITS.get(abi, 16)) - 1
    attr = RulesetAttr(fs, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        fail("create a Landlock ruleset")
    rules = [(p, READ) for p in config["read_paths"]] + [(config["workdir"], fs)]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a path this system lacks
        allowed = access & fs if os.path.isdir(path) else access & fs & 0b111  # files: no dir rights
        rule = PathBeneath(allowed, fd)
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule), 0) != 0:
            fail(f"add a Landlock rule for {path}")
        os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        fail("enforce the Landlock ruleset")
    return f"Landlock ABI {abi} (files{', TCP' if abi >= 4 else ''}{', signals' if abi >= 6 else ''})"


def limits(config: dict) -> None:
    """The program's resource limits, at the lowest CPU priority: however busy it keeps the
    machine, the runner that enforces its wall clock (and the trainer) still get the CPU."""
    os.nice(19)
    mib = 1 << 20
    for name, value in ((resource.RLIMIT_CPU, config["cpu_s"]),
                        (resource.RLIMIT_AS, config["memory_mb"] * mib),
                        (resource.RLIMIT_NPROC, config["nproc"]),
                        (resource.RLIMIT_FSIZE, config["fsize_mb"] * mib),
                        (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(name, (value, value))


def init(config: dict, isolated: list) -> None:
    """PID 1 of the sandbox: the work directory, the limits and Landlock, then the program."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the outer runner died: so do we
    workdir = config["workdir"]
    if isolated:
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            fail("make the mounts private")
        options = f"size={config['tmpfs_mb']}m,mode=0700".encode()
        if libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
            fail("mount a tmpfs on the work directory")
        isolated.append(f"a {config['tmpfs_mb']} MiB tmpfs work directory")
    for name, text in config["files"].items():
        write(os.path.join(workdir, name), text)
    lock = landlock(config)
    if lock:
        isolated.append(lock)
    note("; ".join(isolated) or "no isolation but resource limits")
    child = os.fork()
    if child == 0:
        os.chdir(workdir)
        limits(config)
        os.execve(config["argv"][0], config["argv"], {"PATH": "/usr/bin:/bin", "HOME": workdir,
                                                     "LANG": "C.UTF-8"})
    status = 0
    while True:  # reap everything; the program's own status decides ours
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == child:
            status = os.waitstatus_to_exitcode(raw)
            break
    os._exit(128 - status if status < 0 else status)


def children(pid: str) -> list[str]:
    """The processes ``pid`` started, from any of its threads."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            found += listed.read().split()
    return found


def waited(init_pid: int) -> float:
    """Seconds the program has spent ready to run but waiting for a CPU (its main process's
    run-queue delay, from /proc): on a busy machine, time that is not the program's. 0 once it
    has processes of its own (they, not the machine, may be what it waits for: a fork bomb
    would stretch its own clock up to wall_max_s), and where the kernel does not report it."""
    try:
        ours = children(str(init_pid))
        if len(ours) != 1 or children(ours[0]):
            return 0.0
        with open(f"/proc/{ours[0]}/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def pids_cgroup(nproc: int) -> tuple[str | None, str]:
    """For root, whom the kernel exempts from RLIMIT_NPROC (a fork bomb run as root took every
    PID of the machine, and the trainer's next fork failed): this process moves into a pids
    cgroup of its own capped at ``nproc`` and itself (init counts, as for RLIMIT_NPROC), which
    the sandbox inherits.
    Empty ones left by runners that are gone are removed. Returns the group (or None) and what it
    did, in a few words."""
    if os.getuid() != 0:
        return None, ""  # RLIMIT_NPROC caps the program
    for line in open("/proc/self/cgroup"):
        number, controllers, path = line.rstrip("\n").split(":", 2)
        if "pids" in controllers.split(","):
            base = "/sys/fs/cgroup/pids" + path
        elif number == "0":
            unified = "/sys/fs/cgroup/unified"
            base = (unified if os.path.isdir(unified) else "/sys/fs/cgroup") + path
        else:
            continue
        try:
            for stale in os.listdir(base):
                runner = stale[len("rlep-sandbox-"):]
                if stale.startswith("rlep-sandbox-") and not os.path.exists(f"/proc/{runner}"):
                    try:
                        os.rmdir(os.path.join(base, stale))
                    except OSError:
                        pass  # its processes are still exiting
            group = os.path.join(base, f"rlep-sandbox-{os.getpid()}")
            os.mkdir(group)
            write(os.path.join(group, "pids.max"), str(nproc + 1))
            write(os.path.join(group, "cgroup.procs"), str(os.getpid()))
            return group, f"{nproc} processes (a pids cgroup: root is exempt from RLIMIT_NPROC)"
        except OSError:
            continue
    return None, "processes not capped (root, and no pids cgroup to make)"


def leave(group: str | None) -> None:
    """Out of the sandbox's pids cgroup, and the cgroup removed (its processes all gone)."""
    if group:
        try:
            write(os.path.join(os.path.dirname(group), "cgroup.procs"), str(os.getpid()))
            os.rmdir(group)
        except OSError:
            pass  # the next sandbox removes it


def main() -> None:
    config = json.loads(sys.argv[1])
    group, capped = pids_cgroup(config["nproc"])
    isolated = [n for n in [namespaces(config["require"]), capped] if n]
    init_pid = os.fork()
    if init_pid == 0:
        try:
            init(config, isolated)
        except BaseException as err:  # noqa: BLE001 - setup failed: an infrastructure failure
            os.write(2, f"sandbox: setup failed: {type(err).__name__}: {err}\n".encode())
            os._exit(125)
    start = time.monotonic()

    def stop(*_):
        os.kill(init_pid, signal.SIGKILL)  # the PID namespace goes with its init

    signal.signal(signal.SIGTERM, stop)
    while True:
        pid, raw = os.waitpid(init_pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(raw)
            leave(group)
            os._exit(128 - code if code < 0 else code)
        elapsed = time.monotonic() - start
        if elapsed > config["wall_max_s"] or (
                elapsed > config["wall_s"] and elapsed - waited(init_pid) > config["wall_s"]):
            stop()
            # the namespace's processes are killed; at the lowest priority on a busy machine
            # they may take seconds to exit (32 of them: 2.5 s), time no longer theirs to use:
            # a moment for the usual case, then the verdict, init reaped by whoever
            # inherits it
            deadline = time.monotonic() + 0.2
            while not os.waitpid(init_pid, os.WNOHANG)[0] and time.monotonic() < deadline:
                time.sleep(0.005)
            os._exit(124)  # timeout's own status
        time.sleep(0.005)


if __name__ == "__main__":
    main()
