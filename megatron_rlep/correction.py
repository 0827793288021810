"""Off-policy correction (``algorithm.correction``) as pure functions.

The engine samples with its own numerics (and replayed answers were sampled by an older policy),
so the policy the tokens came from, the behaviour policy, is not quite the actor's policy before
the update (pi_old, whose log-probs the clipped surrogate uses). The semantics are verl's
"rollout correction" in its decoupled mode (verl's keys in brackets), with the ratio
rho_t = pi_old(t) / pi_behaviour(t) of each response token:

* importance weights, ``is_level`` [rollout_is]: ``token`` gives each token
  w_t = min(rho_t, C); ``sequence`` gives every token of a sequence min(prod_t rho_t, C);
  C = ``is_threshold`` [rollout_is_threshold]. Log-ratios are clamped to +-20 first (verl's
  safety bound). The weights multiply the clipped surrogate's token losses.
* rejection, ``rs_level`` [rollout_rs]: ``token`` drops tokens whose rho_t lies outside
  [lower, upper]; ``sequence`` drops whole sequences by prod_t rho_t; ``geometric`` by
  exp(mean_t log rho_t). upper = ``rs_threshold`` [rollout_rs_threshold] (unset: C), lower =
  ``rs_threshold_lower`` [rollout_rs_threshold_lower] (unset: 1 / upper). Dropped tokens leave
  the loss mask, so they count in neither the sum nor the token count.

Replayed answers (``replay``) take one of three treatments:

* ``on_policy`` (RLEP, the paper): their old log-probs are the current policy's and nothing
  corrects them (weight 1, never rejected), as if the policy had sampled them now;
* ``stored``: the log-probs recorded when the answer was sampled (the pool keeps them) are their
  behaviour log-probs; the rules above apply, with token-level truncated IS where ``is_level``
  is unset;
* ``down_weight``: every replayed token's loss is scaled by ``replay_weight``.

No Megatron, no engine: tensors in, tensors out.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")
REPLAY_MODES = ("on_policy", "stored", "down_weight")
BOUND = 20.0  # log-ratios are clamped to +-BOUND before exponentiating (verl's safety bound)


def sequence_correction(old: torch.Tensor, behaviour: torch.Tensor, is_level: Optional[str],
                        is_threshold: float, rs_level: Optional[str] = None,
                        rs_upper: Optional[float] = None, rs_lower: Optional[float] = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights, kept, raw ratios) for one response's tokens: the truncated importance weights
    (1 without ``is_level``), the tokens rejection keeps, and the untruncated ratios the weights
    came from (for metrics)."""
    if old.shape != behaviour.shape:
        raise ValueError(f"{len(behaviour)} behaviour log-probs for a response of {len(old)} tokens")
    log_ratio = (old.double() - behaviour.double()).clamp(-BOUND, BOUND)
    if is_level == "token":
        raw = log_ratio.exp()
    elif is_level == "sequence":
        raw = log_ratio.sum().clamp(-BOUND, BOUND).exp().expand_as(log_ratio)
    elif is_level is None:
        raw = torch.ones_like(log_ratio)
    else:
        raise ValueError(f"importance level {is_level!r} is unknown; use one of {IS_LEVELS}")
    weights = raw.clamp(max=is_threshold) if is_level else raw
    kept = torch.ones_like(log_ratio, dtype=torch.bool)
    if rs_level is not None:
        upper = is_threshold if rs_upper is None else rs_upper
        lower = 1.0 / upper if rs_lower is None else rs_lower
        if rs_level == "token":
            measure = log_ratio
        elif rs_level == "sequence":
            measure = log_ratio.sum().clamp(-BOUND, BOUND).expand_as(log_ratio)
        elif rs_level == "geometric":
            measure = log_ratio.mean().expand_as(log_ratio)
        else:
            raise ValueError(f"rejection level {rs_level!r} is unknown; use one of {RS_LEVELS}")
        kept = (measure >= math.log(lower)) & (measure <= math.log(upper))
    return weights.float(), kept, raw.float()


def active(cfg) -> bool:
    """Whether an ``algorithm.correction`` section changes any token's loss."""
    return cfg.is_level is not None or cfg.rs_level is not None or cfg.replay != "on_policy"


def batch_correction(old: list[torch.Tensor], behaviour: list, replay: list[bool], cfg
                     ) -> tuple[Optional[list[torch.Tensor]], Optional[list[torch.Tensor]], dict]:
    """Per-sequence token weights and kept-token masks for a batch, and their metrics per source
    (``correction/{fresh,replay}/...``); (None, None, {}) when nothing is corrected.

    ``old`` are the actor's log-probs before the update, ``behaviour`` the engine's (fresh) or the
    stored ones (replays; empty where absent), ``cfg`` an ``algorithm.correction`` section."""
    fresh_active = cfg.is_level is not None or cfg.rs_level is not None
    replay_mode = cfg.replay
    if not active(cfg):
        return None, None, {}
    weights, kept, stats = [], [], {"fresh": [], "replay": []}
    for logp, beh, is_replay in zip(old, behaviour, replay):
        logp = logp.detach().float().cpu()
        ones = torch.ones_like(logp)
        if is_replay and replay_mode == "stored":
            if not len(beh):
                raise ValueError("algorithm.correction.replay=stored needs the pool's log-probs, "
                                 "but a replayed answer has none; rebuild the pool with "
                                 "tools/build_pool.py (it records them) or use on_policy")
            w, k, raw = sequence_correction(logp, torch.tensor(beh), cfg.is_level or "token",
                                            cfg.is_threshold, cfg.rs_level, cfg.rs_threshold,
                                            cfg.rs_threshold_lower)
        elif is_replay:
            factor = cfg.replay_weight if replay_mode == "down_weight" else 1.0
            w, k, raw = ones * factor, ones.bool(), ones * factor
        elif fresh_active and len(beh):
            w, k, raw = sequence_correction(logp, torch.tensor(beh), cfg.is_level,
                                            cfg.is_threshold, cfg.rs_level, cfg.rs_threshold,
                                            cfg.rs_threshold_lower)
        else:
            w, k, raw = ones, ones.bool(), ones
        weights.append(w)
        kept.append(k)
        stats["replay" if is_replay else "fresh"].append((w, k, raw))
    return weights, kept, _metrics(stats, cfg.is_threshold if cfg.is_level or replay_mode ==
                                   "stored" else None)


def _metrics(stats: dict, threshold: Optional[float]) -> dict:
    out = {}
    for source, rows in stats.items():
        if not rows:
            continue
        w, k, raw = (torch.cat([r[i] for r in rows]) for i in range(3))
        if not len(w):
            continue
        prefix = f"correction/{source}"
        out[f"{prefix}/is_weight_mean"] = w[k].mean().item() if k.any() else 0.0
        out[f"{prefix}/is_ratio_max"] = raw.max().item()
        out[f"{prefix}/truncated_fraction"] = (raw > threshold).float().mean().item() \
            if threshold is not None else 0.0
        out[f"{prefix}/rejected_fraction"] = 1.0 - k.float().mean().item()
    return out


def engine_old_logp(samples: list, later: list[int]) -> list:
    """``algorithm.old_logp=rollout``: per sample, the engine's log-probs as the old policy's for
    the fresh answers among ``later`` that have one for every response token; None for the rest
    (replayed answers, on-policy as RLEP treats them, and the first mini-batch), which the
    actor's forward pass gives."""
    old: list = [None] * len(samples)
    for i in later:
        s = samples[i]
        if not s.replay and s.logprobs and len(s.logprobs) == len(s.response_ids):
            old[i] = torch.tensor(s.logprobs, dtype=torch.float32)
    return old
