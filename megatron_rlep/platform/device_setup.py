"""The device set-up: where this rank computes, its process-group backend and layer specs.

On a machine with CUDA it picks ``cuda`` + NCCL and the Transformer Engine layer specs (when TE
imports) and changes nothing in Megatron-Core. Without CUDA it picks the CPU + gloo and, before
the process group starts, installs the compatibility shims (shims.py, 1-8: Megatron-Core made to
run there) and the CPU speed-ups (cpu_speedups.py, 9-13), each checked against the Megatron-Core
and torch versions it was written for before any patches.

This module must not patch Megatron-Core or torch itself: each patch is a named unit in shims.py
or cpu_speedups.py, and this module only says when and in which order they are installed.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys

import torch
import torch.distributed as dist

from megatron_rlep.platform import cpu_speedups, shims


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    """The device this rank computes on."""
    if has_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compute_dtype(name: str = "auto") -> torch.dtype:
    """``model.dtype``: ``auto`` is bf16 on a GPU and fp32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if has_cuda() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def backend() -> str:
    return "nccl" if has_cuda() else "gloo"


@functools.cache
def transformer_engine_unavailable() -> str | None:
    """None when Transformer Engine imports (on a GPU), else why not, in a few words."""
    if not has_cuda():
        return "no CUDA device"  # TE's import can fail on CPU machines in ways Megatron misses
    try:
        import transformer_engine  # noqa: F401
    except Exception as error:
        return f"it does not import ({type(error).__name__}: {str(error)[:200]})"
    return None


def have_transformer_engine() -> bool:
    return transformer_engine_unavailable() is None


def layer_spec(normalization: str = "RMSNorm", qk_layernorm: bool = False,
               transformer_engine: bool | None = None, num_experts: int | None = None):
    """Transformer Engine layer specs (by default when TE imports), Megatron-Core's local specs
    otherwise. ``num_experts``: MoE layers; with Transformer Engine a rank's experts run as one
    grouped GEMM (TEGroupedMLP), with the local specs one after another (SequentialMLP)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if have_transformer_engine() if transformer_engine is None else transformer_engine:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=bool(num_experts),
            qk_layernorm=qk_layernorm)
    if num_experts:
        shims.router_without_transformer_engine()
    return gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, normalization=normalization,
        qk_layernorm=qk_layernorm)


_INSTALLED = False


def install_cpu_shims() -> None:
    """Redirect Megatron-Core's CUDA assumptions to the CPU and take the CPU's speed-ups, in this
    order; every one is checked first, so that where one no longer fits nothing is patched. A
    no-op when CUDA is present or once installed."""
    global _INSTALLED
    if has_cuda() or _INSTALLED:
        return
    order = [cpu_speedups.dynamo_off, shims.current_device_is_the_cpu,
             shims.cuda_streams_as_no_ops, shims.tensor_cuda_is_identity,
             shims.sequence_parallel_torch_norms, cpu_speedups.accumulate_weight_gradients_on_cpu,
             cpu_speedups.swiglu_backward_in_two_passes]
    if cpu_speedups.onednn_linears_apply():
        order.append(cpu_speedups.linear_products_through_onednn)
    order += [shims.cpu_rng_tracker, shims.cuda_device_arguments_to_cpu]
    used_later = [shims.grad_norm_on_cpu, shims.cuda_type_names_for_optimizers,
                  cpu_speedups.fused_adam_on_cpu]  # functions of ours, nothing patched
    for unit in order + used_later:
        unit.check()
    for unit in order:
        unit.apply()
    _INSTALLED = True


def init_distributed(tensor_parallel: int = 1, pipeline_parallel: int = 1, seed: int = 1234,
                     expert_parallel: int = 1) -> None:
    """Start the process group (torchrun's env, or a single process) and Megatron's parallel
    state (experts not split over TP: expert tensor parallel 1)."""
    from megatron.core import parallel_state, tensor_parallel as mp_tensor_parallel

    install_cpu_shims()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        if has_cuda():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(
            backend(), rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30)
        )
    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel):
        raise ValueError(
            f"parallel: tensor_parallel={tensor_parallel} x pipeline_parallel={pipeline_parallel} "
            f"does not divide the world size {world}; pick sizes whose product divides it."
        )
    if world % (expert_parallel * pipeline_parallel):
        raise ValueError(
            f"parallel: expert_parallel={expert_parallel} x pipeline_parallel={pipeline_parallel} "
            f"does not divide the world size {world}; pick sizes whose product divides it."
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_parallel, pipeline_parallel, expert_model_parallel_size=expert_parallel,
            expert_tensor_parallel_size=1)
    mp_tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)


def is_rank0() -> bool:
    """Rank 0 of the job; before the process group starts, as torchrun or srun numbered it."""
    if dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank calls it)."""
    value = torch.tensor([float(flag)], device=device())
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def reset_model_parallel() -> None:
    """Megatron-Core's parallel state torn down with its process groups, the world's kept, so
    the next ``init_distributed`` may set up other sizes. Megatron-Core only forgets its groups:
    each gloo group keeps its connections and threads (2,800 threads a rank after seventeen
    set-ups in one process, the CPUs then busy switching between them)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        for group in list(dist.distributed_c10d._world.pg_map):
            if group is not dist.GroupMember.WORLD:
                dist.destroy_process_group(group)


def destroy_distributed() -> None:
    """Every process group torn down. An in-process vLLM engine joined this process's group
    (rollout/vllm_engine.py) and tears its own groups down at exit: vLLM goes first, so that
    its teardown finds nothing left instead of failing with "Invalid process group specified"."""
    vllm_groups = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_groups is not None and dist.is_initialized():
        vllm_groups.destroy_model_parallel()
        vllm_groups.destroy_distributed_environment()  # the world's group too
    reset_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()



def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
