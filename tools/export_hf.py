"""A training run's saved step as a Hugging Face checkpoint, for evaluation, pools or release.

    python tools/export_hf.py RUN_DIR [--step N | --best] [-o OUT]
    torchrun --nproc_per_node 8 tools/export_hf.py RUN_DIR --best --tensor-parallel 8

Reads ``RUN_DIR/config.json`` (the trainer's resolved settings: the base model, whose config,
tokenizer and chat template the export copies) and one checkpoint: ``checkpoints/step-N``
(``--step N``), ``checkpoints/best`` (``--best``: the best validation step's weights, kept by
``logging.keep_best``), or the newest (neither). Megatron-Core reshards on load, so a checkpoint
saved on any TP x PP x DP layout exports on one process, or on ``--tensor-parallel`` x
``--pipeline-parallel`` ranks for a model too large for one. The weights keep the dtype they
were trained in, and layers built as the run built them (Transformer Engine or local specs).
The export is written atomically to OUT (default ``RUN_DIR/hf-step-N``, or ``RUN_DIR/hf-best``):
under ``OUT.partial``, renamed when complete, with a manifest of its files' sizes and checksums
(``python tools/checkpoint.py verify RUN_DIR`` checks it; ``model.path=OUT`` refuses it when a
file no longer has its size). A write the file system refuses stops in one sentence and leaves
nothing under OUT. It is what ``model.path=OUT`` reads in tools/evaluate.py and
tools/build_pool.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep.config import ConfigError, RunError  # noqa: E402


def pick(run_dir: Path, step: int | None, best: bool) -> Path:
    """The checkpoint directory asked for, or a sentence saying what there is."""
    root = run_dir / "checkpoints"
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir} holds no config.json; give the run_dir of a training run "
                          "(python -m megatron_rlep.train writes it at start)")
    saved = sorted(p.name for p in root.glob("step-[0-9]*") if not p.name.endswith(".partial"))
    if best:
        path = root / "best"
        if not path.is_dir():
            raise ConfigError(f"{run_dir} has no checkpoints/best: the run validated never or ran "
                              "with logging.keep_best=false; use --step N (saved: "
                              f"{', '.join(saved) or 'none'})")
        return path
    if step is None:
        if not saved:
            raise ConfigError(f"{run_dir} has no saved step yet (checkpoints/step-*)")
        return root / saved[-1]
    path = root / f"step-{step:06d}"
    if not path.is_dir():
        raise ConfigError(f"{run_dir} has no checkpoint of step {step}; the saved steps are "
                          f"{', '.join(s[5:].lstrip('0') or '0' for s in saved) or 'none'}"
                          + (" and --best" if (root / "best").is_dir() else ""))
    return path


def export(run_dir: Path, source: Path, out: Path, tensor_parallel: int = 1,
           pipeline_parallel: int = 1) -> dict:
    import torch
    from transformers import AutoConfig

    from megatron_rlep import platform
    from megatron_rlep.actor import checkpoint, hf
    from megatron_rlep.actor.actor import _use_transformer_engine, build_module
    from megatron_rlep.builtin_model import resolve_model_path

    meta = checkpoint.metadata(source)
    settings = json.loads((run_dir / "config.json").read_text())
    hf_path = resolve_model_path(settings["model"]["path"])
    impl = "transformer_engine" if meta.get("transformer_engine") else "local"
    try:
        platform.init_distributed(tensor_parallel, pipeline_parallel)
    except ValueError as err:
        raise RunError(str(err)) from None
    use_te = _use_transformer_engine(impl)  # stops in one sentence where TE is missing
    hf_config = AutoConfig.from_pretrained(hf_path)
    dtype = getattr(torch, meta.get("dtype", "float32"))
    _, model = build_module(hf_config, tensor_parallel, pipeline_parallel, dtype, use_te)
    checkpoint.load_weights(source, model)
    hf.export_hf(model, hf_config, lambda buckets: checkpoint.save_hf(out, buckets, hf_path))
    return meta


def main(argv=None) -> int:
    from megatron_rlep.cli import USER_ERRORS, fail, helpers_die_with_me

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="the step of checkpoints/step-N")
    which.add_argument("--best", action="store_true", help="the best validation step's weights")
    parser.add_argument("-o", "--out", type=Path)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--pipeline-parallel", type=int, default=1)
    args = parser.parse_args(argv)
    from megatron_rlep.actor.checkpoint import SaveFailed, human

    helpers_die_with_me()
    out = None
    try:
        source = pick(args.run_dir, args.step, args.best)
        out = args.out or args.run_dir / ("hf-best" if args.best else f"hf-{source.name}")
        meta = export(args.run_dir, source, out, args.tensor_parallel, args.pipeline_parallel)
    except USER_ERRORS as err:
        fail(err)
    except SaveFailed as err:
        if not err.storage:
            raise
        import shutil

        free = shutil.disk_usage(out.parent).free
        fail(RunError(f"writing {out} failed ({err.reason}) with {human(free)} free there; "
                      "the partial export is removed and nothing was written under that name: "
                      "free space (or give -o on a file system with room) and run it again"))
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        score = f", val/acc {meta['extra']['val/acc']:.4f}" if "val/acc" in meta.get("extra", {}) \
            else ""
        step = meta.get("extra", {}).get("step", meta["step"])  # meta's own: updates applied
        print(f"exported step {step} of {args.run_dir} ({source.name}{score}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
