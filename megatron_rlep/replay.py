"""Replay strategies (``algorithm.replay.strategy``): which pool answers go into which group.

Every choice is a pure function of the pool, the question, the run's state and (seed, step), so
a resumed run replays the same stream. M is ``algorithm.replay_per_prompt``.

* ``uniform`` (RLEP, the paper; the default): every prompt gets M answers drawn uniformly from
  its stored ones (``pool.sample_replays``).
* ``rescue`` (AR3PO's idea): only a group whose G fresh rollouts hold no verified answer gets
  replays, up to M: replay where the group has no learning signal of its own. Decided after the
  fresh rollouts are scored, so the engine is always asked for G.
* ``priority`` (ExGRPO's idea): a prompt gets its M replays with probability
  ``max(floor, 4 p (1 - p))``, p the question's running pass rate (``PassRates``): questions the
  policy solves about half the time teach most, those it always or never solves least. A prompt
  of unknown p gets them.
* ``recent``: the M answers of the newest policy versions, ties drawn as ``uniform`` draws; on a
  frozen pool, whose answers share one version, it draws exactly as ``uniform``.

This module neither generates nor scores; the trainer calls it around its engine.
"""

from __future__ import annotations

import hashlib

from megatron_rlep.pool import sample_replays

STRATEGIES = ("uniform", "rescue", "priority", "recent")
PRIOR_SAMPLES = 4  # a pool pass rate counts as this many fresh answers in the running rate


def coin(seed: int, step: int, key: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, step, question key)."""
    digest = hashlib.sha256(f"priority\x00{seed}\x00{step}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def priority_weight(rate: float | None, floor: float) -> float:
    """4 p (1 - p): 1 at p = 0.5, 0 at p = 0 or 1; at least ``floor``; 1 for an unknown p."""
    return 1.0 if rate is None else max(floor, 4.0 * rate * (1.0 - rate))


def replays_before_generation(strategy: str, seed: int, step: int, key: str,
                              rate: float | None = None, floor: float = 0.0) -> bool:
    """Whether a prompt gets replays planned with its fresh rollouts (``rescue`` decides
    after them, so never here)."""
    if strategy == "rescue":
        return False
    if strategy == "priority":
        return coin(seed, step, key) < priority_weight(rate, floor)
    return True


def needs_rescue(fresh_correct: list[bool]) -> bool:
    """``rescue``: the group's fresh answers hold no verified one."""
    return not any(fresh_correct)


def choose(answers: tuple[str, ...], m: int, seed: int, step: int, key: str,
           distinct: bool = False, versions: tuple[int, ...] = (), recent: bool = False
           ) -> list[str]:
    """M of a question's answers: uniformly (``sample_replays``) or, with ``recent``, newest
    version first: whole versions while they fit, the next one drawn uniformly."""
    if not recent or not versions or len(set(versions)) == 1:
        return sample_replays(answers, m, seed, step, key, distinct)
    by_version: dict[int, list[str]] = {}
    for text, version in zip(answers, versions):
        by_version.setdefault(version, []).append(text)
    chosen: list[str] = []
    for version in sorted(by_version, reverse=True):
        tier = [t for t in by_version[version] if not (distinct and t in chosen)]
        chosen += sample_replays(tuple(tier), m - len(chosen), seed, step, f"{key}\x00{version}",
                                 distinct)
        if len(chosen) >= m:
            break
    return chosen


class PassRates:
    """Each question's running pass rate over this run's fresh answers, starting from the pool's
    pass rate (worth ``PRIOR_SAMPLES`` answers) where it has one. Saved in checkpoints."""

    def __init__(self, counts: dict[str, list[int]] | None = None):
        self.counts = counts or {}  # question key -> [correct, answers]

    def rate(self, key: str, prior: float | None = None) -> float | None:
        correct, seen = self.counts.get(key, (0, 0))
        if prior is not None:
            return (correct + PRIOR_SAMPLES * prior) / (seen + PRIOR_SAMPLES)
        return correct / seen if seen else None

    def add(self, key: str, correct: list[bool]) -> None:
        tally = self.counts.setdefault(key, [0, 0])
        tally[0] += sum(correct)
        tally[1] += len(correct)

    def state(self) -> dict:
        return {"counts": self.counts}

    @classmethod
    def from_state(cls, state: dict | None) -> "PassRates":
        return cls({k: list(v) for k, v in (state or {}).get("counts", {}).items()})
