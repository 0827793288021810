"""Disaggregated placement: some of the job's ranks run the rollout engines all the time, the
others train (``rollout.placement=disaggregated``, ``rollout.ranks``).

Under torchrun or srun every rank starts the same command. ``roles.take_role`` decides as the
process starts, before CUDA does (megatron_rlep/roles.py): the last ``rollout.ranks`` ranks are
rollout ranks (``rollout_rank_main``), each with a GPU of its own, the rest learners, whose
process group, Megatron's and every collective of the trainer's, holds only the learners. The
two sides meet on a *bridge*: a process group of its own (gloo for messages; the job's backend,
NCCL on GPUs, for weights) of learner 0 and the rollout ranks, met through the job's own store
(``job_store``: no port of its own that another program could hold).

* The learner sends prompts (``Flight``s: a stream position, prompt ids, answers wanted) to the
  rollout ranks, a rollout engine's ranks at a time, round-robin; each rollout rank keeps them
  in its own ``RolloutStream`` and sends back every flight that finished, with its tokens'
  versions and behaviour log-probs (``RemoteStream`` is the learner's view).
* After each update the learners export the weights (a bucket at a time, gathered from their
  TP/PP/EP shards by the export's own collectives) and learner 0 broadcasts each bucket to the
  rollout ranks: no file, and never the whole model on one rank. The rollout ranks read them
  between two segments of generation; with partial rollouts their unfinished answers go on under
  the new weights, and vLLM's reload reshards the full tensors for the engine's own TP.
* Validation and the weight-sync probe are requests too.

A rollout rank that dies breaks the bridge and the learner stops in one sentence; one that
hangs is given ``rollout.timeout_s``. Scoring, replay and checkpoints stay on the learners.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import signal
import threading
import time

import torch
import torch.distributed as dist

from megatron_rlep import host_memory
from megatron_rlep.errors import ConfigError, RunError
from megatron_rlep.rollout import messages as m
from megatron_rlep.rollout.stream import Answer, Flight, RolloutStream

SIZE, DATA = 1, 2  # message tags: a length, then its bytes
LINKS = datetime.timedelta(days=7)  # the message links' transport timeout: never the judge


def nccl_options(timeout_s: float):
    """The weight group's options: the run's timeout, not NCCL's ten-minute default, whose
    watchdog would abort the job without the one-sentence error."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=max(timeout_s, 60))
    return options


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

    def __init__(self, rank: int, size: int, timeout_s: float, connect_s: float = 1800.0):
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.timeout = datetime.timedelta(seconds=connect_s)  # the stores' (start-up) deadline
        self.store = job_store("bridge", self.timeout)
        self.meet(connect_s)
        self.messages = dist.ProcessGroupGloo(dist.PrefixStore("messages", self.store), rank,
                                              size, LINKS)
        if torch.cuda.is_available():
            self.weights = dist.ProcessGroupNCCL(dist.PrefixStore("weights", self.store), rank,
                                                 size, nccl_options(timeout_s))
        else:
            self.weights = self.messages
        self.lock = threading.Lock()  # a message's two sends are not split by a heartbeat's
        self.inbox: dict[int, queue.Queue] = {}
        self.heard: dict[int, float] = {}
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
        """Every rank of the bridge present within ``connect_s``, or one sentence."""
        who = "learner 0" if self.rank == 0 else f"rollout rank {self.rank - 1}"
        host = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '29500')}"
        print(f"{who}: waiting up to {connect_s:g} s (rollout.connect_timeout_s) for the "
              f"bridge's {self.size} ranks at {host}", flush=True)
        self.store.set(f"present/{self.rank}", "1")
        try:
            self.store.wait([f"present/{r}" for r in range(self.size)],
                            datetime.timedelta(seconds=connect_s))
        except RuntimeError:
            missing = [r for r in range(self.size) if not self.store.check([f"present/{r}"])]
            raise RuntimeError(
                f"{who}: bridge ranks {missing} (0: learner 0, k: rollout rank k - 1) did not "
                f"start within {connect_s:g} s (rollout.connect_timeout_s); their logs say why, "
                "or raise the deadline where a job's nodes start slowly") from None

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
                    self.inbox[peer].put(m.Broken(f"{type(err).__name__}: {str(err)[:200]}"))
                return
            self.heard[peer] = time.monotonic()
            if isinstance(message, m.Alive):
                continue
            self.inbox[peer].put(message)
            if isinstance(message, m.LAST):
                return

    def _beat(self) -> None:
        """``alive`` to every peer every few seconds, until the bridge closes or breaks."""
        every = min(max(self.timeout_s / 10, 0.2), 10.0)
        while not self.closed.wait(every):
            try:
                for peer in self.peers():
                    self.send(peer, m.Alive())
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
                raise TimeoutError(f"nothing from bridge rank {peer} in {timeout_s:g} s")

    def broadcast_buckets(self, buckets, in_flight: int = 2) -> int:
        """Learner 0: each bucket's names, shapes and dtypes as a message to every rollout rank,
        then its tensors as one flat broadcast; returns the bytes sent. On a GPU a broadcast's
        ``wait`` holds the stream, not the host, so the host waits for the broadcast
        ``in_flight`` buckets back before it copies the next one flat: at most that many flat
        copies exist at once (else learner 0 could hold a second copy of the model)."""
        sent = 0
        cuda = torch.cuda.is_available()
        device = torch.device("cuda") if cuda else torch.device("cpu")
        done: list = []  # per bucket sent, an event the host can wait on (GPU)
        for bucket in buckets:
            if cuda and len(done) >= in_flight:
                done[-in_flight].synchronize()
            header = [(name, tuple(t.shape), t.dtype) for name, t in bucket]
            for peer in range(1, self.size):
                self.send(peer, m.Bucket(header))
            flat = flat_bucket(bucket, device)
            options = dist.BroadcastOptions()
            options.rootRank = 0
            self.weights.broadcast([flat], options).wait()
            if cuda:
                done.append(torch.cuda.Event())
                done[-1].record()
            sent += flat.numel()
        for peer in range(1, self.size):
            self.send(peer, m.BucketsDone())
        return sent

    def receive_buckets(self, timeout_s: float):
        """A rollout rank: the buckets learner 0 broadcasts, one at a time, as the engine's
        ``load_weights`` takes them."""
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        while True:
            message = self.receive(0, timeout_s)
            if isinstance(message, m.BucketsDone):
                return
            header = message.header
            sizes = [torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                     for _, shape, dtype in header]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
            options = dist.BroadcastOptions()
            options.rootRank = 0
            self.weights.broadcast([flat], options).wait()
            tensors, start = [], 0
            for (name, shape, dtype), size in zip(header, sizes):
                tensors.append((name, flat[start:start + size].view(dtype).reshape(shape)))
                start += size
            yield tensors


def flat_bucket(bucket, device: torch.device) -> torch.Tensor:
    """A bucket's tensors as the one flat byte buffer a broadcast sends."""
    return torch.cat([t.detach().reshape(-1).view(torch.uint8) for _, t in bucket]).to(device)


def learner_bridge(cfg, learner: int):
    """Learner 0's end of the bridge (None on the other learners)."""
    r = cfg.rollout
    return Bridge(0, 1 + r.ranks, r.timeout_s, r.connect_timeout_s) if learner == 0 else None


def engines(cfg) -> list[list[int]]:
    """The rollout engines as lists of bridge ranks (an engine of rollout.tensor_parallel
    ranks; the first reports for it)."""
    tp, ranks = cfg.rollout.tensor_parallel, cfg.rollout.ranks

    if ranks % tp:
        raise ConfigError(f"config key rollout.ranks={ranks} is not a multiple of "
                          f"rollout.tensor_parallel={tp}: each engine takes that many ranks")
    return [list(range(1 + e * tp, 1 + (e + 1) * tp)) for e in range(ranks // tp)]


class RemoteStream(RolloutStream):
    """The learners' view of the rollout ranks' streams: flights are sent out (learner 0, round
    robin over the engines) and come back finished; every learner holds the same flights,
    learner 0 passing on what arrives. ``advance`` waits for the next finished flights, at
    most ``timeout_s``."""

    def __init__(self, bridge, engine_ranks: list[list[int]], max_staleness: int,
                 timeout_s: float):
        super().__init__(None, 0, 0, max_staleness)
        self.bridge, self.engine_ranks, self.timeout_s = bridge, engine_ranks, timeout_s
        self.turn = 0
        self.idle = 0.0  # seconds the learners waited on the rollout ranks
        self.stashed: list = []  # finished flights that came while a reply was awaited
        self.rollout_idle = 0.0  # seconds the rollout ranks waited (the engines' reports)
        self.waited = 0.0
        self.reported: dict[int, dict] = {}  # each engine's memory, as it last reported it
        self.failed = ""  # a send to a rollout rank that failed, said at the next wait

    def dispatch(self, flights: list[Flight], version: int) -> None:
        super().dispatch(flights, version)
        self._send([(f.position, f.prompt_ids, f.count) for f in flights])

    def started(self, flight: Flight) -> int | None:
        """The rollout ranks report no partial progress: a flight sent out counts as started
        at the version it was sent (its tokens can be no older)."""
        return flight.oldest() if flight.answers else flight.dispatched

    def restart(self, flight: Flight, version: int) -> None:
        super().restart(flight, version)
        self._send([(flight.position, flight.prompt_ids, flight.count)])

    def _send(self, work: list) -> None:
        """Learner 0 sends; a failure is kept and said by the next wait, on every learner at
        once (the learners must leave together)."""
        if self.bridge is None or not work:
            return
        for i, item in enumerate(work):  # spread over the engines, to each one's reader
            rank = self.engine_ranks[(self.turn + i) % len(self.engine_ranks)][0]
            try:
                self.bridge.send(rank, m.Work([item]))
            except RuntimeError as err:
                self.failed = self.failed or gone(rank, err)
        self.turn += len(work)

    def advance(self, version: int, seed: int) -> int:
        """The flights that finished since, from every engine (waits for the first)."""
        start = time.monotonic()
        self.waited = 0.0
        landed, waited = self._from_learner0(lambda: (self._landed(), self.waited))
        self.idle += time.monotonic() - start
        self.rollout_idle += waited
        by_position = {f.position: f for f in self.flights}
        tokens = 0
        for position, answers in landed:
            flight = by_position.get(position)
            if flight is not None and not flight.done:
                flight.answers = [Answer(list(ids), list(lp), list(v), fin, True, list(mask),
                                         list(calls))
                                  for ids, lp, v, fin, mask, calls in answers]
                tokens += sum(len(a.token_ids) for a in flight.answers)
        return tokens

    def _landed(self) -> list:
        if self.failed:
            raise RolloutRankError(self.failed)
        deadline = time.monotonic() + self.timeout_s
        landed, self.stashed = self.stashed, []
        while not landed:
            for engine in self.engine_ranks:
                for rank in engine[1:]:  # the engine's other ranks say only alive, or a failure
                    if self._alive(rank) and self.bridge.ready(rank):
                        self._message(rank)
                while self._alive(engine[0]) and self.bridge.ready(engine[0]):
                    message = self._message(engine[0])
                    landed += message.flights
                    self._count(engine[0], message)
            if not landed:
                if time.monotonic() > deadline:
                    raise RolloutRankError(
                        f"the rollout ranks sent nothing for {self.timeout_s:g} s "
                        "(rollout.timeout_s): one hung or died; its log says which")
                time.sleep(0.002)
        return landed

    def _alive(self, rank: int) -> bool:
        """True, or the rank's silence (no heartbeat for rollout.timeout_s) in one sentence."""
        try:
            self.bridge.check(rank)
        except TimeoutError as err:
            raise RolloutRankError(gone(rank, err)) from None
        return True

    def _message(self, rank: int, timeout_s: float | None = None) -> tuple:
        """The next message from bridge rank ``rank``; its failure raised."""
        message = self.bridge.receive(rank, timeout_s)
        if isinstance(message, m.Failed):
            raise RolloutRankError(f"rollout rank {rank} failed: {message.why}")
        if isinstance(message, m.Broken):
            raise RolloutRankError(gone(rank, message.why))
        return message

    def _reply(self, rank: int):
        """The reply awaited from ``rank``; finished flights that come first are kept."""
        while True:
            message = self._message(rank, self.timeout_s)
            if not isinstance(message, m.Landed):
                return message
            self.stashed += message.flights
            self._count(rank, message)

    def _count(self, rank: int, landed: m.Landed) -> None:
        """A ``Landed`` message's report: the engine's wait, and its memory where it sent it."""
        self.waited += landed.idle / len(self.engine_ranks)
        if landed.memory:
            self.reported[rank] = landed.memory

    def memory(self) -> dict[str, float]:
        """The rollout ranks' memory as last reported (``host_memory.metrics`` of each
        engine's first rank after it loaded weights), summed over the engines."""
        out: dict[str, float] = {}
        for report in self.reported.values():
            for key, value in report.items():
                out[key] = out.get(key, 0.0) + value
        return out

    def probe(self, ids):
        """Engine 0's log-probs of ``ids`` (the weight-sync check), on every learner."""
        def ask():
            self.bridge.send(self.engine_ranks[0][0], m.Probe(tuple(ids)))
            return self._reply(self.engine_ranks[0][0]).logprobs
        return self._from_learner0(ask)

    def sample(self, prompts, counts, seed, **sampling) -> list:
        """Validation's answers, split over the engines as ``generate_sharded`` splits them."""
        def ask():
            shares = [list(range(e, len(prompts), len(self.engine_ranks)))
                      for e in range(len(self.engine_ranks))]
            for engine, mine in zip(self.engine_ranks, shares):
                self.bridge.send(engine[0], m.Generate([prompts[i] for i in mine],
                                                       [counts[i] for i in mine], mine, seed,
                                                       sampling))
            out = [None] * len(prompts)
            for engine, mine in zip(self.engine_ranks, shares):
                for i, completions in zip(mine, self._reply(engine[0]).completions):
                    out[i] = completions
            return out
        return self._from_learner0(ask)

    def weights(self, version: int, export) -> None:
        """Learner 0 broadcasts the export's buckets to the rollout ranks (``export(consume)``,
        ``Actor.export_hf``: every learner runs the whole export, its collectives); a broken
        bridge stops them all in one sentence."""
        def broadcast(buckets):
            try:
                for engine in self.engine_ranks:
                    self.bridge.send(engine[0], m.Weights(version))
                self.bridge.broadcast_buckets(buckets)
            except RuntimeError as err:
                self.failed = gone(0, err)

        export(broadcast if self.bridge is not None and not self.failed else None)

        def verdict():
            if self.failed:
                raise RolloutRankError(self.failed)
        self._from_learner0(verdict)

    def stop(self) -> None:
        """The rollout ranks told to stop, and their goodbyes awaited (a few seconds at most),
        so that no receive is left open when the processes end."""
        if self.bridge is None:
            return
        for engine in self.engine_ranks:  # its reader passes it on to the engine's other ranks
            try:
                self.bridge.send(engine[0], m.Stop())
                while not isinstance(self.bridge.receive(engine[0], 30),
                                     (m.Stopped, m.Failed, m.Broken)):
                    pass
            except (RuntimeError, TimeoutError):
                pass  # a rank that is gone already
        self.bridge.close()

    def _from_learner0(self, work):
        """``work()`` on learner 0, its result (or its failure, in one sentence) on every
        learner."""
        box = [None]
        if self.bridge is not None:
            try:
                box[0] = ("ok", work())
            except (RolloutRankError, RuntimeError, TimeoutError) as err:
                box[0] = ("error", str(err) if isinstance(err, RolloutRankError) else
                          f"the bridge to the rollout ranks broke ({type(err).__name__}: "
                          f"{str(err)[:200]}): a rollout rank died; its log says why")
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise RunError(value)
        return value


class RolloutRankError(RuntimeError):
    pass


def gone(rank: int, why) -> str:
    """One sentence for a rollout rank that died (the bridge broke) or hung (it timed out)."""
    who = f"rollout rank {rank}" if rank else "a rollout rank"
    if "timeout" in str(why).lower() or "timed out" in str(why).lower():
        return (f"{who} stopped answering: the bridge to it timed out ({str(why)[:200]}); it "
                "hung or its node stalls; its log says what it was doing")
    return f"{who} is gone: the bridge to it broke ({str(why)[:200]}); its log says why"


def rollout_rank_main(cfg, index: int, learners: int) -> None:
    """A rollout rank: its engine, its stream of flights, and the learner's requests, until
    told to stop. A failure is sent to learner 0 in one line before this rank exits."""
    r = cfg.rollout
    if torch.cuda.is_available():  # its one visible device (roles.own_device), taken before
        torch.cuda.set_device(0)  # the bridge's NCCL group and the engine use one
    bridge = Bridge(1 + index, 1 + r.ranks, r.timeout_s, r.connect_timeout_s)

    def stopped(signum, frame):
        """SIGTERM from the launcher (torchrun stops a node's other ranks when one dies, Slurm
        when the job ends): learner 0 told why before this rank goes, or the job could end
        with no sentence at all."""
        try:
            bridge.send(0, m.Failed(f"rollout rank {index} was stopped by "
                                    f"{signal.Signals(signum).name} from its launcher: a rank "
                                    "beside it died, or the job is being cancelled"))
        finally:
            os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)
    try:
        RolloutRank(cfg, index, bridge).run()
    except Exception as err:  # noqa: BLE001 - told to the learner in one line
        try:
            bridge.send(0, m.Failed(f"{type(err).__name__}: {str(err)[:300]}"))
            bridge.receive(0, 60)  # the learner's stop: it ends the run in its own words first
        finally:
            raise


class RolloutRank:
    """One rank of a rollout engine: the engine, its own ``RolloutStream`` of flights, and the
    learner's messages, which the engine's first rank (its *reader*) takes from the bridge and
    passes to the engine's other ranks. Between messages it samples a segment of every answer
    in flight and sends back what finished."""

    def __init__(self, cfg, index: int, bridge: Bridge):
        from megatron_rlep.builtin_model import resolve_model_path
        from megatron_rlep.platform import compute_dtype
        from megatron_rlep.rollout import engine_length, make_engine

        self.cfg, self.index, self.bridge = cfg, index, bridge
        r = self.r = cfg.rollout
        self.peers = self._engine_group() if r.tensor_parallel > 1 else None
        self.engine = make_engine(r, resolve_model_path(cfg.model.path),
                                  compute_dtype(cfg.model.dtype), cfg.seed, engine_length(cfg),
                                  dedicated=True, sandbox=cfg.sandbox)
        self.reader = index % r.tensor_parallel == 0  # it alone reads the bridge and reports
        self.stream = RolloutStream(self._generate, r.segment_tokens if r.partial else
                                    r.max_response_length, r.max_response_length,
                                    cfg.algorithm.max_staleness, self._turns())
        self.version = 0
        self.idle = 0.0  # seconds without work or loading weights since the last report
        # host_memory.metrics once the engine is up and after each load of weights (tcmalloc's
        # free pages settled after the first ones): sent with the next finished flights
        self.settle_pages = host_memory.FreePageSettle("perf/rollout_")
        self.memory = host_memory.metrics("perf/rollout_") if self.reader else {}

    def _engine_group(self) -> tuple:
        """(this engine's process group, its reader's rank in the rollout ranks' world): the
        rollout ranks' world first (vLLM's launcher reads RANK and WORLD_SIZE), then a group per
        engine, each made by every rank."""
        r, index = self.r, self.index
        os.environ.update(RANK=str(index), WORLD_SIZE=str(r.ranks))
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl",
                                store=job_store("rollout", self.bridge.timeout), rank=index,
                                world_size=r.ranks)
        first, mine = index - index % r.tensor_parallel, None
        for start in range(0, r.ranks, r.tensor_parallel):
            group = dist.new_group(list(range(start, start + r.tensor_parallel)), backend="gloo")
            if start == first:
                mine = (group, first)
        return mine

    def _turns(self):
        """Tools in the loop (``rollout/tools.py``): this engine runs its answers' calls."""
        if not self.r.tools:
            return None
        from megatron_rlep.rollout.tools import Turns, text_codec

        return Turns(self.engine.toolbox, *text_codec(self.engine.tokenizer), self.r.max_turns)

    def _generate(self, prompts, counts, seeds, max_tokens):
        r = self.r
        stop = {"stop": self.stream.turns.stop} if self.stream.turns is not None else {}
        return self.engine.generate(prompts, counts, seed=seeds, temperature=r.temperature,
                                    top_p=r.top_p, max_tokens=max_tokens, **stop)

    def next_message(self, busy: bool):
        """The learner's next message for this engine, or None to go on sampling: its reader
        takes it from the bridge (waiting when there is nothing to sample) and passes it to the
        engine's other ranks, so that every rank of one engine does the same things in the same
        order (each reading the bridge on its own, a message could land between one rank's
        segment and another's)."""
        message = None
        if self.reader and (not busy or self.bridge.ready(0)):
            message = self.bridge.receive(0, None)
        if self.peers is not None:
            box = [message]
            dist.broadcast_object_list(box, src=self.peers[1], group=self.peers[0])
            message = box[0]
        return message

    def run(self) -> None:
        while True:
            start = time.monotonic()
            message = self.next_message(bool(self.stream.pending()))
            if isinstance(message, m.Stop):
                self.engine.close()  # now, not when a sweep's later job collects it
                self.say(m.Stopped())
                self.bridge.close(wait_s=0)  # the process ends at once (train.main)
                return
            if message is None:
                self.sample()
                continue
            self.handle(message)
            if isinstance(message, (m.Work, m.Weights)):
                self.idle += time.monotonic() - start

    def say(self, message) -> None:
        """To learner 0, by the engine's reader only."""
        if self.reader:
            self.bridge.send(0, message)

    def handle(self, message) -> None:
        r, engine = self.r, self.engine
        if isinstance(message, m.Broken):
            raise RolloutRankError(f"the bridge to learner 0 broke ({message.why})")
        if isinstance(message, m.Work):
            self.stream.dispatch([Flight(p, ids, n) for p, ids, n in message.flights],
                                 self.version)
        elif isinstance(message, m.Weights):
            self.version = message.version
            engine.load_weights(self.bridge.receive_buckets(r.timeout_s),
                                keep_cache=r.partial_kv == "keep")
            # One write with its newline: the ranks share the launcher's stdout.
            print(f"rollout rank {self.index}: weights of version {self.version} loaded; "
                  f"{len(self.stream.flights)} prompts in flight, positions "
                  f"{sorted(f.position for f in self.stream.flights)[:8]}\n", end="", flush=True)
            released = self.settle_pages()
            self.memory = {**released, **host_memory.metrics("perf/rollout_")} \
                if self.reader else {}
        elif isinstance(message, m.Generate):
            from megatron_rlep.rollout.base import request_seed

            if r.partial_kv == "keep":
                engine.clear_cache()  # validated by the current weights alone
            self.say(m.Generated(engine.generate(
                message.prompts, message.counts,
                seed=[request_seed(message.seed, i) for i in message.places], **message.sampling)))
        elif isinstance(message, m.Probe):
            self.say(m.Probed(engine.sequence_logprobs(message.ids)))

    def sample(self) -> None:
        """A segment of every answer in flight; what finished goes to learner 0."""
        self.stream.advance(self.version, self.cfg.seed)
        landed = self.stream.take(len(self.stream.flights), self.version)
        if landed and self.reader:
            self.say(m.Landed([(f.position, [(a.token_ids, a.logprobs, a.versions, a.finished,
                                              a.mask, a.calls)
                                             for a in f.answers]) for f in landed],
                              self.idle, self.memory))
            self.idle, self.memory = 0.0, {}
