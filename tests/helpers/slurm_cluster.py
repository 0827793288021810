"""A one-node Slurm cluster on this host for tests: munged, slurmctld and slurmd with every file
(key, sockets, state, logs, slurm.conf) in one directory, started by ``start`` and stopped by
``stop``, which also cancels every job and kills whatever of them still runs. Waits are
scaled by the machine's speed (``speed.scaled``). Clients find it through ``env()`` (SLURM_CONF). Needs Debian's slurm-wlm and munge
(scripts/test.sh installs them) and root, as on the project's machines.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from speed import scaled

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")


def available() -> str | None:
    """None when a cluster can be started here, else why not."""
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/test.sh installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root here"
    return None


def for_tests(tmp_path_factory, why_not: str | None):
    """A module's cluster (a pytest fixture's body: ``yield from for_tests(...)``); CI must have
    Slurm, so there a missing one fails instead of skipping."""
    import pytest

    if why_not is not None:
        pytest.fail(f"CI must run the Slurm tests, but {why_not}")
    root = tmp_path_factory.mktemp("slurm")
    os.chmod(root, 0o700)
    cluster = Cluster(root).start()
    yield cluster
    cluster.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """``nodes`` > 1: that many nodes on this one host (node1, node2, ...), each a slurmd of its
    own with its own port and spool, each with all of this host's CPUs."""

    def __init__(self, root: Path, cpus: int | None = None, nodes: int = 1):
        self.root = Path(root)
        self.cpus = cpus or os.cpu_count() or 1
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [self.host] if nodes == 1 else [f"node{i + 1}" for i in range(nodes)]
        self.conf = self.root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        # cred_expire (s) is also how long a requeued job waits before it may start again
        # and then for the scheduler's next pass: every sched_interval s (60 by default).
        # MinJobAge: finished jobs stay queryable for a day (the rehearsal asks for its first
        # job's state after its last ends, 15 minutes later on a loaded machine)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
        many = len(self.nodes) > 1
        if not many:
            nodes = f"NodeName={self.host} CPUs={self.cpus} RealMemory={memory} State=UNKNOWN"
        else:  # the same host, a port and a spool each
            memory //= len(self.nodes)
            nodes = "\n".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 "
                               f"Port={_free_port()} CPUs={self.cpus} RealMemory={memory} "
                               "State=UNKNOWN" for n in self.nodes)
            for n in self.nodes:
                (r / "spool" / n).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=rlep-test
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={r / 'munge' / 'munge.socket'},cred_expire=10
CredType=cred/munge
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}{'/%n' if many else ''}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd'}{'-%n' if many else ''}.pid
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd'}{'-%n' if many else ''}.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
KillWait=60
InactiveLimit=0
MinJobAge=86400
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def start(self, timeout: float = 60) -> "Cluster":
        self._write_config()
        r = self.root
        subprocess.run([_daemon("munged"), "--force", f"--socket={r / 'munge' / 'munge.socket'}",
                        f"--key-file={r / 'munge' / 'munge.key'}",
                        f"--log-file={r / 'log' / 'munged.log'}",
                        f"--pid-file={r / 'munge' / 'munged.pid'}",
                        f"--seed-file={r / 'munge' / 'munged.seed'}"], check=True,
                       capture_output=True)
        daemons = [("slurmctld", ["-i"])] + [
            ("slurmd", [] if len(self.nodes) == 1 else ["-N", n]) for n in self.nodes]
        for daemon, extra in daemons:
            name = "-".join([daemon, *extra[1:]])
            self.procs.append(subprocess.Popen(
                [_daemon(daemon), "-D", "-f", str(self.conf), *extra],
                env=self.env(), stdout=open(r / "log" / f"{name}.out", "w"),
                stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.time() + scaled(timeout)
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env(),
                                   capture_output=True, text=True)
            states = state.stdout.split()
            if state.returncode == 0 and len(states) == len(self.nodes) and all(
                    s in ("idle", "mixed", "allocated") for s in states):
                return self
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-1500:] for p in sorted((r / "log").glob("*")) if p.is_file())
        self.stop()
        raise RuntimeError(f"the test Slurm cluster did not come up:\n{logs}")

    def stop(self) -> None:
        """Cancel every job (SIGKILL to the whole job, steps included), stop the daemons, then
        kill whatever still runs under this cluster: a test that stops early, by a failure or
        pytest's timeout, leaves no batch script, srun or slurmstepd behind. Every such process
        carries this cluster's SLURM_CONF in its environment (slurmd and the submitters got it
        from ``env()``; steps and scripts inherit it)."""
        jobs = self.run("squeue", "-h", "-o", "%i", check=False) if self.procs else ""
        if jobs:
            self.run("scancel", "--full", "--signal=KILL", *jobs.split(), check=False)
            self.run("scancel", *jobs.split(), check=False)
        self.reap(spare={p.pid for p in self.procs})  # the jobs' processes, then the daemons
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs = []
        pid = self.root / "munge" / "munged.pid"
        if pid.is_file():
            try:
                os.kill(int(pid.read_text().strip()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        self.reap()

    def leftovers(self, spare=()) -> list[int]:
        """Processes, other than this one, whose environment names this cluster's SLURM_CONF;
        with ``spare`` (the daemons' pids), neither those nor slurmctld's script helper."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in (os.getpid(), *spare):
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0") and not (
                        spare and (entry / "cmdline").read_bytes().startswith(b"slurmctld:")):
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
        return found

    def reap(self, spare=(), timeout: float = 10) -> None:
        """SIGKILL every leftover process of this cluster (but ``spare``) and wait until none is
        left."""
        deadline = time.time() + timeout
        while (left := self.leftovers(spare)) and time.time() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    # ------------------------------------------------------------------ client helpers

    def run(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                                timeout=scaled(60))
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def job_state(self, job: str) -> str:
        return self.job_field(job, "JobState")

    def query(self, *args: str, tries: int = 3) -> str:
        """A read-only client command (squeue, scontrol show), asked up to ``tries`` times:
        a slurmctld busy on a loaded machine may answer one with an error and no words."""
        for attempt in range(tries):
            try:
                return self.run(*args)
            except (RuntimeError, subprocess.TimeoutExpired):
                if attempt == tries - 1:
                    raise
                time.sleep(2)

    def queued(self) -> list[str]:
        """The ids of the jobs still pending or running."""
        return self.query("squeue", "-h", "-o", "%i").split()

    def job_field(self, job: str, name: str) -> str:
        """One field of ``scontrol show job``."""
        out = self.query("scontrol", "show", "job", job, "-o")
        return next(f.split("=", 1)[1] for f in out.split() if f.startswith(f"{name}="))

    def wait(self, job: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                     "OUT_OF_MEMORY", "PREEMPTED"), timeout: float = 900) -> str:
        deadline = time.time() + scaled(timeout)
        while time.time() < deadline:
            state = self.job_state(job)
            if state in states:
                return state
            time.sleep(1)
        raise TimeoutError(f"job {job} still {self.job_state(job)} after {timeout} s")
