"""Where a run's numbers go: ``metrics.jsonl`` in the run directory, Weights & Biases (online,
offline or disabled) and a live progress bar. Only rank 0 writes; other ranks get a silent
monitor. The JSONL file is the record the plots and reports read; wandb mirrors it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from megatron_rlep.errors import RunError


class Monitor:
    """Created before the model starts (so a wandb that cannot start stops the run at once),
    then ``start``ed at the run's first step."""

    def __init__(self, run_dir: str | Path, logging, config: dict, active: bool = True):
        self.active, self.logging = active, logging
        self.path = Path(run_dir) / "metrics.jsonl"
        self.wandb = None
        self.bar = None
        if not active:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if logging.wandb != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            try:
                self.wandb = wandb.init(project=logging.project, name=logging.name,
                                        group=logging.group or os.environ.get("WANDB_RUN_GROUP")
                                        or logging.name, config=config,
                                        dir=str(self.path.parent), mode=logging.wandb,
                                        resume="allow", id=_run_id(self.path.parent))
            except Exception as err:  # noqa: BLE001 - whatever stops it, the fix is the same
                reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
                raise RunError(
                    f"wandb could not start {logging.wandb} ({type(err).__name__}: {reason}); "
                    "on compute nodes without internet set logging.wandb=offline and upload "
                    f"later with `wandb sync {self.path.parent}/wandb/offline-run-*` from a "
                    "machine that has it (docs/cluster.md, \"Offline compute nodes\")") from None

    def start(self, total_steps: int, first_step: int = 0) -> None:
        """At the run's first step: a fresh run empties metrics.jsonl, a resumed one drops the
        lines of steps it redoes; the progress bar starts."""
        if not self.active:
            return
        if first_step == 0 and self.path.exists():
            self.path.unlink()
        else:
            self._truncate_after(first_step + 1)
        if self.logging.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=first_step, unit="step", desc="training",
                            dynamic_ncols=True)

    def _to_wandb(self, call) -> None:
        """wandb mirrors metrics.jsonl; if its service dies (a preempted job's SIGTERM reaches
        it too) the run goes on without it."""
        try:
            call(self.wandb)
        except Exception as err:  # noqa: BLE001 - any wandb failure must not stop training
            print(f"warning: wandb stopped ({type(err).__name__}: {err}); metrics go on to "
                  f"{self.path}", flush=True)
            self.wandb = None

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps after the checkpoint (they are redone)."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", -1) < step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: dict, advance: bool = True) -> None:
        if not self.active:
            return
        record = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self._to_wandb(lambda run: run.log(metrics, step=step))
        if self.bar is not None and advance:
            shown = {k.split("/", 1)[1]: f"{v:.3g}" for k, v in metrics.items()
                     if k in ("train/acc_fresh", "train/acc_replay", "train/reward", "val/acc",
                              "time/step_s") and v is not None}
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def artifact(self, path: str | Path, name: str, kind: str, reference: bool = False) -> None:
        """Log ``path`` (a file or directory) to wandb as an artifact; ``reference`` records
        it by path and checksum instead of copying it (large pools)."""
        if self.active and self.wandb is not None and Path(path).exists():
            self._to_wandb(lambda run: log_artifact(run, [path], name, kind, reference))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self._to_wandb(lambda run: run.finish())


def log_artifact(run, paths, name: str, kind: str, reference: bool = False) -> None:
    """One wandb artifact holding ``paths`` (files or directories), copied or referenced."""
    import wandb

    art = wandb.Artifact(name, type=kind)
    for path in map(Path, paths):
        if reference:
            art.add_reference(path.resolve().as_uri())
        else:
            (art.add_dir if path.is_dir() else art.add_file)(str(path))
    run.log_artifact(art)


def _run_id(run_dir: Path) -> str:
    """One wandb run per run directory, kept across resumes."""
    marker = run_dir / "wandb_id.txt"
    if marker.is_file():
        return marker.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    marker.write_text(run_id + "\n")
    return run_id
