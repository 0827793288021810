"""What every rollout engine returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]  # response tokens, the end-of-sequence token included if emitted
    finished: bool  # True when the engine stopped on end-of-sequence, False when cut at the limit
