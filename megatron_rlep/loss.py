"""The RLEP/DAPO objective as small pure functions (docs/method.md, "The objective").

* ``group_advantages``: A_i = (r_i - mean_g) / (std_g + eps) over each prompt's G' = G + M
  sequences, fresh and replayed alike (``normalize_std=False`` gives Dr. GRPO's r_i - mean_g).
* ``policy_token_loss``: the per-token clipped surrogate with clip-higher and dual clip,
  ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, bounded by ``-c A`` when A < 0.
* ``aggregate``: the mini-batch loss (token-mean, or verl's seq-mean modes) as a (sum, count)
  pair, so the mean is taken over the whole optimiser mini-batch - all micro-batches and
  data-parallel ranks - by summing both.

No Megatron, no distributed code: tensors in, tensors out.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, normalize_std: bool = True,
                     eps: float = 1e-6, weights: torch.Tensor | None = None,
                     replays: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence advantages normalised within groups.

    ``rewards[i]`` is sequence i's scalar reward and ``groups[i]`` its prompt's group id.
    The std is the unbiased (Bessel-corrected) one, as in the reference's GRPO estimator.
    A group of one sequence carries no comparison and gets advantage 0. With ``weights`` the
    group's mean and variance are weighted (sum_i w_i x_i / sum_i w_i; the variance's Bessel
    factor n / (n - 1) kept), which all weights 1 leave as they are. With ``replays`` (a mask)
    a replay's reward is centred on the mean of its group's other answers, the fresh ones,
    instead (on the group's mean where it has none), over the same spread: the other replays
    do not lift its baseline; the fresh answers' advantages are unchanged.
    """
    rewards = rewards.double()
    w = torch.ones_like(rewards) if weights is None else weights.double()
    _, index = torch.unique(groups, return_inverse=True)
    size = int(index.max()) + 1

    def per_group(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.float64).index_add_(0, index, values)
    n, total = per_group(torch.ones_like(rewards)), per_group(w)
    mean = per_group(w * rewards) / total
    centred = shifted = rewards - mean[index]
    if replays is not None:  # a replay's centre: its group's fresh answers' mean
        fresh = (~replays).double()
        count = per_group(fresh)
        centre = torch.where(count > 0, per_group(fresh * rewards) / count.clamp(min=1), mean)
        shifted = torch.where(replays, rewards - centre[index], centred)
    if not normalize_std:
        return torch.where(n[index] > 1, shifted, 0.0).float()
    var = per_group(w * centred**2) / total * n / (n - 1).clamp(min=1)
    advantages = shifted / (var.sqrt()[index] + eps)
    return torch.where(n[index] > 1, advantages, 0.0).float()


def policy_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float = 10.0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss of the clipped surrogate (DAPO clip-higher, dual clip).

    ``advantages`` broadcasts against the token tensors (one value per sequence). Returns the
    token losses, a mask of tokens whose ratio was clipped (the gradient is cut) and a mask of
    tokens bounded by the dual clip. ``dual_clip <= 1`` turns the dual clip off.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip > 1.0:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    else:
        dual = torch.zeros_like(was_clipped)
    return loss, was_clipped, dual


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    delta = (ref_logp - logp).clamp(-20.0, 20.0)
    return delta.exp() - delta - 1.0


LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(token_values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) whose ratio is the mini-batch loss; ``token_values`` and ``mask`` are
    [sequences, tokens].

    * ``token-mean``: sum over every response token / number of response tokens (DAPO).
    * ``seq-mean-token-mean``: each sequence's token mean, summed / number of sequences.
    * ``seq-mean-token-sum``: each sequence's token sum, summed / number of sequences.

    Summing the pairs over micro-batches and ranks before dividing gives the mean over the
    whole mini-batch, not a mean of per-micro-batch means (verl averages per micro-batch).
    Sequences without response tokens count in neither seq-mean mode.
    """
    masked = torch.where(mask, token_values, torch.zeros_like(token_values))
    lengths = mask.sum(-1)
    if mode == "token-mean":
        return masked.sum(), lengths.sum()
    if mode in LOSS_AGG_MODES:
        per_seq = masked.sum(-1)
        if mode == "seq-mean-token-mean":
            per_seq = per_seq / lengths.clamp(min=1)
        return per_seq.sum(), (lengths > 0).sum()
    raise ValueError(f"loss aggregation {mode!r} is unknown; use one of {', '.join(LOSS_AGG_MODES)}")


def rollout_mismatch(behaviour: list, actor: list) -> dict:
    """How far the engine's behaviour log-probs are from the actor's old log-probs, over the
    tokens of the samples that have them (fresh ones): mean and max of |diff|, and the k3
    estimate of KL(behaviour || actor) per token, E[exp(d) - 1 - d] with d = log p_actor -
    log p_behaviour (Schulman's estimator). The input of off-policy correction."""
    pairs = [(torch.tensor(b, dtype=torch.float32), a.detach().float().cpu())
             for b, a in zip(behaviour, actor) if len(b)]
    if not pairs:
        return {}
    for b, a in pairs:
        if len(b) != len(a):
            raise ValueError(f"{len(b)} behaviour log-probs for a response of {len(a)} tokens")
    d = torch.cat([a - b for b, a in pairs])
    return {"rollout/logp_diff_mean": d.abs().mean().item(),
            "rollout/logp_diff_max": d.abs().max().item(),
            "rollout/kl_k3": (d.exp() - 1 - d).mean().item()}
