"""Causal self-attention through ``torch.nn.functional.scaled_dot_product_attention`` for
Megatron-Core's local layer specs.

The local spec's ``DotProductAttention`` materialises the [b, heads, s, s] score tensor, applies
an explicit mask and runs softmax and two batched matmuls unfused; on a CPU that is the slowest
part of a layer after the linear layers. ``SdpaAttention`` keeps its interface (same inputs,
same [s, b, heads * dim] output) and computes causal attention with PyTorch's fused kernel,
grouped-query heads included. Without a mask it is causal (the actor right-pads sequences, so
that is all one sequence per row needs); shared prompts (``parallel.share_prompts``) pass their
own mask, True where attention is not allowed (Megatron's convention). Packed sequences
(``parallel.pack_sequences``, Megatron's THD layout: [t, heads, dim] with the bounds in
``packed_seq_params``) run causal attention over each sequence alone, as Transformer Engine's
attention does with them. Dropout is not supported. Transformer Engine specs keep TE's attention.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaAttention(DotProductAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.attn_mask_type != AttnMaskType.causal or self.config.attention_dropout:
            raise ValueError("SdpaAttention supports causal attention without dropout only")

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None:  # [t, heads, dim], sequences end to end
            bounds = packed_seq_params.cu_seqlens_q.tolist()  # host bounds: no wait (actor.py)
            out = [self.forward(*(x[a:b, None] for x in (query, key, value)))
                   for a, b in zip(bounds[:-1], bounds[1:])]
            return torch.cat(out)  # [t, 1, heads * dim]
        # [s, b, heads, dim] -> [b, heads, s, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        allowed = None if attention_mask is None else ~attention_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=allowed is None, scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def with_sdpa(layer_spec):
    """A copy of a local layer spec whose core attention is ``SdpaAttention``."""
    import copy

    spec = copy.deepcopy(layer_spec)
    spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    return spec
