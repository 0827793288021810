"""What learner 0 and the rollout ranks say to each other over the bridge
(megatron_rlep/rollout/bridge.py), as small named types: a message, and each item it carries, is
read by its fields, never by its place in a tuple.

Learner 0 to an engine's reader (the first of its ranks, which passes it on to the others):
``Work``, ``Weights`` (then the buckets: ``Bucket`` headers and their broadcasts, to every
rollout rank, and ``BucketsDone``), ``Generate``, ``Probe``, ``Stop``. An engine's reader to
learner 0: ``Landed``, ``Generated``, ``Probed``, ``Stopped``. Any rank to its peers:
``Alive`` (heartbeats), ``Failed`` (a rank's last words). Every rollout rank to learner 0:
``Ready``, before a weight sync's broadcasts. ``Broken`` is never sent: a reader
puts it in its own inbox when the link to its peer breaks; nor is ``Idle``, which an engine's
reader passes to the engine's other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prompt:
    """A prompt to sample: its stream position, its token ids, the answers wanted."""
    position: int
    ids: list
    count: int


@dataclass(frozen=True)
class Work:
    """Prompts to sample (``Prompt`` each)."""
    prompts: list


@dataclass(frozen=True)
class Weights:
    """The weights of policy ``version`` follow as bucket broadcasts."""
    version: int


@dataclass(frozen=True)
class Ready:
    """A rollout rank to learner 0: it takes the weights of ``version`` now (its broadcasts are
    posted next), so learner 0 waits for this on the bridge, with its deadlines, and never in a
    broadcast that a rank busy generating has not joined."""
    version: int


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of a bucket: its name, shape and dtype (its bytes come in the broadcast)."""
    name: str
    shape: tuple
    dtype: object


@dataclass(frozen=True)
class Bucket:
    """The next broadcast's tensors (``TensorSpec`` each), in the order of its bytes."""
    tensors: list


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
class Finished:
    """A flight that finished: its stream position and its answers (``rollout/stream.py``'s
    ``Answer`` each: token ids, log-probs, versions, tool mask and calls)."""
    position: int
    answers: list


@dataclass(frozen=True)
class Landed:
    """Finished flights (``Finished`` each), with the seconds the engine waited since its last
    report and its memory where it measured it."""
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
    """A heartbeat; from a rank in the middle of something long (``Bridge.busy``), what it is
    doing and for how many seconds so far: a rank answers the bridge during a batch too."""
    doing: str = ""
    for_s: float = 0.0


@dataclass(frozen=True)
class Idle:
    """Never on the bridge: an engine's reader to its other ranks, when learner 0 has said
    nothing for a heartbeat's time (their group's liveness, ``RolloutRank.next_message``)."""


@dataclass(frozen=True)
class Failed:
    """A rank's failure, in one line, before it exits."""
    why: str


@dataclass(frozen=True)
class Broken:
    """The link to a peer broke (its process died): put in the inbox by the reader itself."""
    why: str


LAST = (Stop, Stopped, Failed)  # after one of these a peer says nothing more
