"""MoE routing replay: the experts each token went to, recorded in one forward pass and forced
in another (``actor.routing_replay``; docs/models.md, "Routing replay").

Megatron-Core's top-k router asks each layer's ``router_replay`` object for its top-k
(``megatron.core.transformer.moe.router_replay``); ``LayerRoutes`` is that object here. Given a
token's experts (a row of ``target``; -1: none given) it routes the token there, the router's
probabilities gathered at those experts, so the router's weights still get a gradient; a token
with none given goes where the router sends it. Either way it keeps the experts used, and counts
how often the router's own choice was the one given.

The actor keeps, per micro-batch of a pass, each layer's experts in the router's order; a later
pass over the same micro-batches gives them back (``Actor._routed``). As a whole, routes are
[tokens, layers, top-k] integer tensors per sequence, row t the experts of the token at position
t: a pass's table holds a sequence's rows after those of the sequences before it (``offsets``),
a micro-batch's ``token_ids`` name each slot's row (-1: padding) and ``router_rows`` puts them
in the order the router sees its tokens.
"""

from __future__ import annotations

from itertools import accumulate

import torch


def route_dtype(num_experts: int) -> torch.dtype:
    """The narrowest signed type holding an expert's index and -1: 1 byte up to 128 experts."""
    return torch.int8 if num_experts <= 128 else torch.int16


class LayerRoutes:
    """One MoE layer's hook into Megatron-Core's top-k (see the module's docstring)."""

    def __init__(self):
        self.target = None  # [tokens, k] in the router's order, or None: the router's own
        self.used = None  # [tokens, k] the experts of the last forward
        self.counts = None  # [tokens given, tokens whose own choice was the one given]

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None,
                        default_compute_topk=None):
        values, index = default_compute_topk(scores, topk, num_groups=num_groups,
                                             group_topk=group_topk)
        if self.target is not None:
            target = self.target.to(device=index.device, dtype=index.dtype)
            given = target[:, 0] >= 0
            same = (index.sort(1).values == target.sort(1).values).all(1) & given
            counts = torch.stack([given.sum(), same.sum()])
            self.counts = counts if self.counts is None else self.counts + counts
            index = torch.where(given[:, None], target, index)
            values = scores.gather(1, index)
        self.used = index.detach()
        return values, index


def install(module) -> dict[int, LayerRoutes]:
    """A ``LayerRoutes`` in each MoE layer of this rank's ``module`` (a GPTModel shard), by the
    layer's index in the whole model (from 0)."""
    hooks = {}
    for layer in module.decoder.layers:
        router = getattr(layer.mlp, "router", None)
        if router is not None:
            router.router_replay = hooks[layer.layer_number - 1] = LayerRoutes()
    return hooks


def offsets(lengths: list[int]) -> list[int]:
    """Each sequence's first row in a pass's table."""
    return [0, *accumulate(lengths)][:-1]


def router_rows(token_ids: torch.Tensor, rank: int = 0, size: int = 1) -> torch.Tensor:
    """A micro-batch's [b, s] table rows in the router's token order: Megatron's [s, b] layout
    flattened, and under sequence parallelism over ``size`` ranks only rank ``rank``'s part of
    the sequence dimension."""
    rows = token_ids.T
    if size > 1:
        part = rows.shape[0] // size
        rows = rows[rank * part:(rank + 1) * part]
    return rows.reshape(-1)


def targets(table: torch.Tensor, rows: torch.Tensor, layer: int) -> torch.Tensor:
    """[tokens, k] experts of ``layer`` at table ``rows`` (-1 rows, padding: none given)."""
    return table[rows.clamp(min=0), layer].masked_fill((rows < 0)[:, None], -1)


def record(table: torch.Tensor, rows: torch.Tensor, used: dict[int, torch.Tensor]) -> None:
    """Each layer's experts ``used`` ([tokens, k] in the router's order) into ``table`` at
    ``rows`` (-1 rows, padding, left out)."""
    valid = rows >= 0
    for layer, experts in used.items():
        table[rows[valid], layer] = experts[valid].to(table.dtype)


def shared_prompt_routes(routes: list, lengths: list[int], groups: list[list[int]],
                         prompt_lengths: list[int]) -> list:
    """Routes per sequence (None: none) under shared prompts, where a prompt is computed once
    for a row of its group's sequences (routes recorded for the row's first sequence only, or
    given for some sequences only): each group's prompt routes, from its first sequence that
    has them all, given to every sequence of the group (one that had none gets -1 after it)."""
    out = list(routes)
    for members in groups:
        p = prompt_lengths[members[0]]
        source = next((routes[i][:p] for i in members
                       if routes[i] is not None and bool((routes[i][:p] >= 0).all())), None)
        if source is None:
            continue
        for i in members:
            mine = routes[i].clone() if routes[i] is not None else \
                torch.full((lengths[i], *source.shape[1:]), -1, dtype=source.dtype)
            mine[:p] = source
            out[i] = mine
    return out


def agreement(counts: torch.Tensor, name: str = "moe/route_agreement") -> dict[str, float]:
    """``name`` (all layers) and ``name_l{i}`` from [layers, 2] counts (tokens given experts,
    tokens whose router chose the same ones); layers without a given token are left out."""
    out = {}
    given, same = counts[:, 0], counts[:, 1]
    if given.sum() > 0:
        out[name] = float(same.sum() / given.sum())
    for layer in range(len(counts)):
        if given[layer] > 0:
            out[f"{name}_l{layer}"] = float(same[layer] / given[layer])
    return out
