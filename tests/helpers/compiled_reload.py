"""The vLLM engine compiled (``rollout.cpu_compile``) on a model, for tests/test_rollout.py (in
a child process: vLLM changes torch's thread settings): the log-probs of a fixed sequence
before any reload and after each of two reloads of perturbed weights, the engine's and a
transformers forward pass's over the same weights, so a compiled graph that kept the weights
it was compiled with shows. Prints one JSON object.

    python tests/helpers/compiled_reload.py MODEL
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(model: str) -> None:
    from transformers import AutoModelForCausalLM

    from megatron_rlep.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(model, max_model_len=256, dtype="float32", cpu_compile=True)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = list(range(5, 40))

    def logprobs():
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0, :-1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        return engine.sequence_logprobs(ids).tolist(), expected.tolist()

    out = {"compiled": engine.compiled, "logprobs": [logprobs()]}
    weights = {n: t for n, t in load_file(str(Path(model) / "model.safetensors")).items()
               if n != "lm_head.weight"}
    for seed in (0, 1):
        noise = torch.Generator().manual_seed(seed)
        new = [(n, t + 0.05 * torch.randn(t.shape, generator=noise)) for n, t in weights.items()]
        engine.load_weights([new])
        reference.load_state_dict(dict(new), strict=False)
        reference.tie_weights()
        out["logprobs"].append(logprobs())
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
