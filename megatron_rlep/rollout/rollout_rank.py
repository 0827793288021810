"""A rollout rank of a disaggregated job: its engine, its own ``RolloutStream`` of the prompts
learner 0 sends, and learner 0's requests (weights, validation, the probe), over the bridge
(``rollout/bridge.py``), until told to stop. megatron_rlep/roles.py makes a rank one, and gives
it a GPU of its own, as its process starts.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import host_memory
from megatron_rlep.rollout.bridge import Bridge, PeerGone, job_store
from megatron_rlep.rollout.messages import (Broken, Failed, Finished, Generate, Generated, Idle,
                                            Landed, Probe, Probed, Ready, Stop, Stopped, Weights,
                                            Work)
from megatron_rlep.rollout.remote_stream import RolloutRankError
from megatron_rlep.rollout.stream import Flight, RolloutStream


def rollout_rank_main(cfg, index: int, learners: int) -> None:
    """A rollout rank: its engine, its stream of flights, and the learner's requests, until
    told to stop. Its failure goes to learner 0 in one line, which says it for the job (naming
    this rank as the job does, ``Bridge.name``), and its traceback to a file in the run
    directory; then this rank exits quietly, as it does when learner 0's side broke (learner 0,
    or the launcher of its node, says why)."""
    r = cfg.rollout
    if torch.cuda.is_available():  # its one visible device (roles.own_device), taken before
        torch.cuda.set_device(0)  # the bridge's NCCL group and the engine use one
    bridge = Bridge(1 + index, 1 + r.ranks, r.timeout_s, r.connect_timeout_s, r.sync_timeout_s)

    def stopped(signum, frame):
        """SIGTERM (a preemption, a requeue, a cancelled job; torchrun's, when a rank beside it
        died): this rank goes on serving the learners, which finish their step, checkpoint and
        tell it to stop (``Stop``), as a colocated job's ranks do. A dead rank is said by
        learner 0; a launcher that will not wait kills this one (torchrun: 30 s later)."""
        os.write(1, f"rollout rank {index}: received {signal.Signals(signum).name}: serving the "
                    "learners until they checkpoint and stop it\n".encode())
    signal.signal(signal.SIGTERM, stopped)
    try:
        RolloutRank(cfg, index, bridge).run()
    except (RolloutRankError, PeerGone):  # learner 0's side broke: said there
        quit_quietly()
    except Exception as err:  # noqa: BLE001 - told to the learner in one line
        where = Path(cfg.run_dir) / f"rollout-rank-{index}.traceback"
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(traceback.format_exc())
            said = f" (traceback: {where})"
        except OSError:
            said = ""
            traceback.print_exc()
        try:
            bridge.send(0, Failed(f"{type(err).__name__}: {str(err)[:300]}{said}"))
            bridge.receive(0, 60)  # the learner's stop: it ends the run in its own words first
        except Exception:  # noqa: BLE001 - learner 0 gone: its node says why
            pass
        quit_quietly()


def quit_quietly() -> None:
    """Exit status 1 with nothing more said; the bridge's links go with the process (gloo's
    destructors at the interpreter's exit call std::terminate while a peer's heartbeats come)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


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
                                  dedicated=True, sandbox=cfg.sandbox,
                                  routes=cfg.actor.routing_replay == "rollout")
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
        # liveness: a rank that hears nothing from its engine's reader for rollout.timeout_s
        # (torch's default is 30 minutes) is told so by their group; the reader speaks at least
        # every heartbeat (``next_message``), so a long silence of learner 0's breaks nothing.
        # The world's collectives (vLLM's) include the engines' start-ups, which may differ by
        # as much as the ranks' own starts: rollout.connect_timeout_s
        timeout = datetime.timedelta(seconds=r.timeout_s)
        os.environ.update(RANK=str(index), WORLD_SIZE=str(r.ranks))
        dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl",
                                store=job_store("rollout", self.bridge.timeout), rank=index,
                                world_size=r.ranks, timeout=self.bridge.timeout)
        first, mine = index - index % r.tensor_parallel, None
        for start in range(0, r.ranks, r.tensor_parallel):
            group = dist.new_group(list(range(start, start + r.tensor_parallel)), backend="gloo",
                                   timeout=timeout)
            if start == first:
                mine = (group, first)
        return mine

    def _turns(self):
        """Tools in the loop (``rollout/tools.py``): this engine runs its answers' calls."""
        if not self.r.tools:
            return None
        from megatron_rlep.rollout.tools import Turns

        return Turns(self.engine.toolbox, self.engine.format, self.r.max_turns)

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
        segment and another's). With other ranks, the reader waits a heartbeat's time at most
        (``Idle`` then): they hear from it that often, however long learner 0 is silent."""
        message = None
        if self.reader and (not busy or self.bridge.ready(0)):
            message = self.bridge.receive(0, None) if self.peers is None else self._within_beat()
        if self.peers is not None:
            box = [message]
            dist.broadcast_object_list(box, src=self.peers[1], group=self.peers[0])
            message = box[0]
        return message

    def _within_beat(self):
        """Learner 0's next message, or ``Idle`` after a heartbeat's time without one."""
        deadline = time.monotonic() + self.bridge.beat_s
        while not self.bridge.ready(0):
            if time.monotonic() > deadline:
                return Idle()
            time.sleep(0.005)
        return self.bridge.receive(0, None)

    def run(self) -> None:
        start = time.monotonic()
        while True:
            message = self.next_message(bool(self.stream.pending()))
            if isinstance(message, Idle):
                continue  # still waiting: the wait counts from ``start``
            if isinstance(message, Stop):
                self.engine.close()  # now, not when a sweep's later job collects it
                self.say(Stopped())
                self.bridge.close(wait_s=0)  # the process ends at once (train.main)
                return
            if message is None:
                self.sample()
            else:
                self.handle(message)
                if isinstance(message, (Work, Weights)):
                    self.idle += time.monotonic() - start
            start = time.monotonic()

    def say(self, message) -> None:
        """To learner 0, by the engine's reader only."""
        if self.reader:
            self.bridge.send(0, message)

    def handle(self, message) -> None:
        r, engine = self.r, self.engine
        if isinstance(message, Broken):
            raise RolloutRankError(f"the bridge to learner 0 broke ({message.why})")
        if isinstance(message, Work):
            self.stream.dispatch([Flight(p.position, p.ids, p.count) for p in message.prompts],
                                 self.version)
        elif isinstance(message, Weights):
            self.version = message.version
            self.bridge.send(0, Ready(message.version))  # every rank: its broadcasts come next
            engine.load_weights(self.bridge.receive_buckets(r.timeout_s),
                                keep_cache=r.partial_kv == "keep")
            # One write with its newline: the ranks share the launcher's stdout.
            print(f"rollout rank {self.index}: weights of version {self.version} loaded; "
                  f"{len(self.stream.flights)} prompts in flight, positions "
                  f"{sorted(f.position for f in self.stream.flights)[:8]}\n", end="", flush=True)
            released = self.settle_pages()
            self.memory = {**released, **host_memory.metrics("perf/rollout_")} \
                if self.reader else {}
        elif isinstance(message, Generate):
            from megatron_rlep.rollout.base import request_seed

            if r.partial_kv == "keep":
                engine.clear_cache()  # validated by the current weights alone
            with self.bridge.busy(f"generating {sum(message.counts)} validation answers"):
                answers = engine.generate(message.prompts, message.counts,
                                          seed=[request_seed(message.seed, i)
                                                for i in message.places], **message.sampling)
            self.say(Generated(answers))
        elif isinstance(message, Probe):
            self.say(Probed(engine.sequence_logprobs(message.ids)))

    def sample(self) -> None:
        """A segment of every answer in flight; what finished goes to learner 0."""
        with self.bridge.busy(f"generating the answers of {len(self.stream.flights)} prompts"):
            self.stream.advance(self.version, self.cfg.seed)
        landed = self.stream.take(len(self.stream.flights), self.version)
        if landed and self.reader:
            self.say(Landed([Finished(f.position, f.answers) for f in landed], self.idle,
                            self.memory))
            self.idle, self.memory = 0.0, {}
