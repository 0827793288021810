"""A step's timeline at the paper's scale, simulated: synchronous, one-step-off and fully async RL.

    python benchmarks/async_timeline.py [--out docs/records/async] [--check]

What it is for: deciding on paper, before a GPU cluster is booked, what issue 48's placements
would give on the paper's run (Qwen2.5-Math-7B, 64 GPUs, 512 prompts x (16 fresh + 2 replayed)
answers of up to 3072 tokens), and at which rollout/training split: the synchronous colocated
trainer of today (all GPUs generate, then all train, then the weights go back into the engines),
one-step-off (R rollout GPUs generate batch k+1 while T = 64 - R train on batch k, then a
broadcast), and fully asynchronous with partial rollouts and streaming (the engines never drain:
new weights pause them, they load them and go on with their unfinished answers; the trainer takes
groups as they finish; an answer may span at most N versions). What it must not do: stand in for
a measurement. It is a model fed with published or measured costs (``PARAMETERS``, each with its
source), checked first against verl's published async results (``--check``); it names what it
fits. Writes ``OUT/async_timeline.json`` and ``OUT/async_timeline.png``.

The model, each part a small pure function below:

- answer lengths: a lognormal of a given mean and log-sd, clipped at the length limit, taken at
  its quantiles (i + 1/2) / n in a seeded order (``answer_lengths``);
- a decode step of one engine (tp GPUs) with b running answers holding c context tokens:
  t = t0 + (2P + kv c) / (tp BW eta_bw) + b 2P / (tp F eta_f): flat at small b (reading the
  weights), linear once the answers' products and KV reads outweigh it; prefill costs
  p 2P / (tp F eta_f) an answer; k steps at once in closed form (``decode_time``);
- continuous batching in one engine, finish by finish (``run_engine``); a synchronous batch lasts
  as long as its slowest engine, the one holding the batch's longest answer (``batch_generation``);
- streaming (fully async): an engine always holds C answers, so a running answer's mean context
  is the length-biased p + E[L^2] / (2 E[L]) (``streaming``); with the bound N the longest answer
  must finish within N steps, so a step lasts at least L_max t(C) / N; the engines' C is chosen
  per split (fewer answers at once make each step, so the tail, faster); resuming after new
  weights either keeps the KV cache or prefills it again (verl does the latter);
- training: tokens / (GPUs x tokens/s per GPU); weights: bytes / bandwidth + a latency a bucket.

A step: synchronous = generation + switch (reshard, wake and sleep the engines) + training;
one-step-off = broadcast + max(generation on R, training on T); fully async = broadcast (engines
paused) + max(streamed generation on R, training on T, the staleness floor). Each side's idle time
is the rest of the step. RLEP's M replays a group cost training tokens, no generation.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from statistics import NormalDist

import numpy as np

P_7B = 7.62e9  # Qwen2.5-(Math-)7B parameters (docs/scaling.md)
KV_BYTES = 2 * 28 * 4 * 128 * 2  # k and v x 28 layers x 4 kv heads x 128 x bf16 = 57,344 a token
ETA_BW, ETA_F = 0.8, 0.5  # achieved share of HBM bandwidth / of bf16 peak in decode (assumed)
RESERVE = 4e9  # vLLM's own reserve per GPU before its KV cache (docs/scaling.md: 4.1 GiB at 7B)
SIGMA = 0.75  # log-sd of answer lengths: MATH-500's reference solutions (data/eval/math500.jsonl)


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm: float  # bytes/s
    flops: float  # dense bf16 FLOP/s
    memory: float  # bytes


H20 = Gpu("H20", 4.0e12, 148e12, 96e9)
H800 = Gpu("H800", 3.35e12, 989e12, 80e9)  # an H100 SXM's HBM and compute, slower NVLink


@dataclass(frozen=True)
class Setup:
    """One RL job: its batch, lengths, hardware and costs."""
    name: str
    gpu: Gpu
    prompts: int  # B
    answers: int  # G fresh answers a prompt
    replays: int  # M replayed answers a prompt (RLEP): trained, not generated
    prompt_tokens: int
    max_len: int
    mean_len: float  # of the lognormal before clipping
    tp: int = 1  # rollout tensor parallelism
    t0: float = 0.0  # fixed seconds a decode step (kernel launches, scheduling)
    max_num_seqs: int = 1024
    mem_colocated: float = 0.5  # vLLM's share of a GPU beside the actor
    mem_alone: float = 0.9  # on a rollout-only GPU
    train_rate: float = 2000.0  # trained tokens/s per GPU, colocated
    train_rate_alone: float = 0.0  # on training-only GPUs (0: the same)
    switch_s: float = 5.0  # colocated: reshard weights, wake and sleep the engines
    other_s: float = 0.0  # on every step's critical path in every mode (reward, bookkeeping)
    sync_gbps: float = 25.0  # broadcast bandwidth to the engines, GB/s
    bucket_bytes: float = 1 << 30
    bucket_latency: float = 0.005
    in_flight: float = 3.0  # fully async: answers in flight at most, in batches (1 + N)
    recompute_kv: bool = False  # fully async: answers resumed after new weights are prefilled again
    max_staleness: int = 2  # fully async: versions an answer may span (0: unbounded, as verl's)


@cache
def normal_quantiles(n: int) -> np.ndarray:
    return np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])


def answer_lengths(mean: float, sigma: float, max_len: int, n: int, seed: int = 0) -> np.ndarray:
    """n answer lengths: a lognormal with this mean and log-sd at its quantiles (i + 1/2) / n,
    clipped at max_len, in a seeded random order."""
    mu = math.log(mean) - sigma ** 2 / 2
    lengths = np.clip(np.round(np.exp(mu + sigma * normal_quantiles(n))), 1, max_len)
    return np.random.default_rng(seed).permutation(lengths)


def step_coefficients(s: Setup) -> tuple[float, float, float, float]:
    """(fixed, per answer, per context token, per prompt token) seconds of an engine's step."""
    bw, f = s.tp * s.gpu.hbm * ETA_BW, s.tp * s.gpu.flops * ETA_F
    return s.t0 + 2 * P_7B / bw, 2 * P_7B / f, KV_BYTES / bw, 2 * P_7B / f


def decode_time(s: Setup, b: int, ctx: float, k: int) -> float:
    """k decode steps of b answers holding ctx context tokens at the first (+ b tokens a step)."""
    fixed, per_answer, per_ctx, _ = step_coefficients(s)
    return k * (fixed + b * per_answer) + per_ctx * (k * ctx + b * k * (k - 1) / 2)


def kv_tokens(s: Setup, mem: float) -> float:
    """Tokens an engine's KV cache holds: its share of tp GPUs less the weights and vLLM's reserve."""
    return (s.tp * (s.gpu.memory * mem - RESERVE) - 2 * P_7B) / KV_BYTES


def run_engine(s: Setup, lengths: np.ndarray, concurrency: int) -> np.ndarray:
    """Finish time of every answer of one engine: continuous batching of up to `concurrency`
    answers, admitted in order (each paying its prefill), k steps at a time between finishes.
    An answer admitted at decode step g ends at step g + L; the running context is
    b (p + g) - (sum of the running answers' admission steps)."""
    *_, per_prompt = step_coefficients(s)
    finish, ends, t, g, admitted = np.zeros(len(lengths)), [], 0.0, 0, 0
    nxt = 0
    while True:
        while len(ends) < concurrency and nxt < len(lengths):
            heapq.heappush(ends, (g + int(lengths[nxt]), g, nxt))
            admitted, nxt, t = admitted + g, nxt + 1, t + s.prompt_tokens * per_prompt
        if not ends:
            return finish
        b, end = len(ends), ends[0][0]
        t += decode_time(s, b, b * (s.prompt_tokens + g) - admitted, end - g)
        g = end
        while ends and ends[0][0] == g:
            _, start, i = heapq.heappop(ends)
            finish[i], admitted = t, admitted - start


def concurrency(s: Setup, mem: float, mean_context: float) -> int:
    """Answers an engine runs at once: vLLM's max_num_seqs, or what its KV cache holds."""
    return max(1, min(s.max_num_seqs, int(kv_tokens(s, mem) / mean_context)))


def batch_generation(s: Setup, gpus: int, lengths: np.ndarray, mem: float) -> float:
    """Seconds to generate a whole batch on `gpus`: its answers dealt to the engines longest
    first, round robin; the slowest engine (the one with the longest answer) sets the time."""
    engines = gpus // s.tp
    mine = np.sort(lengths)[::-1][::engines]
    mine = np.random.default_rng(1).permutation(mine)
    c = concurrency(s, mem, s.prompt_tokens + lengths.mean())
    return float(run_engine(s, mine, c).max())


def streaming(s: Setup, gpus: int, lengths: np.ndarray) -> tuple[float, float, float]:
    """(generated tokens/s, seconds a decode step, seconds to prefill the running answers again)
    of `gpus` whose engines never drain (fully async): each engine holds C answers of mean
    context p + E[L^2] / (2 E[L]) (a running answer is length-biased); C is vLLM's max_num_seqs,
    what the KV cache holds, or the answers allowed in flight (in_flight x a batch)."""
    engines = gpus // s.tp
    running = s.prompt_tokens + (lengths ** 2).mean() / (2 * lengths.mean())
    c = min(concurrency(s, s.mem_alone, running), s.in_flight * s.prompts * s.answers / engines)
    *_, per_prompt = step_coefficients(s)
    a_step = decode_time(s, c, c * running, 1)
    rate = engines / (a_step / c + s.prompt_tokens * per_prompt / lengths.mean())
    return rate, a_step, c * running * per_prompt if s.recompute_kv else 0.0


def broadcast_s(s: Setup) -> float:
    """The actor's bf16 weights to the engines: bytes / bandwidth + a latency per bucket."""
    nbytes = 2 * P_7B
    return nbytes / (s.sync_gbps * 1e9) + math.ceil(nbytes / s.bucket_bytes) * s.bucket_latency


def train_tokens(s: Setup, lengths: np.ndarray) -> float:
    """Tokens of a step's update: B x (G + M) sequences of prompt + answer (replays as long)."""
    return s.prompts * (s.answers + s.replays) * (s.prompt_tokens + lengths.mean())


def train_s(s: Setup, gpus: int, lengths: np.ndarray, alone: bool) -> float:
    """Seconds of a step's update (and its old log-probs) on `gpus` training GPUs."""
    rate = (s.train_rate_alone or s.train_rate) if alone else s.train_rate
    return train_tokens(s, lengths) / (gpus * rate)


def stale_share(lengths: np.ndarray, a_step: float, step_s: float, n: int) -> float:
    """Share of answers that take over n steps to generate (a decode step adds one token to each
    running answer): with partial rollouts their first tokens are more than n versions old."""
    return float((lengths * a_step > n * step_s).mean())


def step(phases: dict) -> dict:
    """A step's time and each side's idle time from its phases (disaggregated: they overlap)."""
    if phases["mode"] == "synchronous":
        total = phases["generate"] + phases["switch"] + phases["train"] + phases["other"]
        return {**phases, "step": total, "rollout_idle": total - phases["generate"],
                "trainer_idle": total - phases["train"]}
    busy = max(phases["generate"], phases["train"], phases.get("staleness_floor", 0.0) - phases["sync"])
    return {**phases, "step": phases["sync"] + busy + phases["other"],
            "rollout_idle": busy - phases["generate"], "trainer_idle": busy - phases["train"]}


def simulate(s: Setup, mode: str, gpus: int, rollout_gpus: int = 0) -> dict:
    """One steady-state step of `mode` on `gpus` GPUs, `rollout_gpus` of them generating.
    Fully async scores each group as it finishes, off the trainer's path (other_s not paid)."""
    lengths = answer_lengths(s.mean_len, SIGMA, s.max_len, s.prompts * s.answers)
    base = {"mode": mode, "gpus": gpus, "rollout_gpus": rollout_gpus, "other": s.other_s,
            "mean_answer": float(lengths.mean()), "max_answer": float(lengths.max())}
    if mode == "synchronous":
        return step({**base, "generate": batch_generation(s, gpus, lengths, s.mem_colocated),
                     "switch": s.switch_s, "train": train_s(s, gpus, lengths, alone=False)})
    base["sync"] = broadcast_s(s)
    train = train_s(s, gpus - rollout_gpus, lengths, alone=True)
    if mode == "one-step-off":
        return step({**base, "generate": batch_generation(s, rollout_gpus, lengths, s.mem_alone),
                     "train": train})
    rate, a_step, refill = streaming(s, rollout_gpus, lengths)
    floor = lengths.max() * a_step / s.max_staleness if s.max_staleness else 0.0
    result = step({**base, "other": 0.0, "generate": lengths.sum() / rate + refill, "train": train,
                   "refill": refill, "staleness_floor": floor})
    over = {n: stale_share(lengths, a_step, result["step"], n) for n in range(1, 9)}
    return {**result, "over_1_version": over[1], "over_2_versions": over[2],
            "staleness_needed": min([n for n, share in over.items() if share < 0.01], default=9)}


def timeline(r: dict, steps: int = 3) -> list[tuple[str, str, float, float]]:
    """(lane, phase, start, end) of `steps` steady steps of a simulated mode, for the picture;
    a disaggregated run starts with its first batch generated alone."""
    out, t = [], 0.0
    if r["mode"] == "synchronous":
        for _ in range(steps):
            for phase in ("generate", "switch", "train", "other"):
                out.append(("all GPUs", phase, t, t + r[phase]))
                t += r[phase]
        return [o for o in out if o[3] > o[2]]
    out += [("rollout", "generate", 0.0, r["generate"]), ("trainer", "idle", 0.0, r["generate"])]
    t = r["generate"]
    busy = r["step"] - r["sync"] - r["other"]
    for _ in range(steps):
        out += [("rollout", "sync", t, t + r["sync"]), ("trainer", "sync", t, t + r["sync"])]
        t += r["sync"]
        out += [("rollout", "generate", t, t + r["generate"]), ("rollout", "idle", t + r["generate"], t + busy),
                ("trainer", "train", t, t + r["train"]), ("trainer", "idle", t + r["train"], t + busy)]
        t += busy + r["other"]
    return [o for o in out if o[3] > o[2]]


def solve(f, target: float, lo: float, hi: float, iterations: int = 22) -> float:
    """x in [lo, hi] with f(x) = target, by bisection (f monotone)."""
    below = f(lo) < target
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (f(mid) < target) == below else (lo, mid)
    return (lo + hi) / 2


# -- verl's published async results (seconds a step), the check ------------------------------
ONE_STEP_OFF = {  # verl docs/advance/one_step_off.md, the Megatron rows: 2 nodes x 8 H20
    "colocated": {"gpus": 16, "step": 699, "gen": 207, "generate_sequences": 162,
                  "old_log_prob": 119, "update_actor": 344, "total_h": 18 + 21 / 60},
    "one-step-off": {"gpus": 16, "rollout_gpus": 4, "step": 566, "wait_prev_gen": 59,
                     "generate_sequences": 501, "old_log_prob": 120, "update_actor": 347,
                     "total_h": 13 + 6 / 60},
}
FULLY_ASYNC = {  # verl docs/advance/fully_async.md, the 7B table (H20, 28K answers), per GPUs
    "colocated": {32: {"step": 790.10, "gen": 357.41, "old_log_prob": 107.71, "update_actor": 269.80},
                  64: {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41},
                  128: {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81}},
    "fully-async": {32: {"step": 294.77, "update_actor": 313.81}, 64: {"step": 189.26, "update_actor": 156.98},
                    128: {"step": 150.63, "update_actor": 113.16}},
    "speedup_400_steps": {32: 2.66, 64: 1.92, 128: 2.35},
}
# the recipes (verl/experimental/*/shell/dapo_7b_math_*): 512 prompts, tp 2 (8K) / 4 (28K)
# engines at 0.8 of an H20; n = 12 in the one-step-off recipe (its rule: n divides the 12
# trainers); verl's rollout defaults of July 2025: enforce_eager, max_num_seqs 1024; its partial
# rollout cancels the running requests at a weight sync and resubmits prompt + partial answer
# (vllm_async_server.py, partial_single_turn_agent_loop.py): the KV cache is prefilled again
VERL_8K = Setup("verl one-step-off", H20, 512, 12, 0, 200, 8192, 1000.0, tp=2, mem_colocated=0.8,
                mem_alone=0.8, switch_s=207 - 162, other_s=699 - 207 - 119 - 344, sync_gbps=50)
VERL_28K = Setup("verl fully async", H20, 512, 16, 0, 200, 28 * 1024, 3000.0, tp=4, mem_colocated=0.8,
                 mem_alone=0.8, switch_s=0.0, in_flight=1.5, recompute_kv=True, max_staleness=0,
                 bucket_bytes=4 << 30)


def generation(s: Setup, gpus: int) -> float:
    """Seconds to generate s's batch at once on `gpus` (engines at verl's 0.8 of a GPU)."""
    lengths = answer_lengths(s.mean_len, SIGMA, s.max_len, s.prompts * s.answers)
    return batch_generation(s, gpus, lengths, s.mem_colocated)


def with_train_rates(s: Setup, gpus: int, colocated_s: float, trainers: int, alone_s: float) -> Setup:
    """The setup whose update takes the published seconds on each placement's GPUs."""
    tokens = train_tokens(s, answer_lengths(s.mean_len, SIGMA, s.max_len, s.prompts * s.answers))
    return replace(s, train_rate=tokens / (gpus * colocated_s), train_rate_alone=tokens / (trainers * alone_s))


def calibrate_verl() -> Setup:
    """What verl's one-step-off page leaves free: the decode step's fixed cost t0 and the mean
    answer length, fitted to both of its generation times (16 GPUs colocated, 4 rollout GPUs)."""
    pub = ONE_STEP_OFF

    def mean_for(t0: float) -> float:
        return solve(lambda m: generation(replace(VERL_8K, t0=t0, mean_len=m), 16),
                     pub["colocated"]["generate_sequences"], 200, 8000)

    t0 = solve(lambda t: generation(replace(VERL_8K, t0=t, mean_len=mean_for(t)), 4),
               pub["one-step-off"]["generate_sequences"], 0.0, 0.03, 14)
    return with_train_rates(replace(VERL_8K, t0=t0, mean_len=mean_for(t0)), 16,
                            pub["colocated"]["old_log_prob"] + pub["colocated"]["update_actor"], 12,
                            pub["one-step-off"]["old_log_prob"] + pub["one-step-off"]["update_actor"])


def check(s8: Setup) -> list[dict]:
    """Published against simulated: seconds a step and the async speedup. One-step-off: s8 as
    fitted. Fully async: t0 from s8; each row's mean answer length (not published) fitted to its
    synchronous generation time, its update times as published; the async step is predicted."""
    pub, rows = ONE_STEP_OFF, []
    sync, off = simulate(s8, "synchronous", 16), simulate(s8, "one-step-off", 16, 4)
    rows.append({"setup": "one-step-off, Megatron, 16 H20, 8K answers, 4 rollout / 12 train",
                 "mean_answer": sync["mean_answer"],
                 "published_sync_step": pub["colocated"]["step"], "simulated_sync_step": sync["step"],
                 "published_async_step": pub["one-step-off"]["step"], "simulated_async_step": off["step"],
                 "published_speedup": pub["colocated"]["total_h"] / pub["one-step-off"]["total_h"],
                 "published_step_speedup": pub["colocated"]["step"] / pub["one-step-off"]["step"],
                 "simulated_speedup": sync["step"] / off["step"], "simulated_trainer_idle": off["trainer_idle"]})
    for gpus in (32, 64, 128):
        col, fa = FULLY_ASYNC["colocated"][gpus], FULLY_ASYNC["fully-async"][gpus]
        s = replace(VERL_28K, t0=s8.t0, other_s=col["step"] - col["gen"] - col["old_log_prob"] - col["update_actor"])
        s = replace(s, mean_len=solve(lambda m, s=s, gpus=gpus: generation(replace(s, mean_len=m), gpus),
                                      col["gen"], 200, 20000))
        s = with_train_rates(s, gpus, col["old_log_prob"] + col["update_actor"], gpus // 2, fa["update_actor"])
        sync, full = simulate(s, "synchronous", gpus), simulate(s, "fully-async", gpus, gpus // 2)
        rows.append({"setup": f"fully async, FSDP2, {gpus} H20, 28K answers, {gpus // 2} / {gpus // 2}",
                     "mean_answer": sync["mean_answer"],
                     "published_sync_step": col["step"], "simulated_sync_step": sync["step"],
                     "published_async_step": fa["step"], "simulated_async_step": full["step"],
                     "published_speedup": FULLY_ASYNC["speedup_400_steps"][gpus],
                     "published_step_speedup": col["step"] / fa["step"],
                     "simulated_speedup": sync["step"] / full["step"],
                     "simulated_trainer_idle": full["trainer_idle"],
                     "simulated_speedup_kv_kept": sync["step"] / simulate(replace(s, recompute_kv=False),
                                                                          "fully-async", gpus, gpus // 2)["step"]})
    return rows


# -- the paper's run ----------------------------------------------------------------------------
PAPER_STEP_S, PAPER_REPLAY_S = 160.0, 5.0  # the RLEP paper: a DAPO-nodyn-bs64 step about 160 s;
# RLEP's 2 replays a group add under 5 s: the update of 16 fresh answers a group takes <= 8 x 5 s
SPLITS = tuple(range(4, 61, 4))  # rollout GPUs of 64
# this project's update at Qwen2.5-Math-7B's width (19 of its 28 layers), one H200, local specs
# (docs/records/gpu/gpu_update_h200_qwen2.5-math-7b-slice.json)
MEASURED_MFU = 0.501


def paper_setup(mean_len: float, train_s: float | None = 40.0, switch_s: float = 5.0,
                t0: float | None = None, mfu: float | None = None) -> Setup:
    """The paper's baseline on 8 x 8 H800 (RLEP's recipe: rollout tp 1, vLLM at 0.8 with the
    actor offloaded, enforce_eager, max_num_seqs 1024), its update taking `train_s` seconds on
    64 GPUs (or running at `mfu`, 8P FLOPs a token: update and old log-probs), and t0 fitted so
    that the synchronous step takes the paper's 160 s (unless given)."""
    s = Setup("paper", H800, 512, 16, 0, 200, 3072, mean_len, mem_colocated=0.8, mem_alone=0.9,
              switch_s=switch_s)
    lengths = answer_lengths(mean_len, SIGMA, s.max_len, s.prompts * s.answers)
    if mfu is not None:
        s = replace(s, train_rate=mfu * H800.flops / (8 * P_7B))
    elif train_s is not None:
        s = replace(s, train_rate=train_tokens(s, lengths) / (64 * train_s))
    if t0 is None:
        t0 = solve(lambda t: simulate(replace(s, t0=t), "synchronous", 64)["step"], PAPER_STEP_S, 0.0, 0.2)
    s = replace(s, t0=t0)
    if train_s is None and mfu is None:  # the rest of the paper's 160 s is the update
        rest = PAPER_STEP_S - simulate(replace(s, train_rate=1e30), "synchronous", 64)["step"]
        s = replace(s, train_rate=train_tokens(s, lengths) / (64 * rest))
    return s


def best_concurrency(s: Setup, mode: str, rollout_gpus: int) -> dict:
    """A split's step with the engines' max_num_seqs that makes it shortest: fewer answers at once
    make each decode step, so the longest answer, faster (what bounded staleness needs)."""
    if mode != "fully-async":
        return simulate(s, mode, 64, rollout_gpus)
    runs = [{**simulate(replace(s, max_num_seqs=c), mode, 64, rollout_gpus), "max_num_seqs": c}
            for c in (64, 128, 256, 512, 1024)]
    return min(runs, key=lambda r: r["step"])


def sweep(s: Setup) -> dict:
    """RLEP (M = 2) on 64 GPUs: synchronous, and both disaggregated modes over the splits."""
    rlep = replace(s, replays=2)
    sync = simulate(rlep, "synchronous", 64)
    variants = {"one-step-off": ("one-step-off", rlep), "fully async, N = 2": ("fully-async", rlep),
                "fully async, N = 2, KV prefilled again": ("fully-async", replace(rlep, recompute_kv=True)),
                "fully async, N unbounded": ("fully-async", replace(rlep, max_staleness=0))}
    modes = {name: [best_concurrency(v, mode, r) for r in SPLITS] for name, (mode, v) in variants.items()}
    best = {m: max(rows, key=lambda r: sync["step"] / r["step"]) for m, rows in modes.items()}
    mfu = 8 * P_7B * s.train_rate / H800.flops
    return {"t0_ms": 1e3 * s.t0, "update_mfu": mfu, "synchronous": sync, "modes": modes,
            "best": {m: {"rollout_gpus": r["rollout_gpus"], "step": r["step"], "speedup": sync["step"] / r["step"]}
                     for m, r in best.items()}}


def paper_scenarios(mean_len: float, t0_verl: float) -> dict:
    """The central reading of the paper's 160 s and three others that bracket it."""
    return {
        "central: update 40 s (from the replays' < 5 s), switch 5 s, t0 fitted to 160 s":
            sweep(paper_setup(mean_len)),
        "update-heavy: t0 as fitted to verl, the rest of 160 s the update":
            sweep(paper_setup(mean_len, train_s=None, t0=t0_verl)),
        "switch 45 s (verl's Megatron colocated, measured), update 40 s, t0 fitted":
            sweep(paper_setup(mean_len, switch_s=45.0)),
        "this project's update as measured (MFU 50.1%), t0 of the central reading":
            sweep(paper_setup(mean_len, mfu=MEASURED_MFU, t0=paper_setup(mean_len).t0)),
    }


PARAMETERS = [  # (name, value, source); the fitted ones are filled in by main()
    ("Qwen2.5-Math-7B parameters P", "7.62e9", "its config; docs/scaling.md"),
    ("KV cache a token", "57,344 bytes", "its config: 28 layers x 4 KV heads x 128 x (k, v) x bf16"),
    ("H800 (= H100 SXM) HBM, bf16 dense, memory", "3.35 TB/s, 989 TFLOP/s, 80 GB", "NVIDIA H100 datasheet"),
    ("H20 HBM, bf16 dense, memory", "4.0 TB/s, 148 TFLOP/s, 96 GB", "NVIDIA H20 datasheet"),
    ("achieved share of HBM / of bf16 peak in decode and prefill", f"{ETA_BW} / {ETA_F}",
     "assumed (not measured here); t0 and the lengths are fitted around them"),
    ("vLLM's reserve before its KV cache", "4 GB a GPU", "docs/scaling.md (4.1 GiB at 7B)"),
    ("answer lengths' log-sd", f"{SIGMA}", ("MATH-500's reference solutions, data/eval/math500.jsonl "
                                             "(std of log length 0.746); Qwen2.5-Math-7B's own spread not published")),
    ("prompt", "200 tokens", "assumed (DAPO-Math-17k prompts with the DAPO template; limit 1024)"),
    ("engine concurrency", "max_num_seqs 1024, or what the KV cache holds",
     "verl's rollout defaults (commit 503ea75f5, July 2025; RLEP's fork: enforce_eager, 1024)"),
    ("weight broadcast", "25 GB/s, 1 GiB buckets, 5 ms a bucket: 0.7 s for 7B",
     "assumed (half of a 400 Gb/s NIC); verl reports under 300 ms for 7B (one_step_off.md)"),
    ("paper: B, G, M, answer limit, GPUs", "512, 16, 2, 3072, 8 x 8", "docs/method.md; conf/experiment/"),
    ("paper: step, replays' cost", "about 160 s; under 5 s more", "RLEP paper, sections 4.1 and 4.2"),
    ("paper: GPU, rollout tp, vLLM memory", "H800 (assumed), 1, 0.8 (0.9 rollout-only)",
     "the paper names no GPU; RLEP's recipe/rlep/dapo_nodyn_bs_64.sh"),
    ("paper: colocated switch (reshard, wake, sleep)", "5 s", "assumed; verl measured 45 s (Megatron, H20)"),
    ("this project's update", f"MFU {MEASURED_MFU:.1%}",
     ("benchmarks/gpu_update.py on one H200: Qwen2.5-Math-7B's width with 19 of its 28 layers, "
      "local specs, 131,072 tokens an update, attention FLOPs counted (its update takes 7P a token, "
      "the old log-probs of one mini-batch of two; charged 8P here, so the update is 14% slow)")),
    ("paper: t0 and the update's tokens/s", "per reading of the 160 s (paper table: t0, MFU)",
     "fitted: the synchronous step = 160 s; the update from the replays' cost or the rest of the step"),
]


def plot(result: dict, path: Path) -> None:
    """Left: speedup over synchronous per mode against the split (central reading); right: three
    steps of the synchronous trainer and of the best split of each disaggregated mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    central = next(iter(result["paper"].values()))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 1.6]})
    sync = central["synchronous"]["step"]
    for mode, rows in central["modes"].items():
        left.plot([r["rollout_gpus"] for r in rows], [sync / r["step"] for r in rows], marker="o", ms=3, label=mode)
    left.axhline(1, color="black", lw=1, label="synchronous, colocated")
    left.axhline(2, color="grey", ls="--", lw=1, label="the issue's goal: 2x")
    left.set_xlabel("rollout GPUs (of 64; the rest train)")
    left.set_ylabel("speedup a step over synchronous")
    left.set_title("RLEP, Qwen2.5-Math-7B, 64 H800 (simulated)", fontsize=10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    colors = {"generate": "tab:blue", "train": "tab:orange", "switch": "tab:red", "sync": "tab:red",
              "idle": "lightgrey", "other": "tab:purple"}
    lanes = [("synchronous", "all GPUs", central["timeline"]["synchronous"])]
    for mode in ("one-step-off", "fully async, N = 2"):
        best = central["best"][mode]["rollout_gpus"]
        for lane in ("rollout", "trainer"):
            lanes.append((f"{mode} {best}/{64 - best}", lane, central["timeline"][mode]))
    for y, (mode, lane, spans) in enumerate(lanes):
        for name, phase, start, end in spans:
            if name == lane:
                right.barh(y, end - start, left=start, color=colors[phase], edgecolor="white", lw=0.3)
    right.set_yticks(range(len(lanes)), [f"{m}: {lane}" for m, lane, _ in lanes], fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("seconds")
    right.set_title("three steps (after the first batch); blue generate, orange train, red sync, grey idle",
                    fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check_table(rows: list[dict]) -> str:
    lines = [("| setup | mean answer (fitted) | sync step: published / simulated | async step: published / "
              "simulated | speedup: published (steps) / simulated |"), "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setup']} | {r['mean_answer']:.0f} | {r['published_sync_step']:.0f} / "
                     f"{r['simulated_sync_step']:.0f} | {r['published_async_step']:.0f} / "
                     f"{r['simulated_async_step']:.0f} | {r['published_speedup']:.2f}x ({r['published_step_speedup']:.2f}x) / "
                     f"{r['simulated_speedup']:.2f}x |")
    return "\n".join(lines)


def paper_table(paper: dict) -> str:
    modes = list(next(iter(paper.values()))["best"])
    lines = ["| reading of the paper's 160 s | t0 (ms) | update MFU | synchronous step (s) | "
             + " | ".join(f"best {m} (R/T: step, speedup)" for m in modes) + " |", "|---" * (4 + len(modes)) + "|"]
    for name, r in paper.items():
        cells = [f"{b['rollout_gpus']}/{64 - b['rollout_gpus']}: {b['step']:.0f} s, {b['speedup']:.2f}x"
                 for b in r["best"].values()]
        lines.append(f"| {name} | {r['t0_ms']:.1f} | {r['update_mfu']:.1%} | {r['synchronous']['step']:.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return float(x) if isinstance(x, (np.floating, np.integer)) else x


def run() -> dict:
    """Everything: verl's check, the paper's readings with their sweeps and timelines."""
    s8 = calibrate_verl()
    paper = paper_scenarios(s8.mean_len, s8.t0)
    for reading in paper.values():
        rlep = reading["synchronous"]
        reading["timeline"] = {"synchronous": timeline(rlep)}
        for mode in ("one-step-off", "fully async, N = 2"):
            best = next(r for r in reading["modes"][mode] if r["rollout_gpus"] == reading["best"][mode]["rollout_gpus"])
            reading["timeline"][mode] = timeline(best)
    params = [{"name": n, "value": v, "source": src} for n, v, src in PARAMETERS] + [
        {"name": "decode step's fixed cost t0 (H20, verl)", "value": f"{1e3 * s8.t0:.2f} ms",
         "source": "fitted: verl's one-step-off generation times, 162 s on 16 GPUs and 501 s on 4"},
        {"name": "mean answer, Qwen2.5-Math-7B DAPO", "value": f"{s8.mean_len:.0f} tokens (lognormal, before clipping)",
         "source": "fitted with t0 (not published); the paper's run uses it clipped at 3072"}]
    return jsonable({"parameters": params, "check": check(s8), "paper": paper})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/records/async"))
    parser.add_argument("--check", action="store_true", help="print verl's published results beside the model's")
    args = parser.parse_args(argv)
    result = run()
    if args.check:
        print(check_table(result["check"]))
        print()
    print(paper_table(result["paper"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_timeline.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "async_timeline.png")
    print(f"wrote {args.out / 'async_timeline.json'} and {args.out / 'async_timeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
