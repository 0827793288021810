"""The CPU speed-ups: Megatron-Core's step made faster on the CPU, the same numbers out.

Each is a ``Patch`` (patch.py) numbered 9-13 as the docs cite them, written for megatron-core
>=0.16.1,<0.17 or >=0.19,<0.20 and torch 2.13, and checked against what it relies on before it
patches; ``device_setup.install_cpu_shims`` installs them with the compatibility shims, in one
order. Each has its own on/off: 9, 11 and 12 are always on on the CPU, 10 follows the actor's
``fused_adam`` (``fused_cpu_adam(..., on=)``), 13 ``onednn_linears_apply()``. On a GPU none
applies and nothing changes.

This module must not make Megatron-Core run on the CPU (shims.py does): without it the step
is the same, only slower.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megatron_rlep.platform.patch import Expect, Patch, patch

LAYERS = "megatron.core.tensor_parallel.layers"


def speedup(number: int, *relies_on: Expect):
    """Decorator: the function that applies CPU speed-up ``number`` becomes its ``Patch``."""
    return patch("CPU speed-up", number, *relies_on)


@speedup(9, Expect("torch._dynamo", "config.disable"),
         Expect("megatron.core.jit", source="jit_fuser = torch.compile"))
def dynamo_off() -> None:
    """``torch.compile`` is off (dynamo disabled): Megatron-Core's ``jit_fuser`` compiles its
    small fused functions (bias + SwiGLU and others) with inductor, about 3 s of C++ compilation
    in every new process, for a step no faster (benchmarks/actor_step.py ``--compile``)."""
    import torch._dynamo

    torch._dynamo.config.disable = True


fused_adam_on_cpu = Patch(
    "CPU speed-up", 10, "fused_adam_on_cpu", (
        Expect("torch.optim.adam", source='grad_scale=getattr(self, "grad_scale", None)'),
        Expect("torch", "_fused_adam_"),
        Expect("megatron.core.optimizer.optimizer", source="self.chained_optimizers = "),
        Expect("megatron.core.optimizer.optimizer", source="self.optimizer = optimizer")),
    __name__)
"""``fused_cpu_adam``: the torch Adam Megatron-Core falls back to without Apex takes its fused
CPU kernel (one pass over each tensor) instead of its default on the CPU, a loop of about ten
element-wise operations per tensor: the same update (weights within 6e-8 after a step), the
optimizer's own pass 4-7x faster, a whole update 1.03-1.06x on a quiet machine
(benchmarks/actor_step.py ``--fused-adam``). On a GPU Megatron-Core uses Transformer Engine's
or Apex's fused Adam and nothing changes. The fused step also applies the clipping factor
(``grad_norm``, ``clip_factor``), so clipping needs no pass of its own. Nothing is patched at
start-up: the actor calls ``fused_cpu_adam`` before each step."""


def fused_cpu_adam(optimizer, on: bool = True, grad_scale: float = 1.0) -> None:
    """Speed-up 10 (CPU only): every torch Adam inside Megatron-Core's ``optimizer`` (chained,
    mixed-precision or distributed) runs fused, or not (``on``). Set before each step, so a
    resumed optimizer state (whose groups carry the flags they were saved with) follows it.
    Fused, the step multiplies the gradients by ``grad_scale`` (the clipping factor) in its own
    pass, through the kernel's ``grad_scale`` input (the gradients are divided by it, as
    torch's loss scaler does), so clipping costs no pass of its own; unfused it must be 1."""
    if torch.cuda.is_available():
        return
    if grad_scale != 1.0 and not on:
        raise ValueError("only the fused CPU Adam folds a gradient scale into its step")
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if isinstance(inner, torch.optim.Adam):  # AdamW included
            for group in inner.param_groups:
                group["fused"], group["foreach"] = on or None, False if on else None
            inner.grad_scale = None if grad_scale == 1.0 else torch.tensor(1.0 / grad_scale)


@speedup(11, Expect(LAYERS, "_grad_accum_fusion_available"),
         Expect(LAYERS, source="fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32("),
         Expect(LAYERS, source="fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16("))
def accumulate_weight_gradients_on_cpu() -> None:
    """Megatron-Core's gradient accumulation fusion (each linear layer's weight gradient added
    into its ``main_grad`` by the GEMM, no gradient tensor and no add by DDP's hook) calls a CUDA
    extension; here ``addmm_`` does it, and the actor builds its layers with the fusion on. The
    same gradients to the bit, an update about 1% faster on the demo's job
    (benchmarks/actor_step.py ``--wgrad-fusion``)."""
    from megatron.core.tensor_parallel import layers

    def accumulate(total_input, grad_output, main_grad):  # main_grad [out, in] += g^T x
        x = total_input.reshape(-1, total_input.shape[-1])
        g = grad_output.reshape(-1, grad_output.shape[-1])
        if x.dtype == main_grad.dtype:
            main_grad.addmm_(g.t(), x)
        else:  # bf16 activations into fp32 gradients: the product in bf16, as unfused
            main_grad.add_(g.t() @ x)

    layers.fused_weight_gradient_mlp_cuda = SimpleNamespace(
        wgrad_gemm_accum_fp32=accumulate, wgrad_gemm_accum_fp16=accumulate)
    layers._grad_accum_fusion_available = True


@speedup(12, Expect("megatron.core.fusions.fused_bias_swiglu", "swiglu_back",
                    parameters=("g", "y")),
         Expect("torch", "ops.aten.silu_backward.grad_input"))
def swiglu_backward_in_two_passes() -> None:
    """With the JIT fuser off (9) Megatron-Core's SwiGLU backward (``swiglu_back``; its biased
    and weighted variants call it too) is a dozen element-wise operations and a concatenation;
    here it is torch's SiLU backward kernel and one product, written into the gradient's two
    halves: the gradient of silu(y1) * y2 with respect to y = [y1, y2] to 2e-6, the demo's
    update 1.07x faster (benchmarks/actor_step.py ``--swiglu``)."""
    from megatron.core.fusions import fused_bias_swiglu

    def swiglu_back(g, y):
        y1, y2 = torch.chunk(y, 2, -1)
        grad = torch.empty_like(y)
        d1, d2 = torch.chunk(grad, 2, -1)
        torch.ops.aten.silu_backward.grad_input(g * y2, y1, grad_input=d1)
        torch.mul(torch.nn.functional.silu(y1), g, out=d2)
        return grad

    fused_bias_swiglu.swiglu_back = swiglu_back


def onednn_linears_apply() -> bool:
    """Whether speed-up 13 applies in this process: a CPU not Intel's, torch built with oneDNN,
    and ``MEGATRON_RLEP_ONEDNN`` not ``0``."""
    return os.environ.get("MEGATRON_RLEP_ONEDNN", "1") != "0" and not _intel_cpu() and \
        torch.backends.mkldnn.is_available()


def _intel_cpu() -> bool:
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # unknown: MKL's default


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """x [n, in] @ weight [out, in]^T (+ bias) by oneDNN's matrix product: a new [n, out]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """Megatron-Core's linear function for one rank's plain product on rows x [n, in]: y = x W^T
    + b, the weight gradient added into ``main_grad`` under gradient accumulation fusion as 11
    does. As in Megatron-Core, the parameter and its buffer are taken in the forward: activation
    checkpointing can hand the backward a detached alias of the weight, without ``main_grad``."""

    @staticmethod
    def forward(ctx, x, weight, bias, fusion, tp_group):
        ctx.save_for_backward(x, weight)
        ctx.param, ctx.with_bias, ctx.tp_group = weight, bias is not None, tp_group
        ctx.main_grad = weight.main_grad if fusion and hasattr(weight, "main_grad") else None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = _onednn(grad, weight.t())
        if ctx.tp_group is not None:  # column-parallel at TP > 1: the input gradient summed
            summed = dist.all_reduce(grad_x, group=ctx.tp_group, async_op=True)
        grad_weight = None
        if ctx.main_grad is None:
            grad_weight = grad.t() @ x
        else:
            from megatron.core.tensor_parallel import layers

            layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(x, grad, ctx.main_grad)
            if hasattr(ctx.param, "grad_added_to_main_grad"):  # DDP's hook then adds nothing
                make = torch.zeros if getattr(ctx.param, "zero_out_wgrad", False) else torch.empty
                grad_weight = make(ctx.main_grad.shape, dtype=x.dtype)
                ctx.param.grad_added_to_main_grad = True
        if ctx.tp_group is not None:
            summed.wait()
        return grad_x, grad_weight, grad.sum(0) if ctx.with_bias else None, None, None


@speedup(13, Expect(LAYERS, "linear_with_grad_accumulation_and_async_allreduce", parameters=(
             "input", "weight", "bias", "gradient_accumulation_fusion", "allreduce_dgrad",
             "sequence_parallel", "grad_output_buffer")),
         Expect(LAYERS, source="linear_with_grad_accumulation_and_async_allreduce.warned"),
         Expect("megatron.core.parallel_state", "get_tensor_model_parallel_group"),
         Expect("torch", "ops.mkldnn._linear_pointwise"))
def linear_products_through_onednn() -> None:
    """The linear layers' plain products by oneDNN (``MEGATRON_RLEP_ONEDNN=0`` turns it off,
    ``onednn_linears_apply``): on a CPU that is not Intel's, MKL (torch's matrix products) does
    not run its fastest kernels, oneDNN (the library vLLM's CPU build uses) does: the linear
    layers' forward and input-gradient products go through oneDNN there, the weight gradient
    stays MKL's ``addmm_`` (11), faster even there. fp32 only; sequence parallelism and deferred
    weight gradients keep Megatron-Core's own function. The same products to fp32 rounding; on
    an AVX-512 AMD EPYC the demo's update 1.08-1.12x faster (benchmarks/actor_step.py
    ``--onednn``; the products alone: docs/cpu_speed.md)."""
    from megatron.core.tensor_parallel import layers

    megatron_linear = layers.linear_with_grad_accumulation_and_async_allreduce

    def linear(input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
               sequence_parallel, grad_output_buffer=None, **rest):
        if sequence_parallel or grad_output_buffer is not None or \
                input.dtype != torch.float32 or weight.dtype != torch.float32:
            return megatron_linear(input, weight, bias, gradient_accumulation_fusion,
                                   allreduce_dgrad, sequence_parallel,
                                   grad_output_buffer=grad_output_buffer, **rest)
        # rows in, rows out: the reshapes outside the function, so that the output is no view
        # made inside it (the loss's cross entropy works on the logits in place)
        tp_group = None
        if allreduce_dgrad:
            from megatron.core import parallel_state

            tp_group = rest.get("tp_group") or parallel_state.get_tensor_model_parallel_group()
        rows = _OneDnnLinear.apply(input.reshape(-1, input.shape[-1]), weight, bias,
                                   gradient_accumulation_fusion, tp_group)
        return rows.view(*input.shape[:-1], weight.shape[0])

    linear.megatron = megatron_linear
    linear.warned = True  # Megatron's function reads it by its module name: CUDA advice only
    layers.linear_with_grad_accumulation_and_async_allreduce = linear
