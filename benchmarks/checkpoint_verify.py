"""What checking a checkpoint against its manifest costs, next to loading it.

A Megatron-Core actor of the built-in model (SmolLM2-135M, fp32 on the CPU) takes one update
(so Adam's state is saved too) and saves a checkpoint, as the trainer does; then, alternating,
the same checkpoint is loaded into the actor (``Actor.load``, what a resume does), checked by
size (one stat a file, what every resume does) and checked by checksum (every byte read and its
CRC-32 computed, ``resume_verify=true``). It also reports what the manifest added to the save.
Prints one JSON object; ratios are of medians measured in this one run.

    python benchmarks/checkpoint_verify.py [--model smollm2-135m] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="where the checkpoint goes")
    args = parser.parse_args()

    import torch

    from megatron_rlep import files
    from megatron_rlep.actor import checkpoint
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.actor.batch import SequenceBatch
    from megatron_rlep.config import AlgorithmConfig

    actor = Actor(args.model, AlgorithmConfig(lr=1e-6, warmup_steps=0))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, actor.hf_config.vocab_size, (4, 96), generator=g).tolist()
    actor.train_step(SequenceBatch(tokens, [32] * 4, advantages=torch.randn(4, generator=g)))
    root = args.out or Path(tempfile.mkdtemp(prefix="checkpoint_verify-"))
    path = root / "step-000001"
    start = time.perf_counter()
    actor.save(path, extra={"step": 1})
    save_s = time.perf_counter() - start
    meta = json.loads((path / checkpoint.COMPLETE).read_text())
    start = time.perf_counter()
    for name in meta["files"]:
        files.file_entry(path / name)
    manifest_s = time.perf_counter() - start  # what _publish spent on the manifest, again
    times = {"load": [], "sizes": [], "checksums": []}
    for _ in range(args.repeats):
        for kind in times:
            start = time.perf_counter()
            if kind == "load":
                actor.load(path)
            else:
                assert checkpoint.damage(path, checksums=kind == "checksums") == (None, True)
            times[kind].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "model": args.model, "files": len(meta["files"]),
        "checkpoint_mib": sum(e["size"] for e in meta["files"].values()) / 2**20,
        "save_s": save_s, "manifest_s": manifest_s, "manifest_share_of_save": manifest_s / save_s,
        **{f"{k}_s": v for k, v in median.items()},
        "sizes_vs_load": median["sizes"] / median["load"],
        "checksums_vs_load": median["checksums"] / median["load"],
        "runs": times}, indent=1))


if __name__ == "__main__":
    main()
