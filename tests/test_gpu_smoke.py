"""scripts/gpu_smoke.py, the script that proves the GPU path, run here in fp32 on the CPU with a
tiny model: log-prob parity with transformers and of packed sequences, two RL steps (vLLM's CPU build where it imports,
RLEP from an empty live pool) with a weight-sync check after each, the distributed optimizer's
save and exact resume with its checkpoint's size against the planner's, and its report; without
CUDA and without --allow-cpu it stops in one sentence."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_smoke.py"
pytestmark = pytest.mark.e2e


def test_smoke_script_runs_its_checks_on_the_cpu(tmp_path):
    model = tiny.make_model(tmp_path / "model")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "refused")],
                             capture_output=True, text=True, timeout=scaled(120))
    assert refused.returncode == 2 and "no CUDA device is visible" in refused.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out"), "--allow-cpu",
                           "--model", str(model), "--scale", str(model / "config.json")],
                          capture_output=True, text=True, timeout=scaled(900))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "smoke.json").read_text())
    assert report["ok"] and report["device"] == "cpu" and report["parity"]["dtype"] == "float32"
    assert report["parity"]["actor_vs_fp32_mean"] <= 1e-4 and report["parity"]["tokens"] > 20
    assert report["parity"]["packing"]["packed_vs_padded_max"] <= 1e-4  # THD against padded
    assert report["parity"]["nan_guard"] == {"skipped": True, "weights_unchanged": True, "ok": True}
    assert report["moe_parity"]["ok"] and report["moe_parity"]["actor_vs_fp32_mean"] <= 1e-4
    # the CPU's experts one after another; on a GPU with TE the check wants TEGroupedMLP
    assert report["moe_parity"]["experts"] == {"module": "SequentialMLP",
                                               "expected": "SequentialMLP",
                                               "export_exact": True, "ok": True}
    assert "experts" not in report["parity"]  # a dense model
    steps = report["steps"]
    assert len(steps["sync/max_logprob_diff"]) == 2
    assert all(d <= 1e-3 for d in steps["sync/max_logprob_diff"])
    assert all(t > 0 for t in steps["perf/update_tokens_per_s"])
    planner = steps["planner"]  # the planner's prediction; nothing to measure it against here
    assert planner["predicted_update_peak_gib"] > 0 and planner["parameters"] > 3e6
    assert 0 < planner["predicted_tensors_gib"] < planner["predicted_update_peak_gib"]
    assert planner["measured_peak_gib"] is None and planner["ratio"] is None and planner["mfu"] is None
    assert planner["device_used_gib"] is None and planner["device_ratio"] is None
    assert set(report["seconds"]) == {"parity", "moe_parity", "steps", "scale"}
    # the "realistic shape" part, at the tiny model's shape: the distributed optimizer resumes
    # exactly, its checkpoint is the size actor/checkpoint.py disk_plan says, two RL steps run
    resume, at_scale = report["scale"]["resume"], report["scale"]["steps"]
    assert resume["optimizers"] == ["DistributedOptimizer"] and resume["ok"]
    assert resume["first_update_moved"] > 0 and resume["second_update"] > 0
    assert resume["resumed_vs_went_on"] == 0.0
    assert 1.0 <= resume["checkpoint_ratio"] < 1.05 and resume["write_gb_per_s"] > 0
    # learner 0's side of a weight broadcast: every parameter's bytes, flattened, timed
    export = resume["export"]
    assert export["bytes"] == export["parameter_bytes"] > 0 and export["buckets"] >= 1
    assert export["gb_per_s"] > 0
    assert at_scale["ok"] and len(at_scale["sync/max_logprob_diff"]) == 2
    assert "SMOKE OK" in done.stdout


def test_a_model_shape_gets_seeded_random_weights_and_keeps_its_tokenizer(tmp_path):
    """What the smoke script runs where the built-in model's weights cannot travel."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_smoke

    model = tiny.make_model(tmp_path / "model")
    shape = tmp_path / "shape"
    shape.mkdir()
    for f in model.iterdir():
        if not f.name.endswith(".safetensors"):
            (shape / f.name).write_bytes(f.read_bytes())
    made = [Path(gpu_smoke.random_weights(shape, tmp_path / f"random{i}")) for i in range(2)]
    assert (made[0] / "config.json").read_text() != "" and (made[0] / "tokenizer.json").is_file()
    original, first, second = (load_file(next(p.glob("*.safetensors")))
                               for p in (model, *made))
    assert first.keys() == original.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # seeded
    assert any(not torch.equal(first[k], original[k]) for k in first)
