"""The bridge of a disaggregated job (``rollout.placement=disaggregated``): learner 0 and the
rollout ranks (megatron_rlep/roles.py chooses which ranks those are) on a process group of their
own, gloo for messages, the job's backend (NCCL on GPUs) for weights, met through the job's own
store (``job_store``: no port of its own that another program could hold).

Messages (``rollout/messages.py``) go point to point, pickled; after each update the weights go
as bucket broadcasts from learner 0 (``broadcast_buckets``), never the whole model on one rank.
Liveness is the application's: every rank says it is alive to its peers every few seconds, and
a peer silent for ``rollout.timeout_s`` is gone, in one sentence. The learners' side of the
bridge is ``remote_stream.py``, the rollout ranks' ``rollout_rank.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import queue
import socket
import threading
import time

import torch
import torch.distributed as dist

from megatron_rlep.rollout.messages import (LAST, Alive, Broken, Bucket, BucketsDone,
                                            TensorSpec)

SIZE, DATA = 1, 2  # message tags: a length, then its bytes
LINKS = datetime.timedelta(days=7)  # the message links' transport timeout: never the judge


NCCL_MARGIN_S = 60.0  # NCCL's watchdog after the sync's own deadline, which says it first


def weights_timeout(sync_s: float) -> datetime.timedelta:
    """The weight group's NCCL timeout: the sync's budget and a margin, so that the bridge's
    deadline (one sentence) comes before NCCL's watchdog (an abort), and neither is NCCL's
    ten-minute default."""
    return datetime.timedelta(seconds=sync_s + NCCL_MARGIN_S)


def nccl_options(sync_s: float):
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = weights_timeout(sync_s)
    return options


class PeerGone(RuntimeError):
    """A bridge rank's process died while this one waited for it (its link broke)."""


class SyncTimeout(TimeoutError):
    """A weight sync past ``rollout.sync_timeout_s``: its message is the whole sentence."""


def node_name() -> str:
    """This rank's node as the job names it: Slurm's node name, else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def side(rank: int) -> str:
    """Bridge rank ``rank`` by its side: bridge rank 0 is learner 0, bridge rank k rollout rank
    k - 1."""
    return "learner 0" if rank == 0 else f"rollout rank {rank - 1}"


def span(numbers: list[int]) -> str:
    """0-3 for [0, 1, 2, 3]; 0,2 otherwise."""
    if len(numbers) > 1 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return ",".join(map(str, numbers))


def job_store(name: str, timeout: datetime.timedelta) -> dist.Store:
    """A part of the job's own key-value store, at MASTER_ADDR:MASTER_PORT, named ``name`` and
    this start of the job (torchrun's restarts each get a fresh part). Under torchrun its agent
    keeps the store and every rank is a client; otherwise the job's rank 0 (learner 0, whose
    process group already serves on that port) shares its server. (A port of the bridge's own
    could be held by any socket on the machine, a client's included.)"""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    first = not agent and dist.is_initialized() and dist.get_rank() == 0
    store = dist.TCPStore(host, port, is_master=first, timeout=timeout, multi_tenant=True,
                          wait_for_workers=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"megatron_rlep/{name}/{attempt}", store)


class Bridge:
    """Learner 0 (bridge rank 0) and the rollout ranks (1..R): pickled messages point to point
    and bucket broadcasts.

    Liveness is the application's, not the transport's: the links never time out (a gloo
    receive that waits past its group's timeout closes the pair, so a learner silent through a
    long checkpoint save, or a rank with nothing to say, once broke the bridge), and every rank
    says it is alive to its peers every few seconds from a thread of its own. A peer not heard
    from for ``timeout_s`` is gone: ``receive`` and ``check`` say so in one sentence; one whose
    process died breaks its connection at once. Start-up waits at most ``connect_s`` for every
    rank of the bridge, and says so in the log."""

    def __init__(self, rank: int, size: int, timeout_s: float, connect_s: float = 1800.0,
                 sync_s: float = 300.0):
        self.rank, self.size, self.timeout_s, self.sync_s = rank, size, timeout_s, sync_s
        self.beat_s = min(max(timeout_s / 10, 0.2), 10.0)  # between heartbeats
        self.timeout = datetime.timedelta(seconds=connect_s)  # the stores' (start-up) deadline
        self.store = job_store("bridge", self.timeout)
        self.meet(connect_s)
        self.messages = dist.ProcessGroupGloo(dist.PrefixStore("messages", self.store), rank,
                                              size, LINKS)
        if torch.cuda.is_available():
            self.weights = dist.ProcessGroupNCCL(dist.PrefixStore("weights", self.store), rank,
                                                 size, nccl_options(sync_s))
        else:
            self.weights = self.messages
        self.lock = threading.Lock()  # a message's two sends are not split by a heartbeat's
        self.inbox: dict[int, queue.Queue] = {}
        self.heard: dict[int, float] = {}
        self.doing_now: tuple[str, float] | None = None  # this rank's (what, since), ``busy``
        self.said: dict[int, tuple[str, float, float]] = {}  # a peer's (what, for_s, heard)
        self.closed = threading.Event()
        self.threads = [threading.Thread(target=self._beat, daemon=True, name="bridge-heartbeat")]
        for peer in self.peers():  # gloo's receive completes only in wait(): a thread a peer
            self.inbox[peer], self.heard[peer] = queue.Queue(), time.monotonic()
            self.threads.append(threading.Thread(target=self._read, args=(peer,), daemon=True,
                                                 name=f"bridge-from-{peer}"))
        for thread in self.threads:
            thread.start()

    def peers(self) -> list[int]:
        return list(range(1, self.size)) if self.rank == 0 else [0]

    def meet(self, connect_s: float) -> None:
        """Every rank of the bridge present within ``connect_s``, or one sentence. Each says
        where it runs (its node, its rank in the job): learner 0 logs the rollout ranks' nodes
        as they are (torchrun's rendezvous orders nodes by its own rule), and a fault names
        the rank by them (``name``)."""
        who = side(self.rank)
        host = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '29500')}"
        print(f"{who}: waiting up to {connect_s:g} s (rollout.connect_timeout_s) for the "
              f"bridge's {self.size} ranks at {host}", flush=True)
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
        self.store.set(f"present/{self.rank}", json.dumps([node_name(), rank]))
        try:
            self.store.wait([f"present/{r}" for r in range(self.size)],
                            datetime.timedelta(seconds=connect_s))
        except RuntimeError:
            missing = [r for r in range(self.size) if not self.store.check([f"present/{r}"])]
            raise RuntimeError(
                f"{who}: bridge ranks {missing} (0: learner 0, k: rollout rank k - 1) did not "
                f"start within {connect_s:g} s (rollout.connect_timeout_s); their logs say why, "
                "or raise the deadline where a job's nodes start slowly") from None
        self.places = {r: tuple(json.loads(self.store.get(f"present/{r}")))
                       for r in range(self.size)}
        if self.rank == 0:
            print(f"learner 0: the bridge met: {self.layout()}", flush=True)

    def name(self, rank: int) -> str:
        """Bridge rank ``rank`` as a user finds it: "rollout rank 1 (job rank 3 on node2)"."""
        who = side(rank)
        node, job_rank = self.places[rank]
        return f"{who} (job rank {job_rank} on {node})"

    def layout(self) -> str:
        """Where the bridge's ranks run, a node at a time: "learner 0 (job rank 0) on node1;
        rollout ranks 0-1 (job ranks 2-3) on node2"."""
        node, job_rank = self.places[0]
        parts, nodes = [f"learner 0 (job rank {job_rank}) on {node}"], {}
        for rank in range(1, self.size):
            nodes.setdefault(self.places[rank][0], []).append(rank)
        for node, ranks in nodes.items():
            many = "s" if len(ranks) > 1 else ""
            parts.append(f"rollout rank{many} {span([r - 1 for r in ranks])} (job rank{many} "
                         f"{span([self.places[r][1] for r in ranks])}) on {node}")
        return "; ".join(parts)

    def broken(self, wait_s: float = 0.0) -> tuple[int, str] | None:
        """(a peer whose link broke: its process died, why) from the inboxes, waiting up to
        ``wait_s`` for one; None if none."""
        deadline = time.monotonic() + wait_s
        while True:
            for peer in self.peers():
                for message in list(self.inbox[peer].queue):
                    if isinstance(message, Broken):
                        return peer, message.why
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _read(self, peer: int) -> None:
        """Messages from ``peer`` into its inbox (a heartbeat only marks it heard), until a last
        one (``stop``, ``stopped``, ``error``) or a broken connection (then a ``broken``
        message of its own)."""
        while True:
            try:
                size = torch.zeros(1, dtype=torch.int64)
                self.messages.recv([size], peer, SIZE).wait()
                data = torch.empty(int(size.item()), dtype=torch.uint8)
                self.messages.recv([data], peer, DATA).wait()
                message = pickle.loads(data.numpy().tobytes())
            except Exception as err:  # noqa: BLE001 - the peer is gone: said once, in order
                if not self.closed.is_set():
                    self.inbox[peer].put(Broken(f"{type(err).__name__}: {str(err)[:200]}"))
                return
            self.heard[peer] = time.monotonic()
            if isinstance(message, Alive) and message.doing:
                self.said[peer] = (message.doing, message.for_s, self.heard[peer])
                continue
            self.said.pop(peer, None)  # done with it
            if isinstance(message, Alive):
                continue
            self.inbox[peer].put(message)
            if isinstance(message, LAST):
                return

    @contextlib.contextmanager
    def busy(self, what: str):
        """While the block runs, this rank's heartbeats say ``what`` it is doing and for how
        long (a generate call of a whole batch, say), so that a peer whose wait on it ends can
        say why (``doing``)."""
        self.doing_now = (what, time.monotonic())
        try:
            yield
        finally:
            self.doing_now = None

    def doing(self, peer: int) -> str | None:
        """What ``peer``'s last heartbeat said it was doing, and for how long by now ("generating
        the answers of 4 prompts for 312 s"); None when it said nothing."""
        said = self.said.get(peer)
        if said is None:
            return None
        what, for_s, heard = said
        return f"{what} for {for_s + time.monotonic() - heard:.0f} s"

    def _beat(self) -> None:
        """``alive`` to every peer every few seconds (with what this rank is doing, ``busy``),
        until the bridge closes or breaks."""
        while not self.closed.wait(self.beat_s):
            doing = self.doing_now
            alive = Alive(doing[0], time.monotonic() - doing[1]) if doing else Alive()
            try:
                for peer in self.peers():
                    self.send(peer, alive)
            except Exception:  # noqa: BLE001 - a broken link: the reader says it
                return

    def send(self, peer: int, message) -> None:
        data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
        with self.lock:
            self.messages.send([torch.tensor([len(data)], dtype=torch.int64)], peer, SIZE).wait()
            self.messages.send([data], peer, DATA).wait()

    def close(self, wait_s: float = 30.0) -> None:
        """No more heartbeats (after the last message), and the threads awaited (up to
        ``wait_s``) until every peer has closed its end: a thread still in a gloo receive when
        the process exits aborts it ("terminate called without an active exception")."""
        self.closed.set()
        deadline = time.monotonic() + wait_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def ready(self, peer: int) -> bool:
        """Whether a message from ``peer`` is waiting; TimeoutError if it went silent."""
        if self.inbox[peer].empty():
            self.check(peer)
            return False
        return True

    def check(self, peer: int) -> None:
        """TimeoutError where ``peer`` has said nothing, not even a heartbeat, for
        ``timeout_s``: its process hangs with its threads, or its node stalls."""
        silent = time.monotonic() - self.heard[peer]
        if silent > self.timeout_s:
            raise TimeoutError(f"timed out: bridge rank {peer} not heard from in {silent:.0f} s "
                               f"(rollout.timeout_s={self.timeout_s:g}), not even its heartbeat")

    def receive(self, peer: int, timeout_s: float | None = None):
        """The next message from ``peer``; TimeoutError after ``timeout_s`` without one, or as
        soon as the peer has been silent for the bridge's ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return self.inbox[peer].get(timeout=0.1)
            except queue.Empty:
                pass
            self.check(peer)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"timed out: nothing from bridge rank {peer} in {timeout_s:g} s")

    def complete(self, work, deadline: float) -> None:
        """Wait for ``work`` (a broadcast) until ``deadline`` (``time.monotonic``): a peer whose
        process died meanwhile is ``PeerGone``, a deadline passed ``TimeoutError``, each in one
        sentence. It polls: a broadcast's own wait has no deadline but its group's timeout,
        after which NCCL's watchdog aborts the process without a word."""
        while not work.is_completed():
            dead = self.broken()
            if dead is not None:
                raise PeerGone(f"bridge rank {dead[0]}'s link broke during a weight sync "
                               f"({dead[1]})")
            if time.monotonic() > deadline:
                raise SyncTimeout(
                    f"a weight sync did not finish within {self.sync_s:g} s "
                    "(rollout.sync_timeout_s) after every rollout rank was ready for it: a "
                    "rank is stuck in it, or the network is slower than the budget allows for "
                    "the model's bytes; raise rollout.sync_timeout_s, or look at that network")
            time.sleep(0.001)
        work.wait()  # done: its error, if it failed, raised here

    def broadcast_buckets(self, buckets, in_flight: int = 2) -> int:
        """Learner 0: each bucket's names, shapes and dtypes as a message to every rollout rank,
        then its tensors as one flat broadcast; returns the bytes sent. The host waits for the
        broadcast ``in_flight`` buckets back before it copies the next one flat: at most that
        many flat copies exist at once (else learner 0 could hold a second copy of the model).
        Every wait has the sync's deadline, ``rollout.sync_timeout_s`` from now (``complete``);
        the rollout ranks said they were ready first (``Ready``)."""
        deadline = time.monotonic() + self.sync_s
        sent = 0
        cuda = torch.cuda.is_available()
        device = torch.device("cuda") if cuda else torch.device("cpu")
        works: list = []
        for bucket in buckets:
            if len(works) >= in_flight:
                self.complete(works[-in_flight], deadline)
            tensors = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in bucket]
            for peer in range(1, self.size):
                self.send(peer, Bucket(tensors))
            flat = flat_bucket(bucket, device)
            options = dist.BroadcastOptions()
            options.rootRank = 0
            works.append(self.weights.broadcast([flat], options))
            if cuda:  # the current stream waits for it, so ``flat`` lives until it is sent
                works[-1].wait()
            else:  # gloo: the messages' group, one operation at a time
                self.complete(works[-1], deadline)
            sent += flat.numel()
        for work in works[-in_flight:]:
            self.complete(work, deadline)
        for peer in range(1, self.size):
            self.send(peer, BucketsDone())
        return sent

    def receive_buckets(self, timeout_s: float):
        """A rollout rank: the buckets learner 0 broadcasts, one at a time, as the engine's
        ``load_weights`` takes them; each header within ``timeout_s``, the whole sync within
        ``rollout.sync_timeout_s``."""
        deadline = time.monotonic() + self.sync_s
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        while True:
            message = self.receive(0, timeout_s)
            if isinstance(message, BucketsDone):
                return
            if isinstance(message, Broken):
                raise PeerGone(f"learner 0's link broke during a weight sync ({message.why})")
            specs = message.tensors
            sizes = [torch.Size(t.shape).numel() * torch.empty((), dtype=t.dtype).element_size()
                     for t in specs]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
            options = dist.BroadcastOptions()
            options.rootRank = 0
            self.complete(self.weights.broadcast([flat], options), deadline)
            tensors, start = [], 0
            for t, size in zip(specs, sizes):
                tensors.append((t.name, flat[start:start + size].view(t.dtype).reshape(t.shape)))
                start += size
            yield tensors


def flat_bucket(bucket, device: torch.device) -> torch.Tensor:
    """A bucket's tensors as the one flat byte buffer a broadcast sends."""
    return torch.cat([t.detach().reshape(-1).view(torch.uint8) for _, t in bucket]).to(device)
