"""What learner 0 and the rollout ranks say to each other over the bridge
(megatron_rlep/rollout/placement.py), as small named types: a message is read by its fields, never by
its place in a tuple.

Learner 0 to an engine's reader (the first of its ranks, which passes it on to the others):
``Work``, ``Weights`` (then the buckets: ``Bucket`` headers and their broadcasts, to every
rollout rank, and ``BucketsDone``), ``Generate``, ``Probe``, ``Stop``. An engine's reader to
learner 0: ``Landed``, ``Generated``, ``Probed``, ``Stopped``. Any rank to its peers:
``Alive`` (heartbeats), ``Failed`` (a rank's last words). ``Broken`` is never sent: a reader
puts it in its own inbox when the link to its peer breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Work:
    """Prompts to sample: (stream position, prompt token ids, answers wanted) each."""
    flights: list


@dataclass(frozen=True)
class Weights:
    """The weights of policy ``version`` follow as bucket broadcasts."""
    version: int


@dataclass(frozen=True)
class Bucket:
    """The next broadcast's tensors: (name, shape, dtype) each."""
    header: list


@dataclass(frozen=True)
class BucketsDone:
    pass


@dataclass(frozen=True)
class Generate:
    """Validation's answers: ``counts[i]`` of ``prompts[i]``, seeded by their ``places`` in the
    whole request."""
    prompts: list
    counts: list
    places: list
    seed: int
    sampling: dict


@dataclass(frozen=True)
class Probe:
    """The engine's log-probs of ``ids`` (the weight-sync check)."""
    ids: tuple


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Landed:
    """Finished flights, (position, [(token ids, log-probs, versions, finished, mask, tool
    calls)]) each (``rollout/stream.py``'s ``Answer``), with the seconds the engine waited since
    its last report and its memory where it measured it."""
    flights: list
    idle: float = 0.0
    memory: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Generated:
    completions: list


@dataclass(frozen=True)
class Probed:
    logprobs: object


@dataclass(frozen=True)
class Stopped:
    pass


@dataclass(frozen=True)
class Alive:
    pass


@dataclass(frozen=True)
class Failed:
    """A rank's failure, in one line, before it exits."""
    why: str


@dataclass(frozen=True)
class Broken:
    """The link to a peer broke (its process died): put in the inbox by the reader itself."""
    why: str


LAST = (Stop, Stopped, Failed)  # after one of these a peer says nothing more
