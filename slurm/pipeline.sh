#!/bin/bash
# The whole method as four chained Slurm jobs: DAPO baseline -> experience pool from its final
# policy -> RLEP from the base model with that pool -> evaluation of both.
#
#   slurm/pipeline.sh cpu      # one node, CPU, the built-in model and task (about an hour)
#   slurm/pipeline.sh paper    # the paper: 8 nodes x 8 GPUs, Qwen2.5-Math-7B on DAPO-Math-17k
#
# paper needs QWEN_MATH_7B (Hugging Face checkpoint directory) and DAPO_MATH_17K (the dataset's
# parquet): tools/get_data.py fetches both. The evaluation sets ship in data/eval/ (RLEP_EVAL_DIR,
# if set, is searched first). Outputs go
# to $OUT (default runs/pipeline-<profile>): baseline/, pool/, rlep/, eval-baseline/, eval-rlep/.
# Extra sbatch options (account, partition, time) come from $SBATCH_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:?usage: slurm/pipeline.sh cpu|paper}
OUT=${OUT:-runs/pipeline-$PROFILE}
read -r -a EXTRA <<< "${SBATCH_ARGS:-}"

case $PROFILE in
cpu)
    NODES=(--nodes 1 --gpus-per-node=0 --cpus-per-task "$(nproc)")
    export NPROC_PER_NODE=1
    BASELINE=(experiment=cpu_baseline)
    POOL=(data.levels=[1,2] data.train_size=192 samples=16 temperature=0.7 top_p=0.95
          min_correct=2 rollout.max_response_length=32 rollout=transformers)
    RLEP=(experiment=cpu_rlep)
    EVAL=(datasets=[arithmetic] levels=[1,2] limit=64 samples=8 max_tokens=32 rollout=transformers)
    ;;
paper)
    : "${QWEN_MATH_7B:?set QWEN_MATH_7B}" "${DAPO_MATH_17K:?set DAPO_MATH_17K}"
    NODES=(--nodes 8 --gpus-per-node 8 --ntasks-per-node 1 --exclusive)
    export NPROC_PER_NODE=8
    BASELINE=(experiment=dapo_nodyn_bs64)
    POOL=(data=dapo-math-17k samples=64 temperature=0.7 top_p=0.95 min_correct=2
          rollout=vllm rollout.max_response_length=3072)
    RLEP=(experiment=rlep_qwen25_math_7b)
    EVAL=(datasets=[aime24,aime25,amc23] samples=32 temperature=1.0
          top_p=1.0 max_tokens=3072 rollout=vllm)
    ;;
*)
    echo "error: profile '$PROFILE' is unknown; use cpu or paper" >&2
    exit 2
    ;;
esac

submit() {  # submit RUN_DIR DEPENDENCY SCRIPT ARGS... -> job id
    local run_dir=$1 after=$2 script=$3
    shift 3
    sbatch --parsable "${NODES[@]}" "${EXTRA[@]}" ${after:+--dependency=afterok:$after} \
        --export=ALL,RUN_DIR="$run_dir" --output="$OUT/slurm-%x-%j.out" "slurm/$script" "$@"
}
mkdir -p "$OUT"
base=$(submit "$OUT/baseline" "" train.sbatch "${BASELINE[@]}")
pool=$(submit "$OUT/pool" "$base" build_pool.sbatch model.path="$OUT/baseline/hf" "${POOL[@]}")
rlep=$(submit "$OUT/rlep" "$pool" train.sbatch "${RLEP[@]}" algorithm.pool="$OUT/pool")
eval_base=$(submit "$OUT/eval-baseline" "$base" evaluate.sbatch model.path="$OUT/baseline/hf" "${EVAL[@]}")
eval_rlep=$(submit "$OUT/eval-rlep" "$rlep" evaluate.sbatch model.path="$OUT/rlep/hf" "${EVAL[@]}")
echo "submitted: baseline $base -> pool $pool -> rlep $rlep; evaluation $eval_base, $eval_rlep"
echo "then: python tools/plot.py $OUT/baseline $OUT/rlep -o $OUT/curves.png"
