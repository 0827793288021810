"""Sequences for the actor: data-parallel slices and length-sorted, padded micro-batches.

A ``SequenceBatch`` is what the trainer hands the actor: token ids (prompt then response) of
every sequence of an optimiser mini-batch, with per-sequence advantages and old log-probs when
training. Every rank holds the whole batch; ``dp_slice`` picks this rank's share, balanced by
tokens. ``micro_batches`` sorts by length so each micro-batch is padded only to its own
longest sequence (the CPU local attention has no packed-sequence path).

A micro-batch's tensors follow Megatron's next-token convention: ``labels[t] = tokens[t + 1]``
and ``loss_mask[t]`` marks the positions whose label is a response token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class SequenceBatch:
    tokens: list[list[int]]  # prompt + response ids
    prompt_lengths: list[int]
    advantages: Optional[torch.Tensor] = None  # [N], training only
    old_logp: Optional[list[torch.Tensor]] = None  # per sequence, [response length]
    ref_logp: Optional[list[torch.Tensor]] = None  # per sequence, only with a KL term
    # off-policy correction (megatron_rlep/correction.py), per sequence, [response length]:
    weights: Optional[list[torch.Tensor]] = None  # importance weights of the token losses
    kept: Optional[list[torch.Tensor]] = None  # tokens rejection keeps in the loss (bool)

    def __post_init__(self):
        if len(self.tokens) != len(self.prompt_lengths):
            raise ValueError("SequenceBatch: tokens and prompt_lengths differ in length")
        for ids, p in zip(self.tokens, self.prompt_lengths):
            if not 0 < p < len(ids):
                raise ValueError(f"SequenceBatch: a sequence of {len(ids)} tokens with prompt length "
                                 f"{p} has no response token")

    def __len__(self) -> int:
        return len(self.tokens)

    def response_lengths(self) -> list[int]:
        return [len(t) - p for t, p in zip(self.tokens, self.prompt_lengths)]


def dp_slice(lengths: list[int], rank: int, size: int) -> list[int]:
    """Indices of this data-parallel rank's sequences: longest first, dealt greedily to the
    rank with the fewest tokens so far (ties to the lower rank), deterministic on all ranks."""
    if len(lengths) < size:
        raise ValueError(f"a mini-batch of {len(lengths)} sequences cannot feed {size} "
                         "data-parallel ranks; use more prompts per update")
    loads = [0] * size
    owned: list[list[int]] = [[] for _ in range(size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(size), key=lambda r: (loads[r], r))
        owned[r].append(i)
        loads[r] += lengths[i]
    return sorted(owned[rank])


def micro_batches(indices: list[int], lengths: list[int], micro_batch_size: int,
                  max_tokens: int = 0) -> list[list[int]]:
    """``indices`` grouped into micro-batches of similar length, longest first: at most
    ``micro_batch_size`` sequences each and, with a token budget ``max_tokens`` > 0 (verl's
    dynamic batch size), at most that many tokens once padded to the micro-batch's longest
    sequence (a sequence longer than the budget goes alone). The loss is a sum over tokens
    divided by the mini-batch's count, so the grouping changes no result beyond float rounding."""
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        current = out[-1] if out else None
        if current and len(current) < micro_batch_size and (
                not max_tokens or (len(current) + 1) * lengths[current[0]] <= max_tokens):
            current.append(i)
        else:
            out.append([i])
    return out


@dataclass
class MicroBatch:
    index: list[int]  # positions in the SequenceBatch
    tokens: torch.Tensor  # [b, s]
    positions: torch.Tensor  # [b, s]
    labels: torch.Tensor  # [b, s]
    loss_mask: torch.Tensor  # [b, s] bool
    old_logp: Optional[torch.Tensor] = None  # [b, s], aligned with loss_mask
    ref_logp: Optional[torch.Tensor] = None
    weights: Optional[torch.Tensor] = None  # [b, s], aligned with loss_mask
    advantages: Optional[torch.Tensor] = None  # [b, 1]


def collate(batch: SequenceBatch, index: list[int], device: torch.device,
            multiple: int = 1) -> MicroBatch:
    """Right-padded tensors of the sequences ``index``, as wide as the longest rounded up to a
    ``multiple`` (the TP size with sequence parallelism); tokens rejection dropped (``kept``)
    leave the loss mask."""
    width = -(-max(len(batch.tokens[i]) for i in index) // multiple) * multiple
    tokens = torch.zeros(len(index), width, dtype=torch.long)
    mask = torch.zeros(len(index), width, dtype=torch.bool)
    aligned = {"old_logp": batch.old_logp, "ref_logp": batch.ref_logp, "weights": batch.weights}
    out = {k: torch.zeros(len(index), width) if v is not None else None for k, v in aligned.items()}
    for row, i in enumerate(index):
        ids, p = batch.tokens[i], batch.prompt_lengths[i]
        tokens[row, :len(ids)] = torch.tensor(ids)
        mask[row, p - 1:len(ids) - 1] = True if batch.kept is None else batch.kept[i]
        for key, values in aligned.items():
            if values is not None:
                out[key][row, p - 1:len(ids) - 1] = values[i]
    labels = torch.roll(tokens, -1, dims=1)
    labels[:, -1] = 0
    positions = torch.arange(width).expand(len(index), width)
    micro = MicroBatch(index, tokens.to(device), positions.to(device), labels.to(device),
                       mask.to(device))
    for key, value in out.items():
        if value is not None:
            setattr(micro, key, value.to(device))
    if batch.advantages is not None:
        micro.advantages = batch.advantages[index].float().reshape(-1, 1).to(device)
    return micro


def causal_mask(width: int, device: torch.device) -> torch.Tensor:
    """Megatron's boolean mask convention: True where attention is NOT allowed."""
    return torch.ones(width, width, dtype=torch.bool, device=device).triu(1)[None, None]
