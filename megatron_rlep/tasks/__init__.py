"""The built-in tasks, sized for the built-in model: ``arithmetic`` (integer answers in the DAPO
template, checked by the math rule), ``calculator`` and ``chain`` (the same, for runs with a
Python tool), ``code`` (short Python functions checked by unit tests in the sandbox) and
``logic`` (puzzles whose answer a program checks). Each task module makes
examples (``examples(split, levels, n, seed)``) and says how its answers are scored
(``VERIFIER``: the ``verifier`` settings a run on it takes); none scores anything itself but
the logic task's checker, a reward function in verl's signature. The data loader resolves
their names (``data.train=code``)."""

from __future__ import annotations

import hashlib
import random
from importlib import import_module

BUILTIN = ("arithmetic", "calculator", "chain", "code", "logic")
TEST_BUCKETS = 8  # one bucket of eight is the test split


def module(name: str):
    return import_module(f"megatron_rlep.tasks.{name}")


def examples(name: str, split: str = "train", levels=(1, 2, 3), n: int = 64, seed: int = 0,
             **extra):
    """``n`` examples of built-in task ``name`` (``extra``: a tool task's ``tool_format``)."""
    return module(name).examples(split=split, levels=levels, n=n, seed=seed, **extra)


def loader_kwargs(spec: str, levels, n: int, seed: int, tool_format: str = "fence") -> dict:
    """What ``load_examples`` passes a built-in task (its levels, size and seed, and to a task
    whose prompt shows a tool call, ``rollout.tool_format``); other datasets take none."""
    if spec not in BUILTIN:
        return {}
    shows = getattr(module(spec), "SHOWS_TOOL_CALL", False)
    return {"levels": levels, "n": n, "seed": seed, **({"tool_format": tool_format} if shows else {})}


def split_of(text: str) -> str:
    """``test`` for the problem texts whose hash falls in one bucket of eight, else ``train``:
    disjoint splits by construction, the same for every seed."""
    bucket = int(hashlib.sha256(text.encode()).hexdigest(), 16) % TEST_BUCKETS
    return "test" if bucket == 0 else "train"


def distinct(task: str, levels_known: dict, split: str, levels, n: int, seed: int, draw) -> list:
    """``n`` distinct examples of ``split``, levels taken in turn, deterministic from ``seed``:
    ``draw(level, rng, index)`` makes one (its key text, the example); a key seen before or of
    the other split is drawn again."""
    from megatron_rlep.example import DataError

    if split not in ("train", "test"):
        raise DataError(f"{task} split={split!r} is unknown; use 'train' or 'test'.")
    levels = [levels] if isinstance(levels, int) else list(levels)
    unknown = [lv for lv in levels if lv not in levels_known]
    if unknown or not levels:
        raise DataError(f"{task} levels={levels} has unknown levels {unknown}; choose from "
                        f"{sorted(levels_known)}.")
    rng = random.Random(f"{task}:{seed}")
    out, seen, attempts = [], set(), 0
    while len(out) < n:
        attempts += 1
        if attempts > 1000 * n:
            raise DataError(f"{task} levels={levels} cannot supply {n} distinct {split} "
                            "problems; ask for fewer or add levels.")
        key, example = draw(levels[len(out) % len(levels)], rng, len(out))
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        out.append(example)
    return out
