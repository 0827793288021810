"""Per-GPU memory of a training preset on a given cluster layout, term by term, with formulas.

    python tools/memory_plan.py experiment=dapo_nodyn_bs64 [--nodes 8] [--gpus-per-node 8] \
        [--gpu-gib 79.2] [--arch qwen2.5-7b] [--markdown] [--step-seconds 160] [--nvls] \
        [--write-gbps 2] [key=value ...]
    python tools/memory_plan.py experiment=rlep_qwen25_math_7b --nodes 8 \
        rollout.placement=disaggregated rollout.ranks=16    # a learner's plan and a rollout rank's

The model's shape comes from ``model.path``'s config.json when that exists, else from --arch
(a few known architectures). Terms, in bytes per GPU (P = parameters of this GPU's shard, tp/pp/dp
the actor's layout, T = tokens of the longest micro-batch, R = its response tokens):

- weights: 2P (bf16); gradients: 4P (Megatron's fp32 gradient buffer) or 2P (bf16 gradients);
- optimizer: Adam's fp32 master weights, m and v, 12P, divided by dp with the distributed
  optimizer;
- activations kept for backward, per token and layer (h hidden, k key/value width, f FFN width,
  2 bytes each): replicated over TP, 4h (the two norms' inputs and outputs; /tp with sequence
  parallelism); split over TP, (2h + 2k + 3f)/tp (q, k, v, attention output, the gated MLP's
  two inputs and its output), with flash attention (TE); full recompute keeps only each layer's
  input (h, /tp with sequence parallelism) plus one whole layer during its backward;
- logits: R x vocab/tp elements at 24 bytes: the bf16 logits (2), their fp32 copy, log-softmax,
  softmax and entropy products (4 each), and in backward their fp32 and bf16 gradients (4 + 2);
  only a chunk's rows at a time when log-probs are computed in chunks;
- the output layer's weight gradient before it joins the gradient buffer: vocab/tp x h x 4;
- NCCL's buffers: 0.5 GiB for each of about six communicators a rank uses (world, data-,
  tensor-, model-parallel, tensor-and-data, and vLLM's own), 3 GiB; with NVLS (``--nvls``) about
  1 GiB more each, 9 GiB; slurm/common.sh sets NCCL_NVLS_ENABLE=0, as NVIDIA's NeMo launcher
  does, so the plan's default is without;
- the allocator's fragmentation: 2 GiB (PyTorch's caching allocator keeps 1-3 GiB it cannot
  hand out at these sizes);
- the colocated vLLM engine: during rollout it may take ``rollout.gpu_memory_utilization`` of
  the GPU: its weights (2 bytes x all parameters / rollout.tensor_parallel), its own reserve
  (the activation peak it profiles at start-up: a forward of 16,384 batched tokens through the
  widest layer, (3f + 2h) x 2 bytes a token / rollout TP, and the sampler's fp32 logits and
  probabilities of 1,024 sequences, V x 8 bytes each; plus its CUDA-graph pool, 1 GiB assumed),
  then KV cache in the rest; asleep during the update (level 1 or 2) it keeps only its CUDA
  context and graph pool (about 2 GiB, assumed).
A CUDA context of about 2.5 GiB per process is added: the context itself with torch's,
Transformer Engine's, Triton's and vLLM's kernels loaded, and cuBLAS's workspaces. The GPU's
size is what the device reports as usable: 79.2 GiB for an 80 GB H100 (``--gpu-gib``). Peaks: rollout = actor's weights, gradients
and optimizer + context + NCCL + fragmentation + vLLM's share; update = the same without vLLM's
share + activations + logits + the output layer's weight gradient + vLLM asleep. With
``parallel.offload_during_rollout`` the rollout holds neither gradients nor optimizer state. vLLM starts
only when ``gpu_memory_utilization`` x the GPU is free beside the actor (its start-up check);
the plan says whether it is.

With ``rollout.placement=disaggregated`` there are two plans, each checked against the GPU. A
learner (the first nodes x GPUs - ``rollout.ranks`` GPUs; tp x pp x dp over them): the actor's
terms above with no vLLM share or sleep (the whole GPU is the actor's), and the export in
flight after each update: learner 0 holds the bucket being broadcast and its flat copy, each up
to max(bucket, L), L the largest tensor the export gathers whole (V x h for the embedding; a
larger tensor is a bucket of its own; buckets of 256 MiB, ``actor.export_hf``), while the export
holds the next tensor (its copy, and at TP > 1 its gathered shards and their concatenation: up
to 3L). A rollout rank: vLLM's share as above, its weights in the engine's dtype
(``model.dtype``) over rollout TP, its reserve and the KV cache in the rest; beside the share the
CUDA context, the receive buffer of one bucket (up to max(bucket, L)) and NCCL's buffers for the
bridge's communicator and, at rollout TP > 1, vLLM's own (0.5 GiB each).

Disk: a checkpoint's size (actor/checkpoint.py ``disk_plan``) and its write time at
``--write-gbps`` per node (the learners' nodes), which with the step time gives the lead the
time-limit signal needs (the sbatch scripts give 300 s).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
H100_80GB = 79.2  # GiB an 80 GB H100 reports to torch (85.0e9 bytes)
CUDA_CONTEXT = 2.5 * GIB
VLLM_ASLEEP = 2.0 * GIB
NCCL_COMMUNICATORS = 6
NCCL = NCCL_COMMUNICATORS * 0.5 * GIB
NCCL_NVLS = NCCL_COMMUNICATORS * 1.5 * GIB
# the terms a training rank holds all the time (without offload)
STATIC = ("weights", "gradients", "optimizer", "cuda_context", "nccl", "fragmentation")
EXPORT_BUCKET = 256 * 2**20  # actor.export_hf's bucket_bytes: the weights travel in these
VLLM_BATCHED_TOKENS = 16384  # vLLM's default max_num_batched_tokens for the offline LLM
VLLM_MAX_SEQS = 1024  # and its max_num_seqs, on a GPU of 70 GiB or more
VLLM_GRAPHS = 1.0 * GIB  # its CUDA-graph pool (assumed)
FRAGMENTATION = 2.0 * GIB
LOGIT_BYTES = 24
SIGNAL_LEAD = 300  # seconds: slurm/train.sbatch's and sweep.sbatch's --signal=B:USR1@300
# name: (hidden, layers, heads, kv heads, head dim, ffn, vocab, tied embeddings[, experts,
# experts a token, an expert's ffn]), from each model's config.json
ARCHS = {
    "smollm2-135m": (576, 30, 9, 3, 64, 1536, 49152, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 128, 18944, 152064, False),  # Qwen2.5-Math-7B too
    "qwen2.5-32b": (5120, 64, 40, 8, 128, 27648, 152064, False),
    "qwen3-8b": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "llama-3.1-8b": (4096, 32, 32, 8, 128, 14336, 128256, False),
    "qwen3-30b-a3b": (2048, 48, 32, 4, 128, 6144, 151936, False, 128, 8, 768),
}


@dataclass
class Arch:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    experts: int = 0  # a mixture-of-experts model's experts per layer (0: dense)
    topk: int = 0  # experts a token goes to
    expert_ffn: int = 0  # an expert's FFN width

    @classmethod
    def from_hf(cls, config: dict) -> "Arch":
        heads = config["num_attention_heads"]
        experts = config.get("num_experts") or config.get("num_local_experts") or 0
        return cls(config["hidden_size"], config["num_hidden_layers"], heads,
                   config.get("num_key_value_heads") or heads,
                   config.get("head_dim") or config["hidden_size"] // heads,
                   config["intermediate_size"], config["vocab_size"],
                   bool(config.get("tie_word_embeddings")), experts,
                   config.get("num_experts_per_tok", 0) if experts else 0,
                   config.get("moe_intermediate_size", 0) if experts else 0)

    def dense_layer_params(self) -> int:
        """A layer's parameters but the experts: qkv (+bias), output, two norms, and the gated
        MLP or the router."""
        q, kv = self.heads * self.head_dim, 2 * self.kv_heads * self.head_dim
        mlp = self.hidden * self.experts if self.experts else 3 * self.hidden * self.ffn
        return self.hidden * (q + kv) + (q + kv) + q * self.hidden + mlp + 2 * self.hidden

    def expert_params(self) -> int:
        """One expert's gated MLP."""
        return 3 * self.hidden * self.expert_ffn

    def params(self) -> int:
        embed = self.vocab * self.hidden
        layer = self.dense_layer_params() + self.experts * self.expert_params()
        return self.layers * layer + embed * (1 if self.tied else 2) + self.hidden


def plan(arch: Arch, tp: int, pp: int, dp: int, tokens: int, response_tokens: int,
         recompute: str = "none", sequence_parallel: bool = False,
         distributed_optimizer: bool = True,
         bf16_grads: bool = False, logprob_chunk: int = 0, vllm_utilization: float = 0.0,
         gpu_bytes: float = H100_80GB * GIB, rollout_tp: int = 1, nvls: bool = False,
         offload: bool = False, ep: int = 1, route_tokens: int = 0) -> dict:
    """Bytes per GPU of each term (the first pipeline stage, which holds the embedding and, with
    1F1B, pp micro-batches in flight), and the rollout and update peaks. A MoE model's experts
    are whole on their rank (expert TP 1): ``experts/ep`` of them a layer, their optimizer state
    divided over the expert data-parallel ranks (tp x dp / ep). ``route_tokens``: the step's
    tokens a rank trains when MoE routing replay keeps their routes (actor.routing_replay): a
    byte per token, layer of its stage and expert a token (two above 128 experts), sliced by
    sequence parallelism, held through the update."""
    h, f = arch.hidden, arch.ffn
    k = arch.kv_heads * arch.head_dim
    embed = arch.vocab * h
    dense = (arch.layers // pp * arch.dense_layer_params() + embed) / tp  # stage 0: the embedding
    if pp == 1 and not arch.tied:
        dense += embed / tp  # and the output layer
    experts = arch.layers // pp * arch.experts // ep * arch.expert_params()
    shard = dense + experts
    sp = tp if sequence_parallel and tp > 1 else 1
    replicated = 4 * h / sp
    if arch.experts:  # a token's topk experts' MLP activations, the dispatcher's three copies
        # of the token (permuted, exchanged, to unpermute) and its fp32 router probabilities
        mlp = (arch.topk * (3 * arch.expert_ffn + 3 * h) + 2 * arch.experts) / tp
    else:
        mlp = 3 * f / tp
    split = (2 * h + 2 * k) / tp + mlp
    per_token_layer = 2 * (replicated + split)
    layers = arch.layers // pp
    if recompute == "full":
        kept = 2 * h / sp * layers + per_token_layer
    else:  # selective recompute (core attention) saves next to nothing with flash attention
        kept = per_token_layer * layers
    in_flight = pp  # 1F1B: the first stage holds pp micro-batches' activations
    rows = min(response_tokens, logprob_chunk) if logprob_chunk else response_tokens
    output_layer = pp == 1  # the plan is stage 0's: it has the output layer only without PP
    terms = {
        "weights": 2 * shard,
        "gradients": (2 if bf16_grads else 4) * shard,
        "optimizer": 12 * (dense / dp + experts / max(tp * dp // ep, 1)
                           if distributed_optimizer else shard),
        "activations": kept * tokens * in_flight,
        "logits": rows * arch.vocab / tp * LOGIT_BYTES if output_layer else 0.0,
        "output_wgrad": arch.vocab / tp * h * 4 if output_layer else 0.0,
        "routes": route_tokens / sp * layers * arch.topk * (1 if arch.experts <= 128 else 2),
        "cuda_context": CUDA_CONTEXT,
        "nccl": NCCL_NVLS if nvls else NCCL,
        "fragmentation": FRAGMENTATION,
    }
    vllm = vllm_share(arch, vllm_utilization, gpu_bytes, rollout_tp)
    vllm_rollout = vllm["vllm_rollout"]
    static = sum(terms[t] for t in STATIC)
    # parallel.offload_during_rollout: gradient buffers freed, optimizer state in host memory
    resident = static - (terms["gradients"] + terms["optimizer"] if offload else 0.0)
    rollout_peak = resident + vllm_rollout
    update_peak = static + terms["activations"] + terms["logits"] + terms["output_wgrad"] + \
        terms["routes"] + (VLLM_ASLEEP if vllm_utilization else 0)
    return {**terms, **vllm, "vllm_asleep": VLLM_ASLEEP if vllm_utilization else 0.0,
            # vLLM's start-up check: this much must be free when the engine starts
            "vllm_startup_free": gpu_bytes - resident,
            "vllm_starts": gpu_bytes - resident >= vllm_rollout,
            "rollout_peak": rollout_peak, "update_peak": update_peak,
            "peak": max(rollout_peak, update_peak), "gpu": gpu_bytes,
            "params_total": arch.params(), "params_shard": shard}


def vllm_share(arch: Arch, utilization: float, gpu_bytes: float, rollout_tp: int,
               dtype_bytes: int = 2) -> dict:
    """vLLM's share of a GPU (``utilization`` of it; none at 0): its weights in the engine's
    dtype over its TP, its own reserve, and KV cache in the rest, with the tokens that holds
    (a token's K and V in every layer, over the engine's TP ranks)."""
    share = utilization * gpu_bytes
    weights = dtype_bytes * arch.params() / rollout_tp if utilization else 0.0
    reserve = vllm_own_reserve(arch, rollout_tp) if utilization else 0.0
    kv = max(share - weights - reserve, 0.0)
    token = 2 * arch.layers * arch.kv_heads * arch.head_dim * dtype_bytes
    return {"vllm_rollout": share, "vllm_weights": weights, "vllm_reserve": reserve,
            "vllm_kv_cache": kv, "kv_tokens": kv * rollout_tp / token}


def largest_tensor(arch: Arch) -> int:
    """Elements of the largest tensor the export gathers whole: the embedding or output layer
    (V x h), the fused gate and up projection (2f x h; an expert's for MoE) or the fused qkv."""
    q, k = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    width = arch.expert_ffn if arch.experts else arch.ffn
    return max(arch.vocab, 2 * width, q + 2 * k) * arch.hidden


def export_in_flight(arch: Arch, tp: int, pp: int, bucket_bytes: float = EXPORT_BUCKET,
                     dtype_bytes: int = 2) -> float:
    """Learner 0 during the weights' export after an update, at most: the bucket being
    broadcast and its flat copy for the broadcast, each up to max(bucket, L) (a larger tensor
    is a bucket of its own), while the export holds the next tensor: its Hugging Face copy,
    and at TP > 1 its gathered shards and their concatenation (3L), or at PP > 1 without TP
    another stage's tensor received whole (2L)."""
    largest = largest_tensor(arch) * dtype_bytes
    next_tensor = 3 if tp > 1 else 2 if pp > 1 else 1
    return 2 * max(bucket_bytes, largest) + next_tensor * largest


def learner_plan(arch: Arch, tp: int, pp: int, dp: int, tokens: int, response_tokens: int,
                 bucket_bytes: float = EXPORT_BUCKET, **actor) -> dict:
    """A learner of disaggregated placement: the actor has the whole GPU (no vLLM share, none
    asleep); after the update learner 0 exports the weights bucket by bucket. Its NCCL count
    is the colocated one's, the bridge's communicator in place of vLLM's."""
    r = plan(arch, tp, pp, dp, tokens, response_tokens, **{**actor, "vllm_utilization": 0.0})
    static = sum(r[t] for t in STATIC)
    export = export_in_flight(arch, tp, pp, bucket_bytes)
    return {**r, "export": export, "export_peak": static + export,
            "peak": max(r["update_peak"], static + export)}


def rollout_plan(arch: Arch, rollout_tp: int, utilization: float,
                 gpu_bytes: float = H100_80GB * GIB, bucket_bytes: float = EXPORT_BUCKET,
                 dtype_bytes: int = 2, nvls: bool = False) -> dict:
    """A rollout rank of disaggregated placement: vLLM's share of the GPU (``utilization``),
    and beside it the CUDA context, the receive buffer of one weight bucket (up to
    max(bucket, L): every rank of an engine receives the whole bucket) and NCCL's buffers for
    the bridge's communicator and, at engine TP > 1, vLLM's own."""
    vllm = vllm_share(arch, utilization, gpu_bytes, rollout_tp, dtype_bytes)
    communicators = 1 + (rollout_tp > 1)
    terms = {"weight_bucket": max(bucket_bytes, largest_tensor(arch) * dtype_bytes),
             "cuda_context": CUDA_CONTEXT,
             "nccl": communicators * (NCCL_NVLS if nvls else NCCL) / NCCL_COMMUNICATORS}
    beside = sum(terms.values())
    return {**vllm, **terms, "peak": vllm["vllm_rollout"] + beside, "gpu": gpu_bytes,
            "vllm_startup_free": gpu_bytes - CUDA_CONTEXT,
            "vllm_starts": gpu_bytes - CUDA_CONTEXT >= vllm["vllm_rollout"],
            "max_utilization": (gpu_bytes - beside) / gpu_bytes}


def vllm_own_reserve(arch: Arch, rollout_tp: int) -> float:
    """What vLLM keeps of its share beside weights and KV cache: the activation peak of its
    start-up profile (a forward of ``VLLM_BATCHED_TOKENS`` through the widest layer, the gated
    MLP's three f-wide tensors and two h-wide ones in bf16, over its TP; the sampler's fp32
    logits and probabilities for ``VLLM_MAX_SEQS`` sequences, the whole vocabulary on every
    rank) and its CUDA-graph pool."""
    width = arch.topk * arch.expert_ffn if arch.experts else arch.ffn
    forward = VLLM_BATCHED_TOKENS * (3 * width + 2 * arch.hidden) * 2 / rollout_tp
    return forward + VLLM_MAX_SEQS * arch.vocab * 8 + VLLM_GRAPHS


def arch_for(model_path: str, name: str | None) -> Arch:
    config = Path(model_path) / "config.json"
    if config.is_file():
        return Arch.from_hf(json.loads(config.read_text()))
    key = name or next((a for a in ARCHS if a.replace(".", "") in
                        Path(model_path).name.lower().replace(".", "").replace("-math", "")), None)
    if key not in ARCHS:
        raise SystemExit(f"error: {model_path} has no config.json; give --arch, one of {sorted(ARCHS)}")
    return Arch(*ARCHS[key])


def fitting_layout(arch: Arch, world: int, gpus_per_node: int, longest: int,
                   settings: dict, spare: float = 6 * GIB,
                   learners: bool = False) -> list[str] | None:
    """The overrides of the fitting layout with the fewest model-parallel GPUs (TP within a
    node; then the largest EP), with ``spare`` left, full recompute, sequence parallelism at
    TP > 1, offload during rollout and log-probs in 2048-token chunks; None when none fits.
    ``learners``: the ``world`` learners of disaggregated placement (no engine beside them)."""
    divisors = [d for d in (1, 2, 4, 8, 16, 32, 64) if world % d == 0]
    candidates = []
    for tp in (d for d in divisors if d <= gpus_per_node):
        for pp in (d for d in divisors if arch.layers % d == 0 and world % (tp * d) == 0):
            for ep in [d for d in divisors if world % (d * pp) == 0 and arch.experts % d == 0] \
                    if arch.experts else [1]:
                for rollout_tp in [1] if learners else (
                        d for d in divisors if d <= gpus_per_node and arch.kv_heads % d == 0):
                    candidates.append((tp * pp, -ep, rollout_tp, tp, pp, ep))
    for _, _, rollout_tp, tp, pp, ep in sorted(candidates):
        r = (learner_plan if learners else plan)(
            arch, tp, pp, world // (tp * pp), recompute="full", sequence_parallel=tp > 1,
            distributed_optimizer=world > tp * pp, logprob_chunk=2048, rollout_tp=rollout_tp,
            offload=not learners, ep=ep, **settings)
        vllm_ok = not settings["vllm_utilization"] or (r["vllm_starts"] and r["kv_tokens"] >= longest)
        if r["peak"] + spare <= settings["gpu_bytes"] and vllm_ok:
            return [f"parallel.tensor_parallel={tp}", f"parallel.pipeline_parallel={pp}",
                    *([f"parallel.expert_parallel={ep}"] if arch.experts else []),
                    f"parallel.sequence_parallel={str(tp > 1).lower()}", "parallel.recompute=full",
                    *([] if learners else ["parallel.offload_during_rollout=true"]),
                    "parallel.logprob_chunk_tokens=2048",
                    *([] if learners else [f"rollout.tensor_parallel={rollout_tp}"])]
    return None


COLOCATED_ROWS = ["weights", "gradients", "optimizer", "activations", "logits", "output_wgrad",
                  "routes", "cuda_context", "nccl", "fragmentation", "vllm_rollout",
                  "vllm_weights", "vllm_reserve", "vllm_kv_cache", "vllm_asleep", "rollout_peak",
                  "update_peak"]
LEARNER_ROWS = ["weights", "gradients", "optimizer", "activations", "logits", "output_wgrad",
                "routes", "cuda_context", "nccl", "fragmentation", "export", "update_peak",
                "export_peak"]
ROLLOUT_ROWS = ["vllm_rollout", "vllm_weights", "vllm_reserve", "vllm_kv_cache", "weight_bucket",
                "cuda_context", "nccl", "peak"]
NO_KV_CACHE = ("DOES NOT FIT: vLLM's weights leave no KV cache for one sequence in its share; "
               "raise rollout.tensor_parallel or rollout.gpu_memory_utilization")


def table(result: dict, order: list[str] = COLOCATED_ROWS) -> list[tuple[str, float]]:
    """The terms in ``order``, routes only where kept (actor.routing_replay)."""
    return [(name, result[name] / GIB) for name in order if name != "routes" or result[name]]


def show(rows: list[tuple[str, float]], markdown: bool) -> None:
    if markdown:
        print("| term | GiB |\n|---|---|")
        print("\n".join(f"| {name} | {gib:.1f} |" for name, gib in rows))
    else:
        print("\n".join(f"  {name:<13} {gib:7.1f} GiB" for name, gib in rows))


def peak_line(what: str, peak: float, gpu_gib: float) -> bool:
    """``what`` peak against the GPU, in one line; whether it fits."""
    margin = gpu_gib - peak / GIB
    print(f"{what}{peak / GIB:.1f} GiB of {gpu_gib:g}: "
          + (f"fits, {margin:.1f} GiB spare" if margin >= 0 else f"DOES NOT FIT by {-margin:.1f} GiB"))
    return margin >= 0


def engine_lines(result: dict, vllm: float, longest: int, gpu_gib: float, where: str) -> bool:
    """vLLM's KV cache and start-up check in a line each; whether it starts and holds a
    sequence."""
    print(f"vLLM's KV cache holds {result['kv_tokens']:,.0f} tokens per engine "
          f"({result['kv_tokens'] / longest:.0f} sequences of {longest} tokens)")
    if result["kv_tokens"] < longest:
        print(NO_KV_CACHE)
    print(f"vLLM's start-up: {result['vllm_startup_free'] / GIB:.1f} GiB free {where}, "
          f"{vllm * gpu_gib:.1f} needed ({vllm:g} of the GPU): "
          + ("it starts" if result["vllm_starts"] else "DOES NOT START; lower "
             "rollout.gpu_memory_utilization"))
    return result["vllm_starts"] and result["kv_tokens"] >= longest


def colocated_report(result: dict, vllm: float, longest: int, args) -> bool:
    """The colocated plan's table and verdict lines; whether it fits."""
    show(table(result), args.markdown)
    engine_ok = engine_lines(result, vllm, longest, args.gpu_gib, "beside the actor") \
        if vllm else True
    return peak_line("peak ", result["peak"], args.gpu_gib) and engine_ok


def disaggregated_report(learner: dict, rollout: dict, vllm: float, rollout_tp: int,
                         longest: int, args) -> tuple[bool, bool]:
    """Both kinds of rank's tables and verdict lines; whether the learner fits, and the rollout
    rank."""
    print("a learner (the actor has the whole GPU; learner 0 also exports the weights):")
    show(table(learner, LEARNER_ROWS), args.markdown)
    learner_fits = peak_line("learner peak ", learner["peak"], args.gpu_gib)
    print(f"a rollout rank (vLLM at {vllm:g} of the GPU, rollout TP {rollout_tp}):")
    show(table(rollout, ROLLOUT_ROWS), args.markdown)
    engine_ok = engine_lines(rollout, vllm, longest, args.gpu_gib, "on the rollout rank")
    rollout_fits = peak_line("rollout rank peak ", rollout["peak"], args.gpu_gib)
    room = math.floor(rollout["max_utilization"] * 100) / 100
    print(f"rollout.gpu_memory_utilization up to {room:.2f} leaves room for the context, NCCL "
          "and a weight bucket beside vLLM")
    return learner_fits, rollout_fits and engine_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu-gib", type=float, default=H100_80GB,
                        help="usable GPU memory, as torch reports it (an 80 GB H100: 79.2)")
    parser.add_argument("--arch", choices=sorted(ARCHS), help="when model.path has no config.json")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--step-seconds", type=float, default=160.0,
                        help="seconds a training step takes, for the cost line (the paper: "
                             "about 160 s on 8 x 8 H100 for Qwen2.5-Math-7B)")
    parser.add_argument("--nvls", action="store_true",
                        help="NCCL with NVLS buffers (NCCL_NVLS_ENABLE=1; slurm/ sets 0)")
    parser.add_argument("--write-gbps", type=float, default=2.0,
                        help="checkpoint write bandwidth per node, GB/s (assumed: measure it)")
    args, overrides = parser.parse_known_args(argv)
    from megatron_rlep.cli import USER_ERRORS, fail
    from megatron_rlep.config import compose

    try:
        cfg = compose(overrides)
    except USER_ERRORS as err:
        fail(err)
    p, r = cfg.parallel, cfg.rollout
    world = args.nodes * args.gpus_per_node
    disaggregated = r.placement == "disaggregated"
    learners = world - r.ranks if disaggregated else world  # the GPUs the actor trains on
    if disaggregated and learners < 1:
        raise SystemExit(f"error: rollout.ranks={r.ranks} leaves no learner of the {world} GPUs; "
                         "lower rollout.ranks or plan more nodes (--nodes)")
    if disaggregated and r.engine == "transformers":
        raise SystemExit("error: rollout.engine=transformers has no plan on the rollout ranks "
                         "(the plan is vLLM's); plan with rollout.engine=vllm")
    if learners % (p.tensor_parallel * p.pipeline_parallel) or learners % (p.expert_parallel *
                                                                           p.pipeline_parallel):
        raise SystemExit(f"error: {learners} {'learner ' if disaggregated else ''}GPUs do not "
                         f"split into tp={p.tensor_parallel} x pp={p.pipeline_parallel} (and "
                         f"ep={p.expert_parallel} x pp); pick sizes that divide the GPU count"
                         + (" less rollout.ranks" if disaggregated else ""))
    dp = learners // (p.tensor_parallel * p.pipeline_parallel)
    longest = cfg.data.max_prompt_length + r.max_response_length
    tokens = p.micro_batch_size * longest  # a budget still lets one longest sequence through
    if p.max_tokens_per_micro_batch:
        tokens = max(longest, min(tokens, p.max_tokens_per_micro_batch))
    response = tokens * r.max_response_length // longest
    a = cfg.algorithm
    routed = cfg.actor.routing_replay != "none"  # every sequence of the step at its longest
    route_tokens = a.prompts_per_rollout * (a.rollouts_per_prompt + a.replay_per_prompt) * \
        longest // dp if routed else 0
    arch = arch_for(cfg.model.path, args.arch)
    vllm = r.gpu_memory_utilization if r.engine != "transformers" else 0.0
    settings = dict(tokens=tokens, response_tokens=response, bf16_grads=p.bf16_grads,
                    vllm_utilization=0.0 if disaggregated else vllm,
                    gpu_bytes=args.gpu_gib * GIB, nvls=args.nvls)
    actor = dict(recompute=p.recompute, sequence_parallel=p.sequence_parallel,
                 distributed_optimizer=dp > 1 if p.distributed_optimizer is None
                 else p.distributed_optimizer,
                 logprob_chunk=p.logprob_chunk_tokens, rollout_tp=r.tensor_parallel,
                 offload=p.offload_during_rollout, ep=p.expert_parallel,
                 route_tokens=route_tokens, **settings)
    moe = (f" ({arch.experts} experts, {arch.topk} a token, ep={p.expert_parallel})"
           if arch.experts else "")
    layout = f"tp={p.tensor_parallel} pp={p.pipeline_parallel} dp={dp}"
    if disaggregated:
        layout = (f"disaggregated: {learners} learners, {layout}; {r.ranks} rollout ranks, "
                  f"{r.ranks // r.tensor_parallel} engines of rollout TP {r.tensor_parallel}")
    print(f"{arch.params() / 1e9:.2f}B parameters{moe}, {world} GPUs of {args.gpu_gib:g} GiB: "
          f"{layout}; longest micro-batch "
          f"{tokens} tokens ({response} response tokens); recompute={p.recompute}, "
          f"sequence_parallel={p.sequence_parallel}, bf16_grads={p.bf16_grads}, logprob_chunk_tokens={p.logprob_chunk_tokens}, "
          f"offload_during_rollout={p.offload_during_rollout}, "
          f"vLLM gpu_memory_utilization={vllm:g}")
    if disaggregated:
        learner = learner_plan(arch, p.tensor_parallel, p.pipeline_parallel, dp, **actor)
        rollout = rollout_plan(arch, r.tensor_parallel, vllm, args.gpu_gib * GIB,
                               dtype_bytes=4 if cfg.model.dtype == "float32" else 2,
                               nvls=args.nvls)
        learner_fits, rollout_fits = disaggregated_report(learner, rollout, vllm,
                                                          r.tensor_parallel, longest, args)
        fits = learner_fits and rollout_fits
    else:
        result = plan(arch, p.tensor_parallel, p.pipeline_parallel, dp, **actor)
        fits = learner_fits = colocated_report(result, vllm, longest, args)
    if not learner_fits:
        found = fitting_layout(arch, learners, args.gpus_per_node, longest, settings,
                               learners=disaggregated)
        print("a layout that fits (its plan: add these overrides): " + " ".join(found)
              if found else "no layout of tp, pp, ep, recompute and offload fits: more GPUs"
              + (" for the learners (fewer rollout.ranks or more nodes)" if disaggregated else ""))
    from megatron_rlep.actor.checkpoint import disk_plan, human

    log = cfg.logging
    disk = disk_plan(arch.params(), True, cfg.algorithm.total_steps, log.save_every,
                     log.keep_checkpoints, log.keep_best)
    writers = math.ceil(learners / args.gpus_per_node)  # the learners' nodes write it
    write = disk["checkpoint"] / writers / (args.write_gbps * 1e9)
    print(f"disk: {human(disk['checkpoint'])} a checkpoint (bf16 weights, fp32 master copy and "
          f"Adam moments), {disk['saves']} saves, {disk['held']} on disk at once "
          f"(logging.keep_checkpoints={log.keep_checkpoints}); the run holds at most "
          f"{human(disk['run'])} with the best step's weights and the final export")
    lead = args.step_seconds + write + 60
    given = ("within the sbatch scripts' 300" if lead <= SIGNAL_LEAD else
             f"more than the sbatch scripts' {SIGNAL_LEAD}: submit with "
             f"--signal=B:USR1@{math.ceil(lead)}")
    print(f"time limit: a checkpoint writes in about {write:.0f} s ({writers} node(s) at "
          f"{args.write_gbps:g} GB/s each); the stop signal needs at least a step, the write and "
          f"a minute: {lead:.0f} s, {given}")
    hours = cfg.algorithm.total_steps * args.step_seconds / 3600
    print(f"cost: {cfg.algorithm.total_steps} steps x {args.step_seconds:g} s = {hours:.1f} h on "
          f"{world} GPUs, {hours * world:,.0f} GPU-hours (--step-seconds sets the step time)")
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
