"""benchmarks/step_profile.py's accounting: a run's CPU time split into matrix products and the
other operators, on a run whose parts are known; and the script end to end on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launch import env, why
from speed import scaled
from tiny import make_model

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "step_profile.py"
sys.path.insert(0, str(SCRIPT.parent))
from step_profile import is_matmul, timed  # noqa: E402


def test_matrix_products_and_the_rest_are_told_apart():
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def run():  # mostly matrix products, one small elementwise sum
        for _ in range(4):
            torch.mm(a, b)
        return a + b

    result = timed(run, repeats=2, top=3)
    assert result["median_s"] > 0
    assert 0.5 < result["matmul_share"] < 1.0
    assert "aten::add" in result["other_ops"] and "aten::mm" not in result["other_ops"]
    assert len(result["other_ops"]) <= 3
    assert 0 < result["other_ops"]["aten::add"] < 1 - result["matmul_share"] + 1e-9


def test_matrix_products_are_known_by_what_they_are_on_any_cpus_kernels():
    """By name on the kernels CPUs dispatch to (an EPYC without AVX-512 runs a linear layer as
    oneDNN's ``mkldnn::_linear_pointwise``, which a fixed list missed: a share of 0.0), and on
    this CPU's own: whatever takes most of a linear layer's and a product's time here is one."""
    from torch.profiler import ProfilerActivity, profile

    for key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
                "aten::matmul", "aten::_addmm_activation", "mkldnn::_linear_pointwise",
                "_C::onednn_mm", "aten::_mkl_linear", "aten::mkldnn_matmul"):
        assert is_matmul(key), key
    for key in ("aten::add", "aten::comm", "aten::copy_", "aten::softmax", "aten::mul",
                "aten::linear_backward_stub", "aten::empty"):
        assert not is_matmul(key), key
    x, w = torch.randn(256, 1024), torch.randn(1024, 1024)
    layer = torch.nn.Linear(1024, 1024)
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        for _ in range(4):
            torch.nn.functional.linear(x, w), layer(x), x @ w, torch.bmm(x[None], w[None])
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops)
    heavy = [e.key for e in ops if e.self_cpu_time_total > 0.1 * total]
    assert heavy and all(is_matmul(key) for key in heavy), heavy


@pytest.mark.e2e
def test_the_update_old_logprobs_and_rollout_are_profiled_on_a_tiny_model(tmp_path):
    from megatron_rlep.rollout import vllm_unavailable

    argv = [sys.executable, str(SCRIPT), "--model", str(make_model(tmp_path / "model")),
            "--repeats", "1", "--top", "3", "--json", str(tmp_path / "profile.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(300), env=env(argv))
    assert done.returncode == 0, why(done)
    r = json.loads((tmp_path / "profile.json").read_text())
    parts = ["update", "old log-probs"] + ([] if vllm_unavailable() else ["rollout"])
    assert sorted(k for k in r if k not in ("dtype", "threads")) == sorted(parts)
    for part in parts:
        assert r[part]["median_s"] > 0 and 0 < r[part]["matmul_share"] < 1
        assert 0 < len(r[part]["other_ops"]) <= 3
