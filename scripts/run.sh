#!/usr/bin/env bash
# The main job on the built-in default: the two-phase demo (DAPO baseline, experience pool, RLEP
# from the base model, evaluation of both, report) on SmolLM2-135M and built-in arithmetic.
# Extra arguments are demo keys or training overrides, e.g.  scripts/run.sh seed=2 out=runs/demo-2
# or another built-in task:  scripts/run.sh task=code out=runs/demo-code  (task=logic, task=calculator, task=chain likewise)
source "$(dirname "$0")/env.sh"
exec python -m megatron_rlep.demo "$@"
