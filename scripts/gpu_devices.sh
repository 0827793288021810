#!/bin/bash
# Each rank of a disaggregated job on a GPU of its own, from the real entry point, in one command:
#   scripts/gpu_devices.sh [OUT]        (default OUT: runs/gpu-devices)
# torchrun starts three ranks of `python -m megatron_rlep.train` on this node as a user's job
# starts them, CUDA_VISIBLE_DEVICES unset: a learner and two rollout ranks
# (rollout.placement=disaggregated rollout.ranks=2) of the needs_gpu preset model=qwen3-8b, its
# path a stand-in directory. Each rank stops at the first call that takes a GPU, after writing
# which one to OUT/devices.jsonl (tests/helpers/rank_device/sitecustomize.py: the GPU's UUID).
# Then one line per rank, and exit status 1 unless every rank took a GPU of its own. Needs three
# GPUs and the project's Python environment; on a host without CUDA it runs on a fake node of
# FAKE_CUDA_DEVICES (default 4), as tests/test_roles.py does.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-devices}
rm -rf "$OUT"
mkdir -p "$OUT/model"
OUT=$(cd "$OUT" && pwd)
echo '{"model_type": "qwen3"}' > "$OUT/model/config.json"  # the ranks stop before a model loads
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')  # NVML's count
if [ "$GPUS" = 0 ]; then
    export FAKE_CUDA_DEVICES=${FAKE_CUDA_DEVICES:-4}
elif [ "$GPUS" -lt 3 ]; then
    echo "scripts/gpu_devices.sh: this node has $GPUS GPUs; a learner and two rollout ranks need 3" >&2
    exit 2
fi
unset CUDA_VISIBLE_DEVICES
export PYTHONPATH=$PWD/tests/helpers/rank_device:$PWD${PYTHONPATH:+:$PYTHONPATH}
export RANK_DEVICE_RECORD=$OUT/devices.jsonl PYTHONUNBUFFERED=1
# a rank that takes no GPU before the bridge meets waits a minute for the others, not 30
python3 -m torch.distributed.run --standalone --nproc_per_node 3 -m megatron_rlep.train \
    model=qwen3-8b model.path="$OUT/model" rollout.placement=disaggregated rollout.ranks=2 \
    algorithm.max_staleness=1 algorithm.replay_per_prompt=0 rollout.connect_timeout_s=60 \
    logging.wandb=disabled run_dir="$OUT/run" > "$OUT/log.txt" 2>&1 ||
    echo "torchrun: exit status $? ($OUT/log.txt)"
python3 - "$RANK_DEVICE_RECORD" <<'EOF'
import json, os, sys

lines = [json.loads(line) for line in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
taken = {}
for rank, side in (("0", "learner"), ("1", "rollout rank 0"), ("2", "rollout rank 1")):
    started = [e for e in lines if e["rank"] == rank and e["event"] == "cuda started"]
    took = [e for e in lines if e["rank"] == rank and e["event"] == "device taken"]
    said = f"GPU {took[0]['device']} ({took[0]['by']})" if took else "no GPU taken"
    if started:  # the fake CUDA says when CUDA started and what it saw then
        said += f"; CUDA started by {started[0]['by']} with devices {started[0]['visible']}"
    print(f"rank {rank} ({side}): {said}")
    if took:
        taken[rank] = took[0]["device"]
ok = len(taken) == 3 and len(set(taken.values())) == 3
print("DEVICES OK: each rank on a GPU of its own" if ok else
      "DEVICES FAIL: not every rank took a GPU of its own")
sys.exit(0 if ok else 1)
EOF
