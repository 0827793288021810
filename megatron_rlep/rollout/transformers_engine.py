"""Sampling with Hugging Face transformers: the rollout engine where vLLM is absent (CPU)."""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.platform import device_rewrite_paused
from megatron_rlep.rollout.base import Completion, counts_and_seeds, stop_ids


class TransformersEngine:
    """Left-padded batched sampling from a causal LM; ``generate`` returns n samples per prompt.

    ``load_weights`` takes the actor's streamed Hugging Face-named export after each update.
    Only one rank of each model-parallel group runs it (``collective = False``).
    """

    collective = False

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32, batch_size: int = 64,
                 device: str | torch.device = "cpu", routes: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.batch_size = batch_size
        self.device = device
        self.stop_ids = stop_ids(self.tokenizer, self.model.generation_config)  # vLLM's set
        # a MoE model's routes returned with each completion (actor.routing_replay=rollout)
        self.routes = _Routes(self.model) if routes else None

    @torch.no_grad()
    @device_rewrite_paused()
    def generate(self, prompts, n: int | list[int] = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_tokens: int = 256, seed: int | list[int] = 0,
                 progress: bool = False, stop: tuple[str, ...] = ()) -> list[list[Completion]]:
        """``n`` completions for each prompt (token ids from ``encode_prompt``), in prompt order;
        ``n`` may differ per prompt. Each sample draws its tokens with a generator of its own,
        seeded as vLLM seeds a request's samples (the request's seed, plus k for its k-th), so a
        sample does not depend on the rows batched with it. A sample stops after the token that
        completes one of the ``stop`` strings, as vLLM's does (kept, ``stopped``)."""
        counts, seeds = counts_and_seeds(len(prompts), n, seed)
        jobs = [(i, k) for i, c in enumerate(counts) for k in range(c)]  # one row per sample
        results: list[list[Completion]] = [[] for _ in prompts]
        bar = tqdm(total=len(jobs), unit="sample", disable=not progress, desc="generating")
        for start in range(0, len(jobs), self.batch_size):
            rows = [i for i, _ in jobs[start:start + self.batch_size]]
            width = max(len(prompts[i]) for i in rows)
            ids = torch.full((len(rows), width), self.tokenizer.pad_token_id)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                ids[r, width - len(prompts[i]):] = torch.tensor(list(prompts[i]))
                mask[r, width - len(prompts[i]):] = 1
            kept = _KeepLogprobs()
            picked = _PickLogprobs(kept)
            strings = _StopStrings(self.tokenizer, stop, width)
            choice = [_SeededChoice([seeds[i] + k for i, k in jobs[start:start + self.batch_size]])] \
                if temperature > 0 else []
            if self.routes is not None:
                self.routes.start()
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                max_new_tokens=max_tokens, eos_token_id=list(self.stop_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                logits_processor=LogitsProcessorList(_warpers(temperature, top_p) + [kept] + choice),
                stopping_criteria=StoppingCriteriaList([picked] + ([strings] if stop else [])),
                do_sample=False,
            )[:, width:].tolist()
            logprobs = picked.result().tolist()
            for r, (i, row, row_logprobs) in enumerate(zip(rows, out, logprobs)):
                end = next((t for t, token in enumerate(row) if token in self.stop_ids), None)
                cut = strings.at.get(r)
                stopped = cut is not None and (end is None or end >= cut)
                finished = end is not None and not stopped
                tokens = row[:cut] if stopped else row[:end + 1] if finished else row
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                routes = None if self.routes is None else \
                    self.routes.of(r, len(rows), width, len(prompts[i]), len(tokens))
                results[i].append(Completion(text, tuple(tokens), finished,
                                             tuple(row_logprobs[:len(tokens)]), stopped=stopped,
                                             routes=routes))
            bar.update(len(rows))
        bar.close()
        return results

    def sleep(self) -> None:
        """Nothing to free: the transformers engine has no sleep mode."""

    @torch.no_grad()
    def load_weights(self, buckets, keep_cache: bool = False) -> int:
        """Copy Hugging Face-named tensors (buckets of ``(name, tensor)``) into the model;
        every parameter must be covered. Returns the number of tensors loaded. (This engine
        keeps no KV cache between calls: ``keep_cache`` changes nothing.)"""
        params = dict(self.model.named_parameters())
        slots = {}
        for key, param in params.items():
            slots.update(_slots(key, param))
        loaded = set()
        for bucket in buckets:
            for name, tensor in bucket:
                if name not in slots:
                    raise KeyError(f"the rollout model has no parameter {name}")
                slots[name].copy_(tensor.to(slots[name].device, slots[name].dtype))
                loaded.add(name)
        missing = slots.keys() - loaded
        if missing:
            raise KeyError(f"weight sync left {len(missing)} parameters stale, e.g. {sorted(missing)[:3]}")
        return len(loaded)

    def clear_cache(self) -> None:
        """Nothing cached between calls."""

    def close(self) -> None:
        """Nothing to shut down: the model goes with the engine."""

    @torch.no_grad()
    def sequence_logprobs(self, ids) -> torch.Tensor:
        """log p(ids[t] | ids[:t]) for t >= 1 at temperature 1 (the weight-sync probe)."""
        tokens = torch.tensor([list(ids)], device=self.device)
        logits = self.model(tokens).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, tokens[0, 1:, None])[:, 0].cpu()


class _Routes:
    """The experts every MoE router of ``model`` picked in one ``generate`` call: a forward hook
    on each router (transformers' ``...TopKRouter``, whose input is the batch's [rows x width]
    tokens flattened row by row) keeps its top-k indices, the prefill's and then one token a row
    at each decoding step."""

    def __init__(self, model):
        from megatron_rlep.actor.routing import route_dtype

        routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        if not routers:
            raise ValueError("rollout routes were asked of a model without a mixture-of-experts "
                             "router")
        self.dtype = route_dtype(model.config.num_experts)
        self.calls: list[list[torch.Tensor]] = [[] for _ in routers]
        for layer, router in enumerate(routers):
            router.register_forward_hook(
                lambda module, args, out, layer=layer: self.calls[layer].append(out[2]))

    def start(self) -> None:
        for calls in self.calls:
            calls.clear()

    def of(self, row: int, rows: int, width: int, prompt: int, response: int) -> torch.Tensor:
        """[prompt + response, layers, top-k] routes of batch row ``row`` (left-padded to
        ``width``); the response's last token was never fed: -1."""
        per_layer = []
        for calls in self.calls:
            fed = [calls[0].view(rows, width, -1)[row, width - prompt:]] + \
                [step.view(rows, -1)[row][None] for step in calls[1:response]]
            per_layer.append(torch.cat(fed))
        out = torch.full((prompt + response, len(per_layer), per_layer[0].shape[-1]), -1,
                         dtype=self.dtype)
        routes = torch.stack(per_layer, 1).cpu()  # on the host once a completion, not a step
        out[:len(routes)] = routes.to(self.dtype)
        return out


def _warpers(temperature: float, top_p: float) -> list:
    """Temperature, then top-p: applied here (not by ``generate``) so the recorder comes after."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    if temperature <= 0:
        return []
    return [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])


class _KeepLogprobs(LogitsProcessor):
    """The last logits processor: keeps this step's log-softmax of the processed scores."""

    def __init__(self):
        self.last = None

    def __call__(self, input_ids, scores):
        self.last = torch.log_softmax(scores.float(), -1)
        return scores


class _SeededChoice(LogitsProcessor):
    """The sampler, after the recorder: each row draws its token with a generator of its own,
    as vLLM draws a seeded request's (the argmax of p / q, q ~ Exp(1) per token, which samples
    p), and only that token is left for ``generate``'s greedy pick."""

    def __init__(self, seeds: list[int]):
        self.generators = [torch.Generator().manual_seed(s % 2**64) for s in seeds]

    def __call__(self, input_ids, scores):
        probs = torch.softmax(scores.float(), -1).cpu()
        noise = torch.stack([torch.empty(probs.shape[-1]).exponential_(generator=g)
                             for g in self.generators])
        choice = (probs / noise).argmax(-1, keepdim=True).to(scores.device)
        return torch.full_like(scores, -math.inf).scatter_(1, choice, 0.0)


class _StopStrings(StoppingCriteria):
    """Stops a row once its response's text holds one of ``stops`` (vLLM's stop strings), and
    records where: ``at[row]``, the response's length with the token that completed it. Only the
    last tokens are decoded: a new match ends in the newest token."""

    TAIL = 16

    def __init__(self, tokenizer, stops: tuple[str, ...], width: int):
        self.tokenizer, self.stops, self.width = tokenizer, stops, width
        self.at: dict[int, int] = {}

    def __call__(self, input_ids, scores, **kwargs):
        length = input_ids.shape[1] - self.width
        for r in range(input_ids.shape[0]):
            if r not in self.at:
                tail = input_ids[r, self.width + max(length - self.TAIL, 0):].tolist()
                if any(s in self.tokenizer.decode(tail, skip_special_tokens=True)
                       for s in self.stops):
                    self.at[r] = length
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[list(self.at)] = True
        return done.to(input_ids.device)


class _PickLogprobs(StoppingCriteria):
    """Called once the sampled token is appended: records its entry of the kept log-softmax.
    Never stops generation itself."""

    def __init__(self, kept: _KeepLogprobs):
        self.kept, self.columns = kept, []

    def __call__(self, input_ids, scores, **kwargs):
        self.columns.append(self.kept.last.gather(-1, input_ids[:, -1:])[:, 0].cpu())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def result(self) -> torch.Tensor:
        return torch.stack(self.columns, 1) if self.columns else torch.zeros(0, 0)


def _slots(key: str, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """{checkpoint name: the view of ``param`` it fills}. transformers holds a mixture-of-experts
    layer's experts fused (``experts.gate_up_proj`` [E, 2I, H], gate rows first, and
    ``experts.down_proj`` [E, H, I]); checkpoints name each expert's projections."""
    prefix, _, leaf = key.rpartition(".")
    if not prefix.endswith(".experts") or param.dim() != 3:
        return {key: param}
    if leaf == "down_proj":
        return {f"{prefix}.{e}.down_proj.weight": param[e] for e in range(len(param))}
    half = param.shape[1] // 2
    return {f"{prefix}.{e}.{kind}_proj.weight": param[e, rows]
            for e in range(len(param))
            for kind, rows in (("gate", slice(0, half)), ("up", slice(half, None)))}
