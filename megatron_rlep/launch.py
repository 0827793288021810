"""torchrun as the Slurm scripts start it (``python -m megatron_rlep.launch``, torchrun's own
arguments): the same launcher, without its traceback when a rank fails. A failing rank has said
why in one sentence (``error: ...``, megatron_rlep/cli.py), and a job's other ranks exit
quietly, so torchrun's ``ChildFailedError`` traceback on every node would only bury that
sentence. This prints one line naming the node's first failed rank and its exit status, and
exits with status 1, as torchrun does; a signal that stops the node's ranks (a preemption, srun
ending a failed job's other nodes) is one line too, with status 128 + its number, and so is a
rendezvous lost because the node that kept it (the job's first) has ended, with status 1. The
launcher's own C++ warnings (its rendezvous store's, with their stacks) are errors only; its
ranks keep the level they were given.
"""

import os
import sys


def launch(argv: list[str] | None = None) -> None:
    given = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"  # read once, as torch loads
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main

    if given is None:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
    else:
        os.environ["TORCH_CPP_LOG_LEVEL"] = given
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
    except RendezvousError as err:  # the keeper's launcher ended first: its ranks said why
        print(f"launch: this node lost the job's rendezvous ({type(err).__name__}); the node "
              "that kept it has ended, and this node's ranks were stopped", file=sys.stderr,
              flush=True)
        sys.exit(1)


if __name__ == "__main__":
    launch()
