"""The compatibility shims: what makes Megatron-Core run on the CPU with the gloo backend.

Megatron-Core (0.16.x on Python 3.11, 0.19.x on 3.12) assumes CUDA in a handful of places; each
is redirected here and nowhere else, by one shim each (``Patch``, patch.py): numbered 1-8 as the
docs cite them, written for megatron-core >=0.16.1,<0.17 or >=0.19,<0.20 and torch 2.13, and
checked against what they rely on before they patch. ``device_setup.install_cpu_shims`` installs
them, with the CPU speed-ups, in one order; ``router_without_transformer_engine`` is applied by
``device_setup.layer_spec`` (CPU or GPU).

This module must not make the CPU faster (cpu_speedups.py does) nor patch at import: a shim
patches when it is installed, and only where it fits.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from megatron_rlep.platform.patch import Expect, Patch, patch

RANDOM = "megatron.core.tensor_parallel.random"
DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"
NORM = "megatron.core.transformer.torch_norm"


def shim(number: int | None, *relies_on: Expect):
    """Decorator: the function that applies compatibility shim ``number`` becomes its ``Patch``."""
    return patch("shim", number, *relies_on)


@shim(1, Expect("torch.cuda", "current_device"))
def current_device_is_the_cpu() -> None:
    """``torch.cuda.current_device()`` answers the CPU device, so ``device=current_device()``
    lands tensors on the CPU."""
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]


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


@shim(2, Expect("torch.cuda", "synchronize"), Expect("torch.cuda", "current_stream"),
      Expect("torch.cuda", "stream"),
      Expect(DISPATCHER, "MoEAlltoAllTokenDispatcher.cuda_dtoh_stream"),
      Expect(DISPATCHER, "maybe_move_tensor_to_cpu",
             parameters=("tensor", "as_numpy", "record_stream")))
def cuda_streams_as_no_ops() -> None:
    """``torch.cuda.synchronize()`` is a no-op, and ``torch.cuda.current_stream()`` answers a
    stream whose waits are no-ops (Megatron-Core 0.19's gradient sync waits on it); the MoE
    all-to-all dispatcher's side stream (it moves its split sizes to the host there) is that
    stream, ``torch.cuda.stream()`` a null context, and its split sizes become the numpy arrays
    its all-to-all takes (on a GPU the move to the host makes them so)."""
    from megatron.core.transformer.moe import token_dispatcher

    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *args, **kwargs: _NO_STREAM  # type: ignore[assignment]
    # the MoE all-to-all dispatcher copies its split sizes on a side stream: the same no-op
    token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM
    to_host = token_dispatcher.maybe_move_tensor_to_cpu  # split sizes: numpy, as from a GPU

    def to_host_as_from_gpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = to_host_as_from_gpu
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[assignment]


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


@shim(3, Expect(RANDOM, "CudaRNGStatesTracker.fork"), Expect(RANDOM, "CudaRNGStatesTracker.add"),
      Expect(RANDOM, source="self.seeds_ = set()"), Expect(RANDOM, source="self.states_ = {}"),
      Expect(RANDOM, "_MODEL_PARALLEL_RNG_TRACKER_NAME"), Expect(RANDOM, "_CUDA_RNG_STATE_TRACKER"),
      Expect(RANDOM, "_CUDA_RNG_STATE_TRACKER_INITIALIZED"), Expect(RANDOM, "_get_cuda_rng_state"),
      Expect(RANDOM, "_set_cuda_rng_state"))
def cpu_rng_tracker() -> None:
    """The model-parallel RNG tracker forks the CPU generator instead of the CUDA one
    (``CpuRNGStatesTracker``), so ``tracker.fork()`` keeps its meaning; activation recompute's
    save and restore of the CUDA generator's state is a no-op (it saves the CPU one beside it)."""
    from megatron.core.tensor_parallel import random as mp_random

    mp_random._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
    # activation recompute saves and restores the CUDA generator beside the CPU one: none here
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` (or ``cuda:N``) arguments to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


_CPU_MODE: _CudaToCpu | None = None


@shim(4, Expect("torch.overrides", "TorchFunctionMode.__torch_function__"))
def cuda_device_arguments_to_cpu() -> None:
    """Tensors created with ``device="cuda"`` (the schedules' token counter, default attention
    masks) are created on the CPU by a ``TorchFunctionMode`` that rewrites the device argument;
    it stays active for the life of the process (main thread), but for rollout engines' calls
    (``device_rewrite_paused``)."""
    global _CPU_MODE
    _CPU_MODE = _CudaToCpu()
    _CPU_MODE.__enter__()


@contextlib.contextmanager
def device_rewrite_paused():
    """Shim 4's mode off for a rollout engine's call (``VllmEngine``, ``TransformersEngine``):
    the engines create no CUDA tensors on a CPU, and each torch call of a token-by-token decode
    would pass through the mode (vLLM's demo rollout took 1.15x as long with it). A no-op where the mode is
    not installed or not this thread's innermost one."""
    stack = torch.overrides._get_current_function_mode_stack()
    if _CPU_MODE is None or not stack or stack[-1] is not _CPU_MODE:
        yield
        return
    _CPU_MODE.__exit__(None, None, None)
    try:
        yield
    finally:
        _CPU_MODE.__enter__()


@shim(5, Expect("torch", "Tensor.cuda"))
def tensor_cuda_is_identity() -> None:
    """``Tensor.cuda()`` returns the tensor itself (the tied-embedding set-up of pipeline stages
    moves the weight with it)."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[assignment]


grad_norm_on_cpu = Patch(
    "shim", 6, "grad_norm_on_cpu", (
        Expect("megatron.core.parallel_state", "get_model_parallel_group"),
        Expect("megatron.core.parallel_state", "get_expert_tensor_model_pipeline_parallel_group"),
        Expect("megatron.core.tensor_parallel", "param_is_not_tensor_parallel_duplicate"),
        Expect("megatron.core.transformer.module", "param_is_not_shared"),
        Expect("torch", "_foreach_norm")), __name__)
"""``grad_norm`` and ``clip_grad_norm`` measure and clip on the CPU itself: Megatron-Core's
``clip_grads`` asserts CUDA tensors. Nothing is patched: the actor calls these functions."""


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
    """The global L2 norm of the gradients across model-parallel ranks (shim 6).

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


@shim(7, Expect(NORM, "WrappedTorchNorm.__new__", parameters=("cls", "config")),
      Expect(NORM, source="assert not config.sequence_parallel"))
def sequence_parallel_torch_norms() -> None:
    """Megatron-Core's torch norm (the local specs' only norm without Apex) refuses sequence
    parallelism; here it accepts it and tags its parameters ``sequence_parallel`` so their
    gradients are summed over the TP group, as Megatron does for its fused and TE norms."""
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


cuda_type_names_for_optimizers = Patch(
    "shim", 8, "cuda_type_names_for_optimizers", (
        Expect("torch", "Tensor.type"),
        Expect("megatron.core.optimizer.optimizer",
               source="param.type() == 'torch.cuda.FloatTensor'"),
        Expect("megatron.core.optimizer.distrib_optimizer",
               source="param.type() == 'torch.cuda.FloatTensor'")), __name__)
"""``cuda_type_names()`` (around building the optimiser only): a CPU tensor's ``type()`` reads
``torch.cuda.FloatTensor`` and the like, the names by which Megatron-Core's optimisers sort
parameters (the distributed optimiser refuses any other), so the distributed optimiser runs on
the CPU too; ``clip_grad_norm(..., sharded=True)`` counts its shards."""


@contextlib.contextmanager
def cuda_type_names():
    """While open (CPU only), ``Tensor.type()`` of a CPU tensor names the CUDA type (shim 8)."""
    if torch.cuda.is_available():
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


@shim(None, Expect("megatron.core.transformer.moe.moe_utils",
                   source="te_general_gemm is not None"))
def router_without_transformer_engine() -> None:
    """Megatron-Core 0.16's router names ``te_general_gemm`` only when Transformer Engine imports
    (a NameError without it, CPU or GPU); 0.19 sets it to None, which selects torch's matmul."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
