"""A training run's directory: what it was started with, what it keeps, what it will hold.

``pin_settings`` refuses to resume a run with other settings than it started with and writes the
resolved settings to ``config.json`` (tools/export_hf.py reads them); ``best_before`` reads the
kept best validation step; ``say_disk`` prints a checkpoint's size and the most the run will
hold (``actor/checkpoint.py disk_plan``); ``prune`` removes the checkpoints beyond the newest
ones kept. The trainer calls them; nothing here trains or touches a model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from megatron_rlep.config import RunError
from megatron_rlep.files import write_text_atomic


def pinned(settings: dict) -> dict:
    """The settings a resumed run must keep, flattened: those that decide what is learned (the
    model path, data, algorithm but its step count, seed, verifier, validation). Logging,
    layout, engine and total_steps may change."""
    out = {"model.path": settings["model"]["path"], "seed": settings["seed"]}
    for section in ("data", "algorithm", "verifier", "validation"):
        for key, value in settings[section].items():
            if (section, key) != ("algorithm", "total_steps"):
                out[f"{section}.{key}"] = value
    return out


def pin_settings(run_dir: Path, settings: dict, resuming: bool, writer: bool) -> None:
    """When ``resuming`` a run directory with a checkpoint, stop in one sentence on a setting
    that differs from ``config.json``'s; then ``writer`` (rank 0) writes ``settings`` there. A
    key that a run from an earlier version does not list counts as its default (a new key's
    default keeps the behaviour from before it existed)."""
    from dataclasses import asdict

    from megatron_rlep.config import Config

    path = run_dir / "config.json"
    if resuming and (run_dir / "checkpoints" / "latest").is_file() and path.is_file():
        before, now = pinned(json.loads(path.read_text())), pinned(settings)
        before = {**pinned(asdict(Config())), **before}
        changed = next((k for k in now if before.get(k) != now[k]), None)
        if changed is not None:
            raise RunError(f"{run_dir} holds a run started with other settings ({changed}: "
                           f"{before.get(changed)!r} there, {now[changed]!r} now); resume it with "
                           "the same settings, or give another run_dir (on Slurm: another "
                           "--job-name, or RUN_DIR)")
    if writer:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json.dumps(settings, indent=1) + "\n", path)


def best_before(run_dir: Path, step: int) -> tuple[float, int] | None:
    """(val/acc, step) of the kept best checkpoint when it is from ``step`` or before (a best
    from after the checkpoint a run resumes from belongs to steps that are redone)."""
    from megatron_rlep.actor import checkpoint

    best = run_dir / "checkpoints" / "best"
    if not checkpoint.is_complete(best):
        return None
    meta = checkpoint.metadata(best)
    return (meta["extra"]["val/acc"], meta["step"]) if meta["step"] <= step else None


def say_disk(run_dir: Path, plan: dict, keep_checkpoints: int) -> None:
    """One line: a checkpoint's size and the most the run will hold; a warning when the file
    system has less free."""
    from megatron_rlep.actor.checkpoint import human

    kept = f"the newest {keep_checkpoints} kept" if keep_checkpoints else \
        f"all {plan['saves']} kept (logging.keep_checkpoints=0)"
    best = f", the best validation step's weights {human(plan['best'])}" if plan["best"] else ""
    print(f"checkpoints: {human(plan['checkpoint'])} each (weights and optimizer), {kept}{best}; "
          f"the run holds at most {human(plan['run'])} in {run_dir}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run_dir).free
    if free < plan["run"]:
        print(f"warning: {run_dir} has {human(free)} free, less than the {human(plan['run'])} "
              "the run will hold: set logging.keep_checkpoints or free space", flush=True)


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (and live pools) of ``run_dir`` (0: all); the best
    step's weights (``checkpoints/best``) are not among those counted."""
    if not keep:
        return
    root = run_dir / "checkpoints"
    for prefix in ("step-", "pool-"):
        for old in sorted(root.glob(prefix + "[0-9]*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
