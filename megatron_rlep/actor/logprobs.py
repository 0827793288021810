"""Log-probabilities and entropy of response tokens from vocab-parallel logits.

The actor computes logits only for response positions (rows [n, vocab/tp]), so prompt
positions cost neither the output layer nor a softmax. Each tensor-parallel rank holds a slice of the vocabulary.
With TP > 1 the log-prob of the target token comes from Megatron-Core's
``vocab_parallel_cross_entropy`` (which reduces max and sum over the TP group), and the
entropy ``H = log Z - sum_v p_v z_v`` reduces the same way, through Megatron's all-reduce
whose backward is the identity, so both are differentiable. With TP = 1 the whole vocabulary
is local and one fused ``log_softmax`` gives both (the same numbers, fewer passes over the
logits; see docs/benchmarks.md).
"""

from __future__ import annotations

import torch


def response_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                      entropy: str = "none") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(targets), entropy) per row of ``logits`` [n, vocab/tp] on this rank.

    ``entropy`` is ``none``, ``detached`` or ``grad`` (differentiable, for an entropy bonus).
    """
    from megatron.core import parallel_state

    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        log_probs = torch.log_softmax(z, dim=-1)
        return log_probs.gather(-1, targets[:, None])[:, 0], _entropy_from_log_probs(log_probs, entropy)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # Megatron's cross entropy works in place on its input: take the entropy first, and give
    # the cross entropy a copy when the entropy's graph still needs z.
    ent = None
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = vocab_parallel_entropy(z)
    logp = -vocab_parallel_cross_entropy(z.clone() if entropy == "grad" else z, targets)
    return logp, ent


def _entropy_from_log_probs(log_probs: torch.Tensor, mode: str) -> torch.Tensor | None:
    if mode == "none":
        return None
    with torch.set_grad_enabled(mode == "grad" and torch.is_grad_enabled()):
        return -(log_probs.exp() * log_probs).sum(-1)


def vocab_parallel_entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) over the whole vocabulary, z being this TP rank's slice."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    peak = z.detach().max(dim=-1, keepdim=True).values
    torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX,
                                 group=parallel_state.get_tensor_model_parallel_group())
    z = z - peak
    exp = z.exp()
    sums = reduce_from_tensor_model_parallel_region(torch.stack([exp.sum(-1), (exp * z).sum(-1)]))
    return sums[0].log() - sums[1] / sums[0]
