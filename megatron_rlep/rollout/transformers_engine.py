"""Sampling with Hugging Face transformers: the rollout engine where vLLM is absent (CPU)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.rollout.base import Completion


class TransformersEngine:
    """Left-padded batched sampling from a causal LM; ``generate`` returns n samples per prompt."""

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32, batch_size: int = 64,
                 device: str | torch.device = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.batch_size = batch_size
        self.device = device

    def encode_prompt(self, messages) -> list[int]:
        return list(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))

    @torch.no_grad()
    def generate(self, prompts, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_tokens: int = 256, seed: int = 0, progress: bool = False
                 ) -> list[list[Completion]]:
        """``n`` completions for each chat prompt (a list of messages), in prompt order."""
        torch.manual_seed(seed)
        eos = self.tokenizer.eos_token_id
        per_call = max(1, self.batch_size // n)
        results: list[list[Completion]] = []
        bar = tqdm(total=len(prompts) * n, unit="sample", disable=not progress,
                   desc="generating")
        for start in range(0, len(prompts), per_call):
            chunk = [self.encode_prompt(p) for p in prompts[start : start + per_call]]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), self.tokenizer.pad_token_id)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, row in enumerate(chunk):
                ids[i, width - len(row):] = torch.tensor(row)
                mask[i, width - len(row):] = 1
            sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) \
                if temperature > 0 else dict(do_sample=False)
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                max_new_tokens=max_tokens, num_return_sequences=n, eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id, **sampling,
            )[:, width:].tolist()
            for i in range(len(chunk)):
                group = []
                for row in out[i * n : (i + 1) * n]:
                    finished = eos in row
                    tokens = row[: row.index(eos) + 1] if finished else row
                    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                    group.append(Completion(text, tuple(tokens), finished))
                results.append(group)
            bar.update(len(chunk) * n)
        bar.close()
        return results
