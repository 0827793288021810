"""Sampling with Hugging Face transformers: the rollout engine where vLLM is absent (CPU)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.rollout.base import Completion


class TransformersEngine:
    """Left-padded batched sampling from a causal LM; ``generate`` returns n samples per prompt.

    ``load_weights`` takes the actor's streamed Hugging Face-named export after each update.
    Only one rank of each model-parallel group runs it (``collective = False``).
    """

    collective = False

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
    def generate(self, prompts, n: int | list[int] = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_tokens: int = 256, seed: int = 0,
                 progress: bool = False) -> list[list[Completion]]:
        """``n`` completions for each chat prompt (a list of messages), in prompt order;
        ``n`` may differ per prompt."""
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        if len(counts) != len(prompts):
            raise ValueError("generate: one count per prompt is needed")
        torch.manual_seed(seed)
        eos = self.tokenizer.eos_token_id
        encoded = [self.encode_prompt(p) for p in prompts]
        jobs = [i for i, c in enumerate(counts) for _ in range(c)]  # one row per sample
        results: list[list[Completion]] = [[] for _ in prompts]
        bar = tqdm(total=len(jobs), unit="sample", disable=not progress, desc="generating")
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) \
            if temperature > 0 else dict(do_sample=False)
        for start in range(0, len(jobs), self.batch_size):
            rows = jobs[start:start + self.batch_size]
            width = max(len(encoded[i]) for i in rows)
            ids = torch.full((len(rows), width), self.tokenizer.pad_token_id)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                ids[r, width - len(encoded[i]):] = torch.tensor(encoded[i])
                mask[r, width - len(encoded[i]):] = 1
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                max_new_tokens=max_tokens, eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id, **sampling,
            )[:, width:].tolist()
            for i, row in zip(rows, out):
                finished = eos in row
                tokens = row[: row.index(eos) + 1] if finished else row
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                results[i].append(Completion(text, tuple(tokens), finished))
            bar.update(len(rows))
        bar.close()
        return results

    @torch.no_grad()
    def load_weights(self, buckets) -> int:
        """Copy Hugging Face-named tensors (buckets of ``(name, tensor)``) into the model;
        every parameter must be covered. Returns the number of tensors loaded."""
        params = dict(self.model.named_parameters())
        loaded = set()
        for bucket in buckets:
            for name, tensor in bucket:
                if name not in params:
                    raise KeyError(f"the rollout model has no parameter {name}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
                loaded.add(name)
        missing = params.keys() - loaded
        if missing:
            raise KeyError(f"weight sync left {len(missing)} parameters stale, e.g. {sorted(missing)[:3]}")
        return len(loaded)

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens.to(self.device)).logits.float().cpu()
