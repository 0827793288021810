"""The sandbox's threat model (docs/sandbox_threat_model.md), kind by kind: a program tries every
way out of a kind of kernel object, from inside the sandbox, through both of its callers (a
tool call's ``python`` and a code answer's tests), and reports what it reached: nothing.

Each probe sets ``opened`` to what it reached; the host side sets up what there is to reach (a
server on a UNIX socket file in the host's /tmp, another on an abstract address, TCP and UDP
servers on 127.0.0.1, System V objects, a POSIX message queue, secrets in /tmp, /dev/shm, /run
and $HOME) and checks it was not reached. The layers a kernel can refuse are refused here for
real (a seccomp filter on the test's own process that denies what a container would), and the
run stops at start in one sentence, or runs without the layer where the user named it."""

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.reward.code import CodeChecker
from megatron_rlep.reward.sandbox import Limits, Sandbox, read_paths
from megatron_rlep.reward.sandbox.sandbox_init import ARCHES, NUMBERS
from megatron_rlep.rollout.tools import PythonTool

ROOT = Path(__file__).resolve().parent.parent
COLUMN = ARCHES[os.uname().machine][0]
NR = {name: numbers[COLUMN] for name, numbers in NUMBERS.items()}
libc = ctypes.CDLL(None, use_errno=True)

PRELUDE = """\
import ctypes, json, os, resource, socket
libc = ctypes.CDLL(None, use_errno=True)
NR, H = json.loads({nr!r}), json.loads({host!r})
opened = []

def call(name, *args):
    return libc.syscall(NR[name], *args)

def fails(what, action):
    '''``action`` must raise OSError (or return a negative status): else ``what`` was reached.'''
    try:
        result = action()
    except (OSError, ValueError):
        return
    if not (isinstance(result, int) and result < 0):
        opened.append(what)

def connects(family, kind, address, what, data=b"escape"):
    def attempt():
        with socket.socket(family, kind) as s:
            s.settimeout(1)
            s.connect(address)
            s.sendall(data)
    fails(what, attempt)
"""

PROBES = {
    # the host's tree: nothing of it but the read-only binds
    "files": """
for path in H["secrets"]:
    fails("read " + path, lambda: open(path).read())
for path in ("/usr/bin", "/usr/sbin", "/home", "/var", "/boot"):
    fails("list " + path, lambda: os.listdir(path))
for path, ok in H["root_ok"].items():
    if os.path.isdir(path) and set(os.listdir(path)) - set(ok):
        opened.append(path + " with " + str(os.listdir(path)))
top = sorted(set(os.listdir("/")) - set(H["top_ok"]))
if top:
    opened.append("a root with " + str(top))
fails("write to the interpreter's files", lambda: open(H["stdlib_file"], "a"))
""",
    "shared_dirs": """
for path in H["shared"]:
    fails("read " + path, lambda: open(path).read())
if os.listdir("/tmp") or os.listdir("/dev/shm"):
    opened.append("a /tmp or /dev/shm with " + str(os.listdir("/tmp") + os.listdir("/dev/shm")))
open("/tmp/" + H["tmp_name"], "w").write("from inside")  # the box's own /tmp, not the host's
for path in ("/run", "/var/run"):
    fails("list " + path, lambda: os.listdir(path))
""",
    "unix_path_socket": """
for path in H["unix_paths"]:
    connects(socket.AF_UNIX, socket.SOCK_STREAM, path, "connect to " + path)
""",
    "unix_abstract_socket": """
connects(socket.AF_UNIX, socket.SOCK_STREAM, "\\0" + H["abstract"], "connect to @" + H["abstract"])
""",
    "netlink": """
for protocol in (0, 9, 15):  # route, audit, kernel events
    fails(f"a netlink socket ({protocol})", lambda: socket.socket(16, socket.SOCK_RAW, protocol).close())
""",
    "ip": """
connects(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", H["tcp_port"]), "TCP to the host")
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"escape", ("127.0.0.1", H["udp_port"]))
fails("UDP to the host", udp)
for family, kind in ((socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_RAW)):
    fails(f"an IP socket ({family}, {kind})", lambda: socket.socket(family, kind, 1 if kind == socket.SOCK_RAW else 0).close())
""",
    "other_families": """
# packet, vsock (not confined by network namespaces: a VM's host), kernel crypto, bluetooth,
# CAN, XDP, PF_KEY, RDS, TIPC
for family in (17, 40, 38, 31, 29, 44, 15, 21, 30):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
        fails(f"a socket of family {family}", lambda: socket.socket(family, kind).close())
""",
    "sysv_ipc": """
for name, key in H["sysv"].items():
    get = getattr(libc, name + "get")
    fails(f"the host's System V {name} {key}", lambda: get(key, 0, 0))
""",
    "posix_ipc": """
fails("the host's POSIX shared memory", lambda: open("/dev/shm/" + H["posix_shm"]).read())
fails("the host's POSIX semaphore", lambda: open("/dev/shm/sem." + H["posix_shm"]).read())
libc.mq_open.restype = ctypes.c_int
fails("the host's message queue", lambda: libc.mq_open(("/" + H["mqueue"]).encode(), os.O_RDONLY))
""",
    "proc": """
pids = [p for p in os.listdir("/proc") if p.isdigit()]
if len(pids) > 2:
    opened.append("processes " + str(pids))
for pid in pids:
    line = open(f"/proc/{pid}/cmdline", "rb").read()
    if b"pytest" in line or b"allow_missing" in line:  # a host process, or the sandbox's config
        opened.append("process " + str(line[:80]))
fails("the trainer's environment", lambda: open(f"/proc/{H['trainer_pid']}/environ").read())
""",
    "ptrace": """
fails("ptrace(TRACEME)", lambda: call("ptrace", 0, 0, 0, 0))
fails("ptrace(ATTACH, init)", lambda: call("ptrace", 16, 1, 0, 0))
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
fails("process_vm_readv(init)", lambda: call("process_vm_readv", 1, iov, 1, iov, 1, 0))
fails("kcmp", lambda: call("kcmp", os.getpid(), 1, 0, 0, 0))
fails("pidfd_getfd", lambda: call("pidfd_getfd", 0, 0, 0))
""",
    "signals": """
for pid in (H["trainer_pid"], H["trainer_parent"]):
    fails(f"a signal to the host's process {pid}", lambda: os.kill(pid, 0))
""",
    "keyrings": """
fails("add_key", lambda: call("add_key", b"user", b"rlep", b"secret", 6, -4))
fails("keyctl(the user keyring)", lambda: call("keyctl", 0, -4, 0))
fails("request_key", lambda: call("request_key", b"user", b"rlep", None, 0))
""",
    "io_uring": """
params = ctypes.create_string_buffer(120)
fails("io_uring_setup", lambda: call("io_uring_setup", 4, params))
""",
    "perf_events": """
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # a software clock of this process
fails("perf_event_open", lambda: call("perf_event_open", attr, 0, -1, -1, 0))
""",
    "userfaultfd": """
fails("userfaultfd", lambda: call("userfaultfd", 1))
""",
    "bpf": """
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)  # an array map of one entry
fails("bpf", lambda: call("bpf", 0, attr, 128))
""",
    "namespaces_inside": """
for flag in (0x10000000, 0x20000, 0x40000000, 0x20000000):  # user, mount, network, PID
    fails(f"unshare({flag:#x})", lambda: call("unshare", flag))
def clone():
    pid = call("clone", 0x10000000 | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    return pid
fails("clone(CLONE_NEWUSER)", clone)
fd = os.open("/proc/self/ns/user", os.O_RDONLY)
fails("setns", lambda: call("setns", fd, 0))
fails("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
fails("chroot", lambda: libc.chroot(b"/tmp"))
fails("pivot_root", lambda: call("pivot_root", b"/tmp", b"/tmp"))
fails("fsopen", lambda: call("fsopen", b"tmpfs", 0))
fails("open_tree", lambda: call("open_tree", -100, b"/", 1))
""",
    "privileges": """
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
    if int(status[key], 16):
        opened.append(key + status[key])
if status["NoNewPrivs"].strip() != "1":
    opened.append("no_new_privs unset")
for line in open("/proc/self/mountinfo"):
    options = line.split(" - ")[0].split()[5].split(",")
    if "nosuid" not in options:
        opened.append("a mount without nosuid: " + line.strip())
fails("setuid", lambda: os.setuid(1000))
""",
    "devices": """
extra = set(os.listdir("/dev")) - {"null", "zero", "random", "urandom", "shm", "fd", "stdin", "stdout", "stderr"}
if extra:
    opened.append("devices " + str(sorted(extra)))
for path in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dri/card0", "/dev/kvm", "/dev/vda",
             "/dev/sda", "/dev/mem", "/dev/kmsg", "/dev/tty", "/dev/fuse", "/dev/net/tun"):
    fails("open " + path, lambda: os.close(os.open(path, os.O_RDONLY)))
fails("list /sys", lambda: os.listdir("/sys"))
fails("mknod a device", lambda: os.mknod("/tmp/mem", 0o20666, os.makedev(1, 1)) or open("/tmp/mem", "rb").read(1))
""",
    "limits": """
want = {resource.RLIMIT_CPU: H["limits"]["cpu_s"], resource.RLIMIT_NPROC: H["limits"]["nproc"],
        resource.RLIMIT_AS: H["limits"]["memory_mb"] << 20, resource.RLIMIT_FSIZE: H["limits"]["fsize_mb"] << 20,
        resource.RLIMIT_NOFILE: 64, resource.RLIMIT_CORE: 0}
for name, value in want.items():
    if resource.getrlimit(name) != (value, value):
        opened.append(f"limit {name}: {resource.getrlimit(name)}")
for name in list(want):
    fails(f"raise limit {name}", lambda: resource.setrlimit(name, (resource.RLIM_INFINITY,) * 2))
def fill():  # more than the sandbox's whole tmpfs, in files under the size limit
    for i in range(H["limits"]["tmpfs_mb"] // H["limits"]["fsize_mb"] + 2):
        with open(f"/tmp/fill{i}", "wb") as f:
            f.write(b"x" * ((H["limits"]["fsize_mb"] << 20) - 1))
fails("write past the tmpfs", fill)
for line in open("/proc/self/cgroup"):
    if line.strip().rsplit(":", 1)[1] != "/":
        opened.append("the host's cgroup " + line.strip())
""",
    "clocks": """
ts = (ctypes.c_long * 2)(0, 0)
fails("clock_settime", lambda: libc.clock_settime(0, ts))
fails("settimeofday", lambda: libc.settimeofday(ts, None))
tx = ctypes.create_string_buffer(256)
ctypes.memmove(tx, (ctypes.c_uint32 * 1)(1), 4)  # ADJ_OFFSET
fails("adjtimex", lambda: call("adjtimex", tx))
""",
    "machine": """
buf = ctypes.create_string_buffer(4096)
fails("the kernel log", lambda: call("syslog", 3, buf, 4096))
fails("open_by_handle_at", lambda: call("open_by_handle_at", -100, buf, 0))
fails("init_module", lambda: call("init_module", buf, 16, b""))
fails("reboot", lambda: call("reboot", 0xfee1dead, 672274793, 0, 0))
fails("swapon", lambda: call("swapon", b"/tmp", 0))
fails("acct", lambda: call("acct", b"/tmp/acct"))
""",
    "inheritance": """
extra = set(os.environ) - set(H["env_ok"])
if extra:
    opened.append("environment " + str(sorted(extra)))
for fd in os.listdir("/proc/self/fd"):  # pipes to the caller, /dev/null, the listing's own
    target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else "pipe:"
    if not target.startswith(("pipe:", "/dev/null", "/proc/")):
        opened.append(f"an inherited descriptor {fd}: {target}")
fails("a terminal", lambda: os.open("/dev/tty", os.O_RDWR))
fails("TIOCSTI", lambda: libc.ioctl(0, 0x5412, ctypes.c_char_p(b"x")))
""",
    "packages": """
import numpy, sympy
if numpy.arange(10).sum() != 45 or str(sympy.factor("x**2 - 1")) != "(x - 1)*(x + 1)":
    opened.append("numpy or sympy broken")
fails("write to numpy", lambda: open(numpy.__file__, "a"))
for name in ("torch", "transformers", "megatron", "vllm"):
    def load():
        __import__(name)
    try:
        load()
        opened.append("imported " + name)
    except ImportError:
        pass
for path in H["site_dirs"]:
    if os.path.isdir(path) and os.listdir(path):
        opened.append(path + " with " + str(os.listdir(path)[:5]))
""",
}
EPILOGUE = "\nresult = 'closed' if not opened else 'OPEN: ' + '; '.join(opened)\n"
LIMITS = Limits(wall_s=10.0, cpu_s=10, memory_mb=512, nproc=16, fsize_mb=8, tmpfs_mb=32)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """What a program could reach on this host, set up for real; its facts for the probes, and
    ``reached()`` for what the servers saw."""
    tag = f"rlep-threat-{os.getpid()}"
    base = tmp_path_factory.mktemp("host")
    secrets = [base / "run" / "config.json", Path.home() / f".{tag}", Path("/etc/shadow")]
    shared = [Path("/tmp") / f"{tag}.secret", Path("/dev/shm") / f"{tag}.secret",
              Path("/run") / f"{tag}.secret"]
    for path in secrets[:2] + shared:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("secret")
    seen, servers = [], []

    def serve(family, kind, address):
        server = socket.socket(family, kind)
        server.bind(address)
        if kind == socket.SOCK_STREAM:
            server.listen()
        server.settimeout(0.2)
        servers.append(server)

        def loop():
            while server.fileno() >= 0:
                try:
                    if kind == socket.SOCK_STREAM:
                        conn, _ = server.accept()
                        seen.append((address, conn.recv(64)))
                    else:
                        seen.append((address, server.recv(64)))
                except (socket.timeout, OSError):
                    continue
        threading.Thread(target=loop, daemon=True).start()
        return server

    unix_paths = [f"/tmp/{tag}.sock", f"/run/{tag}.sock"]
    for path in unix_paths:
        serve(socket.AF_UNIX, socket.SOCK_STREAM, path)
    serve(socket.AF_UNIX, socket.SOCK_STREAM, f"\0{tag}")
    tcp = serve(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
    udp = serve(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
    key = 0x524C0000 + os.getpid() % 0xFFFF
    sysv = {"shm": libc.shmget(key, 4096, 0o1666), "sem": libc.semget(key + 1, 1, 0o1666),
            "msg": libc.msgget(key + 2, 0o1666)}
    assert min(sysv.values()) >= 0, "System V objects could not be made here"
    libc.mq_open.restype = ctypes.c_int
    queue = libc.mq_open(f"/{tag}".encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
    assert queue >= 0, "a POSIX message queue could not be made here"
    box = Sandbox(LIMITS)
    facts = {"secrets": [str(p) for p in secrets], "shared": [str(p) for p in shared],
             "tmp_name": f"{tag}.inside", "unix_paths": unix_paths, "abstract": tag,
             "tcp_port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1],
             "sysv": {"shm": key, "sem": key + 1, "msg": key + 2}, "posix_shm": f"{tag}.secret",
             "mqueue": tag, "trainer_pid": os.getpid(), "trainer_parent": os.getppid(),
             "stdlib_file": os.__file__,
             "site_dirs": box.hide + [str(Path(pytest.__file__).resolve().parents[1])],
             "top_ok": sorted({p.split("/")[1] for p in read_paths()} |
                              {"dev", "pkgs", "proc", "tmp", "work"}),
             "root_ok": {"/etc": ["ld.so.cache"]},
             "env_ok": ["PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE", "OPENBLAS_NUM_THREADS",
                        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONDONTWRITEBYTECODE",
                        "PYTHONPATH", "PYTHONUNBUFFERED"]}
    facts["root_ok"]["/root"] = [p.split("/")[2] for p in read_paths() if p.startswith("/root/")]
    yield facts, lambda: list(seen)
    for server in servers:
        server.close()
    for path in secrets[:2] + shared + [Path(p) for p in unix_paths]:
        path.unlink(missing_ok=True)
    libc.shmctl(sysv["shm"], 0, None)  # IPC_RMID
    libc.semctl(sysv["sem"], 0, 0)
    libc.msgctl(sysv["msg"], 0, None)
    libc.mq_unlink(f"/{tag}".encode())


def program(kind: str, facts: dict, limits: Limits) -> str:
    facts = {**facts, "limits": limits.__dict__}
    return PRELUDE.format(nr=json.dumps(NR), host=json.dumps(facts)) + PROBES[kind] + EPILOGUE


def through_the_tool(kind: str, facts: dict) -> str:
    """What the program's ``result`` was, run as a tool call's ``python`` block."""
    tool = PythonTool(timeout_s=LIMITS.wall_s)
    source = program(kind, facts, tool.sandbox.limits)
    return tool(source + "print(result)\n").output.strip()


def through_a_code_answer(kind: str, facts: dict) -> str:
    """The same through the code reward: an answer whose function returns ``result``, checked
    against a test that expects "closed" (in the answer's sandbox, called over the channel)."""
    checker = CodeChecker(LIMITS)
    source = program(kind, facts, LIMITS)
    answer = f"```python\n{source}\ndef probe():\n    return result\n```"
    verdict = checker.check(answer, {"fn_name": "probe", "inputs": [[]], "outputs": ["closed"]})
    if verdict.correct:
        return "closed"
    shown = checker.sandbox.run({"main.py": source + "print(result)\n"})  # to say why
    return f"{verdict.detail}: {shown.stdout.strip()} {shown.stderr[-500:]}"


@pytest.mark.parametrize("caller", [through_the_tool, through_a_code_answer],
                         ids=["tool", "code_answer"])
@pytest.mark.parametrize("kind", list(PROBES))
def test_a_program_reaches_nothing_of_this_kind_outside(kind, caller, host):
    facts, reached = host
    assert caller(kind, facts) == "closed"
    assert reached() == []  # no server heard from it
    assert not (Path("/tmp") / facts["tmp_name"]).exists()  # its /tmp is not the host's


def test_the_unix_socket_that_a_program_reached_before_is_closed(host, tmp_path, monkeypatch):
    """The escape the threat model starts from: a server on a socket file in the host's /tmp
    received bytes sent from a sandboxed program (the sandbox saw the host's tree, and Landlock
    does not govern connect()). Now the socket's path does not exist inside."""
    facts, reached = host
    out = Sandbox(LIMITS).run({"main.py": "import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                          f"s.connect({facts['unix_paths'][0]!r})\n"
                                          "s.sendall(b'escape')\nprint('sent')\n"})
    assert out.stdout == "" and "FileNotFoundError" in out.stderr, out
    assert reached() == []


def test_a_program_is_nobody_outside_when_root_starts_it():
    """Seen from the host: the program's processes belong to the user that started the sandbox,
    or to nobody when that is root (whom RLIMIT_NPROC would not cap, and whose files a program
    that got out would own)."""
    session = Sandbox(LIMITS).start({"main.py": "import time\nprint('up', flush=True)\n"
                                                "time.sleep(30)\n"})
    try:
        assert session.receive() == "up"
        runner = session.proc.pid
        init = open(f"/proc/{runner}/task/{runner}/children").read().split()[0]
        program_pid = open(f"/proc/{init}/task/{init}/children").read().split()[0]
        status = Path(f"/proc/{program_pid}/status").read_text()
        uid = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        expected = str(65534 if os.getuid() == 0 else os.getuid())
        assert uid == [expected] * 4
    finally:
        session.close()


def test_a_user_who_is_not_root_gets_the_same_sandbox():
    """Cluster users are not root: the same layers, from the system's Python run as nobody (the
    project's own interpreter, and maybe this checkout, lie where nobody cannot enter: the
    sandbox's package goes to a folder nobody can read)."""
    system = Path("/usr/bin/python3")
    assert system.exists(), "this machine has no system Python to run as another user"
    world = Path(tempfile.mkdtemp(prefix="rlep-nobody-", dir="/tmp"))
    try:
        for path in ["megatron_rlep/__init__.py", "megatron_rlep/errors.py",
                     "megatron_rlep/reward/__init__.py",
                     *(str(p.relative_to(ROOT)) for p in
                       (ROOT / "megatron_rlep/reward/sandbox").glob("*.py"))]:
            (world / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, world / path)
        for path in [world, *world.rglob("*")]:
            path.chmod(0o755)
        code = ("from megatron_rlep.reward.sandbox import Sandbox\n"
                "s = Sandbox(packages=())\nprint(s.probe())\n"
                "print(s.run({'main.py': 'import os\\nprint(os.getuid(), os.listdir(\"/tmp\"))'})"
                ".stdout)")
        out = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534",
                              "--clear-groups", str(system), "-c", code], cwd=world,
                             capture_output=True, text=True, timeout=scaled(60),
                             env={"PYTHONPATH": str(world), "PATH": "/usr/bin:/bin"})
    finally:
        shutil.rmtree(world)
    assert out.returncode == 0, out.stderr
    line, listing = out.stdout.splitlines()[:2]
    assert line.startswith("sandbox: user, PID, network, IPC, UTS and cgroup namespaces; a root "
                           "of its own"), line
    assert "; no capabilities; seccomp (" in line and "Landlock ABI" in line, line
    assert listing == "0 []"


# ---------------------------------------------------------------- a kernel that refuses a layer

REFUSE = {  # layer: a seccomp filter for the test's own process that refuses it, as a container
    # would: (system call, its first argument or None for any, errno)
    "namespaces": ("unshare", None, 1),
    "landlock": ("landlock_create_ruleset", None, 38),
    "seccomp": ("prctl", 22, 22),  # PR_SET_SECCOMP: EINVAL, as a kernel without filters
}
PRCTL = {"x86_64": 157, "aarch64": 167}[os.uname().machine]


def refusing(layer: str) -> str:
    """Python source that installs, on its own process, a filter refusing ``layer``."""
    name, first, errno = REFUSE[layer]
    number = PRCTL if name == "prctl" else NUMBERS[name][COLUMN]
    if first is None:
        program = [(0x20, 0, 0, 0), (0x15, 0, 1, number), (0x06, 0, 0, 0x50000 | errno),
                   (0x06, 0, 0, 0x7FFF0000)]
    else:
        program = [(0x20, 0, 0, 0), (0x15, 0, 3, number), (0x20, 0, 0, 16), (0x15, 0, 1, first),
                   (0x06, 0, 0, 0x50000 | errno), (0x06, 0, 0, 0x7FFF0000)]
    return (f"import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"code = b''.join(struct.pack('HBBI', *i) for i in {program!r})\n"
            "buf = ctypes.create_string_buffer(code)\n"
            "class P(ctypes.Structure):\n"
            "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
            "p = P(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))\n"
            "assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0\n")


def under(layer: str, code: str, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", refusing(layer) + code, *args],
                          capture_output=True, text=True, timeout=scaled(120), **kwargs)


@pytest.mark.parametrize("layer", list(REFUSE))
def test_a_refused_layer_stops_the_start_in_one_sentence_or_runs_without_it_when_named(layer,
                                                                                       host):
    facts, _ = host
    code = f"""
from megatron_rlep.errors import RunError
from megatron_rlep.reward.sandbox import Sandbox
try:
    Sandbox(packages=()).probe()
    print("started")
except RunError as refused:
    print(refused)
weaker = Sandbox(allow_missing=[{layer!r}], packages=())
print(weaker.probe())
print(weaker.run({{"main.py": "import os\\nprint(os.path.exists({facts['unix_paths'][0]!r}))"}}).stdout)
"""
    out = under(layer, code)
    assert out.returncode == 0, out.stderr
    refusal, line, exists = out.stdout.splitlines()[:3]
    assert refusal.startswith(f"the sandbox cannot isolate programs on this node: missing {layer}: "
                              ) and f"set sandbox.allow_missing=[{layer}] to run" in refusal, refusal
    assert f"without {layer} (" in line, line
    # what is left still holds: the host's /tmp is out of reach (Landlock alone fences it
    # where the namespaces are refused)
    assert exists == ("True" if layer == "namespaces" else "False"), exists
    if layer == "namespaces":
        steal = {"main.py": f"print(open({facts['shared'][0]!r}).read())"}
        read = under(layer, "from megatron_rlep.reward.sandbox import Sandbox\n"
                            "print(Sandbox(allow_missing=['namespaces'], packages=()).run("
                            f"{steal!r}).stderr)")
        assert "PermissionError" in read.stdout, read.stdout + read.stderr


@pytest.mark.e2e
def test_a_training_run_on_a_node_that_refuses_landlock_stops_at_start(tmp_path):
    """Through the entry point a job runs: a run with the python tool on a kernel without
    Landlock stops before the model loads, with one line naming the layer and the key."""
    code = ("import runpy, sys\nsys.argv = ['megatron_rlep.train'] + sys.argv[1:]\n"
            "runpy.run_module('megatron_rlep.train', run_name='__main__')\n")
    start = time.monotonic()
    out = under("landlock", code, "experiment=cpu_demo_calculator", f"run_dir={tmp_path / 'run'}",
                "logging.wandb=disabled", "logging.progress=false",
                env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "missing landlock" in errors[0] and "sandbox.allow_missing=[landlock]" in errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - start < scaled(120)


def run_filter(program: list, arch: int, number: int, *args: int) -> int:
    """What the classic BPF ``program`` returns for a system call (the few instructions
    ``seccomp_program`` uses: load a word, jump if equal, greater or equal, or any bit set,
    return)."""
    data = [number, arch] + [0, 0] + [word for a in args for word in (a & 0xFFFFFFFF, a >> 32)]
    data += [0] * (16 - len(data))
    a, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # A = seccomp_data's word at k
            a, pc = data[k // 4], pc + 1
        elif code in (0x15, 0x35, 0x45):
            taken = a == k if code == 0x15 else a >= k if code == 0x35 else bool(a & k)
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"an instruction the filter should not hold: {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_decides_each_kind_on_both_architectures(machine):
    """The filter run instruction by instruction on hand-picked calls, for both architectures
    the project runs on (this machine's kernel runs only its own: aarch64's table, a GH200
    node's, is checked here alone)."""
    from megatron_rlep.reward.sandbox.sandbox_init import seccomp_program

    program = seccomp_program(machine)
    column, arch = ARCHES[machine]
    n = {name: numbers[column] for name, numbers in NUMBERS.items()}
    allow, kill = 0x7FFF0000, 0x80000000
    errno = lambda e: 0x50000 | e  # noqa: E731
    read = {"x86_64": 0, "aarch64": 63}[machine]
    cases = [((read, 3, 0, 10), allow),
             ((n["socket"], 1, 1), allow), ((n["socket"], 2, 1), errno(97)),
             ((n["socket"], 16, 3), errno(97)), ((n["socket"], 40, 1), errno(97)),
             ((n["socketpair"], 1, 1), allow), ((n["socketpair"], 10, 1), errno(97)),
             ((n["clone"], 0x01200011), allow),  # fork's flags
             ((n["clone"], 0x003D0F00), allow),  # a thread's
             ((n["clone"], 0x10000000 | 17), errno(1)), ((n["clone"], 0x20000 | 17), errno(1)),
             ((n["clone3"], 0), errno(38)), ((n["io_uring_setup"], 4, 0), errno(38)),
             ((n["ioctl"], 0, 0x5412), errno(1)), ((n["ioctl"], 0, 0x5401), allow),
             ((n["mount"], 0), errno(1)), ((n["unshare"], 0x10000000), errno(1)),
             ((n["ptrace"], 0), errno(1)), ((n["bpf"], 0), errno(1)), ((n["keyctl"], 0), errno(1)),
             ((n["perf_event_open"], 0), errno(1)), ((n["userfaultfd"], 1), errno(1)),
             ((n["capset"], 0), allow), ((n["landlock_restrict_self"], 0), allow)]
    for (number, *args), expected in cases:
        assert run_filter(program, arch, number, *args) == expected, (machine, number, args)
    other = ARCHES["aarch64" if machine == "x86_64" else "x86_64"][1]
    assert run_filter(program, other, read) == kill  # another architecture's ABI
    assert run_filter(program, 0x40000003, read) == kill  # i386 on x86_64
    assert run_filter(program, arch, 0x40000000 + read) == kill  # x32's numbers
