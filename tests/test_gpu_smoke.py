"""scripts/gpu_smoke.py, the script that proves the GPU path, run here in fp32 on the CPU with a
tiny model: log-prob parity with transformers, two RL steps (vLLM's CPU build where it imports,
RLEP from an empty live pool) with a weight-sync check after each, and its report; without
CUDA and without --allow-cpu it stops in one sentence."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_smoke.py"
pytestmark = pytest.mark.e2e


def test_smoke_script_runs_its_checks_on_the_cpu(tmp_path):
    model = tiny.make_model(tmp_path / "model")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "refused")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no CUDA device is visible" in refused.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out"), "--allow-cpu",
                           "--model", str(model)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "smoke.json").read_text())
    assert report["ok"] and report["device"] == "cpu" and report["parity"]["dtype"] == "float32"
    assert report["parity"]["actor_vs_fp32_mean"] <= 1e-4 and report["parity"]["tokens"] > 20
    steps = report["steps"]
    assert len(steps["sync/max_logprob_diff"]) == 2
    assert all(d <= 1e-3 for d in steps["sync/max_logprob_diff"])
    assert all(t > 0 for t in steps["perf/update_tokens_per_s"])
    assert "SMOKE OK" in done.stdout
