"""The sandbox's own process: isolate, then run one program. Standard library only; run as
``python -I -S sandbox_init.py FD`` by the package's ``Sandbox``, which writes the config on the
pipe FD (``marshal``: nothing to import, where ``json`` costs this process a third of its start);
never imported.
docs/sandbox_threat_model.md takes every kind of kernel object a program could reach and names
the step below that closes it.

1. This process (the runner) enters new user, PID, network, IPC, UTS and cgroup namespaces. The
   program is root inside them and, outside, the user that started the sandbox, or ``nobody``
   (65534) when that is root: the kernel exempts only the real root from RLIMIT_NPROC, and
   nothing the program owns is the host's root's.
2. It forks init, PID 1 of the new PID namespace: when init exits the kernel kills every process
   left in it.
3. Init, in a mount namespace of its own, builds a root and ``pivot_root``s into it: a tmpfs of
   ``tmpfs_mb`` (all the program may write) holding read-only, nosuid, nodev binds of the
   interpreter, its standard library and the system's shared libraries (the directories of
   installed packages hidden under empty ones), the allowed packages under /pkgs, /dev with
   null, zero, random and urandom only, a /proc of the new PID namespace (none where the kernel
   refuses one), /tmp, and /work (the program's files, its working directory). The host's tree
   is detached: no path leads out of the root.
4. Landlock: writes only under /work, /tmp and /dev/shm; no TCP; no abstract UNIX socket and no
   signal outside the sandbox (ABI 6 and later).
5. Every capability dropped, the bounding set included; no_new_privs.
6. A seccomp filter that denies whole kinds of system call (``NUMBERS`` groups them by kind); a
   call of another architecture's ABI kills the process.
7. Init forks the program with resource limits (CPU seconds, address space, processes, file
   size, open files, no core) at the lowest CPU priority, waits for it, reaps orphans and
   exits with its status (a signal's death as 128 + the signal).
8. The runner kills init, and with it the PID namespace, once the program has run or slept
   ``wall_s`` seconds (time its one process waits for a CPU on a busy machine does not count;
   once it has processes of its own every second counts), or at ``wall_max_s`` of wall clock
   whatever the load. The verdict does not wait for the killed processes to be reaped.

Where the kernel or a container refuses a layer (``namespaces``, which the root of its own needs,
``landlock``, ``seccomp``), setup ends with exit status 125 and the line ``sandbox: missing
LAYER: ...`` on stderr, unless the config's ``allow_missing`` names the layer: then it is
skipped, and the first stderr line (``sandbox: ...``) says what the program runs under.
"""

import ctypes
import marshal
import math
import os
import resource
import signal
import stat
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NAMESPACES = 0x7E020000  # every CLONE_NEW* flag clone() takes
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE, MNT_DETACH = 0x4000, 0x40000, 2
KEPT_FLAGS = 8 | 1024 | 2048 | 4096  # noexec, noatime, nodiratime, relatime: a remount keeps them
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 4, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
NOBODY = 65534
# Landlock: filesystem rights by ABI (1 has bits 0-12, 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV)
FS_BITS = {1: 13, 2: 14, 3: 15, 4: 15}
READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read directory
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
FILE_RIGHTS = 0b111 | TRUNCATE | (1 << 15)  # execute, write, read, truncate, ioctl on a device
NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)
LANDLOCK_RULE_PATH_BENEATH = 1
WRITABLE = ("/work", "/tmp", "/dev/shm")
DEVICES = ("null", "zero", "random", "urandom")

# System calls by name: (x86_64, aarch64) numbers, and each architecture's seccomp value
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}
NUMBERS = {
    "socket": (41, 198), "socketpair": (53, 199), "clone": (56, 220), "clone3": (435, 435),
    "ioctl": (16, 29), "capset": (126, 91), "pivot_root": (155, 41),
    "landlock_create_ruleset": (444, 444), "landlock_add_rule": (445, 445),
    "landlock_restrict_self": (446, 446),
    # namespaces and mounts
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442),
    # other processes' memory
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "kcmp": (312, 272),
    # kernel keyrings
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    # io_uring (its operations bypass this filter), BPF, perf events, userfaultfd
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    # the machine's: modules, kexec, reboot, swap, accounting, quotas, the kernel log, clocks,
    # file handles (open_by_handle_at reaches any inode), fanotify
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142),
    "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60),
    "quotactl_fd": (443, 443), "syslog": (103, 116), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "fanotify_init": (300, 262), "vhangup": (153, 58),
}
# the filter: calls it reads the arguments of, calls it allows (the sandbox's own set-up uses
# them, and they only restrict the caller), calls it answers ENOSYS (libraries fall back: glibc's
# threads to clone, whose flags it can read), and the rest of NUMBERS, denied
BY_ARGUMENT = ("socket", "socketpair", "clone", "ioctl")
ALLOWED = ("capset", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")
ABSENT = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
DENY = tuple(name for name in NUMBERS if name not in BY_ARGUMENT + ALLOWED + ABSENT)
AF_UNIX, TIOCSTI, TIOCLINUX = 1, 0x5412, 0x541C
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
RET_ALLOW, RET_ERRNO, RET_KILL = 0x7FFF0000, 0x50000, 0x80000000
libc = ctypes.CDLL(None, use_errno=True)


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class Missing(Exception):
    """A layer the kernel refused: (layer, what could not be done)."""


def note(line: str) -> None:
    os.write(2, f"sandbox: {line}\n".encode())


def check(result: int, layer: str, what: str) -> None:
    if result != 0:
        raise Missing(layer, f"cannot {what}: {os.strerror(ctypes.get_errno())}")


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def nr(name: str) -> int:
    return NUMBERS[name][ARCHES[os.uname().machine][0]]


def namespaces() -> None:
    """The runner into new user, PID, network, IPC, UTS and cgroup namespaces, as root inside;
    outside, its own user, or nobody when that is root (mapped by a child left outside, the
    only place such a map can be written from)."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | \
        CLONE_NEWCGROUP
    if uid != 0:
        check(libc.unshare(flags), "namespaces", "create user, PID and network namespaces")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"0 {uid} 1")
        write("/proc/self/gid_map", f"0 {gid} 1")
        return
    os.setgroups([])
    go, ready = os.pipe()
    mapper = os.fork()
    if mapper == 0:  # still outside: maps the runner's root to nobody
        os.close(ready)
        os.read(go, 1)
        try:
            write(f"/proc/{os.getppid()}/uid_map", f"0 {NOBODY} 1")
            write(f"/proc/{os.getppid()}/gid_map", f"0 {NOBODY} 1")
        except OSError:
            os._exit(1)
        os._exit(0)
    os.close(go)
    unshared = libc.unshare(flags)
    os.close(ready)  # the mapper reads an end of file: go
    mapped = os.waitstatus_to_exitcode(os.waitpid(mapper, 0)[1]) == 0
    check(unshared, "namespaces", "create user, PID and network namespaces")
    if not mapped:
        raise Missing("namespaces", "cannot map the sandbox's root to nobody")


def own_root(config: dict) -> str:
    """Init's mount namespace and its root, built at the work directory and pivoted into
    (module docstring, step 3). The bind sources and the new root are opened as the user that
    started the sandbox (who may read what nobody cannot); the binds go through descriptors."""
    check(libc.unshare(CLONE_NEWNS), "namespaces", "create a mount namespace")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "namespaces",
          "make the mounts private")
    sources = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in  # in this namespace
               list(config["binds"]) + list(config["packages"].values()) +
               [f"/dev/{d}" for d in DEVICES] if os.path.exists(path)}
    links = {path: os.readlink(path) for path in config["binds"] if os.path.islink(path)}
    options = f"size={config['tmpfs_mb']}m,mode=0755,uid=0,gid=0".encode()
    check(libc.mount(b"tmpfs", config["workdir"].encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                     options), "namespaces", "mount a tmpfs for the sandbox's root")
    os.chdir(config["workdir"])  # the new root, from here on "."
    os.setresgid(0, 0, 0)  # root inside: nobody or the starting user outside
    os.setresuid(0, 0, 0)

    def bind(source: str, target: str, flags: int) -> None:
        path = "." + target
        if stat.S_ISDIR(os.fstat(sources[source]).st_mode):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        fd = f"/proc/self/fd/{sources[source]}".encode()
        check(libc.mount(fd, path.encode(), None, MS_BIND, None), "namespaces", f"bind {source}")
        kept = os.statvfs(path).f_flag & KEPT_FLAGS
        check(libc.mount(None, path.encode(), None, MS_BIND | MS_REMOUNT | flags | kept, None),
              "namespaces", f"make {source} read-only")

    for path in config["binds"]:
        if path in links:  # /lib -> usr/lib: the same link inside
            os.makedirs(os.path.dirname("." + path), exist_ok=True)
            os.symlink(links[path], "." + path)
        elif path in sources:
            bind(path, path, MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in config["hide"]:  # installed packages' directories: empty
        if os.path.isdir("." + path):
            check(libc.mount(b"tmpfs", ("." + path).encode(), b"tmpfs",
                             MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k"),
                  "namespaces", f"hide {path}")
    for name, path in config["packages"].items():
        bind(path, f"/pkgs/{name}", MS_RDONLY | MS_NOSUID | MS_NODEV)
    for device in DEVICES:
        bind(f"/dev/{device}", f"/dev/{device}", MS_NOSUID | MS_NOEXEC)
    for name in ("work", "tmp", "dev/shm", "proc", "old"):
        os.makedirs(name, exist_ok=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"dev/{name}")
    has_proc = libc.mount(b"proc", b"proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0
    for fd in sources.values():
        os.close(fd)
    check(libc.syscall(nr("pivot_root"), b".", b"old"), "namespaces", "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/old", MNT_DETACH), "namespaces", "detach the host's tree")
    os.rmdir("/old")
    return f"a root of its own ({config['tmpfs_mb']} MiB; " + \
        ("its own /proc)" if has_proc else "no /proc: the kernel refused one)")


def landlock(rules: list) -> str:
    """``rules`` ((path, rights), rights -1: all) enforced on this process and its children."""
    abi = libc.syscall(nr("landlock_create_ruleset"), None, 0, 1)  # the ABI version
    if abi < 1:
        raise Missing("landlock", f"use Landlock: {os.strerror(ctypes.get_errno())}")
    fs = (1 << FS_BITS.get(abi, 16)) - 1
    attr = RulesetAttr(fs, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(nr("landlock_create_ruleset"), ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise Missing("landlock", f"create a ruleset: {os.strerror(ctypes.get_errno())}")
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a path this system lacks
        allowed = access & fs & (-1 if os.path.isdir(path) else FILE_RIGHTS)
        rule = PathBeneath(allowed, fd)
        check(libc.syscall(nr("landlock_add_rule"), ruleset, LANDLOCK_RULE_PATH_BENEATH,
                           ctypes.byref(rule), 0), "landlock", f"add a Landlock rule for {path}")
        os.close(fd)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "landlock", "set no_new_privs")
    check(libc.syscall(nr("landlock_restrict_self"), ruleset, 0), "landlock",
          "enforce the Landlock ruleset")
    os.close(ruleset)
    return f"Landlock ABI {abi} (files{', TCP' if abi >= 4 else ''}" \
           f"{', abstract sockets, signals' if abi >= 6 else ''})"


def drop_capabilities() -> None:
    """No capability left, none to gain: the bounding set emptied (where this process may),
    the ambient set cleared, every set zeroed, no_new_privs."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1  # EINVAL past the last capability
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()  # v3, all 0
    if libc.syscall(nr("capset"), header, data) != 0 or \
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot drop the capabilities")


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as classic BPF (code, jump if true, jump if false, k): another architecture's
    calls (and x32's) killed; sockets other than AF_UNIX, clone with namespace flags and the
    terminal-injecting ioctls refused; ``ABSENT`` calls ENOSYS; ``DENY`` EPERM; the rest
    allowed."""
    column, audit_arch = ARCHES[machine]
    number = {name: numbers[column] for name, numbers in NUMBERS.items()}
    load = lambda offset: (0x20, 0, 0, offset)  # noqa: E731 - A = seccomp_data word
    ret = lambda value: (0x06, 0, 0, value)  # noqa: E731
    arg = lambda i: 16 + 8 * i  # noqa: E731 - an argument's low 32 bits (little-endian)
    program = [load(4), (0x15, 1, 0, audit_arch), ret(RET_KILL), load(0),
               (0x35, 0, 1, 0x40000000), ret(RET_KILL)]  # x32's numbers
    for name in ("socket", "socketpair"):
        program += [(0x15, 0, 4, number[name]), load(arg(0)), (0x15, 0, 1, AF_UNIX),
                    ret(RET_ALLOW), ret(RET_ERRNO | EAFNOSUPPORT)]
    program += [(0x15, 0, 4, number["clone"]), load(arg(0)), (0x45, 0, 1, CLONE_NAMESPACES),
                ret(RET_ERRNO | EPERM), ret(RET_ALLOW)]
    program += [(0x15, 0, 5, number["ioctl"]), load(arg(1)), (0x15, 1, 0, TIOCSTI),
                (0x15, 0, 1, TIOCLINUX), ret(RET_ERRNO | EPERM), ret(RET_ALLOW)]
    tail = len(program) + len(ABSENT) + len(DENY)  # where ALLOW, ENOSYS and EPERM return
    for name in ABSENT + DENY:
        target = tail + 1 if name in ABSENT else tail + 2
        program.append((0x15, target - len(program) - 1, 0, number[name]))
    return program + [ret(RET_ALLOW), ret(RET_ERRNO | ENOSYS), ret(RET_ERRNO | EPERM)]


def seccomp() -> str:
    machine = os.uname().machine
    if machine not in ARCHES:
        raise Missing("seccomp", f"filter system calls on {machine} (x86_64 and aarch64 only)")
    code = b"".join(struct.pack("HBBI", *insn) for insn in seccomp_program(machine))
    filters = ctypes.create_string_buffer(code)

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    program = Program(len(code) // 8, ctypes.cast(filters, ctypes.c_void_p))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "seccomp", "set no_new_privs")
    check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(program), 0, 0), "seccomp",
          "install a seccomp filter")
    return "seccomp (no sockets but AF_UNIX, no namespaces, mounts, ptrace, keyrings, " \
           "io_uring, BPF or perf events)"


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


def layer(name: str, config: dict, setup, *args) -> str:
    """``setup``'s note; where the kernel refused it and ``allow_missing`` names it, what runs
    without it (else the refusal goes on up)."""
    try:
        return setup(*args)
    except Missing as missing:
        if name not in config["allow_missing"]:
            raise
        return f"without {name} ({missing.args[1]})"


def init(config: dict, isolated: bool, notes: list) -> None:
    """PID 1 of the sandbox: its root, Landlock, no capabilities, seccomp, then the program."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the outer runner died: so do we
    if isolated:
        notes.append(own_root(config))
        work, reads, writes = "/work", ["/"], WRITABLE
        path = "/pkgs"
    else:  # the host's tree, Landlock its only fence
        work, reads, writes = config["workdir"], config["binds"], [config["workdir"]]
        path = os.path.join(work, ".pkgs")
        os.makedirs(path)
        for name, source in config["packages"].items():
            os.symlink(source, os.path.join(path, name))
        reads = list(reads) + list(config["packages"].values())
    for name, text in config["files"].items():
        write(os.path.join(work, name), text)
    rules = [(p, READ) for p in reads] + [(p, -1) for p in writes] + \
        [(f"/dev/{d}", READ | WRITE_FILE | TRUNCATE) for d in ("null", "zero")]
    notes.append(layer("landlock", config, landlock, rules))
    drop_capabilities()
    notes.append("no capabilities")
    notes.append(layer("seccomp", config, seccomp))
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    note("; ".join(notes))
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": "/tmp" if isolated else work,
           "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if config["packages"]:
        env["PYTHONPATH"] = path
    if config["unbuffered"]:
        env["PYTHONUNBUFFERED"] = "1"
    child = os.fork()
    if child == 0:
        os.chdir(work)
        limits(config)
        os.closerange(3, 1 << 16)
        os.execve(config["argv"][0], config["argv"], env)
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
    would stretch its own clock up to wall_max_s), and where the kernel does not report it;
    all of it once the program and all it started have ended (init, exiting, tears down the
    sandbox's mounts, which on a busy machine takes a while too)."""
    try:
        ours = children(str(init_pid))
        if not ours:
            return math.inf
        if len(ours) != 1 or children(ours[0]):
            return 0.0
        with open(f"/proc/{ours[0]}/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def refused(missing: Missing) -> None:
    os.write(2, f"sandbox: missing {missing.args[0]}: {missing.args[1]}\n".encode())
    os._exit(125)


def main() -> None:
    with os.fdopen(int(sys.argv[1]), "rb") as channel:
        config = marshal.loads(channel.read())
    try:
        namespaces()
        notes = ["user, PID, network, IPC, UTS and cgroup namespaces"]
    except Missing as missing:
        if "namespaces" not in config["allow_missing"]:
            refused(missing)
        notes = [f"without namespaces ({missing.args[1]}): the host's files, network and "
                 "processes, Landlock its only fence"]
    isolated = not notes[0].startswith("without")
    init_pid = os.fork()
    if init_pid == 0:
        try:
            init(config, isolated, notes)
        except Missing as missing:
            refused(missing)
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
