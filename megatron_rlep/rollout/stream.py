"""Generation that does not wait for the longest answer: prompts in flight, their answers grown a
segment at a time, every token tagged with the version of the policy that sampled it.

The synchronous trainer asks the engine for all of a step's answers and waits for the longest.
A ``RolloutStream`` holds prompts in flight instead (``Flight``: a group and its answers so far):

* ``dispatch(flights)`` adds prompts, each with the number of fresh answers it needs;
* ``advance(version)`` gives every unfinished answer up to ``segment`` more tokens (a prompt's
  first segment samples its answers together; later ones continue each answer from its own
  tokens, so after a weight update they go on under the new policy: a partial rollout). Before
  that, a flight whose oldest token is already more than ``max_staleness`` versions behind is
  started again, since it could never be trained (counted: ``regenerated``);
* ``take(count, version)`` returns up to ``count`` whole flights (every answer ended: on an end
  of sequence or at the response limit), the oldest first. A flight whose oldest token is
  ``max_staleness`` versions behind is *due*: this update is its last chance, so ``take``
  returns nothing until every due flight has finished, and takes those first. A long answer is
  waited for rather than dropped, so slow, hard prompts are not starved and training does not
  lean to short answers; no token trains more than ``max_staleness`` versions after it was
  sampled. Only flights beyond ``count`` that are due (more over-provisioned prompts than
  updates can take) are started again, counted (``regenerated``).

Every answer is a request of its own, seeded by ``answer_seed`` (the run's seed, the flight's
position in the prompt stream, the answer's index and the tokens it has so far): never by a count
of engine calls, so what an answer draws does not depend on when, with what others, or on which
rank it is sampled. Continuing an answer resubmits its prompt and tokens, so the engine
recomputes their KV cache (vLLM's prefix cache keeps it while the weights are unchanged). The
engine is a function (``generate(prompts, counts, seeds, max_tokens) -> [[Completion]]``, one
seed per prompt); this module knows nothing of Megatron, rewards or replay.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from megatron_rlep.rollout.base import Completion, answer_seed, joined_routes


@dataclass
class Answer:
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)  # the policy version of each token
    finished: bool = False  # ended on an end-of-sequence id
    done: bool = False  # finished, or at the response limit
    # with tools (rollout/tools.py, ``Turns``): the model's tokens (True) and the observations'
    # (False), each call's status, where the current turn's tokens start, and how far its
    # tokens are known to hold no end of a code block
    mask: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    turn: int = 0
    scanned: int = 0
    # a MoE model's routes of every token fed so far, prompt first, where the engine returns
    # them (actor.routing_replay=rollout; base.joined_routes)
    routes: object = None


@dataclass
class Flight:
    """One prompt in flight: ``position`` in the prompt stream, what is to be sampled, and its
    answers so far; ``payload`` is the caller's (the trainer's group)."""
    position: int
    prompt_ids: tuple
    count: int
    payload: object = None
    dispatched: int = 0  # the version current when it joined (or was started again)
    answers: list = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.answers) and all(a.done for a in self.answers) or self.count == 0

    def oldest(self) -> int:
        """The version of its oldest token (the one it joined at, before any)."""
        return min((a.versions[0] for a in self.answers if a.versions), default=self.dispatched)


def lags(flights: list, version: int) -> Counter:
    """How many tokens of ``flights`` are k versions behind ``version``, by k."""
    return Counter(version - v for f in flights for a in f.answers for v in a.versions)


class RolloutStream:
    def __init__(self, generate, segment: int, max_tokens: int, max_staleness: int, turns=None):
        self.generate, self.segment, self.max_tokens = generate, segment, max_tokens
        self.turns = turns  # tools in the loop (rollout/tools.py ``Turns``), or None
        self.max_staleness = max_staleness
        self.flights: list[Flight] = []
        self.regenerated = 0  # flights started again for staleness, since the last count

    def dispatch(self, flights: list[Flight], version: int) -> None:
        for flight in flights:
            flight.dispatched, flight.answers = version, []
        self.flights += flights

    def pending(self) -> list[Flight]:
        return [f for f in self.flights if not f.done]

    def started(self, flight: Flight) -> int | None:
        """The version of ``flight``'s oldest token, None before it has one."""
        return flight.oldest() if any(a.versions for a in flight.answers) else None

    def advance(self, version: int, seed: int) -> int:
        """One segment for every unfinished answer (and a flight too stale ever to train
        started again first), each answer seeded by ``answer_seed`` from the run's ``seed``;
        returns how many tokens were sampled."""
        for flight in self.flights:
            oldest = self.started(flight)
            if oldest is not None and not flight.done and version - oldest > self.max_staleness:
                self.restart(flight, version)
        prompts, seeds, targets = [], [], []
        for flight in self.pending():
            if not flight.answers:
                flight.answers = [Answer() for _ in range(flight.count)]
            for index, answer in enumerate(flight.answers):
                if not answer.done:
                    prompts.append(tuple(flight.prompt_ids) + tuple(answer.token_ids))
                    seeds.append(answer_seed(seed, flight.position, index, len(answer.token_ids)))
                    targets.append(answer)
        if not prompts:
            return 0
        limits = [self.max_tokens - len(a.token_ids) for a in targets]
        segment = min(self.segment, max(limits))
        results = self.generate(prompts, [1] * len(prompts), seeds, segment)
        sampled = sum(extend(answer, completions[0], version, min(segment, limit), limit)
                      for answer, limit, completions in zip(targets, limits, results))
        if self.turns is not None:  # code blocks ended: their calls run, outputs appended
            self.turns.after(targets, version, self.max_tokens)
        return sampled

    def restart(self, flight: Flight, version: int) -> None:
        """``flight`` sampled again from its start (too stale to train), counted."""
        flight.dispatched, flight.answers = version, []
        self.regenerated += 1

    def take(self, count: int, version: int) -> list[Flight]:
        """Up to ``count`` finished flights for the update at ``version``: none while a due flight
        (this update is its last within the bound) is still sampling; due ones first, then the
        oldest. A finished flight already past the bound is started again, counted."""
        bound = self.max_staleness
        for flight in self.flights:
            oldest = self.started(flight)
            if oldest is not None and flight.done and version - oldest > bound:
                self.restart(flight, version)
        due = [f for f in self.flights if self.started(f) is not None and
               version - self.started(f) >= bound]
        if any(not f.done for f in due):
            return []
        ready = [f for f in self.flights if f.done and f.count]
        ready.sort(key=lambda f: (f.oldest(), f.position))
        taken = ready[:count]
        chosen = {id(f) for f in taken}
        self.flights = [f for f in self.flights if id(f) not in chosen]
        return taken


def extend(answer: Answer, completion: Completion, version: int, asked: int, limit: int) -> int:
    """``completion``'s tokens added to ``answer`` (``asked`` tokens were asked for, ``limit``
    were left before the response limit); returns how many."""
    ids = list(completion.token_ids)
    answer.token_ids += ids
    answer.logprobs += list(completion.logprobs)
    answer.versions += [version] * len(ids)
    answer.mask += [True] * len(ids)
    answer.finished = completion.finished
    answer.routes = joined_routes(answer.routes, completion.routes)
    # an answer stopped at the end of a code block goes on after its tool's output
    answer.done = completion.finished or len(ids) >= limit or \
        (len(ids) < asked and not completion.stopped)
    return len(ids)
