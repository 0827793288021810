"""The vLLM engine on a model, for tests/test_rollout.py (in a child process: vLLM changes
torch's thread settings): the log-probs of a fixed sequence before any reload and after each of
two reloads of perturbed weights, the engine's and a transformers forward pass's over the same
weights (saved as a checkpoint of their own), so an engine that kept the weights it started
with, or reloaded them into the wrong layout, shows. Prints one JSON object.

    python tests/helpers/compiled_reload.py MODEL [--eager]   # default: rollout.cpu_compile
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(model: str, compile: bool) -> None:
    from transformers import AutoModelForCausalLM

    from megatron_rlep.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(model, max_model_len=256, dtype="float32", cpu_compile=compile)
    ids = list(range(5, 40))
    folder = Path(tempfile.mkdtemp())
    shutil.copy(Path(model) / "config.json", folder)

    def logprobs(path):
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0, :-1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        return engine.sequence_logprobs(ids).tolist(), expected.tolist()

    out = {"compiled": engine.compiled, "logprobs": [logprobs(model)]}
    saved = load_file(str(Path(model) / "model.safetensors"))
    weights = {n: t for n, t in saved.items() if n != "lm_head.weight"}
    for seed in (0, 1):
        noise = torch.Generator().manual_seed(seed)
        new = [(n, t + 0.05 * torch.randn(t.shape, generator=noise)) for n, t in weights.items()]
        engine.load_weights([new])
        save_file({**saved, **dict(new)}, str(folder / "model.safetensors"))
        out["logprobs"].append(logprobs(folder))
    shutil.rmtree(folder)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], "--eager" not in sys.argv[2:])
