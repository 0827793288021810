"""benchmarks/gpu_update.py, the update's benchmark at a real load, at its tiny shape on the CPU
as a real subprocess: the FLOP count against one worked out by hand, the tokens the actor and the
reference count against the batch's, the warm-up left out of the timed updates, every figure
present and finite, and the plain PyTorch reference's old log-probs, losses and gradient norms
equal to the actor's in fp32. And what ``--layers auto`` keeps of the 7B shape on an H100."""

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from launch import env
from speed import scaled

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_update.py"


def test_the_update_benchmark_counts_flops_tokens_and_timed_updates_on_the_cpu(tmp_path):
    out = tmp_path / "tiny.json"
    argv = [sys.executable, str(SCRIPT), "--shape", "tiny", "--warmup", "2", "--steps", "3",
            "--peak-tflops", "0.5", "--sync-debug", "--profile", "both", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(120), env=env(argv))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["dtype"] == "float32" and r["shape"] == "tiny"
    # the preset's settings: micro-batches of 4 sequences and 8,192 tokens
    s = r["settings"]
    assert (s["micro_batch_size"], s["max_tokens_per_micro_batch"], s["recompute"],
            s["logprob_chunk_tokens"]) == (4, 8192, "selective", 2048)
    assert s["sequences_per_step"] == 8 and (s["prompt"], s["response"]) == (32, 96)

    # FLOPs by hand: V 512, h 64, FFN 128, 2 layers, 4 heads of 16 (q 64), 2 KV heads (k, v 32
    # each); a sequence of L = 128 tokens with R = 96 response tokens, 8 a mini-batch
    linear = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)  # N = 73,728
    sequence = 2 * linear * 128 + 2 * 512 * 64 * 96 + 2 * 2 * 64 * 128 ** 2  # 29,360,128
    forward = 8 * sequence  # 234,881,024
    assert r["flops"]["old_logprobs"] == forward and r["flops"]["per_step"] == 3 * forward
    assert r["flops"]["per_update"] == 7 * forward == 1_644_167_168  # 1 + 3 + 3 forwards
    assert r["tokens"] == {"per_update": 2 * 8 * 128, "response_per_update": 2 * 8 * 96}

    for side in ("ours", "reference"):
        x = r[side]
        # two warm-up updates ran, untimed; the three timed ones are all that is timed
        assert x["warmup_updates"] == 2 and x["timed_updates"] == 3 and len(x["update_s"]) == 3
        assert x["tokens_counted"] == 1536  # the batch's response tokens, as each counted them
        median = sorted(x["update_s"])[1]
        assert x["median_s"] == median > 0
        assert x["tokens_per_s"] == pytest.approx(2048 / median)
        assert x["achieved_tflops"] == pytest.approx(7 * forward / median / 1e12)
        assert x["mfu"] == pytest.approx(x["achieved_tflops"] / 0.5)
        assert set(x["phases_median_s"]) == {"old_logprobs", "step_1", "step_2"}
        assert all(0 < t < max(x["update_s"]) for t in x["phases_median_s"].values())
        assert x["sync_debug"]["counted"] is False and "CPU" in x["sync_debug"]["why"]
        profile = x["profile"]
        assert profile["by"] == "self CPU time" and 0 < len(profile["top"]) <= 15
        assert all(0 < op["share"] <= 1 and op["calls"] > 0 for op in profile["top"])
        first = x["first_update"]
        assert all(math.isfinite(v) for v in first["loss"] + first["grad_norm"])
    # the warm-up, timed and profiled updates each took two optimizer steps
    assert r["ours"]["optimizer_steps"] == 2 * (2 + 3 + 1)
    assert r["ours"]["optimizer"] == ["DistributedOptimizer"]
    # the weights' export for a broadcast: every parameter once, in fp32 on the CPU
    export = r["ours"]["export"]
    # the tied embedding once, N = 73,728 linear weights, q, k, v biases and two norms a layer
    params = 512 * 64 + 73_728 + 2 * (64 + 32 + 32 + 2 * 64) + 64  # 107,072
    assert export["bytes"] == export["parameter_bytes"] == 4 * params
    assert export["buckets"] >= 1 and export["seconds"] > 0
    assert "local" in r["ours"]["layer_specs"]
    assert r["reference"]["attention"] == "sdpa" and r["reference"]["dtype"] == "float32"
    assert r["peak_source"] == "--peak-tflops" and r["mfu_note"] is None
    assert math.isfinite(r["ratio_ours_over_reference"]) and r["ratio_ours_over_reference"] > 0
    # the same weights and batch: fp32 agrees to rounding
    agree = r["agreement"]
    assert agree["old_logp_max_abs_diff"] < 1e-4
    assert max(agree["loss"]["relative_diff"] + agree["grad_norm"]["relative_diff"]) < 1e-5
    assert '"ratio_ours_over_reference"' in done.stdout  # the JSON is printed too


def test_layers_auto_keeps_what_the_planner_fits_on_an_h100():
    """Qwen2.5-Math-7B's width at the preset's micro-batches of 4 x 2,048 tokens: 7 of its 28
    layers fit an 80 GB H100 with 6 GiB spare (tools/memory_plan.py); all 28 fit four times that."""
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_update

    args = SimpleNamespace(prompt=512, response=1536)
    parallel = SimpleNamespace(micro_batch_size=4, max_tokens_per_micro_batch=8192,
                               recompute="selective", bf16_grads=False, logprob_chunk_tokens=2048)
    assert gpu_update.micro_shape(args, parallel) == (8192, 6144)
    h100 = gpu_update.h100_bytes()
    assert gpu_update.fitting_layers(gpu_update.QWEN25_MATH_7B, args, parallel, h100) == 7
    assert gpu_update.fitting_layers(gpu_update.QWEN25_MATH_7B, args, parallel, 4 * h100) == 28
