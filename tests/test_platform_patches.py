"""The CPU's patches one by one (megatron_rlep/platform/): each compatibility shim (1-8 and the MoE
router's) and each CPU speed-up (9-13) fits the installed Megatron-Core and torch, does what it
says, and where a version outside its range or a changed Megatron-Core meets it, stops in one
sentence naming itself without patching. Speed-ups 12 and 13 and the RNG tracker's fork have
their tests with real Megatron-Core steps in tests/test_platform.py.
"""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from launch import env
from speed import scaled

from megatron_rlep.platform import cpu_speedups, patch, shims

ROOT = Path(__file__).resolve().parents[1]
PATCHES = [unit for module in (shims, cpu_speedups) for unit in vars(module).values()
           if isinstance(unit, patch.Patch)]
BY_NAME = {unit.name: unit for unit in PATCHES}


def one_sentence(text: str) -> bool:
    return "\n" not in text and text.endswith(".") and not re.search(r"\.\s+[A-Z]", text)


def test_the_thirteen_numbered_patches_and_the_routers_are_each_one_named_unit():
    numbers = sorted(unit.number for unit in PATCHES if unit.number is not None)
    assert numbers == list(range(1, 14))
    assert {unit.number for unit in PATCHES if unit.kind == "shim"} == {*range(1, 9), None}
    assert {unit.number for unit in PATCHES if unit.kind == "CPU speed-up"} == {*range(9, 14)}
    assert len(BY_NAME) == len(PATCHES) == 14


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_each_patch_fits_the_installed_megatron_core_and_torch(name):
    unit = BY_NAME[name]
    assert unit.megatron_core == (">=0.16.1,<0.17", ">=0.19,<0.20")
    assert unit.torch == (">=2.13,<2.14",)
    assert unit.relies_on, f"{name} names nothing it relies on"
    assert unit.problem() is None


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_a_megatron_core_outside_its_range_stops_each_patch_in_one_sentence(name, monkeypatch):
    """The must-show: a faked Megatron-Core 0.21 meets each shim and speed-up; it raises one
    sentence naming itself, the versions it was written for and the one found, and patches
    nothing."""
    import megatron.core

    applied = []
    unit = dataclasses.replace(BY_NAME[name], apply=lambda: applied.append(name))
    monkeypatch.setattr(megatron.core, "__version__", "0.21.0")
    with pytest.raises(RuntimeError) as raised:
        unit()
    message = str(raised.value)
    assert message.startswith(f"Platform {unit.title}, written for megatron-core >=0.16.1,<0.17 "
                              "or >=0.19,<0.20 and torch >=2.13,<2.14, does not fit "
                              "megatron-core 0.21.0 with torch "), message
    assert "megatron-core 0.21.0 is outside that range" in message
    assert f"megatron_rlep/platform/{'shims' if unit.kind == 'shim' else 'cpu_speedups'}.py" \
        in message
    assert one_sentence(message), message
    assert not applied


def test_a_torch_outside_its_range_stops_a_shim(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with pytest.raises(RuntimeError, match=r"^Platform shim 5 \(tensor_cuda_is_identity\).*"
                                           r"torch 2\.14\.0 is outside that range"):
        shims.tensor_cuda_is_identity.check()


def without_line(module: str, line: str):
    real = patch._source_text

    def source_text(name):
        text = real(name)
        return text.replace(line, "") if name == module and text else text

    return source_text


def to_host_as_list(tensor, to_list=False):  # a dispatcher's helper that changed its keywords
    return tensor


def linear_without_buffer(input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
                          sequence_parallel):  # Megatron-Core's linear function, one keyword less
    return input


LAYERS = "megatron.core.tensor_parallel.layers"
CHANGED = {  # name: (what a new Megatron-Core or torch might change, and the words that say so)
    "current_device_is_the_cpu": (("delattr", "torch.cuda", "current_device"),
                                  "torch.cuda has no current_device"),
    "cuda_streams_as_no_ops": (
        ("setattr", "megatron.core.transformer.moe.token_dispatcher", "maybe_move_tensor_to_cpu",
         to_host_as_list),
        "token_dispatcher.maybe_move_tensor_to_cpu no longer takes as_numpy, record_stream"),
    "cpu_rng_tracker": (("delattr", "megatron.core.tensor_parallel.random",
                         "_CUDA_RNG_STATE_TRACKER"),
                        "megatron.core.tensor_parallel.random has no _CUDA_RNG_STATE_TRACKER"),
    "sequence_parallel_torch_norms": (
        ("source", "megatron.core.transformer.torch_norm", "assert not config.sequence_parallel"),
        "megatron.core.transformer.torch_norm no longer holds `assert not config.sequence_parallel`"),
    "router_without_transformer_engine": (
        ("source", "megatron.core.transformer.moe.moe_utils", "te_general_gemm is not None"),
        "moe_utils no longer holds `te_general_gemm is not None`"),
    "accumulate_weight_gradients_on_cpu": (("delattr", LAYERS, "_grad_accum_fusion_available"),
                                           f"{LAYERS} has no _grad_accum_fusion_available"),
    "swiglu_backward_in_two_passes": (
        ("delattr", "megatron.core.fusions.fused_bias_swiglu", "swiglu_back"),
        "megatron.core.fusions.fused_bias_swiglu has no swiglu_back"),
    "linear_products_through_onednn": (
        ("setattr", LAYERS, "linear_with_grad_accumulation_and_async_allreduce",
         linear_without_buffer),
        "linear_with_grad_accumulation_and_async_allreduce no longer takes grad_output_buffer"),
}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_what_a_patch_relies_on_changed_stops_it_in_one_sentence_naming_it(name, monkeypatch):
    """Megatron-Core or torch changed under a patch (an attribute gone, a function's parameters,
    a line of source it relies on), at a version inside its range: it stops naming itself and
    what changed, and patches nothing."""
    import importlib

    (how, module, what, *value), words = CHANGED[name]
    if how == "delattr":
        monkeypatch.delattr(importlib.import_module(module), what)
    elif how == "setattr":
        monkeypatch.setattr(importlib.import_module(module), what, value[0])
    else:
        monkeypatch.setattr(patch, "_source_text", without_line(module, what))
    applied = []
    unit = dataclasses.replace(BY_NAME[name], apply=lambda: applied.append(name))
    with pytest.raises(RuntimeError) as raised:
        unit()
    message = str(raised.value)
    assert message.startswith(f"Platform {unit.title}, written for "), message
    assert words in message and "it stops here instead of patching blind" in message, message
    assert one_sentence(message), message
    assert not applied


def test_the_install_stops_before_any_patch_where_one_does_not_fit(cpu_process):
    """install_cpu_shims checks every patch before it applies any: under a faked Megatron-Core
    0.21 the first in its order (speed-up 9) says so, and nothing of the CPU's is patched."""
    assert cpu_process["refused"].startswith("Platform CPU speed-up 9 (dynamo_off), written for")
    assert "megatron-core 0.21.0 is outside that range" in cpu_process["refused"]
    assert cpu_process["untouched"] == [True] * 6


# each patch at work, in one process that installs them all (tests/test_platform.py: 3's fork,
# 12 and 13 in Megatron-Core's steps, 6 under torchrun)
CPU_PROCESS = """
import json, numpy, torch
from types import SimpleNamespace
import megatron.core
from megatron.core.tensor_parallel import layers, random as mp_random
from megatron.core.transformer.moe import moe_utils, token_dispatcher
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron_rlep import platform

out = {}
was = (torch.cuda.current_device, torch.cuda.current_stream, torch.Tensor.cuda,
       WrappedTorchNorm.__new__, mp_random._CUDA_RNG_STATE_TRACKER)
real, megatron.core.__version__ = megatron.core.__version__, "0.21.0"
try:
    platform.install_cpu_shims()
except RuntimeError as error:
    out["refused"] = str(error)
import torch._dynamo
now = (torch.cuda.current_device, torch.cuda.current_stream, torch.Tensor.cuda,
       WrappedTorchNorm.__new__, mp_random._CUDA_RNG_STATE_TRACKER)
out["untouched"] = [a is b for a, b in zip(was, now)] + [not torch._dynamo.config.disable]
megatron.core.__version__ = real
norm_config = SimpleNamespace(layernorm_zero_centered_gamma=False, persist_layer_norm=False,
                              sequence_parallel=True, memory_efficient_layer_norm=False,
                              normalization="RMSNorm")
try:
    WrappedTorchNorm(norm_config, 8)
    out["norm_before"] = "built"
except AssertionError as error:
    out["norm_before"] = str(error)
platform.install_cpu_shims()

out["dynamo_off"] = torch._dynamo.config.disable
out["current_device_is_the_cpu"] = str(torch.cuda.current_device())
stream = torch.cuda.current_stream()
stream.wait_stream(stream), stream.wait_event(None), stream.synchronize()
with torch.cuda.stream(stream):
    pass
sizes = torch.tensor([3, 1])
out["cuda_streams_as_no_ops"] = [
    torch.cuda.synchronize() is None, stream.record_event() is stream,
    token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is stream,
    isinstance(token_dispatcher.maybe_move_tensor_to_cpu(sizes, as_numpy=True), numpy.ndarray),
    token_dispatcher.maybe_move_tensor_to_cpu(sizes) is sizes]
tracker = mp_random.get_cuda_rng_tracker()
state = torch.get_rng_state()
mp_random._set_cuda_rng_state(torch.zeros_like(state))
out["cpu_rng_tracker"] = [type(tracker).__name__, mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED,
                          torch.equal(mp_random._get_cuda_rng_state(), state),
                          torch.equal(torch.get_rng_state(), state)]
out["cuda_device_arguments_to_cpu"] = [torch.zeros(2, device="cuda").device.type,
                                       torch.ones(1, device="cuda:0").device.type,
                                       torch.arange(3, device=torch.device("cuda")).device.type]
tensor = torch.ones(2)
out["tensor_cuda_is_identity"] = tensor.cuda() is tensor
norm = WrappedTorchNorm(norm_config, 8)
out["sequence_parallel_torch_norms"] = [out.pop("norm_before"), type(norm).__name__,
                                        norm_config.sequence_parallel,
                                        [p.sequence_parallel for p in norm.parameters()]]
x, g = torch.randn(2, 3, 4), torch.randn(2, 3, 5)
expected = g.reshape(6, 5).t() @ x.reshape(6, 4)
main_grad = torch.randn(5, 4)
start = main_grad.clone()
layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(x, g, main_grad)
bf16_grad = torch.zeros(5, 4)
layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16(x.bfloat16(), g.bfloat16(), bf16_grad)
out["accumulate_weight_gradients_on_cpu"] = [
    layers._grad_accum_fusion_available,
    torch.allclose(main_grad - start, expected, atol=1e-5),
    torch.allclose(bf16_grad, expected, rtol=0.05, atol=0.1)]
platform.layer_spec(num_experts=2, transformer_engine=False)
out["router_without_transformer_engine"] = moe_utils.te_general_gemm is None
print("RESULTS", json.dumps(out))
"""


@pytest.fixture(scope="module")
def cpu_process():
    done = subprocess.run([sys.executable, "-c", CPU_PROCESS], capture_output=True, text=True,
                          timeout=scaled(300), env=env([sys.executable]), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def test_shim_1_current_device_is_the_cpu(cpu_process):
    assert cpu_process["current_device_is_the_cpu"] == "cpu"


def test_shim_2_cuda_streams_are_no_ops_and_the_dispatchers_split_sizes_numpy(cpu_process):
    assert cpu_process["cuda_streams_as_no_ops"] == [True] * 5


def test_shim_3_the_rng_tracker_and_recomputes_cuda_state_are_the_cpus(cpu_process):
    assert cpu_process["cpu_rng_tracker"] == ["CpuRNGStatesTracker", True, True, True]


def test_shim_4_tensors_made_on_cuda_are_made_on_the_cpu(cpu_process):
    assert cpu_process["cuda_device_arguments_to_cpu"] == ["cpu", "cpu", "cpu"]


def test_shim_5_tensor_cuda_is_the_tensor_itself(cpu_process):
    assert cpu_process["tensor_cuda_is_identity"] is True


def test_shim_6_the_gradient_norm_and_clipping_on_the_cpu():
    """The global L2 norm without a process group: a parameter shared with another stage
    (``shared``) is left to the stage that counts it, an expert's part (``allreduce=False``) is
    added; ``max_norm`` 0 only measures, 1 scales the gradients to a norm of 1."""
    def param(*grad, **tags):
        p = torch.nn.Parameter(torch.zeros(len(grad)))
        p.grad = torch.tensor(grad)
        for key, value in {"tensor_model_parallel": True, **tags}.items():
            setattr(p, key, value)
        return p

    params = [param(3.0, 0.0), param(0.0, 4.0, allreduce=False), param(1.0, shared=True)]
    assert shims.grad_norm(params) == pytest.approx(5.0)
    assert shims.clip_grad_norm(params, 0.0) == pytest.approx(5.0)
    assert params[0].grad.tolist() == [3.0, 0.0]
    assert shims.clip_grad_norm(params, 1.0) == pytest.approx(5.0)
    assert shims.grad_norm(params) == pytest.approx(1.0, rel=1e-5)
    assert shims.clip_factor(0.5, 1.0) == 1.0 and shims.clip_factor(2.0, 0.0) == 1.0


def test_shim_7_torch_norms_take_sequence_parallelism_and_tag_their_parameters(cpu_process):
    assert cpu_process["sequence_parallel_torch_norms"] == [
        "sequence parallel not supported by torch LayerNorm", "RMSNorm", True, [True]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's shim")
def test_shim_8_cpu_tensors_name_cuda_types_only_while_the_optimizer_is_built():
    cpu = torch.zeros(1)
    with shims.cuda_type_names():
        inside = [cpu.type(), cpu.half().type(), cpu.type(torch.float64).dtype]
    assert inside == ["torch.cuda.FloatTensor", "torch.cuda.HalfTensor", torch.float64]
    assert cpu.type() == "torch.FloatTensor"


def test_the_routers_shim_lets_megatron_core_016_route_without_transformer_engine(cpu_process):
    # 0.16 named te_general_gemm only with Transformer Engine (a NameError), 0.19 sets it to None
    assert cpu_process["router_without_transformer_engine"] is True


def test_speedup_9_dynamo_is_off(cpu_process):
    assert cpu_process["dynamo_off"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's speed-up")
def test_speedup_10_the_fused_cpu_adam_folds_the_clipping_factor_into_its_step():
    """Fused, with the clipping factor 0.5 as its gradient scale: the same weights as torch's
    default Adam on gradients halved; off, the flags go back to torch's defaults."""
    def adam():
        weight = torch.nn.Parameter(torch.linspace(-1, 1, 64))
        weight.grad = torch.linspace(2, -3, 64)
        return weight, torch.optim.Adam([weight], lr=0.1)

    fused_weight, fused = adam()
    plain_weight, plain = adam()
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=fused)])
    cpu_speedups.fused_cpu_adam(chained, on=True, grad_scale=0.5)
    assert (fused.param_groups[0]["fused"], fused.param_groups[0]["foreach"]) == (True, False)
    fused.step()
    plain_weight.grad.mul_(0.5)
    plain.step()
    assert torch.allclose(fused_weight, plain_weight, atol=1e-7)
    cpu_speedups.fused_cpu_adam(SimpleNamespace(optimizer=fused), on=False)
    assert (fused.param_groups[0]["fused"], fused.param_groups[0]["foreach"], fused.grad_scale) \
        == (None, None, None)
    with pytest.raises(ValueError, match="only the fused CPU Adam"):
        cpu_speedups.fused_cpu_adam(chained, on=False, grad_scale=0.5)


def test_speedup_11_weight_gradients_accumulate_into_main_grad_by_addmm(cpu_process):
    assert cpu_process["accumulate_weight_gradients_on_cpu"] == [True, True, True]


def test_speedup_13_is_on_where_the_cpu_is_not_intels_unless_turned_off(monkeypatch):
    monkeypatch.setattr(cpu_speedups, "_intel_cpu", lambda: False)
    monkeypatch.delenv("MEGATRON_RLEP_ONEDNN", raising=False)
    assert cpu_speedups.onednn_linears_apply() == torch.backends.mkldnn.is_available()
    monkeypatch.setenv("MEGATRON_RLEP_ONEDNN", "0")
    assert not cpu_speedups.onednn_linears_apply()
    monkeypatch.delenv("MEGATRON_RLEP_ONEDNN")
    monkeypatch.setattr(cpu_speedups, "_intel_cpu", lambda: True)
    assert not cpu_speedups.onednn_linears_apply()
