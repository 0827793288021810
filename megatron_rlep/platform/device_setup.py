"""Where the code runs: device, process-group backend, layer specs, and the CPU shims.

On a machine with CUDA this module only picks ``cuda`` + NCCL and the Transformer Engine
layer specs (when TE imports) and changes nothing in Megatron-Core.

Without CUDA it makes Megatron-Core (0.16.x on Python 3.11, 0.19.x on 3.12) run on the CPU with the gloo backend.
Megatron-Core assumes CUDA in a handful of places; each is redirected here and nowhere else:

1. ``torch.cuda.current_device()`` answers the CPU device, so ``device=current_device()`` lands
   tensors on the CPU.
2. ``torch.cuda.synchronize()`` is a no-op, and ``torch.cuda.current_stream()`` answers a stream
   whose waits are no-ops (Megatron-Core 0.19's gradient sync waits on it); the MoE all-to-all
   dispatcher's side stream (it moves its split sizes to the host there) is that stream,
   ``torch.cuda.stream()`` a null context, and its split sizes become the numpy arrays its
   all-to-all takes (on a GPU the move to the host makes them so).
3. The model-parallel RNG tracker forks the CPU generator instead of the CUDA one
   (``CpuRNGStatesTracker``), so ``tracker.fork()`` keeps its meaning; activation recompute's
   save and restore of the CUDA generator's state is a no-op (it saves the CPU one beside it).
4. Tensors created with ``device="cuda"`` (the schedules' token counter, default attention
   masks) are created on the CPU by a ``TorchFunctionMode`` that rewrites the device argument.
5. ``Tensor.cuda()`` returns the tensor itself (the tied-embedding set-up of pipeline stages
   moves the weight with it).
6. ``grad_norm`` and ``clip_grad_norm`` measure and clip on the CPU itself: Megatron-Core's
   ``clip_grads`` asserts CUDA tensors.
7. Megatron-Core's torch norm (the local specs' only norm without Apex) refuses sequence
   parallelism; here it accepts it and tags its parameters ``sequence_parallel`` so their
   gradients are summed over the TP group, as Megatron does for its fused and TE norms.
8. ``cuda_type_names()`` (around building the optimiser only): a CPU tensor's ``type()`` reads
   ``torch.cuda.FloatTensor`` and the like, the names by which Megatron-Core's optimisers sort
   parameters (the distributed optimiser refuses any other), so the distributed optimiser runs
   on the CPU too; ``clip_grad_norm(..., sharded=True)`` counts its shards.
9. ``torch.compile`` is off (dynamo disabled): Megatron-Core's ``jit_fuser`` compiles its small
   fused functions (bias + SwiGLU and others) with inductor, about 3 s of C++ compilation in
   every new process, for a step no faster (benchmarks/actor_step.py ``--compile``).
10. ``fused_cpu_adam``: the torch Adam Megatron-Core falls back to without Apex takes its
   fused CPU kernel (one pass over each tensor) instead of its default on the CPU, a loop of
   about ten element-wise operations per tensor: the same update (weights within 6e-8 after a
   step), the optimizer's own pass 4-7x faster, a whole update 1.03-1.06x on a quiet machine
   (benchmarks/actor_step.py ``--fused-adam``). On a GPU Megatron-Core uses
   Transformer Engine's or Apex's fused Adam and nothing changes. The fused step also applies
   the clipping factor (``grad_norm``, ``clip_factor``), so clipping needs no pass of its own.
11. ``_accumulate_weight_gradients_on_cpu``: Megatron-Core's gradient accumulation fusion (each
   linear layer's weight gradient added into its ``main_grad`` by the GEMM, no gradient tensor
   and no add by DDP's hook) calls a CUDA extension; here ``addmm_`` does it, and the actor
   builds its layers with the fusion on. The same gradients to the bit, an update about 1%
   faster on the demo's job (benchmarks/actor_step.py ``--wgrad-fusion``).
12. ``_swiglu_backward_in_two_passes``: with the JIT fuser off (9) Megatron-Core's SwiGLU
   backward is a dozen element-wise operations and a concatenation; here it is torch's SiLU
   backward kernel and one product, written into the gradient's two halves: the same
   gradient to 2e-6, the demo's update 1.07x faster (benchmarks/actor_step.py ``--swiglu``).
13. ``_linear_products_through_onednn`` (``MEGATRON_RLEP_ONEDNN=0`` turns it off): on a CPU
   that is not Intel's, MKL (torch's matrix products) does not run its fastest kernels, oneDNN
   (the library vLLM's CPU build uses) does: the linear layers' forward and input-gradient
   products go through oneDNN there, the weight gradient stays MKL's ``addmm_`` (11), faster
   even there. fp32 only; sequence parallelism and deferred weight gradients keep
   Megatron-Core's own function. The same products to fp32 rounding; on an AVX-512 AMD EPYC
   the demo's update 1.08-1.12x faster (benchmarks/actor_step.py ``--onednn``,
   benchmarks/cpu_gemm.py).

This module must not import anything from the rest of the package: everything else reads
only ``device()``, ``compute_dtype()``, ``backend()``, ``layer_spec()`` and
``init_distributed()``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode


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
        _router_without_transformer_engine()
    return gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, normalization=normalization,
        qk_layernorm=qk_layernorm)


def _router_without_transformer_engine() -> None:
    """Megatron-Core 0.16's router names ``te_general_gemm`` only when Transformer Engine imports
    (a NameError without it, CPU or GPU); 0.19 sets it to None, which selects torch's matmul."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` (or ``cuda:N``) arguments to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


def _cpu_rng_tracker_class():
    from megatron.core.tensor_parallel import random as mp_random

    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        """Megatron-Core's RNG tracker with named CPU generator states instead of CUDA ones."""

        def add(self, name, seed):
            if seed in self.seeds_ or name in self.states_:
                raise ValueError(f"RNG state {name!r} or seed {seed} is already tracked")
            self._is_initialized = True
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"RNG state {name!r} was never added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def _allow_sequence_parallel_norms() -> None:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    build = WrappedTorchNorm.__new__

    def new(cls, config, *args, **kwargs):
        wanted, config.sequence_parallel = config.sequence_parallel, False  # past its assert
        try:
            norm = build(cls, config, *args, **kwargs)
        finally:
            config.sequence_parallel = wanted
        for param in norm.parameters():
            param.sequence_parallel = wanted
        return norm

    WrappedTorchNorm.__new__ = staticmethod(new)


class _NoStream:
    """What ``torch.cuda.current_stream()`` answers on the CPU: waiting on it is a no-op."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None) -> "_NoStream":  # an event that is already complete
        return self


_NO_STREAM = _NoStream()
_CPU_MODE: _CudaToCpu | None = None


def install_cpu_shims() -> None:
    """Redirect Megatron-Core's CUDA assumptions to the CPU. No-op when CUDA is present."""
    global _CPU_MODE
    if has_cuda() or _CPU_MODE is not None:
        return
    import torch._dynamo
    from megatron.core.tensor_parallel import random as mp_random

    torch._dynamo.config.disable = True
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *args, **kwargs: _NO_STREAM  # type: ignore[assignment]
    # the MoE all-to-all dispatcher copies its split sizes on a side stream: the same no-op
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    from megatron.core.transformer.moe import token_dispatcher

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM
    to_host = token_dispatcher.maybe_move_tensor_to_cpu  # split sizes: numpy, as from a GPU

    def to_host_as_from_gpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = to_host_as_from_gpu
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[assignment]
    _allow_sequence_parallel_norms()
    _accumulate_weight_gradients_on_cpu()
    _swiglu_backward_in_two_passes()
    if onednn_linears_apply():
        _linear_products_through_onednn()
    mp_random._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
    # activation recompute saves and restores the CUDA generator beside the CPU one: none here
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    _CPU_MODE = _CudaToCpu()
    _CPU_MODE.__enter__()  # stays active for the life of the process (main thread)


def _accumulate_weight_gradients_on_cpu() -> None:
    """Shim 11: Megatron-Core's gradient accumulation fusion (the linear layers' weight
    gradient added into ``main_grad`` by the GEMM itself, no gradient tensor and no separate
    add) calls a CUDA extension; here the same two functions run as torch's ``addmm_``."""
    from types import SimpleNamespace

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


def _swiglu_backward_in_two_passes() -> None:
    """Shim 12: the gradient of silu(y1) * y2 with respect to y = [y1, y2], as Megatron-Core's
    ``swiglu_back`` (its biased and weighted variants call it too)."""
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
    """Whether shim 13 applies in this process: a CPU not Intel's, torch built with oneDNN, and
    ``MEGATRON_RLEP_ONEDNN`` not ``0``."""
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


def _linear_products_through_onednn() -> None:
    """Shim 13: the linear layers' plain products by oneDNN (see the module's docstring)."""
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


@contextlib.contextmanager
def cuda_type_names():
    """While open (CPU only), ``Tensor.type()`` of a CPU tensor names the CUDA type."""
    if has_cuda():
        yield
        return
    plain = torch.Tensor.type

    def as_cuda(self, *args, **kwargs):
        name = plain(self, *args, **kwargs)
        if args or kwargs or name.startswith("torch.cuda.") or self.device.type != "cpu":
            return name
        return "torch.cuda." + name[len("torch."):]

    torch.Tensor.type = as_cuda  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.Tensor.type = plain  # type: ignore[assignment]


def fused_cpu_adam(optimizer, on: bool = True, grad_scale: float = 1.0) -> None:
    """Shim 10 (CPU only): every torch Adam inside Megatron-Core's ``optimizer`` (chained,
    mixed-precision or distributed) runs fused, or not (``on``). Set before each step, so a
    resumed optimizer state (whose groups carry the flags they were saved with) follows it.
    Fused, the step multiplies the gradients by ``grad_scale`` (the clipping factor) in its own
    pass, through the kernel's ``grad_scale`` input (the gradients are divided by it, as
    torch's loss scaler does), so clipping costs no pass of its own; unfused it must be 1."""
    if has_cuda():
        return
    if grad_scale != 1.0 and not on:
        raise ValueError("only the fused CPU Adam folds a gradient scale into its step")
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if isinstance(inner, torch.optim.Adam):  # AdamW included
            for group in inner.param_groups:
                group["fused"], group["foreach"] = on or None, False if on else None
            inner.grad_scale = None if grad_scale == 1.0 else torch.tensor(1.0 / grad_scale)


def clip_grad_norm(parameters, max_norm: float, sharded: bool = False) -> float:
    """Clip gradients to a global L2 norm ``max_norm`` (``grad_norm``, ``clip_factor``);
    return the norm before."""
    norm = grad_norm(parameters, sharded)
    scale_grads(parameters, clip_factor(norm, max_norm))
    return norm


def scale_grads(parameters, factor: float) -> None:
    """Multiply every gradient present by ``factor`` (nothing to do for 1)."""
    if factor != 1.0:
        for p in parameters:
            if p.grad is not None:
                p.grad.detach().mul_(factor)


def clip_factor(norm: float, max_norm: float) -> float:
    """What clipping to ``max_norm`` multiplies gradients of global norm ``norm`` by (1 when
    within it, or ``max_norm`` is 0)."""
    return max_norm / (norm + 1e-6) if 0 < max_norm < norm else 1.0


def grad_norm(parameters, sharded: bool = False) -> float:
    """The global L2 norm of the gradients across model-parallel ranks.

    Tensor-parallel duplicates (layer norms, ``tensor_model_parallel=False`` params) and the
    last pipeline stage's copy of tied embeddings are counted once, as Megatron-Core does; an
    expert's weights (not all-reduced over data parallel) are summed over the expert-parallel
    ranks that hold the others. ``sharded``: the distributed optimiser's parameters, each rank
    a disjoint piece, summed over all ranks. Used on the CPU, where Megatron-Core's
    ``clip_grads`` asserts CUDA tensors.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    params = [p for p in parameters if p.grad is not None]
    square = torch.zeros((), dtype=torch.float64)
    for expert in (False, True):
        part = [p for p in params if (not getattr(p, "allreduce", True)) == expert]
        if not expert:
            part = [p for p in part if param_is_not_tensor_parallel_duplicate(p)
                    and param_is_not_shared(p)]
        norms = torch._foreach_norm([p.grad.detach() for p in part]) if part else []
        partial = torch.stack([n.double() for n in norms]).pow(2).sum() if part \
            else torch.zeros((), dtype=torch.float64)
        if dist.is_initialized():
            group = (None if sharded  # the world
                     else parallel_state.get_expert_tensor_model_pipeline_parallel_group() if expert
                     else parallel_state.get_model_parallel_group())
            dist.all_reduce(partial, group=group)
        square += partial
    return float(square.sqrt())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
