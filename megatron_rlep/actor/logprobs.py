"""Log-probabilities and entropy of given tokens from vocab-parallel logits.

Each tensor-parallel rank holds a slice of the vocabulary. The log-prob of the target token
comes from Megatron-Core's ``vocab_parallel_cross_entropy`` (which reduces max and sum over
the TP group); the entropy ``H = log Z - sum_v p_v z_v`` reduces the same way, through
Megatron's all-reduce whose backward is the identity, so both are differentiable.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
                   ) -> torch.Tensor:
    """log p(targets) under softmax(logits / temperature); logits [..., vocab/tp] on this rank."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    scaled = logits.float() / temperature
    return -vocab_parallel_cross_entropy(scaled, targets)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) over the whole (TP-split) vocabulary."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    z = logits.float() / temperature
    peak = z.detach().max(dim=-1, keepdim=True).values
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX,
                                     group=parallel_state.get_tensor_model_parallel_group())
    z = z - peak
    exp = z.exp()
    sums = torch.stack([exp.sum(-1), (exp * z).sum(-1)])
    sums = reduce_from_tensor_model_parallel_region(sums)
    return sums[0].log() - sums[1] / sums[0]
