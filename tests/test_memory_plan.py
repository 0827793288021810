"""tools/memory_plan.py: each term by hand on a tiny architecture, and the paper presets fitting
an 80 GB H100 (79.2 GiB usable) by the plan (the numbers of docs/scaling.md); with disaggregated
placement a learner's plan and a rollout rank's, by hand at a 7B shape."""

import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import memory_plan  # noqa: E402


def test_terms_by_hand():
    # h 4, 2 layers, 2 heads of width 2, 1 key/value head, FFN 8, vocabulary 10, untied
    arch = memory_plan.Arch(4, 2, 2, 1, 2, 8, 10, False)
    # a layer: qkv 4 x 8 + bias 8, output 4 x 4, MLP 3 x 4 x 8, two norms 4 + 4 = 160
    assert arch.dense_layer_params() == 160
    assert arch.params() == 2 * 160 + 2 * 40 + 4  # embedding and output layer, final norm
    ctx, asleep = memory_plan.CUDA_CONTEXT, memory_plan.VLLM_ASLEEP
    nccl, frag = memory_plan.NCCL, memory_plan.FRAGMENTATION
    r = memory_plan.plan(arch, tp=2, pp=1, dp=4, tokens=10, response_tokens=6,
                         vllm_utilization=0.5, gpu_bytes=1000)
    assert r["params_shard"] == (2 * 160 + 40) / 2 + 40 / 2  # 200 on each TP rank
    assert (r["weights"], r["gradients"], r["optimizer"]) == (400, 800, 12 * 200 / 4)
    # per token and layer: 2 bytes x (4h replicated + (2h + 2k + 3f) / tp) = 2 x (16 + 18)
    assert r["activations"] == 68 * 2 * 10
    # 6 response rows x 10 / 2 vocabulary columns x 24 bytes; the output layer's weight
    # gradient in fp32 before it joins the buffer: 10 / 2 x 4 x 4
    assert r["logits"] == 6 * 10 / 2 * 24 and r["output_wgrad"] == 10 / 2 * 4 * 4
    # six communicators at 0.5 GiB (1.5 with NVLS), a CUDA context with its kernels of 2.5 GiB
    assert (r["nccl"], r["fragmentation"], ctx) == (3 * 2**30, 2 * 2**30, 2.5 * 2**30)
    assert memory_plan.plan(arch, 2, 1, 4, 10, 6, nvls=True)["nccl"] == 9 * 2**30
    # vLLM's own reserve: 16,384 tokens x (3 x 8 + 2 x 4) x 2 bytes, the sampler's 1,024 x 10 x 8
    # bytes, and the graph pool
    assert r["vllm_reserve"] == 16384 * 32 * 2 + 1024 * 10 * 8 + 2**30
    assert (r["vllm_rollout"], r["vllm_weights"], r["vllm_kv_cache"]) == (500, 808, 0)
    kv = memory_plan.plan(arch, 1, 1, 1, 10, 6, vllm_utilization=0.5, gpu_bytes=4 * 2**30)
    assert kv["vllm_kv_cache"] == 2 * 2**30 - 808 - kv["vllm_reserve"]
    # a token's K and V in bf16 over the 2 layers: 2 x 2 x 1 x 2 x 2 bytes
    assert kv["kv_tokens"] == kv["vllm_kv_cache"] / 16
    assert memory_plan.plan(arch, 2, 1, 4, 10, 6)["gpu"] == 79.2 * 2**30  # an 80 GB H100
    static = 400 + 800 + 600 + ctx + nccl + frag
    assert r["rollout_peak"] == static + 500
    assert r["update_peak"] == static + 1360 + 720 + 80 + asleep
    # vLLM starts only with its share free beside the actor: here far from it
    assert r["vllm_startup_free"] == 1000 - static and not r["vllm_starts"]
    # offloaded between updates: the rollout holds neither gradients nor optimizer state
    off = memory_plan.plan(arch, tp=2, pp=1, dp=4, tokens=10, response_tokens=6,
                           vllm_utilization=0.5, gpu_bytes=1000, offload=True)
    assert off["rollout_peak"] == static - 800 - 600 + 500
    assert off["update_peak"] == r["update_peak"] and off["vllm_startup_free"] == 1000 - static + 1400
    full = memory_plan.plan(arch, 2, 1, 4, 10, 6, recompute="full", bf16_grads=True,
                            distributed_optimizer=False, logprob_chunk=4)
    assert full["activations"] == (2 * 4 * 2 + 68) * 10  # layer inputs + one whole layer
    assert (full["gradients"], full["optimizer"], full["logits"]) == (400, 2400, 4 * 5 * 24)
    assert full["vllm_rollout"] == full["vllm_asleep"] == 0
    sp = memory_plan.plan(arch, 2, 1, 4, 10, 6, recompute="full", sequence_parallel=True)
    assert sp["activations"] == (2 * 4 / 2 * 2 + 2 * (16 / 2 + 18)) * 10  # replicated parts / tp
    stage = memory_plan.plan(arch, 1, 2, 1, 10, 6)  # the first of two pipeline stages
    assert stage["params_shard"] == 160 + 40 and stage["logits"] == stage["output_wgrad"] == 0
    assert stage["activations"] == 2 * (16 + 36) * 1 * 10 * 2  # 1 layer, 2 micro-batches


@pytest.mark.parametrize("preset", ["dapo_nodyn_bs64", "rlep_qwen25_math_7b"])
def test_paper_presets_fit_an_80_gb_h100(preset):
    def plan(*args):
        return subprocess.run([sys.executable, str(REPO / "tools" / "memory_plan.py"),
                               f"experiment={preset}", "--nodes", "8", *args],
                              capture_output=True, text=True, timeout=scaled(120))

    fits = plan()
    assert fits.returncode == 0, fits.stdout + fits.stderr
    peak = float(fits.stdout.split("peak ")[-1].split(" GiB")[0])
    # 6 GiB of margin at least of the 79.2 an 80 GB H100 exposes, NCCL and fragmentation counted
    assert peak <= 79.2 - 6, fits.stdout
    assert "vLLM's start-up: 49.1 GiB free beside the actor, 39.6 needed" in fits.stdout
    assert "tp=2 pp=1 dp=32" in fits.stdout and "7.62B parameters" in fits.stdout
    unplanned = plan("parallel.max_tokens_per_micro_batch=0", "parallel.logprob_chunk_tokens=0",
                     "parallel.micro_batch_size=8")
    assert unplanned.returncode == 1 and "DOES NOT FIT" in unplanned.stdout, unplanned.stdout


def test_moe_terms_by_hand():
    # hidden 4, 2 layers, 2 heads of 2, 1 kv head, vocab 10, untied; 4 experts of FFN 3, 2 a token
    arch = memory_plan.Arch(4, 2, 2, 1, 2, 8, 10, False, experts=4, topk=2, expert_ffn=3)
    # q 4, kv 4: qkv 32 + bias 8 + output 16 + router 4 x 4 + norms 8; an expert 3 x 4 x 3
    assert (arch.dense_layer_params(), arch.expert_params()) == (80, 36)
    assert arch.params() == 2 * (80 + 4 * 36) + 2 * 40 + 4
    r = memory_plan.plan(arch, tp=1, pp=1, dp=4, tokens=10, response_tokens=6, ep=2)
    dense, experts = 2 * 80 + 40 + 40, 2 * 2 * 36  # two experts a layer on this rank
    assert r["weights"] == 2 * (dense + experts)
    # Adam: dense state over dp 4, the experts' over the expert data-parallel ranks (4 / 2)
    assert r["optimizer"] == 12 * (dense / 4 + experts / 2)
    # per token and layer: norms 4h = 16, q/k/v/out 2h + 2k = 12, MLP: 2 experts x (3 x 3 FFN
    # + 3 x 4 dispatcher copies) + 2 x 4 router probabilities (fp32) = 50; 2 bytes each
    assert r["activations"] == 2 * (16 + 12 + 50) * 2 * 10
    assert r["routes"] == 0 and "routes" not in dict(memory_plan.table(r))
    # routing replay: a byte per token, layer of the stage and expert a token, a TP 2 rank's
    # half of the tokens under sequence parallelism
    kept = memory_plan.plan(arch, tp=2, pp=2, dp=2, tokens=10, response_tokens=6, ep=2,
                            sequence_parallel=True, route_tokens=100)
    assert kept["routes"] == 100 / 2 * 1 * 2 and "routes" in dict(memory_plan.table(kept))
    assert kept["update_peak"] - memory_plan.plan(
        arch, tp=2, pp=2, dp=2, tokens=10, response_tokens=6, ep=2,
        sequence_parallel=True)["update_peak"] == kept["routes"]


def test_a_moe_preset_gets_a_layout_that_fits_two_nodes():
    def plan(*args):
        return subprocess.run([sys.executable, str(REPO / "tools" / "memory_plan.py"),
                               "experiment=rlep_qwen25_math_7b", "model=qwen3-30b-a3b",
                               "--nodes", "2", *args], capture_output=True, text=True, timeout=scaled(120))

    first = plan()
    assert first.returncode == 1 and "30.53B parameters (128 experts, 8 a token" in first.stdout
    layout = first.stdout.split("a layout that fits (its plan: add these overrides): ")[1]
    overrides = layout.splitlines()[0].split()
    assert "parallel.expert_parallel=16" in overrides, first.stdout
    second = plan(*overrides)
    assert second.returncode == 0 and "fits" in second.stdout.split("peak ")[-1], second.stdout


def test_disaggregated_learner_terms_by_hand():
    """A learner: the actor's terms with the whole GPU (no vLLM share, none asleep) and the
    export in flight: the bucket and learner 0's flat copy of it, each up to max(bucket, L),
    and the next tensor's gather (3L at TP > 1, 2L at PP > 1, its copy alone otherwise)."""
    arch = memory_plan.Arch(4, 2, 2, 1, 2, 8, 10, False)  # test_terms_by_hand's
    # L: the fused gate/up, 2 x 8 x 4 = 64 elements (the embedding 40, qkv 8 x 4), 128 bytes
    assert memory_plan.largest_tensor(arch) == 64
    r = memory_plan.learner_plan(arch, 2, 1, 4, 10, 6, bucket_bytes=100,
                                 vllm_utilization=0.5, gpu_bytes=1000)
    assert r["export"] == 2 * 128 + 3 * 128  # a bucket smaller than L: L is a bucket of its own
    static = 400 + 800 + 600 + memory_plan.CUDA_CONTEXT + memory_plan.NCCL + memory_plan.FRAGMENTATION
    assert r["vllm_rollout"] == r["vllm_asleep"] == 0  # the engine is not on this GPU
    assert r["update_peak"] == static + 1360 + 720 + 80 and r["export_peak"] == static + 640
    assert r["peak"] == r["update_peak"]
    assert memory_plan.learner_plan(arch, 2, 1, 4, 10, 6, bucket_bytes=1000)["export"] == \
        2 * 1000 + 3 * 128
    assert memory_plan.learner_plan(arch, 1, 2, 1, 10, 6, bucket_bytes=100)["export"] == 4 * 128
    assert memory_plan.learner_plan(arch, 1, 1, 8, 10, 6, bucket_bytes=100)["export"] == 3 * 128
    # the trainer's buckets are the export's default
    source = (REPO / "megatron_rlep" / "actor" / "hf.py").read_text()
    assert "bucket_bytes: int = 256 << 20" in source and memory_plan.EXPORT_BUCKET == 256 << 20


def test_disaggregated_rollout_rank_of_a_7b_model_by_hand():
    """A rollout rank of an engine of TP 2 for Qwen2.5-7B at 0.9 of an 80 GB H100: vLLM's
    share, and beside it the context, one bucket's receive buffer and two communicators."""
    arch = memory_plan.Arch(*memory_plan.ARCHS["qwen2.5-7b"])
    assert arch.params() == 7_615_616_512
    gpu = 79.2 * 2**30
    r = memory_plan.rollout_plan(arch, 2, 0.9, gpu, bucket_bytes=256 << 20)
    assert r["vllm_weights"] == 2 * 7_615_616_512 / 2  # bf16, half on each rank of the engine
    # its reserve: 16,384 tokens x (3 x 18,944 + 2 x 3,584) x 2 bytes / 2, the sampler's
    # 1,024 x 152,064 x 8 bytes, and the graph pool
    assert r["vllm_reserve"] == 1_048_576_000 + 1_245_708_288 + 2**30 == 3_368_026_112
    assert r["vllm_kv_cache"] == 0.9 * gpu - 7_615_616_512 - 3_368_026_112  # 61.1 GiB
    # a token's K and V over 28 layers of 4 heads x 128 in bf16 is 57,344 bytes; two ranks
    assert r["kv_tokens"] == r["vllm_kv_cache"] * 2 / 57_344
    assert round(r["kv_tokens"]) == 2_286_296
    # the embedding, 152,064 x 3,584 in bf16 (1.02 GiB), is a bucket of its own: the receive
    # buffer is that, not the 256 MiB
    assert r["weight_bucket"] == 1_089_994_752
    assert (r["cuda_context"], r["nccl"]) == (2.5 * 2**30, 2**30)  # the bridge's and vLLM's
    assert r["peak"] == 0.9 * gpu + 1_089_994_752 + 3.5 * 2**30  # 75.8 GiB
    assert r["vllm_startup_free"] == gpu - 2.5 * 2**30 and r["vllm_starts"]
    assert r["max_utilization"] == 1 - (1_089_994_752 + 3.5 * 2**30) / gpu  # 0.943
    one = memory_plan.rollout_plan(arch, 1, 0.3, gpu, dtype_bytes=4)  # fp32, an engine of 1
    assert one["vllm_weights"] == 4 * 7_615_616_512 and one["nccl"] == 2**29
    assert one["weight_bucket"] == 2 * 1_089_994_752
    assert one["vllm_kv_cache"] == one["kv_tokens"] == 0  # 28.4 GiB of weights in a 23.8 share
    # the learners' export for the same model at TP 2: 2 x 1.02 GiB + 3 x 1.02 GiB
    assert memory_plan.export_in_flight(arch, 2, 1) == 5 * 1_089_994_752


def test_disaggregated_paper_run_plans_both_kinds_of_rank(capsys):
    """2 of 8 nodes for rollout: the learners are 48 GPUs (dp 24), the rollout ranks 16
    engines; both fit, and a share that leaves no room beside vLLM is said with the most that
    does (the numbers of docs/scaling.md)."""
    run = ["experiment=rlep_qwen25_math_7b", "--nodes", "8", "rollout.placement=disaggregated",
           "rollout.ranks=16"]
    assert memory_plan.main(run) == 0
    out = capsys.readouterr().out
    assert "64 GPUs of 79.2 GiB: disaggregated: 48 learners, tp=2 pp=1 dp=24; 16 rollout " \
           "ranks, 16 engines of rollout TP 1" in out
    assert "learner peak 52.0 GiB of 79.2: fits, 27.2 GiB spare" in out
    assert "  export            5.1 GiB" in out and "vllm_asleep" not in out
    assert "rollout rank peak 43.6 GiB of 79.2: fits, 35.6 GiB spare" in out
    assert "rollout.gpu_memory_utilization up to 0.94 leaves room" in out
    assert "a checkpoint writes in about 9 s (6 node(s) at 2 GB/s each)" in out  # the learners'
    assert memory_plan.main([*run, "rollout.gpu_memory_utilization=0.96"]) == 1
    assert "rollout rank peak 80.0 GiB of 79.2: DOES NOT FIT by 0.8 GiB" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: rollout.ranks=64 leaves no learner of the 64 "
                                         "GPUs; lower rollout.ranks or plan more nodes"):
        memory_plan.main(run[:-1] + ["rollout.ranks=64"])
    with pytest.raises(SystemExit):  # the config's own rule (Config.check), in one line
        memory_plan.main(run[:-1] + ["rollout.ranks=15", "rollout.tensor_parallel=2"])
    assert "error: config key rollout.ranks=15 is not a multiple of rollout.tensor_parallel=2" \
        in capsys.readouterr().err


def test_checkpoint_disk_plan_by_hand():
    from megatron_rlep.actor.checkpoint import disk_plan

    # 1000 parameters in bf16: weights 2000 B, a full checkpoint adds Adam's fp32 master copy
    # and two moments (12000 B); 400 steps saved every 20: 20 saves, the newest 2 kept and a
    # third while it is written, plus the best step's weights and the final export
    plan = disk_plan(1000, True, 400, 20, 2, True)
    assert (plan["checkpoint"], plan["best"], plan["hf"], plan["saves"], plan["held"]) == \
        (14000, 2000, 2000, 20, 3)
    assert plan["run"] == 3 * 14000 + 2000 + 2000
    assert disk_plan(1000, True, 400, 20, 0, True)["run"] == 20 * 14000 + 4000  # keep them all
    fp32 = disk_plan(1000, False, 10, 3, 1, False)  # 4 saves (3, 6, 9 and the last step)
    assert (fp32["checkpoint"], fp32["saves"], fp32["held"], fp32["run"]) == (12000, 4, 2, 28000)
    # the distributed optimizer keeps (and saves) an fp32 master copy of fp32 weights too
    assert disk_plan(1000, False, 10, 3, 1, False, distributed_optimizer=True)["checkpoint"] \
        == 16000
    assert disk_plan(1000, True, 10, 3, 1, False, distributed_optimizer=True)["checkpoint"] \
        == 14000


def test_the_time_limit_signal_covers_a_step_and_the_checkpoint_write():
    """Checkpoint write time at the stated bandwidth and the signal lead derived from it, by
    hand: 99.3 GiB over 8 nodes at 2 GB/s is 6.7 s, plus the 160 s step and a minute."""
    def lead(*args):
        done = subprocess.run([sys.executable, str(REPO / "tools" / "memory_plan.py"),
                               "experiment=rlep_qwen25_math_7b", "--nodes", "8", *args],
                              capture_output=True, text=True, timeout=scaled(120))
        return done.stdout.split("time limit: ")[1].splitlines()[0]

    assert lead() == ("a checkpoint writes in about 7 s (8 node(s) at 2 GB/s each); the stop "
                      "signal needs at least a step, the write and a minute: 227 s, within the "
                      "sbatch scripts' 300")
    slow = lead("--write-gbps", "0.1")  # 133 s of writing
    assert slow.endswith("353 s, more than the sbatch scripts' 300: submit with "
                         "--signal=B:USR1@354"), slow
    for script in ("train.sbatch", "sweep.sbatch"):
        text = (REPO / "slurm" / script).read_text()
        assert f"#SBATCH --signal=B:USR1@{memory_plan.SIGNAL_LEAD}" in text, script


def test_paper_preset_keeps_its_disk_bounded():
    from megatron_rlep.actor.checkpoint import disk_plan
    from megatron_rlep.config import compose

    log = compose(["experiment=rlep_qwen25_math_7b"]).logging
    plan = disk_plan(memory_plan.Arch(*memory_plan.ARCHS["qwen2.5-7b"]).params(), True, 400,
                     log.save_every,
                     log.keep_checkpoints, log.keep_best)
    assert log.keep_checkpoints == 2 and 95 < plan["checkpoint"] / 2**30 < 105
    assert plan["run"] / 2**30 < 350  # keeping all 20 would hold about 2 TB
