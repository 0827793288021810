"""Trainer runs of several replay settings in one process (imports paid once): for each
setting a straight run of 2 steps, and a run stopped after step 1 and resumed to step 2 from its
checkpoint (the path a SIGTERM'd run takes). The caller compares their dumped batches.

    python tests/helpers/replay_runs.py OUT MODEL POOL '{"name": ["key=value", ...], ...}'
"""

import json
import sys
from pathlib import Path


def overrides(model: str, pool: str, run_dir: Path, steps: int, extra: list[str]) -> list[str]:
    return [f"model.path={model}", "data.train_size=8", "data.levels=[1,2]", "data.eval_size=4",
            "algorithm.prompts_per_rollout=4", "algorithm.prompts_per_update=2",
            "algorithm.rollouts_per_prompt=3", "algorithm.replay_per_prompt=2",
            f"algorithm.pool={pool}", f"algorithm.total_steps={steps}", "algorithm.lr=1e-3",
            "algorithm.warmup_steps=0", "algorithm.overlong_buffer=4",
            "rollout.engine=transformers", "rollout.max_response_length=12",
            "logging.wandb=disabled", "logging.dump_batches=true", "logging.eval_every=0",
            "logging.save_every=0", "logging.progress=false", f"run_dir={run_dir}", *extra]


def main(out: str, model: str, pool: str, settings: str) -> None:
    from megatron_rlep import platform
    from megatron_rlep.config import compose
    from megatron_rlep.train import Trainer

    for name, extra in json.loads(settings).items():
        for run, steps in (("straight", 2), ("resumed", 1), ("resumed", 2)):
            cfg = compose(overrides(model, pool, Path(out) / name / run, steps, extra))
            Trainer(cfg).run()
            platform.reset_model_parallel()
        print(f"OK {name}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
