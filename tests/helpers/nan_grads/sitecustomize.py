"""Test instrumentation for tests/test_train.py, put on PYTHONPATH by the test: the policy loss
of the actor's updates numbered in NAN_UPDATES (from 0, comma-separated) is multiplied by NaN,
so their gradients are NaN for real and the optimiser step sees a non-finite norm."""

import builtins
import os
import sys

WANTED = {int(x) for x in os.environ.get("NAN_UPDATES", "").split(",") if x}
_import = builtins.__import__
state = {"update": -1, "patched": set()}


def _patch() -> None:
    actor, loss = sys.modules.get("megatron_rlep.actor.actor"), sys.modules.get("megatron_rlep.loss")
    if actor is not None and "actor" not in state["patched"] and hasattr(actor, "Actor"):
        state["patched"].add("actor")
        original = actor.Actor.train_step

        def train_step(self, batch, *args, **kwargs):
            state["update"] += 1
            return original(self, batch, *args, **kwargs)

        actor.Actor.train_step = train_step
    if loss is not None and "loss" not in state["patched"] and hasattr(loss, "policy_token_loss"):
        state["patched"].add("loss")
        original_loss = loss.policy_token_loss

        def policy_token_loss(*args, **kwargs):
            out = original_loss(*args, **kwargs)
            if state["update"] in WANTED:
                return (out[0] * float("nan"),) + tuple(out[1:])
            return out

        loss.policy_token_loss = policy_token_loss


def _importing(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if len(state["patched"]) < 2:
        _patch()
    return module


if WANTED:
    builtins.__import__ = _importing
