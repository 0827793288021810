"""tools/memory_plan.py: each term by hand on a tiny architecture, and the paper presets fitting
an 80 GiB GPU by the plan (the numbers of docs/scaling.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import memory_plan  # noqa: E402


def test_terms_by_hand():
    # h 4, 2 layers, 2 heads of width 2, 1 key/value head, FFN 8, vocabulary 10, untied
    arch = memory_plan.Arch(4, 2, 2, 1, 2, 8, 10, False)
    # a layer: qkv 4 x 8 + bias 8, output 4 x 4, MLP 3 x 4 x 8, two norms 4 + 4 = 160
    assert arch.layer_params() == 160
    assert arch.params() == 2 * 160 + 2 * 40 + 4  # embedding and output layer, final norm
    ctx, asleep = memory_plan.CUDA_CONTEXT, memory_plan.VLLM_ASLEEP
    r = memory_plan.plan(arch, tp=2, pp=1, dp=4, tokens=10, response_tokens=6,
                         vllm_utilization=0.5, gpu_bytes=1000)
    assert r["params_shard"] == (2 * 160 + 40) / 2 + 40 / 2  # 200 on each TP rank
    assert (r["weights"], r["gradients"], r["optimizer"]) == (400, 800, 12 * 200 / 4)
    # per token and layer: 2 bytes x (4h replicated + (2h + 2k + 3f) / tp) = 2 x (16 + 18)
    assert r["activations"] == 68 * 2 * 10
    assert r["logits"] == 6 * 10 / 2 * 14
    assert (r["vllm_rollout"], r["vllm_weights"], r["vllm_kv_cache"]) == (500, 808, 0)
    assert r["rollout_peak"] == 400 + 800 + 600 + ctx + 500
    assert r["update_peak"] == 400 + 800 + 600 + ctx + 1360 + 420 + asleep
    full = memory_plan.plan(arch, 2, 1, 4, 10, 6, recompute="full", bf16_grads=True,
                            distributed_optimizer=False, logprob_chunk=4)
    assert full["activations"] == (2 * 4 * 2 + 68) * 10  # layer inputs + one whole layer
    assert (full["gradients"], full["optimizer"], full["logits"]) == (400, 2400, 4 * 5 * 14)
    assert full["vllm_rollout"] == full["vllm_asleep"] == 0
    sp = memory_plan.plan(arch, 2, 1, 4, 10, 6, recompute="full", sequence_parallel=True)
    assert sp["activations"] == (2 * 4 / 2 * 2 + 2 * (16 / 2 + 18)) * 10  # replicated parts / tp
    stage = memory_plan.plan(arch, 1, 2, 1, 10, 6)  # the first of two pipeline stages
    assert stage["params_shard"] == 160 + 40 and stage["logits"] == 0
    assert stage["activations"] == 2 * (16 + 36) * 1 * 10 * 2  # 1 layer, 2 micro-batches


@pytest.mark.parametrize("preset", ["dapo_nodyn_bs64", "rlep_qwen25_math_7b"])
def test_paper_presets_fit_an_80_gib_gpu(preset):
    def plan(*args):
        return subprocess.run([sys.executable, str(REPO / "tools" / "memory_plan.py"),
                               f"experiment={preset}", "--nodes", "8", *args],
                              capture_output=True, text=True, timeout=120)

    fits = plan()
    assert fits.returncode == 0, fits.stdout + fits.stderr
    peak = float(fits.stdout.split("peak ")[-1].split(" GiB")[0])
    assert peak <= 72, fits.stdout  # 8 GiB of margin at least
    assert "tp=2 pp=1 dp=32" in fits.stdout and "7.62B parameters" in fits.stdout
    unplanned = plan("parallel.max_tokens_per_micro_batch=0", "parallel.logprob_chunk_tokens=0",
                     "parallel.micro_batch_size=8")
    assert unplanned.returncode == 1 and "DOES NOT FIT" in unplanned.stdout, unplanned.stdout
