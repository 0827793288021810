"""The one example type every reader and task makes, and the error a bad data file raises.

Readers (``megatron_rlep/data.py``) and built-in tasks (``megatron_rlep/tasks/``) both import
from here, and nothing here imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DataError(ValueError):
    """A data file that cannot be read as asked; the message names the file and the fix."""


@dataclass(frozen=True)
class Example:
    id: str
    prompt: tuple[dict, ...]  # chat messages: ({"role": ..., "content": ...}, ...)
    ground_truth: str
    data_source: str
    candidates: tuple[str, ...] = field(default=())  # verified answers (RLEP pool), if any
    # verl's extra_info column: what a reward function is handed besides the ground truth
    extra_info: dict | None = field(default=None, compare=False, hash=False)

    @property
    def question(self) -> str:
        return self.prompt[-1]["content"]
