# Sourced by the sbatch scripts in slurm/: repository and Python environment, rendezvous on the
# first node, NCCL settings, one run directory per job, and requeue on preemption.
#
# Environment knobs (all optional):
#   MEGATRON_RLEP_REPO  repository to run from (default: the directory sbatch was called in)
#   MEGATRON_RLEP_VENV  virtual environment to activate (default: $REPO/.venv when present)
#   NPROC_PER_NODE      ranks per node (default: the GPUs Slurm gave the node, else 1)
#   RUN_DIR             output directory (default: runs/<job name>-<job id>[-<array index>];
#                       when given for an array job, RUN_DIR/<array index>)

set -euo pipefail
REPO=${MEGATRON_RLEP_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$REPO"
VENV=${MEGATRON_RLEP_VENV:-$REPO/.venv}
if [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi

MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-$((20000 + ${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} % 20000 + ${SLURM_ARRAY_TASK_ID:-0}))}
export MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}  # fail, never hang
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron's TP overlap
NPROC_PER_NODE=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}
JOB_TAG=${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}
if [ -n "${RUN_DIR:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    RUN_DIR=$RUN_DIR/$SLURM_ARRAY_TASK_ID  # one run directory per array task
fi
RUN_DIR=${RUN_DIR:-runs/$SLURM_JOB_NAME-$JOB_TAG}
export WANDB_RUN_GROUP=${WANDB_RUN_GROUP:-$SLURM_JOB_NAME}
echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NUM_NODES node(s) x" \
     "$NPROC_PER_NODE rank(s), rendezvous $MASTER_ADDR:$MASTER_PORT, run_dir $RUN_DIR"

# Preemption and `scontrol requeue` send SIGTERM to every process of the job, the ranks included:
# they checkpoint at the end of their step and leave. The time-limit warning
# (--signal=B:USR1@SECONDS) reaches only this shell, which passes SIGTERM to the ranks through
# srun and requeues the job once they are done. A requeued job starts again with the same job
# id, so the same run directory, and the trainer resumes from its latest checkpoint.
REQUEUE=0
STEP_PID=
on_usr1() {
    REQUEUE=1
    echo "received SIGUSR1 (time limit near): asking the ranks to checkpoint and stop"
    [ -n "$STEP_PID" ] && kill -TERM "$STEP_PID" 2>/dev/null || true
}
trap on_usr1 USR1
trap 'echo "received SIGTERM: the ranks checkpoint and stop"' TERM

# launch ARGS...: one torchrun per node through srun; torchrun starts NPROC_PER_NODE ranks.
launch() {
    srun --kill-on-bad-exit=1 --ntasks-per-node=1 \
        torchrun --nnodes "$SLURM_JOB_NUM_NODES" --nproc_per_node "$NPROC_PER_NODE" \
        --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \
        --rdzv_id "$JOB_TAG" "$@" &
    STEP_PID=$!
    local status=0
    wait "$STEP_PID" || status=$?
    while kill -0 "$STEP_PID" 2>/dev/null; do  # a trapped signal ended the first wait
        wait "$STEP_PID" || status=$?
    done
    STEP_PID=
    if [ "$REQUEUE" = 1 ]; then
        echo "requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    return "$status"
}
