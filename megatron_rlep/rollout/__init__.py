"""Rollout engines: turn chat prompts into sampled completions, and take weight updates.

``TransformersEngine`` runs anywhere (CPU included); ``VllmEngine`` (GPU only) sits behind the
same calls: ``generate(prompts, n, ...)``, ``load_weights(buckets)``, ``encode_prompt``.
``generate_sharded`` spreads prompts over the job's ranks and returns every result on every
rank. Engines know nothing about rewards, replay or the loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rlep.rollout.base import Completion
from megatron_rlep.rollout.transformers_engine import TransformersEngine

__all__ = ["Completion", "TransformersEngine", "make_engine", "generate_sharded", "engine_kind"]


def engine_kind(requested: str) -> str:
    if requested != "auto":
        return requested
    import importlib.util

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "transformers"


def _mp_rank() -> int:
    """This rank's place in its model-parallel group (0 without Megatron's parallel state)."""
    from megatron.core import parallel_state as ps

    return ps.get_model_parallel_group().rank() if ps.model_parallel_is_initialized() else 0


def make_engine(rollout, model_path: str, dtype: torch.dtype, seed: int, max_model_len: int,
                tensor_parallel: int | None = None):
    """This rank's engine, or None on ranks that do not generate (transformers: one rank per
    model-parallel group generates for it). ``tensor_parallel`` overrides the engine's TP size."""
    kind = engine_kind(rollout.engine)
    if kind == "vllm":
        from megatron_rlep.rollout.vllm_engine import VllmEngine

        tp = rollout.tensor_parallel if tensor_parallel is None else tensor_parallel
        return VllmEngine(model_path, tp, rollout.gpu_memory_utilization,
                          max_model_len, "bfloat16" if dtype == torch.bfloat16 else "float32", seed)
    if _mp_rank() != 0:
        return None
    from megatron_rlep import platform

    return TransformersEngine(model_path, dtype=dtype, batch_size=rollout.batch_size,
                              device=platform.device())


def _share(engine, rollout_tp: int) -> tuple[int, int, bool]:
    """(share index, number of shares, whether this rank reports its share's results)."""
    if not dist.is_initialized():
        return 0, 1, True
    rank, world = dist.get_rank(), dist.get_world_size()
    if engine is not None and engine.collective:
        return rank // rollout_tp, world // rollout_tp, rank % rollout_tp == 0
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), engine is not None


def generate_sharded(engine, prompts, counts: list[int], rollout_tp: int = 1, **sampling
                     ) -> list[list[Completion]]:
    """``counts[i]`` completions of ``prompts[i]`` for every i, on every rank. Prompts are dealt
    round-robin to the job's engines; the seed differs per share."""
    share, shares, reports = _share(engine, rollout_tp)
    mine = list(range(share, len(prompts), shares))
    results = None
    if engine is not None:
        seed = sampling.pop("seed", 0) * 1000 + share
        results = engine.generate([prompts[i] for i in mine], [counts[i] for i in mine],
                                  seed=seed, **sampling)
    if not dist.is_initialized():
        return results
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, results) if reports else None)
    out: list = [None] * len(prompts)
    for item in gathered:
        if item is not None:
            for i, group in zip(*item):
                out[i] = group
    return out

