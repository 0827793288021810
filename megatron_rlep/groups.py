"""G' = G + M groups: fresh rollouts plus replayed pool answers, scored, with advantages.

Per prompt, ``plan_group`` decides how many answers come from the pool and how many the engine
must generate: M replays chosen by the replay strategy (``megatron_rlep/replay.py``; uniform
draws by default); a question with fewer than M pool answers gets fresh rollouts in the free
slots (never padding answers); a question absent from the pool gets G + M fresh rollouts, or G
when ``fill_absent`` is off; a prompt the strategy leaves without replays gets G.
``replay_sample`` turns a pool answer into a sequence like a fresh one: its stored token ids and
behaviour log-probs where the pool has them, else the text re-tokenised with EOS appended; cut
at the response limit (then without EOS, and the overlong penalty applies). Every sample of a group is
scored by the same reward (``reward/scorer.py``, once for all ranks); an answer the code
sandbox could not run is left out; advantages are normalised over the whole group.

This module knows nothing of Megatron or of the engines' internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from megatron_rlep import replay
from megatron_rlep.data import Example
from megatron_rlep.loss import group_advantages
from megatron_rlep.pool import ExperiencePool, question_key


@dataclass
class Sample:
    response_ids: tuple[int, ...]
    text: str
    replay: bool
    finished: bool  # ended with EOS (False: cut at the response limit)
    reward: float = 0.0
    correct: bool = False
    pred: Optional[str] = None
    advantage: float = 0.0
    logprobs: tuple[float, ...] = ()  # behaviour log-probs: the engine's, a replay's stored ones
    status: str = "ok"  # the reward's: ok | error | timeout | infra (reward/scorer.py)
    # asynchronous rollout: the policy version that sampled each token (empty: the step's own)
    versions: tuple[int, ...] = ()
    # tools (rollout/tools.py): True for the model's tokens, False for an observation's, which
    # stay out of the loss (empty: every token is the model's); each tool call's status
    mask: tuple[bool, ...] = ()
    calls: tuple[str, ...] = ()
    # the engine's MoE routes of the prompt and response, [tokens, layers, top-k]
    # (actor.routing_replay=rollout; None: the actor's own first pass routes it)
    routes: Optional[torch.Tensor] = field(default=None, compare=False)


@dataclass
class Group:
    example: Example
    prompt_ids: tuple[int, ...]
    replays: list[str]  # pool texts chosen for this step
    fresh_requested: int  # what the engine was asked for
    samples: list[Sample] = field(default_factory=list)
    position: Optional[int] = None  # asynchronous rollout: its place in the prompt stream

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def informative(self, metric: str = "acc") -> bool:
        """Dynamic sampling's test (verl's filter_groups): the group's answers differ in
        correctness (``acc``) or in shaped reward (``reward``), replays counted like fresh
        answers; a group of one answer always passes, as in the reference."""
        values = [s.correct for s in self.samples] if metric == "acc" else self.rewards
        return len(set(values)) > 1 or len(values) == 1


def plan_group(example: Example, pool: Optional[ExperiencePool], g: int, m: int,
               fill_absent: bool, seed: int, step: int, distinct: bool = False,
               strategy: str = "uniform", rate: Optional[float] = None, floor: float = 0.0
               ) -> tuple[list[str], int]:
    """(replayed texts, number of fresh rollouts) for one prompt at one step. ``strategy``
    (megatron_rlep/replay.py) may leave a prompt without replays: it then gets G fresh rollouts
    (``rescue`` adds its replays after them, ``rescue_replays``)."""
    if m == 0:
        return [], g
    answers = pool.answers(example) if pool is not None else ()
    if not answers:
        return [], g + m if fill_absent else g
    key = question_key(example)
    if not replay.replays_before_generation(strategy, seed, step, key, rate, floor):
        return [], g
    replays = replay.choose(answers, m, seed, step, key, distinct, pool.versions(example),
                            strategy == "recent")
    return replays, g + m - len(replays)


def rescue_replays(group: "Group", pool: Optional[ExperiencePool], m: int, seed: int, step: int,
                   distinct: bool = False) -> list[str]:
    """``rescue``: up to M pool answers for a group whose scored fresh answers hold no verified
    one, none otherwise."""
    if m == 0 or pool is None or not replay.needs_rescue([s.correct for s in group.samples]):
        return []
    return replay.choose(pool.answers(group.example), m, seed, step, question_key(group.example),
                         distinct)


def replay_sample(text: str, tokenizer, max_length: int,
                  sampled: Optional[tuple[list[int], list[float]]] = None,
                  stops: tuple[int, ...] = (), mask: tuple[bool, ...] = ()) -> Sample:
    """A pool answer as a sequence, cut at ``max_length``: the token ids it was sampled with and
    their behaviour log-probs when ``sampled`` gives them, else re-tokenised with EOS appended.
    It is finished when it ends on the tokenizer's EOS or on another of ``stops`` (the model's
    end-of-sequence ids, ``rollout.base.stop_ids``). A tool-using answer comes with its recorded
    tokens and ``mask`` (its observations, never run again)."""
    if sampled is not None:
        ids, logprobs = sampled
    else:
        ids, logprobs = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + \
            [tokenizer.eos_token_id], []
    finished = len(ids) <= max_length and bool(ids) and \
        (ids[-1] == tokenizer.eos_token_id or ids[-1] in stops)
    if len(ids) > max_length:
        ids, logprobs, mask = ids[:max_length], logprobs[:max_length], mask[:max_length]
        kept = [t for t, m in zip(ids, mask or [True] * len(ids)) if m]
        text = tokenizer.decode(kept, skip_special_tokens=True)
    return Sample(tuple(ids), text, replay=True, finished=finished, logprobs=tuple(logprobs),
                  mask=tuple(mask))


def score_samples(pairs: list[tuple[Sample, Example]], scorer, collective: bool = True) -> list:
    """Reward every (sample, its example) in one batch (``reward/scorer.py``: once for all
    ranks, overlong penalty by token length); returns the Scores."""
    from megatron_rlep.reward.scorer import Item

    scores = scorer.score([Item(ex.data_source, s.text, ex.ground_truth, ex.extra_info,
                                len(s.response_ids)) for s, ex in pairs], collective)
    for (s, _), score in zip(pairs, scores):
        s.reward, s.correct, s.pred, s.status = score.reward, score.correct, score.pred, \
            score.status
    return scores


def without_unscored(groups: list[Group]) -> int:
    """Leave out of their groups the answers the sandbox could not run (an infrastructure
    failure is no signal: neither in a group's statistics nor trained), and a group left with
    none out of ``groups``; returns how many answers went."""
    dropped = 0
    for group in groups:
        kept = [s for s in group.samples if s.status != "infra"]
        dropped += len(group.samples) - len(kept)
        group.samples = kept
    groups[:] = [g for g in groups if g.samples]
    return dropped


def assign_advantages(groups: list[Group], normalize_std: bool = True,
                      weights: Optional[list[float]] = None, fresh_baseline: bool = False) -> None:
    """Each sample's advantage over its group (``loss.group_advantages``); ``weights``, one
    per sample in order, weigh the groups' means and spreads; ``fresh_baseline``: a replay's
    is centred on its group's fresh answers alone."""
    rewards = torch.tensor([r for g in groups for r in g.rewards])
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.samples])
    if not len(rewards):
        return
    replays = torch.tensor([s.replay for g in groups for s in g.samples]) if fresh_baseline \
        else None
    advantages = group_advantages(rewards, ids, normalize_std, weights=None if weights is None
                                  else torch.tensor(weights), replays=replays).tolist()
    for s, a in zip((s for g in groups for s in g.samples), advantages):
        s.advantage = a
