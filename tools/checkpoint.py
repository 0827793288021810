"""Check a training run's checkpoints against their manifests, before resubmitting a job.

    python tools/checkpoint.py verify RUN_DIR

Every checkpoint directory of RUN_DIR (``checkpoints/step-*``, ``checkpoints/best``, and the
Hugging Face exports ``hf``, ``hf-best``, ``hf-step-*``) is read whole: each file its manifest
lists must be there, of its size and with its CRC-32 (the manifest is the checkpoint's
``actor_checkpoint.json``, written after every other file). One line each: intact, DAMAGED
(which file, what is wrong), unchecked (written before checkpoints carried a manifest), or an
unfinished save (``.partial``: never loaded). Exit status 1 when the newest step checkpoint (the
one ``checkpoints/latest`` names) is damaged, and the line says which one a resume would take;
2 when RUN_DIR holds no checkpoint; 0 otherwise. Reads files only: no torch, no GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep.files import CHECKPOINT_MANIFEST, checkpoint_damage  # noqa: E402


def state(directory: Path) -> tuple[str, str]:
    """(intact | DAMAGED | unchecked, details) of one checkpoint directory, checksums included."""
    problem, checked = checkpoint_damage(directory, checksums=True)
    if problem:
        return "DAMAGED", problem
    if not checked:
        return "unchecked", "written before checkpoints carried a manifest"
    meta = json.loads((directory / CHECKPOINT_MANIFEST).read_text())
    size = sum(entry["size"] for entry in meta["files"].values())
    # the training step (a step checkpoint's own "step" counts optimizer updates)
    step = meta.get("extra", {}).get("step", meta.get("step"))
    step = f"step {step}, " if step is not None else ""
    return "intact", f"{step}{len(meta['files'])} files, {size / 2**20:,.1f} MiB, checksums match"


def verify(run_dir: Path) -> int:
    root = run_dir / "checkpoints"
    steps = sorted(p for p in root.glob("step-*") if re.fullmatch(r"step-\d{6}", p.name))
    others = [root / "best"] + sorted(run_dir.glob("hf*"))
    found = [p for p in [*steps, *others] if p.is_dir() and not p.name.endswith(".partial")]
    if not found:
        print(f"error: {run_dir} holds no checkpoint (checkpoints/step-*, checkpoints/best, hf*); "
              "give the run_dir of a training run", file=sys.stderr)
        return 2
    latest = root / "latest"
    newest = latest.read_text().strip() if latest.is_file() else (steps[-1].name if steps else None)
    print(f"{run_dir}: {len(found)} checkpoints" + (f", latest {newest}" if newest else ""))
    states = {}
    for path in found:
        states[path.name] = state(path)
        label = str(path.relative_to(run_dir))
        print(f"  {label:<28} {states[path.name][0]:<9} {states[path.name][1]}", flush=True)
    for path in sorted([*root.glob("*.partial"), *run_dir.glob("hf*.partial")]):
        print(f"  {str(path.relative_to(run_dir)):<28} {'unfinished':<9} a save that did not end: "
              "never loaded")
    if newest is None or states.get(newest, ("DAMAGED",))[0] != "DAMAGED":
        return 0
    fallback = next((p.name for p in reversed(steps) if p.name < newest and
                     states[p.name][0] != "DAMAGED"), None)
    print(f"the newest checkpoint, {newest}, is damaged: "
          + (f"a resume takes {fallback}, the newest intact one" if fallback else
             "no intact step checkpoint is left: resume from a copy of the run directory, or "
             "start afresh (resume=false or another run_dir)"))
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="every checkpoint of a run against its manifest")
    check.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    return verify(args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
