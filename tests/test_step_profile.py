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
from step_profile import timed  # noqa: E402


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
