"""Test instrumentation for tests/test_slurm.py, put on PYTHONPATH by the test: in a training
rank (torchrun sets RANK) of a job's first restart, the first update lasts SLOW_SECONDS longer
- longer than torchrun's 30-second grace - and the file SLOW_MARK is written when it starts."""

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
    original = trainer.update

    def update(self, groups):
        if not getattr(update, "slowed", False):
            update.slowed = True
            open(os.environ["SLOW_MARK"], "w").close()
            time.sleep(float(os.environ["SLOW_SECONDS"]))
        return original(self, groups)

    trainer.update = update


if os.environ.get("SLURM_RESTART_COUNT") == "1" and "RANK" in os.environ:
    threading.Thread(target=_patch_trainer, daemon=True).start()
