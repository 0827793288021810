"""One job's vLLM engine after the job, as a Hydra sweep leaves it (for tests/test_rollout.py,
in a child process: vLLM changes process-wide state). Job 1 starts an engine in a one-process
gloo group, closes it if asked, and tears the groups down as the trainer does; job 2 sets its
group up again; then job 1's engine is dropped and the garbage collector runs. Prints one JSON
object: whether job 2's group is still up, and whether job 1's engine was freed.

    python tests/helpers/engine_teardown.py DIR close|keep
"""

import gc
import json
import sys
import weakref
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))


def main(out: str, how: str) -> None:
    from tiny import make_model

    from megatron_rlep import platform
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    path = make_model(Path(out) / "model")
    dist.init_process_group("gloo", init_method=f"file://{out}/job-1", rank=0, world_size=1)
    engine = VllmEngine(str(path), max_model_len=256, dtype="float32")
    engine.generate([[5, 6, 7]], 1, max_tokens=2)
    if how == "close":
        engine.close()
    platform.destroy_distributed()
    dist.init_process_group("gloo", init_method=f"file://{out}/job-2", rank=0, world_size=1)
    freed = weakref.ref(engine.llm)
    del engine
    gc.collect()
    print(json.dumps({"job_2_group_up": dist.is_initialized(), "engine_freed": freed() is None}))


if __name__ == "__main__":
    main(*sys.argv[1:])
