"""Hydra sweeps as Slurm array jobs: job i of a ``-m`` command line.

    python -m megatron_rlep.sweep --count experiment=cpu_rlep algorithm.replay_per_prompt=0,2 seed=1,2
    python -m megatron_rlep.sweep --index 3 experiment=cpu_rlep algorithm.replay_per_prompt=0,2 seed=1,2

``--count`` prints the number of jobs (4 here), ``--index I`` job I's overrides, one per line
(``experiment=cpu_rlep``, ``algorithm.replay_per_prompt=2``, ``seed=2``), in the order Hydra's
``-m`` runs them. Every job is checked against the schema first; slurm/sweep.sbatch uses this.
"""

from __future__ import annotations

import argparse
import sys

from megatron_rlep.cli import USER_ERRORS, fail
from megatron_rlep.config import check_overrides, expand_sweep


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--count", action="store_true")
    group.add_argument("--index", type=int)
    parser.add_argument("--config-name", default="config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    try:
        check_overrides(args.overrides, args.config_name)
    except USER_ERRORS as err:
        fail(err)
    jobs = expand_sweep(args.overrides)
    if args.count:
        print(len(jobs))
    elif not 0 <= args.index < len(jobs):
        fail(ValueError(f"sweep index {args.index} is outside 0..{len(jobs) - 1}; submit with "
                        f"--array=0-{len(jobs) - 1}"))
    else:
        print("\n".join(jobs[args.index]))


if __name__ == "__main__":
    main(sys.argv[1:])
