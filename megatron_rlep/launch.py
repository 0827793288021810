"""torchrun as the Slurm scripts start it (``python -m megatron_rlep.launch``, torchrun's own
arguments): the same launcher, without its traceback when a rank fails. A failing rank has said
why in one sentence (``error: ...``, megatron_rlep/cli.py), and a job's other ranks exit
quietly, so torchrun's ``ChildFailedError`` traceback on every node would only bury that
sentence. This prints one line naming the node's first failed rank and its exit status, and
exits with status 1, as torchrun does; a signal that stops the node's ranks (a preemption, srun
ending a failed job's other nodes) is one line too, with status 128 + its number.
"""

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main


def launch(argv: list[str] | None = None) -> None:
    try:
        main(argv)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        print(f"launch: rank {rank} of this node's ranks exited with status {failure.exitcode}; "
              "the job's log says why in its error: line", file=sys.stderr, flush=True)
        sys.exit(1)
    except SignalException as err:  # Slurm's or srun's: the ranks were stopped with it
        print(f"launch: {err.sigval.name}: this node's ranks were stopped", file=sys.stderr,
              flush=True)
        sys.exit(128 + err.sigval)


if __name__ == "__main__":
    launch()
