"""Test instrumentation for tests/test_async_rollout.py, put on PYTHONPATH by the test: in
learner 0 (the process torchrun starts as RANK=0), the first checkpoint save lasts SLOW_SECONDS
longer: a learner silent towards the rollout ranks for longer than the bridge's timeout."""

import os
import sys
import threading
import time


def _patch_trainer() -> None:
    deadline = time.time() + 120 * float(os.environ.get("MEGATRON_RLEP_TEST_SPEED", "1"))
    while (trainer := getattr(sys.modules.get("__main__"), "Trainer", None)) is None:
        if time.time() > deadline:
            return
        time.sleep(0.01)
    original = trainer.save

    def save(self, step):
        if not getattr(save, "slowed", False):
            save.slowed = True
            print(f"test: the save of step {step} lasts {os.environ['SLOW_SECONDS']} s longer",
                  flush=True)
            time.sleep(float(os.environ["SLOW_SECONDS"]))
        return original(self, step)

    trainer.save = save


if os.environ.get("RANK") == "0" and "SLOW_SECONDS" in os.environ:
    threading.Thread(target=_patch_trainer, daemon=True).start()
