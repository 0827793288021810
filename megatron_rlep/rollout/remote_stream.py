"""The learners' side of a disaggregated job: ``RemoteStream``, the rollout ranks' streams as
the learners see them, and learner 0's end of the bridge (``rollout/bridge.py``).

* Learner 0 sends prompts (``Work``: a stream position, prompt ids, answers wanted) to the
  rollout ranks, an engine's ranks at a time, round-robin; each rollout rank keeps them in its
  own ``RolloutStream`` (``rollout_rank.py``) and sends back every flight that finished, with its
  tokens' versions and behaviour log-probs. Every learner holds the same flights.
* After each update the learners export the weights (a bucket at a time, gathered from their
  TP/PP/EP shards by the export's own collectives) and learner 0 broadcasts each bucket to the
  rollout ranks; with partial rollouts their unfinished answers go on under the new weights,
  and vLLM's reload reshards the full tensors for the engine's own TP.
* Validation and the weight-sync probe are requests too.

A rollout rank that dies breaks the bridge and the learners stop in one sentence; one that
hangs is given ``rollout.timeout_s``. Scoring, replay and checkpoints stay on the learners.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch.distributed as dist

from megatron_rlep.errors import RunError, SaidElsewhere
from megatron_rlep.rollout.bridge import Bridge, SyncTimeout
from megatron_rlep.rollout.messages import (Broken, Failed, Generate, Landed, Probe, Prompt, Ready,
                                            Stop, Stopped, Weights, Work)
from megatron_rlep.rollout.stream import Flight, RolloutStream


def learner_bridge(cfg, learner: int):
    """Learner 0's end of the bridge (None on the other learners)."""
    r = cfg.rollout
    return Bridge(0, 1 + r.ranks, r.timeout_s, r.connect_timeout_s,
                  r.sync_timeout_s) if learner == 0 else None


def engines(cfg) -> list[list[int]]:
    """The rollout engines as lists of bridge ranks (an engine of rollout.tensor_parallel
    ranks, a whole number of them: ``Config.check``; the first reports for it)."""
    tp, ranks = cfg.rollout.tensor_parallel, cfg.rollout.ranks
    return [list(range(1 + e * tp, 1 + (e + 1) * tp)) for e in range(ranks // tp)]


class RemoteStream(RolloutStream):
    """The learners' view of the rollout ranks' streams: flights are sent out (learner 0, round
    robin over the engines) and come back finished; every learner holds the same flights,
    learner 0 passing on what arrives. ``advance`` waits for the next finished flights, at
    most ``timeout_s``."""

    def __init__(self, bridge, engine_ranks: list[list[int]], max_staleness: int,
                 timeout_s: float, start_s: float = 0.0):
        super().__init__(None, 0, 0, max_staleness)
        self.bridge, self.engine_ranks, self.timeout_s = bridge, engine_ranks, timeout_s
        # until the rollout ranks' first word their engines may still be starting: a wait on
        # them then has the start-up's deadline (rollout.connect_timeout_s), after it
        # rollout.timeout_s
        self.start_s, self.answered = max(start_s, timeout_s), False
        self.turn = 0
        self.idle = 0.0  # seconds the learners waited on the rollout ranks
        self.stashed: list = []  # finished flights that came while a reply was awaited
        self.rollout_idle = 0.0  # seconds the rollout ranks waited (the engines' reports)
        self.waited = 0.0
        self.reported: dict[int, dict] = {}  # each engine's memory, as it last reported it
        self.failed = ""  # a send to a rollout rank that failed, said at the next wait

    def dispatch(self, flights: list[Flight], version: int) -> None:
        super().dispatch(flights, version)
        self._send([Prompt(f.position, f.prompt_ids, f.count) for f in flights])

    def started(self, flight: Flight) -> int | None:
        """The rollout ranks report no partial progress: a flight sent out counts as started
        at the version it was sent (its tokens can be no older)."""
        return flight.oldest() if flight.answers else flight.dispatched

    def restart(self, flight: Flight, version: int) -> None:
        super().restart(flight, version)
        self._send([Prompt(flight.position, flight.prompt_ids, flight.count)])

    def _send(self, prompts: list) -> None:
        """Learner 0 sends; a failure is kept and said by the next wait, on every learner at
        once (the learners must leave together)."""
        if self.bridge is None or not prompts:
            return
        for i, prompt in enumerate(prompts):  # spread over the engines, to each one's reader
            rank = self.engine_ranks[(self.turn + i) % len(self.engine_ranks)][0]
            try:
                self.bridge.send(rank, Work([prompt]))
            except RuntimeError as err:
                self.failed = self.failed or self._fault(rank, err)
        self.turn += len(prompts)

    def advance(self, version: int, seed: int) -> int:
        """The flights that finished since, from every engine (waits for the first)."""
        start = time.monotonic()
        self.waited = 0.0
        landed, waited = self._from_learner0(lambda: (self._landed(), self.waited))
        self.idle += time.monotonic() - start
        self.rollout_idle += waited
        by_position = {f.position: f for f in self.flights}
        tokens = 0
        for finished in landed:
            flight = by_position.get(finished.position)
            if flight is not None and not flight.done:
                flight.answers = [replace(a, done=True) for a in finished.answers]
                tokens += sum(len(a.token_ids) for a in flight.answers)
        return tokens

    def _landed(self) -> list:
        if self.failed:
            raise RolloutRankError(self.failed)
        limit, key = self._limit()
        deadline = time.monotonic() + limit
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
                    busy = [said for e in self.engine_ranks if (said := self._busy(e[0]))]
                    raise RolloutRankError(busy[0] if busy else (
                        f"the rollout ranks sent nothing for {limit:g} s ({key}): one hung or "
                        "died; its log says which"))
                time.sleep(0.002)
        return landed

    def _alive(self, rank: int) -> bool:
        """True, or the rank's silence (no heartbeat for rollout.timeout_s) in one sentence."""
        try:
            self.bridge.check(rank)
        except TimeoutError as err:
            raise RolloutRankError(self._fault(rank, err)) from None
        return True

    def _message(self, rank: int, timeout_s: float | None = None) -> tuple:
        """The next message from bridge rank ``rank``; its failure raised."""
        message = self.bridge.receive(rank, timeout_s)
        if isinstance(message, (Failed, Broken)):
            raise RolloutRankError(self._fault(rank, message))
        self.answered = True
        return message

    def _limit(self) -> tuple[float, str]:
        """The longest a wait on the rollout ranks may last now, and its config key."""
        if self.answered:
            return self.timeout_s, "rollout.timeout_s"
        return self.start_s, "rollout.connect_timeout_s, as their engines start"

    def _fault(self, rank: int, why) -> str:
        """One sentence for bridge rank ``rank``'s fault (``why``: its ``Failed`` or ``Broken``
        message, or an error; ``rank`` 0: not known, as when a broadcast to them all broke),
        naming the rank as the job does. A rank whose process died is the cause wherever it is:
        its link breaks at once, while a peer of its engine may report the broken collective
        first, or a broadcast break before the link's reader says which rank's it was (a second
        of grace for that)."""
        dead = self.bridge.broken(wait_s=1.0 if isinstance(why, Failed) or not rank else 0.0)
        if dead is not None:
            rank, why = dead[0], Broken(dead[1])
        if isinstance(why, Failed):
            return f"{self.bridge.name(rank)} failed: {why.why}"
        if isinstance(why, TimeoutError) and rank and (busy := self._busy(rank)):
            return busy
        return gone(self.bridge.name(rank) if rank else "a rollout rank",
                    why.why if isinstance(why, Broken) else why)

    def _busy(self, rank: int) -> str | None:
        """One sentence for bridge rank ``rank`` alive but busy past the wait on it (what its
        heartbeats said, ``Bridge.busy``: a batch's generate call, say); None if it said
        nothing."""
        doing = self.bridge.doing(rank)
        if doing is None:
            return None
        limit, key = self._limit()
        return (f"{self.bridge.name(rank)} has been {doing}, past the wait on it, {limit:g} s "
                f"({key}): raise that above a batch's time (docs/cluster.md, sizing), or set "
                "rollout.partial=true, whose segments of rollout.segment_tokens answer between "
                "them")

    def _reply(self, rank: int):
        """The reply awaited from ``rank``; finished flights that come first are kept."""
        while True:
            message = self._message(rank, self._limit()[0])
            if not isinstance(message, Landed):
                return message
            self.stashed += message.flights
            self._count(rank, message)

    def _count(self, rank: int, landed: Landed) -> None:
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
            self.bridge.send(self.engine_ranks[0][0], Probe(tuple(ids)))
            return self._reply(self.engine_ranks[0][0]).logprobs
        return self._from_learner0(ask)

    def sample(self, prompts, counts, seed, **sampling) -> list:
        """Validation's answers, split over the engines as ``generate_sharded`` splits them."""
        def ask():
            shares = [list(range(e, len(prompts), len(self.engine_ranks)))
                      for e in range(len(self.engine_ranks))]
            for engine, mine in zip(self.engine_ranks, shares):
                self.bridge.send(engine[0], Generate([prompts[i] for i in mine],
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
        ``Actor.export_hf``: every learner runs the whole export, its collectives) once every
        rollout rank said it is ready (``Ready``: a rank busy generating says so when its
        generate call returns; meanwhile learner 0 waits on the bridge, with its heartbeats and
        ``rollout.timeout_s``, not in a broadcast); a broken bridge, or a sync past
        ``rollout.sync_timeout_s``, stops them all in one sentence."""
        def broadcast(buckets):
            try:
                for engine in self.engine_ranks:
                    self.bridge.send(engine[0], Weights(version))
                for rank in (r for engine in self.engine_ranks for r in engine):
                    try:
                        ready = self._reply(rank)
                    except TimeoutError as err:
                        raise RolloutRankError(self._fault(rank, err)) from None
                    if not isinstance(ready, Ready):
                        raise RolloutRankError(f"{self.bridge.name(rank)} answered the weights "
                                               f"of version {version} with {ready}")
                self.bridge.broadcast_buckets(buckets)
            except SyncTimeout as err:
                self.failed = str(err)
            except (RuntimeError, TimeoutError) as err:  # a dead rank named (``_fault``)
                self.failed = str(err) if isinstance(err, RolloutRankError) else \
                    self._fault(0, err)

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
                self.bridge.send(engine[0], Stop())
                while not isinstance(self.bridge.receive(engine[0], 30),
                                     (Stopped, Failed, Broken)):
                    pass
            except (RuntimeError, TimeoutError):
                pass  # a rank that is gone already
        self.bridge.close()

    def _from_learner0(self, work):
        """``work()`` on learner 0, its result on every learner; its failure in one sentence,
        said by learner 0 alone (the other learners exit quietly: ``SaidElsewhere``)."""
        box = [None]
        if self.bridge is not None:
            try:
                box[0] = ("ok", work())
            except RolloutRankError as err:
                box[0] = ("error", str(err))
            except (RuntimeError, TimeoutError) as err:
                box[0] = ("error", self._fault(0, err))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise RunError(value) if self.bridge is not None else SaidElsewhere(value)
        return value


class RolloutRankError(RuntimeError):
    pass


def gone(who: str, why) -> str:
    """One sentence for a rollout rank (``who``) that died (the bridge broke) or hung (it timed
    out)."""
    if "timeout" in str(why).lower() or "timed out" in str(why).lower():
        return (f"{who} stopped answering: the bridge to it timed out ({str(why)[:200]}); it "
                "hung or its node stalls; its log says what it was doing")
    return f"{who} is gone: the bridge to it broke ({str(why)[:200]}); its log says why"
