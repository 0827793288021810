"""What every rollout engine takes and returns: prompt token ids in, completions out.

Prompts reach an engine as token ids, encoded and left-truncated once by ``encode_prompt``, so
the engine samples after exactly the tokens the actor trains on. Each request gets its own seed
from ``request_seed``; a training answer's seed comes from ``answer_seed``, a pure function of
where the answer stands, so the same answer is drawn with the same random numbers whatever the
timing, the batching or the placement. Each completion carries its behaviour log-probs (see
``Completion``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]  # response tokens, the end-of-sequence token included if emitted
    finished: bool  # True when the engine stopped on end-of-sequence, False when cut at the limit
    # log p(token) of each of ``token_ids`` under the distribution it was sampled from: the
    # engine's logits divided by the temperature, top-p applied and renormalised (vLLM's
    # logprobs_mode="processed_logprobs"). With top_p = 1 this is what the actor computes.
    logprobs: tuple[float, ...] = ()
    # with tools (rollout/tools.py): True for the model's tokens, False for an observation's
    # (their log-probs are 0.0, never used); empty: every token is the model's
    mask: tuple[bool, ...] = ()
    calls: tuple[str, ...] = ()  # each tool call's status, in order
    stopped: bool = False  # the engine stopped on one of the call's stop strings
    # a mixture-of-experts model's experts for every token the engine fed it, prompt then
    # response, [tokens, layers, top-k] (-1: never fed, the response's last token), when the
    # engine was asked for them (actor.routing_replay=rollout)
    routes: torch.Tensor | None = field(default=None, compare=False)


def joined_routes(before, after, dropped: int = 0):
    """An answer's MoE routes grown by a completion's (``Completion.routes``; None without):
    ``before``'s rows of the tokens it fed (all but its last row), then ``after``'s, less the
    rows of the completion's last ``dropped`` tokens (cut off the answer). A completion that
    continues an answer fed its context again, so the rows ``before`` never fed (its last
    token's, a tool's observation's) are that prefill's, by the weights that sampled the tokens
    after them: a partial rollout's rows each come from the segment that fed them last."""
    if after is None:
        return None
    if before is not None:
        after = torch.cat([before[:len(before) - 1], after[len(before) - 1:]])
    return after[:len(after) - dropped]


def padded_routes(routes, rows: int):
    """``routes`` with rows of -1 (never fed: the router chooses) up to ``rows``."""
    if routes is None or len(routes) >= rows:
        return routes
    return torch.cat([routes, routes.new_full((rows - len(routes), *routes.shape[1:]), -1)])


def stop_ids(tokenizer, generation_config=None) -> tuple[int, ...]:
    """Every end-of-sequence id a model stops on: the tokenizer's EOS and each id of its
    ``generation_config``'s ``eos_token_id`` (Qwen3 lists ``<|im_end|>`` and ``<|endoftext|>``,
    Llama 3.1 Instruct 128001, 128008 and 128009). vLLM stops on all of them; so does the
    transformers engine, and an answer ending on any of them is finished."""
    ids = [tokenizer.eos_token_id]
    extra = getattr(generation_config, "eos_token_id", None)
    ids += extra if isinstance(extra, (list, tuple)) else [extra]
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def model_stop_ids(model_path, tokenizer) -> tuple[int, ...]:
    """``stop_ids`` of a checkpoint directory (its generation_config.json, where it has one)."""
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        generation_config = None
    return stop_ids(tokenizer, generation_config)


def encode_prompt(tokenizer, messages, max_length: int | None = None, tools=None,
                  template: str | None = None) -> tuple[int, ...]:
    """A chat prompt's token ids with the generation prompt, left-truncated to ``max_length``
    (the trainer's ``data.max_prompt_length``): the ids the actor and every engine see.
    ``tools``: declared to the chat template (``template``, None: the tokenizer's), for tool
    calls in its format (``rollout/chat_tools.py``)."""
    ids = tokenizer.apply_chat_template(list(messages), tools=tools, chat_template=template,
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return tuple(ids[-max_length:] if max_length else ids)


def request_seed(base: int, index) -> int:
    """The seed of request ``index`` of a call seeded ``base``: a 62-bit hash of both.

    vLLM seeds the j-th of a request's n samples with ``seed + j``, so consecutive seeds such as
    ``base + index`` give overlapping streams; hashed seeds are apart by about 2**61 and never
    overlap in practice. ``index`` is the prompt's place in the whole call, so a request's seed
    does not depend on how prompts are dealt to ranks.
    """
    digest = hashlib.blake2b(f"{base}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def answer_seed(run_seed: int, position: int, index: int, offset: int = 0) -> int:
    """The seed of training answer ``index`` of the prompt at ``position`` of the run's prompt
    stream, for its tokens from ``offset`` on (a partial rollout's later segments: the tokens
    it has so far). Neither the engine call, nor the rank, nor the time an answer is sampled
    enters it, so two runs of one seed (synchronous or asynchronous, colocated or not) draw each
    answer with the same random numbers, and their answers differ only where the weights that
    sampled them do (or where a partial rollout cut them differently)."""
    return request_seed(run_seed, f"answer:{position}:{index}:{offset}")


def counts_and_seeds(prompts: int, n, seed) -> tuple[list[int], list[int]]:
    """One sample count and one seed per request. ``n`` is one count for all or a list; ``seed``
    is a list (one per prompt) or a base that ``request_seed`` spreads over the prompts."""
    counts = list(n) if isinstance(n, (list, tuple)) else [n] * prompts
    seeds = list(seed) if isinstance(seed, (list, tuple)) else \
        [request_seed(seed, i) for i in range(prompts)]
    if len(counts) != prompts or len(seeds) != prompts:
        raise ValueError(f"generate: {len(counts)} counts and {len(seeds)} seeds for {prompts} "
                         "prompts; give one of each per prompt")
    return counts, seeds
