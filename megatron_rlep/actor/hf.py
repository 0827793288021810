"""Hugging Face <-> Megatron-Core: model configs, weight loading into shards, streamed export.

A model family is one short table from Megatron-Core parameter names (global layer index
``{i}``) to Hugging Face names plus a transform:

* ``Copy``: the same tensor, split along the parameter's tensor-parallel dimension if it has one;
* ``QKV``: q, k and v projections interleaved per query group (``[q_g..., k_g, v_g]`` for each
  group g), so a contiguous TP slice holds whole groups;
* ``GateUp``: the fused SwiGLU ``linear_fc1`` holds, on TP rank r, ``[gate_r; up_r]``.

Transformer Engine specs fuse the layer norms into the following linear layer, and run a rank's
experts as one grouped GEMM (one weight per expert, ``linear_fc1.weight<k>``); their names are
aliased to the local spec's names before the table lookup, so one table serves both specs.

Loading reads only the tensors a rank needs (safetensors opened lazily). Export walks every
parameter of the whole model in a fixed order, layer by layer (a layer's experts, from every
expert-parallel rank, right after its dense weights, so a consumer that keeps a layer's tensors
until the layer is whole, as vLLM's layer-wise reload does, holds one layer at a time), gathers
TP shards on the owning pipeline stage, converts to Hugging Face tensors and broadcasts them
over the pipeline group, handing bounded buckets of ``(name, tensor)`` to a consumer on every
rank, and completes its collectives whatever the consumer does. It never writes to disk.

This module knows nothing of RL, rollouts or optimisers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist


class ModelError(ValueError):
    """A model the actor cannot build; the message is one sentence naming the fix."""


# ----------------------------------------------------------------------------- transforms


@dataclass(frozen=True)
class Copy:
    hf: str

    def names(self) -> tuple[str, ...]:
        return (self.hf,)

    def to_mcore(self, tensors, cfg, tp_rank, tp_size, partition_dim):
        return _split(tensors[0], tp_rank, tp_size, partition_dim)

    def to_hf(self, shards, cfg, partition_dim):
        return [torch.cat(shards, partition_dim) if partition_dim is not None else shards[0]]


@dataclass(frozen=True)
class QKV:
    q: str
    k: str
    v: str

    def names(self) -> tuple[str, ...]:
        return (self.q, self.k, self.v)

    def to_mcore(self, tensors, cfg, tp_rank, tp_size, partition_dim):
        q, k, v = tensors
        groups = cfg.num_query_groups
        per_group = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
        fused = torch.cat(per_group, dim=1).reshape(-1, *q.shape[1:])
        return _split(fused, tp_rank, tp_size, 0)

    def to_hf(self, shards, cfg, partition_dim):
        fused = torch.cat(shards, 0)
        groups, dim = cfg.num_query_groups, cfg.kv_channels
        heads_per_group = cfg.num_attention_heads // groups
        grouped = fused.reshape(groups, (heads_per_group + 2) * dim, *fused.shape[1:])
        q, k, v = grouped.split([heads_per_group * dim, dim, dim], dim=1)
        return [t.reshape(-1, *fused.shape[1:]).contiguous() for t in (q, k, v)]


@dataclass(frozen=True)
class GateUp:
    gate: str
    up: str

    def names(self) -> tuple[str, ...]:
        return (self.gate, self.up)

    def to_mcore(self, tensors, cfg, tp_rank, tp_size, partition_dim):
        gate, up = tensors
        return torch.cat([_split(gate, tp_rank, tp_size, 0), _split(up, tp_rank, tp_size, 0)])

    def to_hf(self, shards, cfg, partition_dim):
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]


def _split(tensor: torch.Tensor, rank: int, size: int, dim: int | None) -> torch.Tensor:
    if dim is None or size == 1:
        return tensor
    return tensor.chunk(size, dim=dim)[rank]


# ----------------------------------------------------------------------------- families

_LAYER = "model.layers.{i}."
LLAMA = {
    "embedding.word_embeddings.weight": Copy("model.embed_tokens.weight"),
    "output_layer.weight": Copy("lm_head.weight"),
    "decoder.final_layernorm.weight": Copy("model.norm.weight"),
    "decoder.layers.{i}.input_layernorm.weight": Copy(_LAYER + "input_layernorm.weight"),
    "decoder.layers.{i}.self_attention.linear_qkv.weight": QKV(
        _LAYER + "self_attn.q_proj.weight", _LAYER + "self_attn.k_proj.weight",
        _LAYER + "self_attn.v_proj.weight"),
    "decoder.layers.{i}.self_attention.linear_qkv.bias": QKV(
        _LAYER + "self_attn.q_proj.bias", _LAYER + "self_attn.k_proj.bias",
        _LAYER + "self_attn.v_proj.bias"),
    "decoder.layers.{i}.self_attention.linear_proj.weight": Copy(_LAYER + "self_attn.o_proj.weight"),
    "decoder.layers.{i}.pre_mlp_layernorm.weight": Copy(_LAYER + "post_attention_layernorm.weight"),
    "decoder.layers.{i}.mlp.linear_fc1.weight": GateUp(
        _LAYER + "mlp.gate_proj.weight", _LAYER + "mlp.up_proj.weight"),
    "decoder.layers.{i}.mlp.linear_fc2.weight": Copy(_LAYER + "mlp.down_proj.weight"),
}
QWEN2 = LLAMA  # same Hugging Face names; the q/k/v biases are always present (config below)
QWEN3 = {  # Llama's names plus a per-head RMSNorm of queries and keys
    **LLAMA,
    "decoder.layers.{i}.self_attention.q_layernorm.weight": Copy(_LAYER + "self_attn.q_norm.weight"),
    "decoder.layers.{i}.self_attention.k_layernorm.weight": Copy(_LAYER + "self_attn.k_norm.weight"),
}
_EXPERT = _LAYER + "mlp.experts.{e}."
QWEN3_MOE = {  # every layer's MLP a router and experts (Megatron's SequentialMLP names)
    **QWEN3,
    "decoder.layers.{i}.mlp.router.weight": Copy(_LAYER + "mlp.gate.weight"),
    "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight": GateUp(
        _EXPERT + "gate_proj.weight", _EXPERT + "up_proj.weight"),
    "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight": Copy(
        _EXPERT + "down_proj.weight"),
}

FAMILIES = {"llama": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3, "qwen3_moe": QWEN3_MOE}

# Transformer Engine fuses layer norms into the next linear layer: map its names to local ones.
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def family(hf_config) -> dict:
    kind = getattr(hf_config, "model_type", None)
    if kind not in FAMILIES:
        raise ModelError(f"model type {kind!r} is not supported (supported: "
                         f"{', '.join(sorted(FAMILIES))}); add a table to megatron_rlep/actor/hf.py")
    return FAMILIES[kind]


RECOMPUTE = {
    "none": {},
    "selective": {"recompute_granularity": "selective"},
    "full": {"recompute_granularity": "full", "recompute_method": "uniform",
             "recompute_num_layers": 1},
}


def unsupported(hf_config, expert_parallel: int = 1) -> str | None:
    """Why the actor cannot build ``hf_config`` faithfully, naming the config field, or None."""
    c, kind = hf_config, hf_config.model_type
    rope = rope_parameters(c)
    if rope["rope_type"] == "llama3":
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}  # Megatron-Core's llama3 scaling
        wrong = [k for k, v in fixed.items() if float(rope.get(k, v)) != v]
        if wrong:
            return (f"rope_scaling {wrong[0]}={rope[wrong[0]]} differs from the Llama 3.1 value "
                    f"{fixed[wrong[0]]} that Megatron-Core's llama3 RoPE scaling fixes; use a "
                    "checkpoint with Llama 3.1's RoPE settings")
    elif rope["rope_type"] != "default":
        return (f"rope_scaling of type {rope['rope_type']!r} is not supported (default and llama3 "
                "are); use a checkpoint without it")
    if getattr(c, "mlp_bias", False):
        return "mlp_bias=true is not supported; use a checkpoint without MLP biases"
    if getattr(c, "use_sliding_window", False):
        return "use_sliding_window=true is not supported; use a checkpoint with full attention"
    if kind == "qwen3_moe":
        if list(getattr(c, "mlp_only_layers", None) or []) or c.decoder_sparse_step != 1:
            return ("mlp_only_layers and decoder_sparse_step != 1 (dense layers among the MoE "
                    "ones) are not supported; use a checkpoint whose every layer is MoE")
        if c.num_experts % expert_parallel:
            return (f"parallel.expert_parallel={expert_parallel} must divide the model's "
                    f"{c.num_experts} experts; pick a divisor")
    elif expert_parallel > 1:
        return (f"parallel.expert_parallel={expert_parallel} needs a mixture-of-experts model "
                f"and {kind} has no experts; set parallel.expert_parallel=1")
    return None


def _moe_settings(c, expert_parallel: int, router_aux_loss: float, grouped_gemm: bool) -> dict:
    """Megatron-Core MoE settings equal to a Qwen3-MoE block: softmax router, top-k (renormalised
    when ``norm_topk_prob``: Megatron's top-k-then-softmax; else softmax-then-top-k), a rank's
    experts as one grouped GEMM (``grouped_gemm``: Transformer Engine's TEGroupedMLP) or one
    after another (SequentialMLP: the local specs'), tokens to the experts' ranks by all-to-all,
    experts not split over TP (expert TP 1), the router unfused."""
    if c.model_type != "qwen3_moe":
        return {}
    return dict(
        num_moe_experts=c.num_experts, moe_router_topk=c.num_experts_per_tok,
        moe_ffn_hidden_size=c.moe_intermediate_size, moe_router_pre_softmax=not c.norm_topk_prob,
        moe_router_score_function="softmax", moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=grouped_gemm, expert_model_parallel_size=expert_parallel,
        expert_tensor_parallel_size=1, moe_aux_loss_coeff=router_aux_loss,
        moe_router_load_balancing_type="aux_loss" if router_aux_loss else "none",
        moe_router_fusion=False)  # the fused router skips routing replay's hook (routing.py)


def spec_options(hf_config) -> dict:
    """The layer-spec options ``hf_config`` needs (``platform.layer_spec``'s keywords)."""
    kind = hf_config.model_type
    return {"qk_layernorm": kind in ("qwen3", "qwen3_moe"),
            "num_experts": hf_config.num_experts if kind == "qwen3_moe" else None}


def transformer_config(hf_config, tensor_parallel: int, pipeline_parallel: int,
                       dtype: torch.dtype, cpu: bool, recompute: str = "none",
                       sequence_parallel: bool = False, expert_parallel: int = 1,
                       router_aux_loss: float = 0.0, grouped_gemm: bool = False):
    """Megatron-Core ``TransformerConfig`` equivalent to a Hugging Face config of a family above.
    ``recompute``: none; selective (core attention recomputed in the backward pass, Megatron's
    default modules); full (only each layer's input kept, the layer recomputed).
    ``sequence_parallel`` (with TP > 1) splits the norms' and residuals' activations over TP.
    ``expert_parallel`` spreads a MoE model's experts over that many ranks; ``router_aux_loss``
    is the router's load-balancing loss coefficient (0: off, the RL default); ``grouped_gemm``
    runs a rank's experts as one grouped GEMM (with Transformer Engine's layer specs only)."""
    from megatron.core.transformer import TransformerConfig

    family(hf_config)
    c = hf_config
    heads, groups = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    problem = unsupported(c, expert_parallel)
    if problem:
        raise ModelError(f"{c.model_type}: {problem}")
    if heads % tensor_parallel or groups % tensor_parallel:
        raise ModelError(f"parallel.tensor_parallel={tensor_parallel} must divide the model's "
                         f"{heads} attention heads and {groups} key/value heads; pick a divisor")
    if c.num_hidden_layers % pipeline_parallel:
        raise ModelError(f"parallel.pipeline_parallel={pipeline_parallel} must divide the model's "
                         f"{c.num_hidden_layers} layers; pick a divisor")
    if c.model_type == "qwen3_moe" and tensor_parallel > 1 and not sequence_parallel:
        raise ModelError(f"a mixture-of-experts model at parallel.tensor_parallel="
                         f"{tensor_parallel} needs parallel.sequence_parallel=true (Megatron-Core's "
                         "MoE layer trains only so)")
    if c.vocab_size % tensor_parallel:
        raise ModelError(f"parallel.tensor_parallel={tensor_parallel} must divide the vocabulary "
                         f"size {c.vocab_size}; pick a divisor")
    qkv_bias = c.model_type == "qwen2" or bool(getattr(c, "attention_bias", False))
    config = TransformerConfig(
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
        ffn_hidden_size=c.intermediate_size, num_attention_heads=heads,
        num_query_groups=groups, kv_channels=getattr(c, "head_dim", None) or c.hidden_size // heads,
        normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=qkv_bias,
        qk_layernorm=spec_options(c)["qk_layernorm"],
        bias_activation_fusion=True, masked_softmax_fusion=False, apply_rope_fusion=False,
        bias_dropout_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=cpu,  # the CPU's own (platform shim 11); GPU: off as before
        # perform_initialization also tags each weight's TP split (partition_dim) on the CPU path
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=cpu,
        perform_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel,
        sequence_parallel=sequence_parallel and tensor_parallel > 1,
        calculate_per_token_loss=True,
        cuda_graph_scope=[],  # the default "full" only warns that it is deprecated
        **RECOMPUTE[recompute], **_moe_settings(c, expert_parallel, router_aux_loss,
                                                          grouped_gemm),
    )
    # Micro-batches are padded to their own length, so pipeline stages exchange shapes. Set
    # after construction: the constructor's check on this flag concerns MoE dispatchers only.
    config.variable_seq_lengths = True
    return config


def gpt_model(hf_config, config, layer_spec):
    """This rank's pipeline stage of a ``GPTModel`` shaped like ``hf_config`` (weights unset)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    rope = rope_parameters(hf_config)
    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec, vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        position_embedding_type="rope", rotary_base=float(rope["rope_theta"]),
        rope_scaling=rope["rope_type"] == "llama3",
        rope_scaling_factor=float(rope.get("factor", 8.0)),
    )
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:  # Megatron tags them so only at expert parallel > 1
            param.allreduce = False  # an expert's: reduced over the expert data-parallel group
    return model


def rope_parameters(hf_config) -> dict:
    """RoPE settings across transformers versions (``rope_parameters`` or the older fields)."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


# ----------------------------------------------------------------------------- names


def _global_name(model, local_name: str) -> str:
    """``decoder.layers.<local>.x`` -> ``decoder.layers.{global}.x``, a local expert's index ->
    the global one, TE names aliased (TEGroupedMLP's ``linear_fc1.weight<k>`` to SequentialMLP's
    ``local_experts.<k>.linear_fc1.weight``, so one table serves both)."""
    m = re.match(r"decoder\.layers\.(\d+)\.(.+)", local_name)
    if not m:
        return local_name
    layer = model.decoder.layers[int(m.group(1))]
    rest = TE_ALIASES.get(m.group(2), m.group(2))
    grouped = re.match(r"mlp\.experts\.(linear_fc[12])\.weight(\d+)$", rest)
    if grouped:  # TEGroupedMLP's GEMM k is local expert k: SequentialMLP's name for it
        rest = f"mlp.experts.local_experts.{grouped.group(2)}.{grouped.group(1)}.weight"
    expert = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.+)", rest)
    if expert:
        index = layer.mlp.local_expert_indices[int(expert.group(1))]
        rest = f"mlp.experts.local_experts.{index}.{expert.group(2)}"
    return f"decoder.layers.{layer.layer_number - 1}.{rest}"


def _rule(table: dict, global_name: str):
    layer = re.match(r"decoder\.layers\.(\d+)\.", global_name)
    expert = re.search(r"\.local_experts\.(\d+)\.", global_name)
    key = global_name
    if layer:
        key = key.replace(layer.group(0), "decoder.layers.{i}.", 1)
    if expert:
        key = key.replace(expert.group(0), ".local_experts.{e}.", 1)
    if key not in table:
        raise ModelError(f"Megatron-Core parameter {global_name} has no entry in the conversion "
                         "table; extend the family's table in megatron_rlep/actor/hf.py")
    rule = table[key]
    fill = {"{i}": layer.group(1) if layer else "", "{e}": expert.group(1) if expert else ""}
    return type(rule)(*(re.sub(r"\{[ie]\}", lambda m: fill[m.group(0)], n) for n in rule.names()))


def _is_expert(param) -> bool:
    """An expert's weight (tagged in ``gpt_model``): whole on its expert-parallel rank."""
    return not getattr(param, "allreduce", True)


def _tp_dim(param) -> int | None:
    if _is_expert(param):  # experts are whole on their rank (expert tensor parallel 1)
        return None
    return param.partition_dim if getattr(param, "tensor_model_parallel", False) else None


def _is_tied_output(model, local_name: str) -> bool:
    return local_name == "output_layer.weight" and model.share_embeddings_and_output_weights


# ----------------------------------------------------------------------------- loading


class SafetensorsReader:
    """Lazily reads named tensors from a Hugging Face checkpoint directory."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        path = Path(path)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = [p.name for p in sorted(path.glob("*.safetensors"))]
        if not files:
            raise ModelError(f"{path} holds no .safetensors weights; give a Hugging Face checkpoint "
                             "directory saved with safe_serialization=True")
        self._handles = [safe_open(str(path / f), framework="pt") for f in files]
        self._where = {k: h for h in self._handles for k in h.keys()}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ModelError(f"the checkpoint has no tensor {name}; is it a checkpoint of a "
                             f"family in megatron_rlep/actor/hf.py ({', '.join(FAMILIES)})?")
        return self._where[name].get_tensor(name)


@torch.no_grad()
def load_hf_weights(model, hf_config, get: Callable[[str], torch.Tensor]) -> None:
    """Copy Hugging Face tensors (``get(name)``) into this rank's shards of ``model``."""
    from megatron.core import parallel_state

    table = family(hf_config)
    cfg = model.config
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    for local_name, param in model.named_parameters():
        name = _global_name(model, local_name)
        if _is_tied_output(model, local_name):
            name = "embedding.word_embeddings.weight"
        rule = _rule(table, name)
        tensors = [get(n) for n in rule.names()]
        whole = _is_expert(param)  # expert tensor parallel 1
        shard = rule.to_mcore(tensors, cfg, 0 if whole else tp_rank, 1 if whole else tp_size,
                              _tp_dim(param))
        if shard.shape != param.shape:
            raise ModelError(f"{rule.names()[0]} has shape {tuple(tensors[0].shape)} which does not "
                             f"fit {name} {tuple(param.shape)}; the config and weights disagree")
        param.copy_(shard)


# ----------------------------------------------------------------------------- export


def _export_plan(model) -> list[tuple[int, int | None, str, str, torch.Size, int | None]]:
    """Every exported parameter of the whole model: (pp rank, expert-parallel rank of an
    expert's weight else None, local name, global name, full shape, tp dim), the same list in
    the same order on every rank: layer by layer, each layer whole (its experts from every
    expert-parallel rank included) before the next."""
    from megatron.core import parallel_state

    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    dense, experts = [], []
    for local_name, param in model.named_parameters():
        if _is_tied_output(model, local_name):
            continue
        dim = _tp_dim(param)
        shape = list(param.shape)
        if dim is not None:
            shape[dim] *= tp_size
        expert = _is_expert(param)
        (experts if expert else dense).append(
            (pp_rank, ep_rank if expert else None, local_name, _global_name(model, local_name),
             torch.Size(shape), dim))
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    if ep_size > 1:
        ranks = [None] * ep_size
        dist.all_gather_object(ranks, experts, group=parallel_state.get_expert_model_parallel_group())
        experts = [entry for rank in ranks for entry in rank]
    # layer by layer, each layer's experts (from every EP rank) right after its dense weights:
    # vLLM's layer-wise reload keeps what arrived of a layer until the layer is whole
    mine = sorted(dense + experts, key=lambda entry: _layer_position(entry[3]))
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    if pp_size == 1:
        return mine
    stages = [None] * pp_size
    dist.all_gather_object(stages, mine, group=parallel_state.get_pipeline_model_parallel_group())
    return [entry for stage in stages for entry in stage]


def _layer_position(global_name: str) -> float:
    """Where a parameter goes in the export of its pipeline stage: the embedding first, then
    each decoder layer in order, then the final norm and the output layer."""
    layer = re.match(r"decoder\.layers\.(\d+)\.", global_name)
    if layer:
        return int(layer.group(1))
    return -1 if global_name.startswith("embedding.") else float("inf")


@torch.no_grad()
def export_hf(model, hf_config, consume: Callable[[Iterator], Any] | None = None,
              bucket_bytes: int = 256 << 20) -> Any:
    """Run the whole export on this rank and return ``consume(buckets)``: the model as Hugging
    Face ``(name, tensor)`` pairs in buckets of at most ``bucket_bytes`` (a single larger tensor
    is a bucket of its own). What ``consume`` leaves of the export (it stopped early or failed;
    None: a rank that only takes part) runs after it, so every rank's collectives complete
    whatever its consumer did, and no caller drains the export."""
    buckets = _buckets(model, hf_config, bucket_bytes)
    try:
        return consume(buckets) if consume is not None else None
    finally:
        for _ in buckets:
            pass


def _buckets(model, hf_config, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    from megatron.core import parallel_state

    table = family(hf_config)
    cfg = model.config
    params = dict(model.named_parameters())
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    dtype = cfg.params_dtype
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    ep_group = parallel_state.get_expert_model_parallel_group()
    device = next(iter(params.values())).device
    bucket, size = [], 0
    for owner, ep_owner, local_name, name, full_shape, dim in _export_plan(model):
        rule = _rule(table, name)
        if owner == pp_rank and ep_owner not in (None, ep_rank):  # another rank's expert
            full = torch.empty(full_shape, dtype=dtype, device=device)
        elif owner == pp_rank:
            shard = params[local_name].detach()
            if tp_size > 1 and dim is not None:
                shards = [torch.empty_like(shard) for _ in range(tp_size)]
                dist.all_gather(shards, shard.contiguous(),
                                group=parallel_state.get_tensor_model_parallel_group())
            else:
                shards = [shard]
            # one shard: the rule's to_hf below copies it (a parameter never leaves as itself)
            full = torch.cat(shards, dim) if dim is not None and len(shards) > 1 else shards[0]
        else:
            full = torch.empty(full_shape, dtype=dtype, device=device)
        if owner == pp_rank and ep_owner is not None and dist.get_world_size(ep_group) > 1:
            dist.broadcast(full, src=dist.get_global_rank(ep_group, ep_owner), group=ep_group)
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            src = dist.get_global_rank(pp_group, owner)
            dist.broadcast(full, src=src, group=pp_group)
        split = list(full.chunk(tp_size, dim)) if dim is not None else [full]
        for hf_name, tensor in zip(rule.names(), rule.to_hf(split, cfg, dim)):
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((hf_name, tensor))
            size += nbytes
    if bucket:
        yield bucket
