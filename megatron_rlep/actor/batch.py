"""Sequences for the actor: data-parallel slices and length-sorted, padded micro-batches.

A ``SequenceBatch`` is what the trainer hands the actor: token ids (prompt then response) of
every sequence of an optimiser mini-batch, with per-sequence advantages and old log-probs when
training. Every rank holds the whole batch; ``dp_slice`` picks this rank's share, balanced by
tokens. ``micro_batches`` sorts by length so each micro-batch is padded only to its own
longest sequence. Packed sequences (``parallel.pack_sequences``; ``collate_packed``) remove the
padding: a micro-batch's sequences stand end to end in one row, the THD layout of Transformer
Engine's attention, with their bounds (``cu_seqlens``) in Megatron's ``PackedSeqParams``; the
rotary embedding restarts at each bound and attention stays within a sequence, so every token's
hidden state is the one it has alone.

A micro-batch's tensors follow Megatron's next-token convention: ``labels[t] = tokens[t + 1]``
and ``loss_mask[t]`` marks the positions whose label is a response token. The mask's positions
are also made on the host as flat indices (``loss_index``) with their count per row: on a GPU,
picking rows by a boolean mask waits for the device (its size is known only there), picking them
by index does not. Host tensors go to the device without waiting (``non_blocking``).

Shared prompts (``parallel.share_prompts``; the idea of Prefix Grouper, arXiv 2506.05433): the
sequences of a group repeat one prompt, so ``collate_shared`` packs each prompt once, followed by
the responses of its sequences in the micro-batch, into one row; an explicit attention mask lets
each response see the prompt and its own earlier tokens only, and position ids restart after the
prompt for each response. Every response token's hidden state is then what it would be in its own
sequence, and the prompt's gradient is the sum over its responses: the same log-probs and
gradients with the prompt computed once instead of G' times. The loss side (labels, loss mask,
old log-probs, advantages) keeps the one-sequence-per-row layout; ``hidden_index`` maps each
loss-mask position to its row of the packed hidden states.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from megatron_rlep.actor import routing


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
    # each token's class for the update's metrics by class (correction.token_tags: a fresh
    # token's lag, or a replay's), per sequence, [response length]
    tags: Optional[list[torch.Tensor]] = None
    # MoE routes given per sequence, [tokens, layers, top-k] (-1 or None: none given; the
    # rollout's, actor.routing_replay=rollout): the first pass under a key uses them
    routes: Optional[list[Optional[torch.Tensor]]] = None

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


def dp_slice(lengths: list[int], rank: int, size: int,
             units: list[tuple[list[int], int]] | None = None) -> list[int]:
    """Indices of this data-parallel rank's sequences: longest first, dealt greedily to the
    rank with the fewest tokens so far (ties to the lower rank), deterministic on all ranks.
    With ``units`` ((sequences that go together, their tokens): the prompt groups of shared
    prompts) whole units are dealt the same way, when there are at least as many as ranks."""
    if len(lengths) < size:
        raise ValueError(f"a mini-batch of {len(lengths)} sequences cannot feed {size} "
                         "data-parallel ranks; use more prompts per update")
    if units is None or len(units) < size:
        units = [([i], n) for i, n in enumerate(lengths)]
    loads = [0] * size
    owned: list[list[int]] = [[] for _ in range(size)]
    for members, tokens in sorted(units, key=lambda u: (-u[1], u[0][0])):
        r = min(range(size), key=lambda r: (loads[r], r))
        owned[r] += members
        loads[r] += tokens
    return sorted(owned[rank])


def micro_batches(indices: list[int], lengths: list[int], micro_batch_size: int,
                  max_tokens: int = 0, packed: bool = False) -> list[list[int]]:
    """``indices`` grouped into micro-batches of similar length, longest first: at most
    ``micro_batch_size`` sequences each and, with a token budget ``max_tokens`` > 0 (verl's
    dynamic batch size), at most that many tokens once padded to the micro-batch's longest
    sequence, or, ``packed``, end to end (a sequence longer than the budget goes alone). The
    loss is a sum over tokens divided by the mini-batch's count, so the grouping changes no
    result beyond float rounding."""
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        current = out[-1] if out else None
        if current and len(current) < micro_batch_size:
            tokens = sum(lengths[j] for j in current) + lengths[i] if packed \
                else (len(current) + 1) * lengths[current[0]]
            if not max_tokens or tokens <= max_tokens:
                current.append(i)
                continue
        out.append([i])
    return out


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` (micro-batches) cut until there are ``count`` of them or each holds one
    sequence: the one with the most sequences is halved first (its longest half first)."""
    out = [list(g) for g in groups]
    while len(out) < count and any(len(g) > 1 for g in out):
        i = max(range(len(out)), key=lambda k: (len(out[k]), -k))
        half = (len(out[i]) + 1) // 2
        out[i:i + 1] = [out[i][:half], out[i][half:]]
    return out


def prompt_groups(batch: "SequenceBatch", indices: list[int] | None = None) -> list[list[int]]:
    """``indices`` (default all) grouped by identical prompt tokens, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i in range(len(batch)) if indices is None else indices:
        groups.setdefault(tuple(batch.tokens[i][:batch.prompt_lengths[i]]), []).append(i)
    return list(groups.values())


def packed_tokens(batch: "SequenceBatch", members: list[int]) -> int:
    """Tokens of one packed row: the members' shared prompt once, then every response."""
    return batch.prompt_lengths[members[0]] + sum(batch.response_lengths()[i] for i in members)


def shared_micro_batches(batch: "SequenceBatch", indices: list[int], micro_batch_size: int,
                         max_tokens: int = 0) -> list[list[int]]:
    """``indices`` in micro-batches for ``collate_shared``: each prompt group's sequences, longest
    first, cut into pieces of at most ``micro_batch_size`` sequences and (with ``max_tokens``)
    at most that many packed tokens; pieces of different prompts, largest first, share a
    micro-batch while its sequences and its rows padded to the widest stay within the same
    limits."""
    lengths = [len(t) for t in batch.tokens]
    pieces = []
    for members in prompt_groups(batch, indices):
        piece: list[int] = []
        for i in sorted(members, key=lambda i: (-lengths[i], i)):
            if piece and (len(piece) == micro_batch_size or
                          max_tokens and packed_tokens(batch, piece + [i]) > max_tokens):
                pieces.append(piece)
                piece = []
            piece.append(i)
        pieces.append(piece)
    pieces.sort(key=lambda piece: (-packed_tokens(batch, piece), piece[0]))
    prompt = lambda i: tuple(batch.tokens[i][:batch.prompt_lengths[i]])  # noqa: E731
    out: list[list] = []  # [sequences, rows, widest row, prompts]
    for piece in pieces:
        if out and len(out[-1][0]) + len(piece) <= micro_batch_size and (
                not max_tokens or (out[-1][1] + 1) * out[-1][2] <= max_tokens) and \
                prompt(piece[0]) not in out[-1][3]:
            out[-1][0] += piece
            out[-1][1] += 1
            out[-1][3].add(prompt(piece[0]))
        else:
            out.append([list(piece), 1, packed_tokens(batch, piece), {prompt(piece[0])}])
    return [micro[0] for micro in out]


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
    tags: Optional[torch.Tensor] = None  # [b, s], aligned with loss_mask
    advantages: Optional[torch.Tensor] = None  # [b, 1]
    # loss_mask's positions as flat indices (row * s + column, in the mask's order) and their
    # count per row, made on the host (loss_positions)
    loss_index: Optional[torch.Tensor] = None
    loss_counts: Optional[list[int]] = None
    # shared prompts (collate_shared): tokens and positions are packed rows [r, w], the
    # attention mask [r, 1, w, w] (True: not allowed), and hidden_index the packed row (r * w +
    # column) of each loss-mask position, in loss_mask's order
    attention_mask: Optional[torch.Tensor] = None
    hidden_index: Optional[torch.Tensor] = None
    # packed sequences (collate_packed): tokens and positions [1, t], the sequences' bounds in the
    # row [b + 1] (int32, kept on the host; padding is one more sequence at the end), the longest
    # one's length, and hidden_index as above
    cu_seqlens: Optional[torch.Tensor] = None
    max_seqlen: int = 0
    # [b, s] like tokens: each slot's row in a pass's table of routes (routing.offsets: the
    # sequence's first row + its position), -1 for padding
    token_ids: Optional[torch.Tensor] = None


def collate(batch: SequenceBatch, index: list[int], device: torch.device,
            multiple: int = 1) -> MicroBatch:
    """Right-padded tensors of the sequences ``index``, as wide as the longest rounded up to a
    ``multiple`` (the TP size with sequence parallelism); tokens rejection dropped (``kept``)
    leave the loss mask."""
    width = -(-max(len(batch.tokens[i]) for i in index) // multiple) * multiple
    tokens = torch.zeros(len(index), width, dtype=torch.long)
    token_ids = torch.full((len(index), width), -1, dtype=torch.long)
    first = routing.offsets([len(t) for t in batch.tokens])
    mask = torch.zeros(len(index), width, dtype=torch.bool)
    aligned = {"old_logp": batch.old_logp, "ref_logp": batch.ref_logp, "weights": batch.weights,
               "tags": batch.tags}
    out = {k: torch.zeros(len(index), width) if v is not None else None for k, v in aligned.items()}
    for row, i in enumerate(index):
        ids, p = batch.tokens[i], batch.prompt_lengths[i]
        tokens[row, :len(ids)] = torch.tensor(ids)
        token_ids[row, :len(ids)] = first[i] + torch.arange(len(ids))
        mask[row, p - 1:len(ids) - 1] = True if batch.kept is None else batch.kept[i]
        for key, values in aligned.items():
            if values is not None:
                out[key][row, p - 1:len(ids) - 1] = values[i]
    labels = torch.roll(tokens, -1, dims=1)
    labels[:, -1] = 0
    positions = torch.arange(width).expand(len(index), width)
    micro = MicroBatch(index, tokens, positions, labels, mask, **out, token_ids=token_ids)
    micro.loss_index, micro.loss_counts = loss_positions(mask)
    if batch.advantages is not None:
        micro.advantages = batch.advantages[index].float().reshape(-1, 1)
    return to_device(micro, device)


def loss_positions(mask: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """(flat indices of a host [b, s] mask's True entries in row-major order, count per row)."""
    return mask.reshape(-1).nonzero()[:, 0], mask.sum(1).tolist()


def collate_shared(batch: SequenceBatch, index: list[int], device: torch.device,
                   multiple: int = 1) -> MicroBatch:
    """The sequences ``index`` with each prompt packed once (see the module's docstring): one
    row per prompt group, as wide as the widest rounded up to a ``multiple``; the loss side as
    ``collate`` makes it."""
    micro = collate(batch, index, torch.device("cpu"))
    rows = prompt_groups(batch, index)
    width = max(batch.prompt_lengths[m[0]] + sum(len(batch.tokens[i]) - batch.prompt_lengths[i]
                                                 for i in m) for m in rows)
    width = -(-width // multiple) * multiple
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    token_ids = torch.full((len(rows), width), -1, dtype=torch.long)
    first = routing.offsets([len(t) for t in batch.tokens])
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # padding sees itself
    source = torch.zeros(micro.loss_mask.shape, dtype=torch.long)
    row_of = {i: row for row, i in enumerate(index)}
    for r, members in enumerate(rows):
        p = batch.prompt_lengths[members[0]]
        tokens[r, :p] = torch.tensor(batch.tokens[members[0]][:p])
        positions[r, :p] = torch.arange(p)
        token_ids[r, :p] = first[members[0]] + torch.arange(p)  # routing.share_prompts
        allowed[r, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        start = p
        for i in members:
            response = batch.tokens[i][p:]
            n, stop = len(response), start + len(response)
            tokens[r, start:stop] = torch.tensor(response)
            positions[r, start:stop] = torch.arange(p, p + n)
            token_ids[r, start:stop] = first[i] + torch.arange(p, p + n)
            allowed[r, start:stop, :p] = True
            allowed[r, start:stop, start:stop] = torch.ones(n, n, dtype=torch.bool).tril()
            # the sequence's position p - 1 (the prompt's last) predicts its first response
            # token; its position p + t predicts token t + 1, from packed column start + t
            source[row_of[i], p - 1] = r * width + p - 1
            source[row_of[i], p:p + n - 1] = r * width + torch.arange(start, stop - 1)
            start = stop
    micro.tokens, micro.positions, micro.token_ids = tokens, positions, token_ids
    micro.attention_mask = ~allowed[:, None]
    micro.hidden_index = source[micro.loss_mask]
    return to_device(micro, device)


def collate_packed(batch: SequenceBatch, index: list[int], device: torch.device,
                   multiple: int = 1) -> MicroBatch:
    """The sequences ``index`` end to end in one row (THD, see the module's docstring), padded
    at the end to a ``multiple`` as one more sequence; the loss side as ``collate`` makes it."""
    micro = collate(batch, index, torch.device("cpu"))
    lengths = [len(batch.tokens[i]) for i in index]
    total = sum(lengths)
    padding = -total % multiple
    bounds = torch.tensor([0] + lengths + ([padding] if padding else []), dtype=torch.int32).cumsum(0)
    micro.tokens = torch.tensor([t for i in index for t in batch.tokens[i]] + [0] * padding)[None]
    micro.positions = torch.cat([torch.arange(n) for n in lengths + [padding]])[None]
    first = routing.offsets([len(t) for t in batch.tokens])
    micro.token_ids = torch.cat([first[i] + torch.arange(n) for i, n in zip(index, lengths)] +
                                [torch.full((padding,), -1)])[None]
    source = bounds[:len(index), None].long() + torch.arange(micro.loss_mask.shape[1])
    micro.hidden_index = source[micro.loss_mask]
    micro.cu_seqlens, micro.max_seqlen = bounds.int(), max(lengths + [padding])
    return to_device(micro, device)


def to_device(micro: MicroBatch, device: torch.device) -> MicroBatch:
    """``micro``'s tensors on ``device`` but ``cu_seqlens`` (the actor copies it for Transformer
    Engine), each copy queued without waiting for the device."""
    for key in ("tokens", "positions", "labels", "loss_mask", "old_logp", "ref_logp", "weights",
                "tags", "advantages", "attention_mask", "hidden_index", "loss_index", "token_ids"):
        value = getattr(micro, key)
        if value is not None:
            setattr(micro, key, value.to(device, non_blocking=True))
    return micro


def idle(mb: MicroBatch) -> MicroBatch:
    """A micro-batch of ``mb``'s shape with no loss token and no sequence: a forward and backward
    pass that changes no result (expert parallelism needs every rank to run as many)."""
    return dataclasses.replace(
        mb, index=[], loss_mask=torch.zeros_like(mb.loss_mask), loss_index=mb.loss_index[:0],
        token_ids=torch.full_like(mb.token_ids, -1),
        loss_counts=[], hidden_index=None if mb.hidden_index is None else mb.hidden_index[:0])
