"""What checking a checkpoint against its manifest costs, next to loading it.

A Megatron-Core actor of the built-in model (SmolLM2-135M, fp32 on the CPU) takes one update
(so Adam's state is saved too) and saves a checkpoint, as the trainer does; then, alternating,
the same checkpoint is loaded into the actor (``Actor.load``, what a resume does), checked by
size (one stat a file, what every resume does) and checked by checksum (every byte read and its
CRC-32 computed, ``resume_verify=true``). It also reports what the manifest added to the
save (its files read by threads, and one after another for comparison), and where the save's
time went: Megatron-Core's sharded state dicts (model and optimizer), its
``dist_checkpointing.save``, the manifest (``--profile N`` adds the N functions with the most
cumulative time inside the save).
Prints one JSON object; ratios are of medians measured in this one run. ``--repeats 0`` saves
only (a large model on a GPU: ``--distributed-optimizer``, as the paper presets train there).

    python benchmarks/checkpoint_verify.py [--model smollm2-135m] [--repeats 3] [--out DIR]
        [--distributed-optimizer] [--profile N]
"""

from __future__ import annotations

import argparse
import contextlib
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
    parser.add_argument("--distributed-optimizer", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="the N functions with the most cumulative time in the save")
    args = parser.parse_args()

    import torch

    from megatron_rlep import files, platform
    from megatron_rlep.actor import checkpoint
    from megatron_rlep.actor.actor import Actor
    from megatron_rlep.actor.batch import SequenceBatch
    from megatron_rlep.config import AlgorithmConfig

    actor = Actor(args.model, AlgorithmConfig(lr=1e-6, warmup_steps=0),
                  distributed_optimizer=args.distributed_optimizer)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, actor.hf_config.vocab_size, (4, 96), generator=g).tolist()
    actor.train_step(SequenceBatch(tokens, [32] * 4, advantages=torch.randn(4, generator=g)))
    root = args.out or Path(tempfile.mkdtemp(prefix="checkpoint_verify-"))
    path = root / "step-000001"
    start = time.perf_counter()
    with timed_phases() as phases, profiled(args.profile) as top:
        actor.save(path, extra={"step": 1})
    save_s = time.perf_counter() - start
    meta = json.loads((path / checkpoint.COMPLETE).read_text())
    start = time.perf_counter()
    for name in meta["files"]:  # one file after another, as _publish did before file_entries
        files.file_entry(path / name)
    serial_s = time.perf_counter() - start
    start = time.perf_counter()
    files.file_entries(path, list(meta["files"]))  # what _publish spends on the manifest, again
    manifest_s = time.perf_counter() - start
    times = {"load": [], "sizes": [], "checksums": []}
    for _ in range(args.repeats):
        for kind in times:
            start = time.perf_counter()
            if kind == "load":
                actor.load(path)
            else:
                assert checkpoint.damage(path, checksums=kind == "checksums") == (None, True)
            times[kind].append(time.perf_counter() - start)
    size = sum(e["size"] for e in meta["files"].values())
    report = {"model": args.model, "device": str(platform.device()), "dtype": str(actor.dtype),
              "distributed_optimizer": args.distributed_optimizer, "files": len(meta["files"]),
              "checkpoint_mib": size / 2**20, "save_s": save_s,
              "save_gb_per_s": size / 1e9 / save_s, "save_phases_s": phases, "manifest_s": manifest_s,
              "manifest_share_of_save": manifest_s / save_s, "manifest_serial_s": serial_s,
              "manifest_serial_vs_threads": serial_s / manifest_s, "save_profile": top}
    if args.repeats:
        median = {k: statistics.median(v) for k, v in times.items()}
        report.update({f"{k}_s": v for k, v in median.items()},
                      sizes_vs_load=median["sizes"] / median["load"],
                      checksums_vs_load=median["checksums"] / median["load"], runs=times)
    print(json.dumps(report, indent=1))


@contextlib.contextmanager
def timed_phases():
    """Seconds in each phase of ``checkpoint.save`` while open: the sharded state dicts, the
    write, the manifest and rename."""
    from megatron.core import dist_checkpointing

    from megatron_rlep.actor import checkpoint

    phases = {"sharded_state_dicts": 0.0, "dist_checkpointing_save": 0.0, "manifest_publish": 0.0}
    originals = {"sharded_state_dicts": (checkpoint, "_sharded"),
                 "dist_checkpointing_save": (dist_checkpointing, "save"),
                 "manifest_publish": (checkpoint, "_publish")}

    def timing(name, function):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] += time.perf_counter() - start
        return run

    saved = {name: getattr(owner, attr) for name, (owner, attr) in originals.items()}
    for name, (owner, attr) in originals.items():
        setattr(owner, attr, timing(name, saved[name]))
    try:
        yield phases
    finally:
        for name, (owner, attr) in originals.items():
            setattr(owner, attr, saved[name])


@contextlib.contextmanager
def profiled(count: int):
    """cProfile while open; the ``count`` functions with the most cumulative time go into the
    yielded list when it closes (none when ``count`` is 0)."""
    top: list = []
    if not count:
        yield top
        return
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield top
    finally:
        profile.disable()
        stats = pstats.Stats(profile).stats
        rows = sorted(stats.items(), key=lambda item: -item[1][3])[:count]
        top.extend({"function": f"{Path(f).name}:{line}:{name}", "calls": calls,
                    "cumulative_s": round(cumulative, 3), "own_s": round(own, 3)}
                   for (f, line, name), (_, calls, own, cumulative, _) in rows)


if __name__ == "__main__":
    main()
