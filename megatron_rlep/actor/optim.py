"""Megatron-Core's optimiser and learning-rate schedule for the actor.

Adam with decoupled weight decay (Megatron skips biases and norms; ``decay_all`` decays every
parameter, as the reference's AdamW over all parameters does), linear warm-up then a
constant learning rate, gradient clipping by global norm. The schedule counts rollout steps,
as the reference does: every optimiser update of one step runs at the same learning rate
(``set_position``), however many mini-batches the step has. The distributed optimiser
(``distributed``) shards the optimiser state over data-parallel ranks; on the CPU it is built
under ``platform.cuda_type_names``, the gradient norm comes from ``platform.grad_norm`` (Megatron's
``clip_grads`` asserts CUDA tensors) and the fused Adam applies the clipping factor in its own
pass over the gradients (``platform.fused_cpu_adam``). On a GPU without Transformer Engine or
Apex, Megatron-Core's gradient norm falls back to a version that makes a host number of every
tensor's norm; ``build`` puts ``device_l2_norm`` in its place (``keep_norm_on_device``).

A step whose gradient norm is not finite is skipped on every platform (``step`` reports it and
applies nothing): in bf16 without a loss scaler Megatron-Core never flags inf/NaN itself, so its
own ``optimizer.step()`` would apply a NaN update.
"""

from __future__ import annotations

import math

import torch

from megatron_rlep import platform


def build(model_chunks, lr: float, weight_decay: float, grad_clip: float, warmup_steps: int,
          total_steps: int, dtype: torch.dtype, distributed: bool, decay_all: bool = False,
          adam_eps: float = 1e-8):
    """(optimizer, scheduler) for the DDP-wrapped ``model_chunks``. Biases and norms (Megatron's
    one-dimensional parameters) get no weight decay unless ``decay_all``."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam", lr=lr, min_lr=lr, weight_decay=weight_decay, adam_beta1=0.9,
        adam_beta2=0.999, adam_eps=adam_eps, clip_grad=0.0,  # clipped in ``step``
        bf16=dtype == torch.bfloat16, params_dtype=dtype, use_distributed_optimizer=distributed,
    )
    if platform.has_cuda():
        keep_norm_on_device()
    with platform.cuda_type_names():
        # no overrides ({}): every parameter in the default group, decayed; None: Megatron's
        # standard overrides, no decay for biases and one-dimensional parameters
        optimizer = get_megatron_optimizer(config, model_chunks,
                                           config_overrides={} if decay_all else None)
    return optimizer, schedule(optimizer, lr, weight_decay, warmup_steps, total_steps)


def device_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """The l2 norm of all of ``tensor_lists[0]`` together, as Megatron-Core's multi-tensor
    l2 norm returns it (a one-element fp32 tensor on their device, and None), computed without
    leaving the device. Megatron-Core's own fallback (``local_multi_tensor_l2_norm``) builds a
    host list of the tensors' norms: a device synchronisation for each tensor, about 200 an
    optimizer step at Qwen2.5-1.5B's shape (``benchmarks/gpu_update.py --sync-debug``)."""
    norms = torch._foreach_norm(tensor_lists[0], 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def keep_norm_on_device() -> None:
    """Megatron-Core's gradient norm through ``device_l2_norm`` where it would use its own
    fallback (no Transformer Engine, no Apex); their fused kernels are left as they are."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.utils import local_multi_tensor_l2_norm

    if clip_grads.l2_norm_impl is local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = device_l2_norm


def schedule(optimizer, lr: float, weight_decay: float, warmup_steps: int, total_steps: int):
    """Megatron-Core's scheduler: linear warm-up from 0 over ``warmup_steps``, then constant;
    at position 1 until ``set_position`` moves it."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    steps = max(total_steps, warmup_steps + 1)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=lr, min_lr=lr, lr_warmup_steps=warmup_steps,
        lr_decay_steps=steps, lr_decay_style="constant", start_wd=weight_decay,
        end_wd=weight_decay, wd_incr_steps=steps, wd_incr_style="constant",
    )
    set_position(scheduler, 1)
    return scheduler


def position(step: int, from_zero: bool) -> int:
    """The schedule position of rollout step ``step`` (from 0), whose updates all run at
    lr * min(1, position / warmup_steps). The reference advances its schedule after each step's
    update, so its first step runs at position 0, with learning rate 0 (``from_zero``);
    otherwise the first step runs at lr / warmup_steps."""
    return step if from_zero else step + 1


def set_position(scheduler, at: int) -> None:
    scheduler.num_steps = at
    scheduler.step(increment=0)


def step(optimizer, grad_clip: float, fused: bool = True) -> tuple[float, float, bool]:
    """One optimiser step; returns (gradient norm before clipping, learning rate, applied).
    A non-finite norm (or a loss scaler's inf) skips it: nothing is applied. On the CPU torch's
    Adam runs fused unless ``fused`` is false (platform.fused_cpu_adam)."""
    lr = optimizer.param_groups[0]["lr"]
    if optimizer.prepare_grads():  # a loss scaler's inf check (fp16 only)
        return math.inf, lr, False
    if platform.has_cuda():  # as Megatron-Core's ChainedOptimizer.step, with the check
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        norm = float(optimizer.get_grad_norm())
        if not math.isfinite(norm):
            return norm, lr, False
        for part in getattr(optimizer, "chained_optimizers", [optimizer]):
            params = part.get_parameters()
            if grad_clip > 0 and params and not getattr(part, "is_stub_optimizer", False):
                decoupled = getattr(part.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8",
                                    False)
                clip_grad_by_total_norm_fp32(params, max_norm=grad_clip, total_norm=norm,
                                             use_decoupled_grad=decoupled)
    else:
        parts = getattr(optimizer, "chained_optimizers", [optimizer])  # dense, experts
        sharded = any(type(part).__name__ == "DistributedOptimizer" for part in parts)
        params = [p for part in parts for p in part.get_parameters()]
        norm = platform.grad_norm(params, sharded)
        if not math.isfinite(norm):
            return norm, lr, False
        factor = platform.clip_factor(norm, grad_clip)
        platform.fused_cpu_adam(optimizer, fused, factor if fused else 1.0)
        if not fused:  # fused, the kernel scales them in its own pass
            platform.scale_grads(params, factor)
    optimizer.step_with_ready_grads()
    return norm, lr, True
