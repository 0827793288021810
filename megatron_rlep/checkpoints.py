"""The run's checkpoints, beside the producer (``producer.py``) and the learner (``train.py``):
what a save writes and where, the newest intact one found on resume, the best validation's
weights, and room on disk checked before each write.

A checkpoint ``run_dir/checkpoints/step-XXXXXX`` holds the actor's state (weights, optimizer,
RNG; ``actor/checkpoint.py``) and, as its extra state, the step and the producer's (the
prompt stream's position, the pass rates, the prompts in flight); a live pool is written beside
it as ``pool-XXXXXX``. ``latest`` names the newest; on resume each one that fails its check is
skipped in one line. A save the file system refuses stops the run in one sentence and leaves
``latest`` on the last intact checkpoint. When to save is the trainer's loop's to decide.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import platform, rundir
from megatron_rlep.actor import checkpoint as actor_checkpoint
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.config import Config, RunError
from megatron_rlep.platform import any_rank, is_rank0
from megatron_rlep.pool import ExperiencePool


def disk_plan(cfg: Config) -> dict:
    """What the run's checkpoints and export hold on disk (actor/checkpoint.py disk_plan),
    from the checkpoint's headers and the settings, before the model loads."""
    log = cfg.logging
    distributed = cfg.parallel.distributed_optimizer
    if distributed is None:  # the actor's default: on a GPU with data parallelism
        p = cfg.parallel
        world = int(os.environ.get("WORLD_SIZE", "1"))
        distributed = platform.has_cuda() and world // (p.tensor_parallel *
                                                        p.pipeline_parallel) > 1
    return actor_checkpoint.disk_plan(
        actor_checkpoint.hf_parameters(resolve_model_path(cfg.model.path)),
        platform.compute_dtype(cfg.model.dtype) == torch.bfloat16, cfg.algorithm.total_steps,
        log.save_every, log.keep_checkpoints, log.keep_best, distributed)


class Checkpoints:
    """The checkpoints of ``cfg.run_dir``; ``disk`` is ``disk_plan(cfg)``."""

    def __init__(self, cfg: Config, disk: dict):
        self.cfg, self.disk = cfg, disk
        self.run_dir = Path(cfg.run_dir)
        self.best = None  # (val/acc, step) of the best validation so far
        self.last_saved = None  # the newest intact checkpoint's name

    def resume(self, actor) -> tuple[Path, dict, ExperiencePool | None]:
        """(checkpoint, its extra state, its live pool or None) of the newest intact
        checkpoint, loaded into ``actor``: the one ``latest`` names, else the step before it,
        and so on. A checkpoint is checked against its manifest first (every file's size; with
        ``resume_verify`` every checksum too); one whose load still fails is checked by
        checksum to tell damage from a bug. Each one skipped is said in one line; with none
        intact the run stops in one sentence."""
        skipped = []
        for checkpoint in rundir.resume_candidates(self.run_dir):
            problem, checked = actor_checkpoint.damage(checkpoint, self.cfg.resume_verify)
            if problem is None:
                failed, pool = None, None
                try:
                    extra = actor.load(checkpoint)
                    if extra.get("live_pool"):  # answers verified when they joined
                        pool = ExperiencePool.load_live(checkpoint.parent / extra["live_pool"])
                except Exception as err:  # noqa: BLE001 - told from damage below, every rank
                    failed = err
                if any_rank(failed is not None):  # the check is collective: all ranks go in
                    problem = actor_checkpoint.damage(checkpoint, checksums=True)[0] if checked \
                        else None
                    if problem is None:
                        raise failed or RunError(f"loading {checkpoint} failed on another rank "
                                                 "(its log has the error)")
            if problem is not None:
                skipped.append(f"checkpoints/{checkpoint.name}: {problem}")
                if is_rank0():
                    print(f"warning: skipping checkpoints/{checkpoint.name}, it is damaged: "
                          f"{problem}", flush=True)
                continue
            if not checked and is_rank0():
                print(f"note: checkpoints/{checkpoint.name} was written before checkpoints "
                      "carried a manifest: its files could not be checked", flush=True)
            self.last_saved = checkpoint.name
            self.best = rundir.best_before(self.run_dir, extra["step"])
            return checkpoint, extra, pool
        raise RunError(f"{self.run_dir} holds no intact checkpoint to resume from "
                       f"({'; '.join(skipped)}): resume from a copy of the run directory, or "
                       "start afresh with resume=false or another run_dir")

    def save(self, actor, step: int, extra: dict, pool: ExperiencePool | None) -> None:
        """A checkpoint of ``step`` (``extra``: what the producer keeps; ``pool``: a live pool
        to write beside it), then ``latest`` names it. Too little room for it, or a write the
        file system refuses, stops the run in one sentence with the numbers; the partial
        directory goes, ``latest`` stays on the last intact checkpoint."""
        name = f"step-{step:06d}"
        self.room_for(f"checkpoints/{name}", self.disk["checkpoint"])
        extra = {"step": step, **extra}
        beside = None
        if pool is not None:
            extra["live_pool"] = f"pool-{step:06d}"
            beside = self.run_dir / "checkpoints" / extra["live_pool"]
            if is_rank0():
                shutil.rmtree(beside, ignore_errors=True)  # left by a save cut short
        with self.stop_if_refused(f"checkpoints/{name}", self.disk["checkpoint"], beside):
            if pool is not None and is_rank0():
                pool.write(beside, {"live_pool_of": str(self.run_dir), "step": step})
            actor.save(self.run_dir / "checkpoints" / name, extra=extra)
        if is_rank0():
            latest = self.run_dir / "checkpoints" / "latest"
            tmp = latest.with_suffix(".tmp")
            tmp.write_text(name + "\n")
            tmp.replace(latest)
            rundir.prune(self.run_dir, self.cfg.logging.keep_checkpoints)
        self.last_saved = name
        if dist.is_initialized():
            dist.barrier()

    def keep_best(self, actor, step: int, accuracy: float | None) -> bool:
        """After a validation: a new best ``val/acc`` replaces ``checkpoints/best`` (weights
        only). Every rank computed the same accuracy, so every rank takes part in the save."""
        if not self.cfg.logging.keep_best or accuracy is None or \
                (self.best is not None and accuracy <= self.best[0]):
            return False
        self.best = (accuracy, step)
        self.room_for("checkpoints/best", self.disk["best"])
        with self.stop_if_refused("checkpoints/best", self.disk["best"]):
            actor.save_weights(self.run_dir / "checkpoints" / "best", step,
                               {"val/acc": accuracy})
        return True

    def room_for(self, what: str, need: int) -> None:
        """Stop before a save (``what``: its path under run_dir) the file system has no room
        for (every rank agrees)."""
        problem = rundir.save_room_problem(self.run_dir, what, need, self.last_saved) \
            if is_rank0() else None
        if any_rank(problem is not None):
            raise RunError(problem or f"cannot save {what}: rank 0 found too little "
                           f"room; {rundir.kept_note(self.run_dir, self.last_saved)}")

    @contextlib.contextmanager
    def stop_if_refused(self, what: str, need: int, also: Path | None = None):
        """A save the file system refuses (full, over quota, an I/O error) becomes one sentence;
        what it wrote (its partial directory, ``also``) is gone."""
        try:
            yield
        except (actor_checkpoint.SaveFailed, OSError) as err:
            if isinstance(err, actor_checkpoint.SaveFailed) and not err.storage or \
                    isinstance(err, OSError) and not actor_checkpoint.storage_error(err):
                raise
            if also is not None and is_rank0():
                shutil.rmtree(also, ignore_errors=True)
            reason = err.reason if isinstance(err, actor_checkpoint.SaveFailed) else \
                f"{type(err).__name__}: {err}"
            free = shutil.disk_usage(self.run_dir).free
            raise RunError(f"saving {what} failed ({reason}) in {self.run_dir}, which "
                           f"has {actor_checkpoint.human(free)} free for a checkpoint of "
                           f"{actor_checkpoint.human(need)}; the partial save is removed and "
                           f"{rundir.kept_note(self.run_dir, self.last_saved)}") from None
