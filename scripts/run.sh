#!/usr/bin/env bash
# The main job on the built-in default: SmolLM2-135M answers built-in arithmetic questions.
# Extra arguments are Hydra overrides, e.g.  scripts/run.sh samples=8 questions=10
source "$(dirname "$0")/env.sh"
exec python -m megatron_rlep.quickstart experiment=quickstart "$@"
