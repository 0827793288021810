"""What the Hugging Face <-> Megatron-Core conversion refuses: one sentence naming the config field (no model is built)."""

import pytest
import transformers as tf

from megatron_rlep.actor import hf

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=2)


def llama3(**rope):
    return tf.LlamaConfig(**SMALL, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, **rope})


def moe(**extra):
    return tf.Qwen3MoeConfig(**SMALL, moe_intermediate_size=16, num_experts=4,
                             num_experts_per_tok=2, **extra)


def test_supported_configs_pass():
    for config in (tf.LlamaConfig(**SMALL), llama3(), tf.Qwen2Config(**SMALL),
                   tf.Qwen3Config(**SMALL), moe()):
        assert hf.unsupported(config) is None, config.model_type
    assert hf.unsupported(moe(), expert_parallel=4) is None


@pytest.mark.parametrize("config, ep, says", [
    (llama3(factor=32.0, original_max_position_embeddings=4096), 1,
     "rope_scaling original_max_position_embeddings=4096 differs from the Llama 3.1 value 8192"),
    (tf.LlamaConfig(**SMALL, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                              "factor": 4.0}), 1,
     "rope_scaling of type 'yarn' is not supported"),
    (tf.LlamaConfig(**SMALL, mlp_bias=True), 1, "mlp_bias=true is not supported"),
    (moe(mlp_only_layers=[0]), 1, "mlp_only_layers and decoder_sparse_step != 1"),
    (moe(), 3, "parallel.expert_parallel=3 must divide the model's 4 experts"),
    (tf.Qwen3Config(**SMALL), 2, "parallel.expert_parallel=2 needs a mixture-of-experts model"),
])
def test_unsupported_configs_name_their_field(config, ep, says):
    assert hf.unsupported(config, expert_parallel=ep).startswith(says)


def test_an_unknown_family_and_moe_without_sequence_parallelism_stop_in_one_sentence():
    import torch

    with pytest.raises(hf.ModelError, match=r"model type 'gemma' is not supported \(supported: "
                                                 r"llama, qwen2, qwen3, qwen3_moe\)"):
        hf.family(tf.GemmaConfig(**SMALL))
    with pytest.raises(hf.ModelError, match="needs parallel.sequence_parallel=true"):
        hf.transformer_config(moe(), 2, 1, torch.float32, cpu=True)


def test_grouped_gemm_expert_names_map_to_the_sequential_table():
    """Transformer Engine's TEGroupedMLP holds a rank's experts as ``linear_fc1.weight<k>`` (one
    weight per GEMM); the conversion aliases them to SequentialMLP's ``local_experts.<k>`` and then
    to the global expert, so the one Qwen3-MoE table loads and exports both (a GPU checks the
    real module: scripts/gpu_smoke.py's MoE parity)."""
    from types import SimpleNamespace

    from megatron_rlep.actor.hf import QWEN3_MOE, _global_name, _rule

    layer = SimpleNamespace(layer_number=3, mlp=SimpleNamespace(local_expert_indices=[4, 5, 6, 7]))
    model = SimpleNamespace(decoder=SimpleNamespace(layers=[layer]))  # EP rank 1 of 2, 8 experts
    assert _global_name(model, "decoder.layers.0.mlp.experts.linear_fc1.weight1") == \
        "decoder.layers.2.mlp.experts.local_experts.5.linear_fc1.weight"
    assert _global_name(model, "decoder.layers.0.mlp.experts.linear_fc2.weight3") == \
        _global_name(model, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight") == \
        "decoder.layers.2.mlp.experts.local_experts.7.linear_fc2.weight"
    rule = _rule(QWEN3_MOE, "decoder.layers.2.mlp.experts.local_experts.5.linear_fc1.weight")
    assert rule.names() == ("model.layers.2.mlp.experts.5.gate_proj.weight",
                            "model.layers.2.mlp.experts.5.up_proj.weight")
