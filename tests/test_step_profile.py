"""benchmarks/step_profile.py's accounting: a run's CPU time split into matrix products and the
other operators, on a run whose parts are known."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
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
