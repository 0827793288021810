"""Off-policy correction (``algorithm.correction``) as pure functions.

The engine samples with its own numerics (and replayed answers were sampled by an older policy),
so the policy the tokens came from, the behaviour policy, is not quite the actor's policy before
the update (pi_old, whose log-probs the clipped surrogate uses). The semantics are verl's
"rollout correction" in its decoupled mode (verl's keys in brackets), with the ratio
rho_t = pi_old(t) / pi_behaviour(t) of each response token:

* importance weights, ``is_level`` [rollout_is]: ``token`` gives each token
  w_t = min(rho_t, C); ``sequence`` gives every token of a sequence min(prod_t rho_t, C);
  C = ``is_threshold`` [rollout_is_threshold]. With ``is_mode=mask`` a token whose rho_t is
  above C leaves the loss instead (AReaL's ``behav_imp_weight_cap``), and the others keep
  rho_t. Log-ratios are clamped to +-20 first (verl's safety bound). The weights multiply the
  clipped surrogate's token losses: with the ratio r_t = pi(t) / pi_old(t) against the proximal
  policy this is the decoupled loss, -w_t min(r_t A, clip(r_t) A), truncated as verl does
  (AReaL's masks: ``is_mode=mask``). ``is_level=auto`` (the
  default) is ``token`` under asynchronous rollout (``algorithm.max_staleness`` > 0), where
  tokens come from policies up to N versions old, and off otherwise (``config.py`` resolves it).
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

import dataclasses
import math
from collections import Counter
from typing import Optional

import torch

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
RS_LEVELS = ("token", "sequence", "geometric")
REPLAY_MODES = ("on_policy", "stored", "down_weight")
BASELINES = ("plain", "weighted")
BOUND = 20.0  # log-ratios are clamped to +-BOUND before exponentiating (verl's safety bound)


def sequence_correction(old: torch.Tensor, behaviour: torch.Tensor, is_level: Optional[str],
                        is_threshold: float, rs_level: Optional[str] = None,
                        rs_upper: Optional[float] = None, rs_lower: Optional[float] = None,
                        is_mode: str = "truncate"
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights, kept, raw ratios) for one response's tokens: the importance weights (1 without
    ``is_level``), truncated at the threshold or, ``is_mode=mask``, the tokens above it left
    out; the tokens kept (rejection's and the mask's); and the untruncated ratios the weights
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
    if is_mode not in IS_MODES:
        raise ValueError(f"importance mode {is_mode!r} is unknown; use one of {IS_MODES}")
    weights = raw.clamp(max=is_threshold) if is_level else raw
    kept = torch.ones_like(log_ratio, dtype=torch.bool)
    if is_level and is_mode == "mask":
        weights, kept = raw, raw <= is_threshold
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
        kept = kept & (measure >= math.log(lower)) & (measure <= math.log(upper))
    return weights.float(), kept, raw.float()


def active(cfg) -> bool:
    """Whether an ``algorithm.correction`` section changes any token's loss or advantage."""
    return cfg.is_level is not None or cfg.rs_level is not None or cfg.replay != "on_policy" \
        or cfg.baseline != "plain" or getattr(cfg, "m2_threshold", None) is not None


def m2_mask(log_ratios: list[torch.Tensor], threshold: float) -> tuple[list[torch.Tensor], float]:
    """M2PO's mask over a batch's tokens (one tensor of log(pi_old / pi_behaviour) per
    sequence): the tokens of largest squared log-ratio leave, largest first, until the mean
    square of the rest is at most ``threshold``; (kept per sequence, the batch's mean square
    before). A batch already within the threshold keeps every token."""
    squares = torch.cat([r.double() ** 2 for r in log_ratios]) if log_ratios else torch.zeros(0)
    if not len(squares):
        return [torch.ones(0, dtype=torch.bool) for _ in log_ratios], 0.0
    order = squares.argsort(descending=True)
    left = squares.sum() - torch.cat([torch.zeros(1, dtype=squares.dtype),
                                      squares[order].cumsum(0)])[:-1]
    # mean of what is left after leaving out the k largest, k = 0 .. n - 1
    means = left / torch.arange(len(squares), 0, -1, dtype=squares.dtype)
    k = int((means > threshold).long().cumprod(0).sum())  # the first k that satisfies it
    kept = torch.ones(len(squares), dtype=torch.bool)
    kept[order[:k]] = False
    return list(kept.split([len(r) for r in log_ratios])), squares.mean().item()


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
                                            cfg.rs_threshold_lower, cfg.is_mode)
        elif is_replay:
            factor = cfg.replay_weight if replay_mode == "down_weight" else 1.0
            w, k, raw = ones * factor, ones.bool(), ones * factor
        elif fresh_active and len(beh):
            w, k, raw = sequence_correction(logp, torch.tensor(beh), cfg.is_level,
                                            cfg.is_threshold, cfg.rs_level, cfg.rs_threshold,
                                            cfg.rs_threshold_lower, cfg.is_mode)
        else:
            w, k, raw = ones, ones.bool(), ones
        weights.append(w)
        kept.append(k)
        stats["replay" if is_replay else "fresh"].append((w, k, raw))
    out = {}
    fresh = [i for i, (beh, is_replay) in enumerate(zip(behaviour, replay))
             if not is_replay and len(beh)]
    if getattr(cfg, "m2_threshold", None) is not None and fresh:
        ratios = [old[i].detach().double().cpu() - torch.tensor(behaviour[i], dtype=torch.float64)
                  for i in fresh]
        masks, second_moment = m2_mask(ratios, cfg.m2_threshold)
        for i, mask in zip(fresh, masks):
            kept[i] = kept[i] & mask
        out = {"correction/fresh/m2": second_moment,
               "correction/fresh/m2_masked_fraction": 1 - torch.cat(masks).float().mean().item()}
    return weights, kept, {**_metrics(stats, cfg.is_threshold if cfg.is_level or replay_mode ==
                                      "stored" else None), **out}


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


# ---------------------------------------------------------------------- tools' observations

def model_tokens(samples: list, old: list) -> list:
    """``samples`` as the corrections see them: an observation token (a tool's output, the
    sample's ``mask`` False) gets its proximal log-prob as its behaviour one, ratio 1, so that
    no weight, sum or rejection of a sequence counts it. A sample without observations, or
    without old log-probs yet, is returned as it is."""
    out = []
    for s, logp in zip(samples, old):
        if not s.mask or logp is None or not s.logprobs:
            out.append(s)
            continue
        mask = torch.tensor(s.mask)
        behaviour = torch.where(mask, torch.tensor(s.logprobs, dtype=torch.float32),
                                logp.detach().float().cpu())
        out.append(dataclasses.replace(s, logprobs=tuple(behaviour.tolist())))
    return out


def without_observations(kept: Optional[list], samples: list) -> Optional[list]:
    """The kept-token masks with every observation token out of the loss and its token count
    (None stays None when no sample has observations)."""
    if not any(s.mask for s in samples):
        return kept
    out = []
    for i, s in enumerate(samples):
        k = torch.ones(len(s.response_ids), dtype=torch.bool) if kept is None else kept[i]
        out.append(k & torch.tensor(s.mask, dtype=torch.bool) if s.mask else k)
    return out


def model_parts(samples: list, old: list) -> tuple[list, list]:
    """(behaviour log-probs, actor log-probs) of the fresh answers' model tokens only, for
    ``loss.rollout_mismatch``: observations and replays have no behaviour of the engine's."""
    behaviour, actor = [], []
    for s, logp in zip(samples, old):
        if s.replay or not s.logprobs:
            behaviour.append(())
            actor.append(logp)
        elif s.mask:
            mask = torch.tensor(s.mask, dtype=torch.bool)
            behaviour.append(torch.tensor(s.logprobs)[mask].tolist())
            actor.append(logp.detach().float().cpu()[mask])
        else:
            behaviour.append(s.logprobs)
            actor.append(logp)
    return behaviour, actor


# ---------------------------------------------------------------------- staleness, measured

TAG_CLASSES = 8  # a fresh token's lag in versions, 0 to 6 (6: six or more), then replays
REPLAY_TAG = TAG_CLASSES - 1


def token_tags(samples: list, version: int) -> list[torch.Tensor]:
    """Each response token's class for the update's metrics by class: a fresh token's lag,
    ``version`` minus the version that sampled it (a synchronous answer's: 0), at most
    ``REPLAY_TAG - 1``; every replayed token ``REPLAY_TAG``."""
    out = []
    for s in samples:
        n = len(s.response_ids)
        if s.replay:
            out.append(torch.full((n,), float(REPLAY_TAG)))
        elif s.versions:
            out.append((version - torch.tensor(s.versions, dtype=torch.float32))
                       .clamp(0, REPLAY_TAG - 1))
        else:
            out.append(torch.zeros(n))
    return out


def class_sums(tags: torch.Tensor, cut: torch.Tensor, coefficient: torch.Tensor) -> torch.Tensor:
    """[3 * TAG_CLASSES] sums over a micro-batch's loss tokens by class (``tags``): the tokens,
    those whose gradient the clip cut (``cut``), and the others' gradient coefficient
    ``coefficient`` = |A| w r (the size of what a token's log-prob gradient is multiplied by)."""
    index = tags.long()
    out = torch.zeros(3, TAG_CLASSES, dtype=torch.float64, device=tags.device)
    out[0].index_add_(0, index, torch.ones_like(tags, dtype=torch.float64))
    out[1].index_add_(0, index, cut.double())
    out[2].index_add_(0, index, torch.where(cut, torch.zeros_like(coefficient), coefficient)
                      .double())
    return out.reshape(-1)


def class_metrics(by_class: list[torch.Tensor]) -> dict:
    """The step's updates' ``class_sums`` as metrics: per lag of fresh tokens, the share of
    tokens whose gradient the clip cut; for fresh and replayed tokens, their share of the
    gradient coefficient mass (what part of the update each source steers)."""
    if not by_class:
        return {}
    tokens, cut, mass = torch.stack(by_class).sum(0).reshape(3, TAG_CLASSES)
    out = {}
    for lag in range(REPLAY_TAG):
        if tokens[lag] > 0:
            out[f"stale/lag_{lag}/clip_fraction"] = (cut[lag] / tokens[lag]).item()
    if tokens[REPLAY_TAG] > 0:
        out["stale/replay/clip_fraction"] = (cut[REPLAY_TAG] / tokens[REPLAY_TAG]).item()
    total = mass.sum().item()
    if total > 0:
        out["stale/replay/gradient_share"] = mass[REPLAY_TAG].item() / total
        out["stale/fresh/gradient_share"] = 1.0 - out["stale/replay/gradient_share"]
    return out


def lag_metrics(samples: list, old: list, version: int, updates: list[list[int]],
                threshold: float) -> dict:
    """What staleness did to a step's batch, from the tokens trained:

    * the lag of each fresh token in versions (``version`` minus the one that sampled it) and
      in optimizer updates (the updates between the weights that sampled it and the weights it
      trains: its lag in versions times the step's updates, plus the updates of this step
      before its own; ``updates`` lists each update's sample indices, epochs included, and a
      token trained in two epochs counts twice): the mean, the largest and the share of
      tokens at each lag;
    * per lag in versions, how far the sampling policy is from the proximal one (the actor
      before the update, ``old``): the k3 estimate of KL(behaviour || proximal) per token, the
      mean ratio rho = pi_old / pi_behaviour and the share of tokens above ``threshold``;
    * the mean advantage of fresh and of replayed answers."""
    per_step = len(updates)
    versions, in_updates = Counter(), Counter()
    by_lag: dict[int, list[torch.Tensor]] = {}
    for u, index in enumerate(updates):
        for i in index:
            s = samples[i]
            if s.replay:
                continue
            lags = [version - v for v in s.versions] or [0] * len(s.response_ids)
            for lag in lags:
                in_updates[lag * per_step + u] += 1
            versions.update(lags)
    for i, s in enumerate(samples):
        if s.replay or not s.logprobs or old[i] is None:
            continue
        d = old[i].detach().float().cpu() - torch.tensor(s.logprobs, dtype=torch.float32)
        lags = torch.tensor([version - v for v in s.versions] if s.versions else
                            [0] * len(d))
        for lag in lags.unique().tolist():
            by_lag.setdefault(lag, []).append(d[lags == lag])
    out = {}
    for name, counts in (("versions", versions), ("updates", in_updates)):
        total = sum(counts.values())
        if not total:
            continue
        out[f"stale/lag_{name}_mean"] = sum(k * n for k, n in counts.items()) / total
        out[f"stale/lag_{name}_max"] = max(counts)
        for lag, n in sorted(counts.items()):
            out[f"stale/tokens_{name}_{lag}"] = n / total
    for lag, parts in sorted(by_lag.items()):
        d = torch.cat(parts).clamp(-BOUND, BOUND).double()
        out[f"stale/lag_{lag}/kl_behaviour_proximal"] = (d.exp() - 1 - d).mean().item()
        out[f"stale/lag_{lag}/is_ratio_mean"] = d.exp().mean().item()
        out[f"stale/lag_{lag}/above_threshold"] = (d.exp() > threshold).double().mean().item()
    for source, replay in (("fresh", False), ("replay", True)):
        values = [s.advantage for s in samples if s.replay == replay]
        if values:
            out[f"stale/{source}/advantage_mean"] = sum(values) / len(values)
    return out


def baseline_weights(samples: list, old: list, threshold: float) -> list[float]:
    """``baseline=weighted``: each answer's weight in its group's mean and spread. A fresh
    answer's is its sequence ratio pi_old / pi_behaviour (the proximal policy's probability of
    the whole answer over the sampling policy's) kept within [1 / C, C], C = ``threshold``, so
    that the group's baseline estimates the success rate of the policy being trained rather
    than of the older ones that sampled its answers; a replayed answer's, and one without
    behaviour log-probs, is 1."""
    out = []
    for s, logp in zip(samples, old):
        if s.replay or not s.logprobs or logp is None:
            out.append(1.0)
            continue
        d = (logp.detach().double().cpu() - torch.tensor(s.logprobs, dtype=torch.float64)).sum()
        out.append(float(d.clamp(-math.log(threshold), math.log(threshold)).exp()))
    return out
