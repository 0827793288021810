"""G' = G + M groups: fresh rollouts plus replayed pool answers, scored, with advantages.

Per prompt, ``plan_group`` decides how many answers come from the pool and how many the engine
must generate: M replays drawn by ``pool.sample_replays``; a question with fewer than M pool
answers gets fresh rollouts in the free slots (never padding answers); a question absent from
the pool gets G + M fresh rollouts, or G when ``fill_absent`` is off. ``replay_sample`` turns a
pool text into a sequence exactly like a fresh one: re-tokenised, EOS appended, cut at the
response limit (then without EOS, and the overlong penalty applies). Every sample of a group is
scored by the same reward; advantages are normalised over the whole group.

This module knows nothing of Megatron or of the engines' internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from megatron_rlep.data import Example
from megatron_rlep.loss import group_advantages
from megatron_rlep.pool import ExperiencePool, question_key, sample_replays


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
    logprobs: tuple[float, ...] = ()  # the engine's behaviour log-probs (fresh samples only)


@dataclass
class Group:
    example: Example
    prompt_ids: tuple[int, ...]
    replays: list[str]  # pool texts chosen for this step
    fresh_requested: int  # what the engine was asked for
    samples: list[Sample] = field(default_factory=list)

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
               fill_absent: bool, seed: int, step: int, distinct: bool = False
               ) -> tuple[list[str], int]:
    """(replayed texts, number of fresh rollouts) for one prompt at one step."""
    if m == 0:
        return [], g
    answers = pool.answers(example) if pool is not None else ()
    if not answers:
        return [], g + m if fill_absent else g
    replays = sample_replays(answers, m, seed, step, question_key(example), distinct)
    return replays, g + m - len(replays)


def replay_sample(text: str, tokenizer, max_length: int) -> Sample:
    """A pool answer as a sequence: re-tokenised, EOS appended, cut at ``max_length``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    if len(ids) <= max_length:
        return Sample(tuple(ids), text, replay=True, finished=True)
    ids = ids[:max_length]
    return Sample(tuple(ids), tokenizer.decode(ids, skip_special_tokens=True), replay=True,
                  finished=False)


def score_groups(groups: list[Group], verifier) -> None:
    """Reward every sample with the verifier (overlong penalty by token length)."""
    for group in groups:
        for s in group.samples:
            score = verifier.score(s.text, group.example.ground_truth, length=len(s.response_ids))
            s.reward, s.correct, s.pred = score.reward, score.correct, score.pred


def assign_advantages(groups: list[Group], normalize_std: bool = True) -> None:
    rewards = torch.tensor([r for g in groups for r in g.rewards])
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.samples])
    if not len(rewards):
        return
    advantages = group_advantages(rewards, ids, normalize_std).tolist()
    for s, a in zip((s for g in groups for s in g.samples), advantages):
        s.advantage = a
