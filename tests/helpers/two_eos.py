"""Both rollout engines on a tiny model whose generation_config lists two EOS ids, for
tests/test_rollout.py (in a child process: vLLM changes torch's thread settings). The second EOS
id is the first token of the model's greedy answer (the random model repeats one token), so a
greedy answer stops on it at once. Prints one JSON object: per engine, the greedy answer's ids, whether it
finished, and its log-prob count; and for sampled answers, whether every one has one log-prob
per token.

    python tests/helpers/two_eos.py DIR
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(out: str) -> None:
    from transformers import GenerationConfig

    from tiny import make_model

    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.rollout import TransformersEngine, encode_prompt
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    path = make_model(Path(out) / "model")
    engine = TransformersEngine(str(path))
    prompt = encode_prompt(engine.tokenizer, arithmetic.examples("test", (1,), 1, seed=0)[0].prompt)
    greedy = list(engine.generate([prompt], 1, temperature=0.0, max_tokens=16)[0][0].token_ids)
    second = greedy[0]
    GenerationConfig(eos_token_id=[engine.tokenizer.eos_token_id, second], bos_token_id=1,
                     pad_token_id=2).save_pretrained(path)
    report = {"second_eos": second}
    for name, make in (("transformers", lambda: TransformersEngine(str(path))),
                       ("vllm", lambda: VllmEngine(str(path), max_model_len=512, dtype="float32"))):
        engine = make()
        answer = engine.generate([prompt], 1, temperature=0.0, max_tokens=16)[0][0]
        sampled = engine.generate([prompt] * 4, 4, temperature=0.7, max_tokens=16, seed=3)
        report[name] = {"ids": list(answer.token_ids), "finished": answer.finished,
                        "logprobs": len(answer.logprobs),
                        "aligned": all(len(c.logprobs) == len(c.token_ids)
                                       for group in sampled for c in group),
                        "stops": [c.token_ids[-1] for group in sampled for c in group
                                  if c.finished]}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
