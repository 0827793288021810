"""Pool building throughput against bare generation, same engine and batch, in one run.

For each shard k of the built-in task, in alternating order: the bare generation of shard k
(``engine.generate`` with the shard's seed) and the pool builder's whole work on shard k
(``tools/build_pool.py:build_shard``: the same generation, then verification, deduplication,
selection and the atomic shard + sidecar writes). Both draw the same completions, so the
difference is the builder's overhead. As generation time varies from call to call, the
builder's own work (``write_shard`` on the bare completions) is also timed alone. Prints
samples/s of each, the overhead measured both ways.

    python benchmarks/pool_build.py [--shards 4] [key=value overrides of conf/build_pool.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

DEFAULTS = ["data.levels=[1,2]", "data.train_size=64", "samples=16", "shard_size=8",
            "rollout.max_response_length=32", "rollout.engine=transformers", "min_correct=1",
            "temperature=1.0", "top_p=1.0"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import build_pool

    from megatron_rlep import platform
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.config import compose
    from megatron_rlep.data import load_examples
    from megatron_rlep.rollout import make_engine
    from megatron_rlep.reward.scorer import Scorer

    cfg = compose(DEFAULTS + args.overrides, "build_pool")
    examples = load_examples(cfg.data.train, "train", None, levels=cfg.data.levels,
                             n=cfg.data.train_size, seed=cfg.seed)
    shards = [examples[i:i + cfg.shard_size] for i in range(0, len(examples), cfg.shard_size)]
    shards = shards[:args.shards]
    engine = make_engine(cfg.rollout, resolve_model_path(cfg.model.path),
                         platform.compute_dtype(cfg.model.dtype), cfg.seed,
                         cfg.data.max_prompt_length + cfg.rollout.max_response_length, 1,
                         sandbox=cfg.sandbox)
    verifier = Scorer(cfg.verifier, sandbox=cfg.sandbox)
    build_pool.sample(engine, shards[0][:1], 0, cfg)  # warm-up
    times = {"bare": 0.0, "build": 0.0, "builder_work": 0.0}
    samples = 0
    with tempfile.TemporaryDirectory() as out:
        (Path(out) / "alone").mkdir()
        for k, shard in enumerate(shards):
            order = ("bare", "build") if k % 2 == 0 else ("build", "bare")
            for kind in order:
                start = time.perf_counter()
                if kind == "bare":
                    completions = build_pool.sample(engine, shard, k, cfg)
                    times["bare"] += time.perf_counter() - start
                    start = time.perf_counter()
                    build_pool.write_shard(shard, completions, k, Path(out) / "alone", verifier, cfg)
                    times["builder_work"] += time.perf_counter() - start
                else:
                    build_pool.build_shard(engine, shard, k, Path(out), verifier, cfg)
                    times["build"] += time.perf_counter() - start
            samples += len(shard) * cfg.samples
    verifier.close()
    result = {"shards": len(shards), "samples": samples,
              "bare_samples_per_s": samples / times["bare"],
              "build_samples_per_s": samples / times["build"],
              "overhead": times["build"] / times["bare"] - 1,
              "builder_work_s": times["builder_work"],
              "builder_work_overhead": times["builder_work"] / times["bare"],
              "settings": DEFAULTS + args.overrides}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
