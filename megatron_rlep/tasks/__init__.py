"""The built-in tasks, sized for the built-in model: ``arithmetic`` (integer answers in the DAPO
template, checked by the math rule), ``code`` (short Python functions checked by unit tests in
the sandbox) and ``logic`` (puzzles whose answer a program checks). Each task module makes
examples (``examples(split, levels, n, seed)``) and says how its answers are scored
(``VERIFIER``: the ``verifier`` settings a run on it takes); none scores anything itself but
the logic task's checker, a reward function in verl's signature. The data loader resolves
their names (``data.train=code``)."""

from __future__ import annotations

from importlib import import_module

BUILTIN = ("arithmetic", "code", "logic")


def module(name: str):
    return import_module(f"megatron_rlep.tasks.{name}")


def examples(name: str, split: str = "train", levels=(1, 2, 3), n: int = 64, seed: int = 0):
    """``n`` examples of built-in task ``name``."""
    return module(name).examples(split=split, levels=levels, n=n, seed=seed)


def loader_kwargs(spec: str, levels, n: int, seed: int) -> dict:
    """What ``load_examples`` passes a built-in task (its levels, size and seed); other
    datasets take none."""
    return {"levels": levels, "n": n, "seed": seed} if spec in BUILTIN else {}
