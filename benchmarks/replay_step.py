"""Step time with M = 0 and M = 2 replays per prompt, in one run, on the CPU preset.

Two trainers (same seed, same prompts) alternate steps so drift of the machine hits both alike.
Replay adds no generation; it adds M sequences per group to the update. The floor of the ratio
is therefore (rollout + sync + update * tokens(M=2) / tokens(M=0)) / (rollout + sync + update),
with the response tokens of the updates, computed from the M = 0 run's own split; the measured
ratio should sit next to it (a little under it, as the optimiser step does not grow with M).

    python benchmarks/replay_step.py [--steps 3] [key=value overrides for both runs ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def synthetic_pool(examples, path: Path) -> Path:
    """Two verified-looking answers per training question (timing only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": ex.data_source, "prompt": list(ex.prompt),
             "reward_model": {"ground_truth": ex.ground_truth, "style": "rule",
                              "candidates": [f"Adding them gives {ex.ground_truth}.\nAnswer: {ex.ground_truth}",
                                             f"The result is {ex.ground_truth}.\nAnswer: {ex.ground_truth}"]},
             "extra_info": {"index": ex.id}} for ex in examples]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def timed_step(trainer, step: int) -> dict:
    t0 = time.perf_counter()
    groups, _ = trainer.producer.groups(step)
    t1 = time.perf_counter()
    updates, _ = trainer.update(groups)
    t2 = time.perf_counter()
    trainer.sync_weights(step + 1)
    t3 = time.perf_counter()
    return {"rollout_s": t1 - t0, "update_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0,
            "update_tokens": sum(u["tokens"] for u in updates),
            "sequences": sum(len(g.samples) for g in groups)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from megatron_rlep.config import compose
    from megatron_rlep.train import Trainer

    work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    base = ["experiment=cpu_baseline", "logging.wandb=disabled", "logging.eval_every=0",
            "logging.save_every=0", "resume=false", *args.overrides]
    cfg0 = compose(base + [f"run_dir={work / 'm0'}"])
    plain = Trainer(cfg0)
    pool = synthetic_pool(plain.train_set, work / "pool.parquet")
    cfg2 = compose(base + ["algorithm.replay_per_prompt=2", f"algorithm.pool={pool}",
                           f"run_dir={work / 'm2'}"])
    replay = Trainer(cfg2)
    runs = {"M=0": [], "M=2": []}
    for step in range(args.steps + 1):  # step 0 warms up
        for name, trainer in (("M=0", plain), ("M=2", replay)):
            result = timed_step(trainer, step)
            if step:
                runs[name].append(result)
    summary = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
               for name, rows in runs.items()}
    m0, m2 = summary["M=0"], summary["M=2"]
    floor = (m0["rollout_s"] + m0["sync_s"] + m0["update_s"] * m2["update_tokens"] / m0["update_tokens"]) \
        / m0["step_s"]
    summary["ratio_step_time_M2_over_M0"] = m2["step_s"] / m0["step_s"]
    summary["floor_from_response_tokens"] = floor
    summary["G"] = cfg0.algorithm.rollouts_per_prompt
    summary["steps_timed"] = args.steps
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
