"""A training run's directory: what it was started with, what it keeps, what it will hold.

``pin_settings`` refuses to resume a run with other settings than it started with and writes the
resolved settings to ``config.json`` (tools/export_hf.py reads them); ``best_before`` reads the
kept best validation step; ``say_disk`` prints a checkpoint's size and the most the run will
hold (``actor/checkpoint.py disk_plan``), ``room_problem`` and ``save_room_problem`` say when the
file system has too little room for them (at start, and before each save);
``resume_candidates`` lists the checkpoints a resume may take, newest first; ``prune`` removes
the checkpoints beyond the newest ones kept; ``note_code`` records the code each start ran. The
trainer calls them; nothing here trains or touches a model.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from megatron_rlep.config import RunError
from megatron_rlep.files import write_text_atomic

STEP = re.compile(r"step-\d{6}")  # a saved step's directory name
CODE = ("megatron_rlep", "conf", "tools")  # what a run executes, in the repository


def code_identity(root: Path = Path(__file__).resolve().parent.parent) -> dict:
    """The code a process runs: the repository's commit, a hash of the trees of what a run
    executes (``CODE``: the same across commits that changed only docs or records), and whether
    those have uncommitted changes; all None outside a git checkout (an installed package) or
    without git."""
    def git(*args):
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        except OSError:  # no git on this node
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    trees = git("rev-parse", *(f"HEAD:{part}" for part in CODE)) if commit else None
    status = git("status", "--porcelain", "--untracked-files=no", "--", *CODE) if commit else None
    code = hashlib.sha256(trees.encode()).hexdigest()[:16] if trees else None
    return {"commit": commit, "code": code, "dirty": bool(status) if status is not None else None}


def note_code(run_dir: Path, step: int) -> None:
    """One line in ``run_dir/code.jsonl`` for this start (``code_identity``, the step it starts
    at, the time): a study can tell which code trained each stretch of a run."""
    with open(run_dir / "code.jsonl", "a") as out:
        out.write(json.dumps({**code_identity(), "step": step, "time": time.time()}) + "\n")


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
    """One line: a checkpoint's size and the most the run will hold."""
    from megatron_rlep.actor.checkpoint import human

    kept = f"the newest {keep_checkpoints} kept" if keep_checkpoints else \
        f"all {plan['saves']} kept (logging.keep_checkpoints=0)"
    best = f", the best validation step's weights {human(plan['best'])}" if plan["best"] else ""
    print(f"checkpoints: {human(plan['checkpoint'])} each (weights and optimizer), {kept}{best}; "
          f"the run holds at most {human(plan['run'])} in {run_dir}", flush=True)


def bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) \
        if Path(path).is_dir() else 0


def room_problem(run_dir: Path, plan: dict, keep: int) -> str | None:
    """At start, before the model loads: why the file system under ``run_dir`` cannot hold the
    run's checkpoints (``actor/checkpoint.py disk_plan``: the kept ones, the one being written,
    the best step's weights and the final export; what the run already holds counts toward
    them), or None."""
    from megatron_rlep.actor.checkpoint import human

    run_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run_dir).free
    need = plan["run"] - bytes_under(run_dir / "checkpoints") - bytes_under(run_dir / "hf")
    if free >= need:
        return None
    fewest = next((k for k in range(1, plan["saves"]) if
                   min(k + 1, plan["saves"]) * plan["checkpoint"] + plan["best"] + plan["hf"]
                   - bytes_under(run_dir / "checkpoints") <= free), None)
    fix = (f"set logging.keep_checkpoints={fewest} (it fits)" if fewest and fewest != keep
           else "free space there")
    return (f"{run_dir} has {human(free)} free but the run's checkpoints need {human(need)} "
            f"more ({plan['held']} of {human(plan['checkpoint'])} on disk at once with "
            f"logging.keep_checkpoints={keep}, plus the best step's weights and the final "
            f"export): {fix}, or give a run_dir on a file system with room")


def save_room_problem(run_dir: Path, what: str, need: int, last: str | None) -> str | None:
    """Before a save: why ``what`` (its path under ``run_dir``, ``need`` bytes) cannot be
    written, or None."""
    from megatron_rlep.actor.checkpoint import human

    free = shutil.disk_usage(run_dir).free
    if free >= need:
        return None
    return (f"cannot save {what}: {run_dir} has {human(free)} free and it needs "
            f"{human(need)}; {kept_note(run_dir, last)}")


def kept_note(run_dir: Path, last: str | None) -> str:
    """What a stopped run still has, and how to go on."""
    if last is None:
        return "the run has no checkpoint yet; free space (or lower logging.keep_checkpoints) " \
               "and start it again"
    return (f"the last intact checkpoint, checkpoints/{last}, is still there: free space (or "
            f"lower logging.keep_checkpoints) and the same command resumes from it")


def resume_candidates(run_dir: Path) -> list[Path]:
    """The checkpoints a resume may take, newest first: the one ``checkpoints/latest`` names,
    then every older ``step-*`` (an unfinished ``.partial`` never)."""
    root = run_dir / "checkpoints"
    named = (root / "latest").read_text().strip()
    older = sorted((p for p in root.glob("step-[0-9]*") if STEP.fullmatch(p.name)
                    and p.name < named), reverse=True)
    return [root / named, *older]


def looks_whole(checkpoint: Path) -> bool:
    """Its manifest is there and every file it lists has its size (a checkpoint from before
    manifests counts as whole). One stat a file, on one rank: no collective."""
    from megatron_rlep.files import checkpoint_damage

    return checkpoint_damage(checkpoint)[0] is None


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` whole checkpoints (and the live pools of their steps and after)
    of ``run_dir`` (0: all) and remove the older ones; a damaged checkpoint is not counted (a
    resume skipped it, and the run writes its step again), so it never costs an intact one its
    place. The best step's weights (``checkpoints/best``) are not among those counted."""
    if not keep:
        return
    root = run_dir / "checkpoints"
    steps = sorted(p for p in root.glob("step-*") if STEP.fullmatch(p.name))
    kept = [p for p in steps if looks_whole(p)][-keep:]
    if not kept:
        return
    oldest = kept[0].name[len("step-"):]
    for old in [*steps, *root.glob("pool-*")]:
        if old.name.split("-", 1)[1][:6] < oldest:
            shutil.rmtree(old, ignore_errors=True)
