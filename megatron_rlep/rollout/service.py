"""The rollout side as the learner's loop sees it, wherever the engines run: ``LocalRollout``
(the engines in the learners' own processes, synchronous or through the colocated stream) and
``RemoteRollout`` (the rollout ranks of a disaggregated job, behind the bridge) answer the same
calls, so the trainer (megatron_rlep/train.py) chooses one once (``rollout_side``) and never
asks again where the engines are.

Set-up: ``connect`` (the bridge, before the data and the model load), ``start`` (this rank's
engine, after the actor), ``stream`` (what the producer samples through, ``producer.py``). Then
each step: make room for an update, take the weights of a version, sample validation's answers,
probe the engine's log-probs (the weight-sync check), the step's waits and memory, and the end.
"""

from __future__ import annotations

import torch.distributed as dist

from megatron_rlep import platform
from megatron_rlep.errors import RunError
from megatron_rlep.rollout import engine_length, generate_sharded, make_engine
from megatron_rlep.rollout.remote_stream import RemoteStream, engines, learner_bridge
from megatron_rlep.rollout.stream import RolloutStream


class LocalRollout:
    """The engine of this rank (None on a rank that does not generate, whose part of the export
    and of ``generate_sharded`` it still takes)."""

    where = "colocated engines"

    def __init__(self, cfg):
        self.cfg, self.rollout, self.engine = cfg, cfg.rollout, None

    def connect(self) -> None:
        """Nothing to meet: the engines start beside the actor (``start``)."""

    def start(self, rollout, hf_path: str, dtype):
        """This rank's engine, after the actor loaded (``rollout``: the config with the engine
        the actor's model takes); None where it does not generate."""
        self.rollout = rollout
        self.engine = make_engine(rollout, hf_path, dtype, self.cfg.seed, engine_length(self.cfg),
                                  sandbox=self.cfg.sandbox,
                                  routes=self.cfg.actor.routing_replay == "rollout")
        return self.engine

    def stream(self, segment, turns) -> RolloutStream | None:
        """The colocated stream, sampling ``segment(prompts, counts, seed, max_tokens)`` with
        ``turns()``'s tools, where the trainer samples asynchronously; None where synchronously
        (the producer then samples a whole batch with the engine)."""
        a, r = self.cfg.algorithm, self.rollout
        if not (a.max_staleness > 0 or r.partial or r.extra_prompts):
            return None
        return RolloutStream(segment, r.segment_tokens if r.partial else r.max_response_length,
                             r.max_response_length, a.max_staleness, turns())

    @property
    def toolbox(self):
        """The engine's tools (``rollout/tools.py``), None without."""
        return getattr(self.engine, "toolbox", None)

    def before_update(self) -> None:
        if self.engine is not None:
            self.engine.sleep()  # a colocated engine frees its memory for the update

    def load_weights(self, version: int, export) -> None:
        """``export(consume)`` runs the actor's export (``Actor.export_hf``): its buckets into
        this rank's engine, or only its collectives on a rank without one."""
        keep = self.rollout.partial_kv == "keep"
        export(None if self.engine is None else
               lambda buckets: self.engine.load_weights(buckets, keep_cache=keep))

    def probe(self, ids):
        """The engine's log-probs of ``ids`` at temperature 1 (None without an engine)."""
        return self.engine.sequence_logprobs(ids) if self.engine is not None else None

    def sample(self, prompts, counts, seed, **sampling) -> list:
        """Validation's answers, on every rank."""
        if self.engine is not None and self.rollout.partial_kv == "keep":
            self.engine.clear_cache()  # validated by the current weights alone
        return generate_sharded(self.engine, prompts, counts, self.rollout.tensor_parallel,
                                seed=seed, **sampling)

    def waits(self, rollout_s: float, generating_s: float, since_rollout_s: float) -> dict:
        """Colocated, each side idles while the other works: the learner through the step's
        rollout, the engine through its scoring and the update and sync after it."""
        return {"time/learner_idle": rollout_s,
                "time/rollout_idle": rollout_s - generating_s + since_rollout_s}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()  # vLLM's teardown now, not at a later job's garbage collection


class RemoteRollout:
    """The rollout ranks, through the learners' ``RemoteStream`` (``remote_stream.py``)."""

    toolbox = None  # the rollout ranks run the tools

    def __init__(self, cfg):
        self.cfg, self.bridge, self.remote = cfg, None, None

    @property
    def where(self) -> str:
        return (f"disaggregated engines (their weights broadcast within "
                f"{self.cfg.rollout.sync_timeout_s:g} s a sync, rollout.sync_timeout_s)")

    def connect(self) -> None:
        """Learner 0's end of the bridge, up before the data, the pool and the model load, so
        that the rollout ranks build their engines meanwhile (the learners' process group first:
        under srun learner 0 serves the job's store)."""
        p = self.cfg.parallel
        try:
            platform.init_distributed(p.tensor_parallel, p.pipeline_parallel, self.cfg.seed,
                                      p.expert_parallel)
        except ValueError as err:  # parallel sizes that do not fit the ranks started
            raise RunError(str(err)) from None
        self.bridge = learner_bridge(self.cfg, dist.get_rank())

    def start(self, rollout, hf_path: str, dtype) -> None:
        """No engine here: the rollout ranks have theirs."""

    def stream(self, segment, turns) -> RemoteStream:
        """The rollout ranks' streams, as every learner sees them."""
        a, r = self.cfg.algorithm, self.cfg.rollout
        self.remote = RemoteStream(self.bridge, engines(self.cfg), a.max_staleness, r.timeout_s,
                                   r.connect_timeout_s)
        return self.remote

    def before_update(self) -> None:
        """Nothing: the rollout ranks' engines have GPUs of their own."""

    def load_weights(self, version: int, export) -> None:
        self.remote.weights(version, export)

    def probe(self, ids):
        return self.remote.probe(ids)

    def sample(self, prompts, counts, seed, **sampling) -> list:
        return self.remote.sample(prompts, counts, seed, **sampling)

    def waits(self, rollout_s: float, generating_s: float, since_rollout_s: float) -> dict:
        """Each side's waits on the other since the last step, as measured, and the rollout
        ranks' memory as they last reported it."""
        out = {"time/learner_idle": self.remote.idle, "time/rollout_idle": self.remote.rollout_idle,
               **self.remote.memory()}
        self.remote.idle = self.remote.rollout_idle = 0.0
        return out

    def close(self) -> None:
        self.remote.stop()
