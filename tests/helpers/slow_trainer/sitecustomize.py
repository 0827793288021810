"""Test instrumentation, put on PYTHONPATH by a test: in the process ``SLOW_WHEN`` names, the
first call of ``Trainer.<SLOW_METHOD>`` lasts SLOW_SECONDS longer, and the file SLOW_MARK (when
set) is written as it starts.

* tests/test_slurm.py: a training rank's first update in a job's first restart
  (``SLOW_WHEN=restart``, ``SLOW_METHOD=update``), longer than torchrun's 30-second grace;
* tests/test_slurm.py's cluster rehearsal: learner 0's first checkpoint save
  (``SLOW_WHEN=learner0``, ``SLOW_METHOD=save``), a learner silent towards the rollout ranks for
  longer than the bridge's timeout.

And a late start: the ranks torchrun started as the ranks in ``LATE_RANKS`` ("0,1") sleep
``LATE_SECONDS`` before anything else (tests/test_slurm.py: learners later than the rollout
ranks). Both the late start and ``SLOW_WHEN=learner0`` are a job's first start's only (a
requeued job's restart runs as it is)."""

import functools
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
    name = os.environ["SLOW_METHOD"]
    original = getattr(trainer, name)

    @functools.wraps(original)
    def slowed(self, *args):
        if not getattr(slowed, "done", False):
            slowed.done = True
            if os.environ.get("SLOW_MARK"):
                open(os.environ["SLOW_MARK"], "w").close()
            print(f"test: the first Trainer.{name} lasts {os.environ['SLOW_SECONDS']} s longer",
                  flush=True)
            time.sleep(float(os.environ["SLOW_SECONDS"]))
        return original(self, *args)

    setattr(trainer, name, slowed)


FIRST = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
if "TORCHELASTIC_RUN_ID" in os.environ and FIRST and os.environ.get("RANK") in \
        os.environ.get("LATE_RANKS", "").split(","):
    print(f"test: rank {os.environ['RANK']} starts {os.environ['LATE_SECONDS']} s late", flush=True)
    time.sleep(float(os.environ["LATE_SECONDS"]))
WHEN = {"restart": os.environ.get("SLURM_RESTART_COUNT") == "1" and "RANK" in os.environ,
        "learner0": os.environ.get("RANK") == "0" and FIRST}
if WHEN.get(os.environ.get("SLOW_WHEN", "")) and "SLOW_SECONDS" in os.environ:
    threading.Thread(target=_patch_trainer, daemon=True).start()
