# Sourced by the sbatch scripts in slurm/: repository and Python environment, rendezvous on the
# first node, NCCL settings, one run directory per job, and requeue on preemption.
#
# Environment knobs (all optional):
#   MEGATRON_RLEP_REPO  repository to run from (default: the directory sbatch was called in)
#   MEGATRON_RLEP_VENV  virtual environment to activate (default: $REPO/.venv when present)
#   NPROC_PER_NODE      ranks per node (default: the GPUs Slurm gave the node, else 1)
#   RUNS_ROOT           where run directories go by default (default: runs, in the repository)
#   RUN_DIR             output directory (default: RUNS_ROOT/<job name>, RUNS_ROOT/<job name>/<index>
#                       for an array task; when given for an array job, RUN_DIR/<index>): a job
#                       resubmitted under the same name resumes there; a directory that a job
#                       still queued or running holds is refused
#   SOCKET_IFNAME       network interface for NCCL's and gloo's bootstrap sockets (sets
#                       NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unless those are set)
#   PREFLIGHT=0         skip the preflight (scripts/check_env.py --preflight on every node)
#   ROLLOUT_NODES       train.sbatch: the allocation's last N nodes run the rollout engines
#                       (rollout.placement=disaggregated rollout.ranks=N x NPROC_PER_NODE)

set -euo pipefail
REPO=${MEGATRON_RLEP_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$REPO"
VENV=${MEGATRON_RLEP_VENV:-$REPO/.venv}
if [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi

# the first node's address as Slurm reaches it (NodeAddr, which is its name unless slurm.conf
# gives another)
FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$FIRST_NODE" -o 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
MASTER_ADDR=${MASTER_ADDR:-$FIRST_NODE}
if [ -z "${MASTER_PORT:-}" ]; then
    # from the job's id; this script runs on the first node, the rendezvous host, so a port some
    # other program listens on there is skipped (torchrun would otherwise join that program's
    # store and fail), three ports at a time, each of the three free: an array's tasks start on
    # consecutive ports, and a task pushed off its own must not land on the next task's (the
    # rollout bridge meets in the job's store: no port of its own)
    MASTER_PORT=$((20000 + ${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} % 20000 + ${SLURM_ARRAY_TASK_ID:-0}))
    port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
    while port_taken "$MASTER_PORT" || port_taken $((MASTER_PORT + 1)) || port_taken $((MASTER_PORT + 2)); do
        MASTER_PORT=$((MASTER_PORT + 3))
    done
fi
export MASTER_ADDR MASTER_PORT
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}  # fail, never hang
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron's TP overlap
# NVLS buffers take about 2 GiB a communicator on NVSwitch nodes, and this job's collectives
# gain little from them; the memory plan (tools/memory_plan.py) counts NCCL without them
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ -n "${SOCKET_IFNAME:-}" ]; then
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$SOCKET_IFNAME}
    export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$SOCKET_IFNAME}
fi
NPROC_PER_NODE=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}
[ "$NPROC_PER_NODE" -gt 0 ] 2>/dev/null || NPROC_PER_NODE=1  # --gpus-per-node=0: one CPU rank
CPUS_PER_NODE=${SLURM_CPUS_ON_NODE:-1}  # the whole allocation goes to the node's one torchrun
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS_PER_NODE / NPROC_PER_NODE > 0 ? CPUS_PER_NODE / NPROC_PER_NODE : 1 ))}
JOB_TAG=${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}
JOB_ID=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID}  # as squeue knows it
JOB_ID=${JOB_ID:-$SLURM_JOB_ID}
RUN_DIR=${RUN_DIR:-${RUNS_ROOT:-runs}/$SLURM_JOB_NAME}
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    RUN_DIR=$RUN_DIR/$SLURM_ARRAY_TASK_ID  # one run directory per array task
fi
echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NUM_NODES node(s) x" \
     "$NPROC_PER_NODE rank(s), rendezvous $MASTER_ADDR:$MASTER_PORT, run_dir $RUN_DIR"

# The time-limit warning (--signal=B:USR1@SECONDS) reaches only this shell. It writes
# $RUN_DIR/STOP, which the trainer's ranks poll at the end of every step: they finish the step,
# checkpoint, remove the file and exit 0, and this shell requeues the job. No process is
# signalled, so a step may take as long as it needs (a signal to torchrun would give the ranks
# 30 seconds before SIGKILL). Preemption and `scontrol requeue` send SIGTERM to every process
# of the job: the ranks checkpoint if their step ends within Slurm's KillWait and torchrun's
# 30 seconds; otherwise the work since the last checkpoint (logging.save_every) is lost.
# A requeued job starts again with the same job id, so the same run directory, and the trainer
# resumes from its latest checkpoint.
REQUEUE=0
STOP_FILE=$RUN_DIR/STOP
on_usr1() {
    REQUEUE=1
    echo "received SIGUSR1 (time limit near): $STOP_FILE asks the ranks to checkpoint and stop"
    mkdir -p "$RUN_DIR" && touch "$STOP_FILE"
}
trap on_usr1 USR1
trap 'echo "received SIGTERM: the ranks checkpoint and stop"' TERM

# claim_run_dir: RUN_DIR/.slurm-job names the job using it; a job still queued or running there
# (another one submitted under the same name) stops this one. A requeued job keeps its id.
claim_run_dir() {
    local owner=$RUN_DIR/.slurm-job other
    mkdir -p "$RUN_DIR"
    other=$(cat "$owner" 2>/dev/null || true)
    if [ -n "$other" ] && [ "$other" != "$JOB_ID" ] && \
            [ -n "$(squeue -h -j "$other" -o %i 2>/dev/null)" ]; then
        echo "error: $RUN_DIR is in use by job $other, which is still queued or running; give" \
             "this job another name (sbatch --job-name) or RUN_DIR, or cancel job $other" >&2
        exit 2
    fi
    echo "$JOB_ID" > "$owner"
}

# rollout_split ARGS...: disaggregated placement on whole nodes of this allocation. torchrun
# numbers ranks node by node, so ROLLOUT_NODES=N makes N nodes' ranks the job's last ones, the
# rollout ranks: ROLLOUT_ARGS becomes rollout.placement=disaggregated
# rollout.ranks=N x NPROC_PER_NODE. Which nodes those are is the rendezvous' choice (it orders
# nodes by its own rule): learner 0 logs them as they are ("learner 0: the bridge met: ..."). A split that is not whole nodes (ROLLOUT_NODES or a
# rollout.ranks= argument) or leaves no node to train stops the job here, before any srun.
rollout_split() {
    ROLLOUT_ARGS=()
    local nodes=${ROLLOUT_NODES:-} ranks="" arg what
    for arg in "$@"; do
        case $arg in rollout.ranks=*) ranks=${arg#rollout.ranks=} ;; esac
    done
    what="ROLLOUT_NODES=$nodes"
    if [ -n "$ranks" ]; then
        [ -z "$nodes" ] || split_error "ROLLOUT_NODES=$nodes and rollout.ranks=$ranks both set" \
            "the split; give ROLLOUT_NODES alone"
        [[ $ranks =~ ^[0-9]+$ ]] && (( ranks % NPROC_PER_NODE == 0 )) || split_error \
            "rollout.ranks=$ranks is not whole nodes of $NPROC_PER_NODE ranks; on Slurm the" \
            "rollout ranks are whole nodes: give ROLLOUT_NODES=N instead"
        nodes=$(( ranks / NPROC_PER_NODE )) what="rollout.ranks=$ranks"
    fi
    [[ ${nodes:-0} =~ ^[0-9]+$ ]] || split_error "ROLLOUT_NODES=$nodes is not a whole number of" \
        "nodes; give how many of the job's nodes run the engines, e.g. ROLLOUT_NODES=2"
    nodes=$(( 10#${nodes:-0} ))
    [ "$nodes" -gt 0 ] || return 0
    (( nodes < SLURM_JOB_NUM_NODES )) || split_error "$what leaves no training node in a job" \
        "of $SLURM_JOB_NUM_NODES node(s); submit with more nodes (sbatch -N) or fewer rollout nodes"
    [ -z "$ranks" ] || return 0  # the command line's own split, whole nodes: passed as it is
    ROLLOUT_ARGS=(rollout.placement=disaggregated rollout.ranks=$(( nodes * NPROC_PER_NODE )))
    echo "placement: disaggregated, $nodes of $SLURM_JOB_NUM_NODES nodes (ranks" \
         "$(( (SLURM_JOB_NUM_NODES - nodes) * NPROC_PER_NODE ))-$(( SLURM_JOB_NUM_NODES * NPROC_PER_NODE - 1 )))" \
         "run the rollout engines, the other $(( SLURM_JOB_NUM_NODES - nodes )) train; learner" \
         "0's line \"the bridge met\" names the nodes"
}

split_error() {
    echo "error: $*" >&2
    exit 2
}

# launch ARGS...: a preflight on every node, then one torchrun per node through srun (all the
# node's CPUs for it); torchrun starts NPROC_PER_NODE ranks. It runs as megatron_rlep.launch:
# torchrun without its traceback when a rank fails (that rank's one sentence says why).
launch() {
    claim_run_dir
    rm -f "$STOP_FILE"  # left by a job that died before its ranks saw it
    if [ "${PREFLIGHT:-1}" != 0 ]; then
        srun --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_NODE" \
            python scripts/check_env.py --preflight --nproc "$NPROC_PER_NODE" -- "$@"
    fi
    srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_NODE" \
        python -m megatron_rlep.launch --nnodes "$SLURM_JOB_NUM_NODES" --nproc_per_node "$NPROC_PER_NODE" \
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
