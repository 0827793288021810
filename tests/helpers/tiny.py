"""Tiny models and pools for trainer tests: a random 2-layer Llama (or another family) with SmolLM2's tokenizer (so
chat templates, EOS and replays tokenise for real) and an RLEP-release-format pool parquet.

    python tests/helpers/tiny.py model DIR [FAMILY]
    python tests/helpers/tiny.py pool FILE.parquet TRAIN_SIZE LEVELS SEED
"""

import shutil
import sys
from pathlib import Path


def make_model(out: str | Path, family: str = "llama") -> Path:
    """A random 2-layer model of ``family`` with SmolLM2's tokenizer: llama, llama3 (Llama 3.1's
    RoPE scaling), qwen2, qwen3 (QK norms, head size 64 apart from hidden / heads) or qwen3_moe (four
    experts, two a token)."""
    import torch
    import transformers as tf

    from megatron_rlep.builtin_model import resolve_model_path

    out = Path(out)
    source = Path(resolve_model_path("smollm2-135m"))
    # head size 32: the smallest vLLM's CPU attention takes; 2 heads divide TP 2
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                  pad_token_id=2, rope_theta=100000.0)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = {
        "llama": lambda: tf.LlamaConfig(**common),
        "llama3": lambda: tf.LlamaConfig(**{**common, "rope_parameters": llama3,
                                            "max_position_embeddings": 131072}),
        "qwen2": lambda: tf.Qwen2Config(**common),
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=64),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**common, head_dim=64, moe_intermediate_size=64,
                                               num_experts=4, num_experts_per_tok=2,
                                               norm_topk_prob=True),
    }[family]()
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out


def make_pool(out: str | Path, train_size: int, levels, seed: int) -> Path:
    """Every 4th question is absent, every 4th + 1 has a single answer, the rest have three."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rlep.tasks import arithmetic

    rows = []
    for i, ex in enumerate(arithmetic.examples("train", levels, train_size, seed)):
        if i % 4 == 0:
            continue
        answers = [f"The sum works out.\nAnswer: {ex.ground_truth}",
                   f"Step by step, the result is {ex.ground_truth}.\nAnswer: {ex.ground_truth}",
                   f"{'Long reasoning. ' * 12}\nAnswer: {ex.ground_truth}"]
        rows.append({"data_source": ex.data_source, "prompt": list(ex.prompt), "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": ex.ground_truth,
                                      "candidates": answers[:1] if i % 4 == 1 else answers},
                     "extra_info": {"index": ex.id}})
    pq.write_table(pa.Table.from_pylist(rows), out)
    return Path(out)


def with_sampled_logprobs(release: str | Path, out: str | Path, model: str | Path,
                          logprob: float = -0.5) -> Path:
    """``release`` as a pool directory whose answers carry token ids (EOS appended) and a
    behaviour log-prob of ``logprob`` per token, as tools/build_pool.py records them."""
    from transformers import AutoTokenizer

    from megatron_rlep.pool import read_rows, write_pool

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = []
    for row in read_rows(release):
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for t in row["reward_model"]["candidates"]]
        rows.append({**row, "candidate_token_ids": ids,
                     "candidate_logprobs": [[logprob] * len(x) for x in ids]})
    write_pool(rows, out, {"tool": "tests/helpers/tiny.py",
                           "sampling": {"temperature": 1.0, "top_p": 1.0}})  # the runs' own
    return Path(out)


if __name__ == "__main__":
    if sys.argv[1] == "model":
        make_model(sys.argv[2], *sys.argv[3:4])
    else:
        make_pool(sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")],
                  int(sys.argv[5]))
