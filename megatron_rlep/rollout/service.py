"""The rollout side as the learner's loop sees it, wherever the engines run: ``LocalRollout``
(the engines in the learners' own processes, synchronous or through the colocated stream) and
``RemoteRollout`` (the rollout ranks of the disaggregated placement, behind the bridge) answer
the same calls, so the loop (megatron_rlep/train.py) never asks where the engines are.

Each step's groups come from the producer's stream (``producer.py``); the rest is here: make
room for an update, take the weights of a version, sample validation's answers, probe the
engine's log-probs (the weight-sync check), the step's waits and memory, and the end.
"""

from __future__ import annotations

from megatron_rlep.rollout import generate_sharded


class LocalRollout:
    """The engine of this rank (None on a rank that does not generate, whose part of the export
    and of ``generate_sharded`` it still takes)."""

    def __init__(self, engine, rollout):
        self.engine, self.rollout = engine, rollout

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
    """The rollout ranks, through the learners' ``placement.RemoteStream``."""

    def __init__(self, stream):
        self.stream = stream

    def before_update(self) -> None:
        """Nothing: the rollout ranks' engines have GPUs of their own."""

    def load_weights(self, version: int, export) -> None:
        self.stream.weights(version, export)

    def probe(self, ids):
        return self.stream.probe(ids)

    def sample(self, prompts, counts, seed, **sampling) -> list:
        return self.stream.sample(prompts, counts, seed, **sampling)

    def waits(self, rollout_s: float, generating_s: float, since_rollout_s: float) -> dict:
        """Each side's waits on the other since the last step, as measured, and the rollout
        ranks' memory as they last reported it."""
        out = {"time/learner_idle": self.stream.idle, "time/rollout_idle": self.stream.rollout_idle,
               **self.stream.memory()}
        self.stream.idle = self.stream.rollout_idle = 0.0
        return out

    def close(self) -> None:
        self.stream.stop()
