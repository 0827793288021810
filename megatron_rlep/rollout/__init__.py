"""Rollout engines: turn chat prompts into sampled completions.

``TransformersEngine`` runs anywhere (CPU included). The vLLM engine for GPU clusters joins it
behind the same ``generate`` call. Engines know nothing about rewards, replay or the loss.
"""

from megatron_rlep.rollout.base import Completion
from megatron_rlep.rollout.transformers_engine import TransformersEngine

__all__ = ["Completion", "TransformersEngine"]
