"""Run under torchrun: a tiny GPTModel forward/backward, the forward-backward schedule and a
distributed checkpoint round trip, with the layout given on the command line (tp, pp).

Every check raises on failure; rank 0 prints "OK <tp> <pp>" at the end.
"""

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import platform


def build(tp, pp):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2,
        ffn_hidden_size=64, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32, params_dtype=torch.float32,
    )
    return GPTModel(
        config=config, transformer_layer_spec=platform.layer_spec(), vocab_size=128,
        max_sequence_length=64, pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False, position_embedding_type="rope",
    )


def batch(seed=0, b=4, s=16):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 128, (b, s), generator=g)
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool)).logical_not()[None, None]
    return tokens, torch.arange(s)[None].expand(b, s), mask


def forward_backward(model, tokens, positions, mask, num_microbatches=2):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    micro = list(zip(tokens.chunk(num_microbatches), positions.chunk(num_microbatches)))
    it = iter(micro)

    def step(data_iterator, model):
        tok, pos = next(data_iterator)
        labels = torch.roll(tok, -1, dims=1)
        out = model(tok, pos, mask, labels=labels)

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"loss": loss.detach()}

        return out, loss_func

    return get_forward_backward_func()(
        forward_step_func=step, data_iterator=it, model=[model],
        num_microbatches=num_microbatches, seq_length=tokens.shape[1],
        micro_batch_size=tokens.shape[0] // num_microbatches, forward_only=False,
    )


def main(tp, pp, ckpt_dir):
    from megatron.core import dist_checkpointing, parallel_state

    platform.init_distributed(tp, pp, seed=7)
    model = build(tp, pp)
    tokens, positions, mask = batch()
    losses = forward_backward(model, tokens, positions, mask)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    params = list(model.parameters())
    # Megatron's model keeps grads in main_grad only under DDP; plain modules fill .grad
    if not grads or not all(torch.isfinite(g).all() for g in grads):
        raise AssertionError("backward produced no or non-finite gradients")
    if parallel_state.is_pipeline_last_stage():
        assert len(losses) == 2 and all(torch.isfinite(l["loss"]) for l in losses), losses
    norm = platform.clip_grad_norm(params, 1e-3)
    after = platform.clip_grad_norm(params, 0.0)  # max_norm 0: measure only
    assert norm > 1e-3 and abs(after - 1e-3) < 1e-6, (norm, after)

    # distributed checkpoint round trip
    ckpt_dir = dist_checkpointing_dir(ckpt_dir)
    dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir)
    model.load_state_dict(loaded)
    for k, v in model.state_dict().items():
        if torch.is_tensor(v) and k in saved:
            assert torch.equal(saved[k], v), f"checkpoint changed {k}"
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"OK tp={tp} pp={pp} losses={[round(float(l['loss']), 4) for l in losses] if losses else None}")
    platform.destroy_distributed()


def dist_checkpointing_dir(base):
    # all ranks must agree on one directory
    obj = [str(base)]
    dist.broadcast_object_list(obj, src=0)
    if dist.get_rank() == 0:
        Path(obj[0]).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    return obj[0]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp())
