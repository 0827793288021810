#!/bin/bash
# The update at a real load on one GPU, both shapes, in one command of under 8 minutes (issue 51):
#   scripts/gpu_update.sh [OUT]        (default OUT: $OUT, else runs/gpu-update)
# Needs Python with torch (CUDA) and transformers; megatron-core, hydra-core, omegaconf and
# antlr4 come from the wheels in .whl/ (scripts/gpu_smoke_carry.sh fills it on a machine with pip
# access), installed into /tmp/smoke-site as scripts/gpu_smoke.sh does. No Transformer Engine and
# no vLLM: Megatron-Core's local layer specs with torch's SDPA. benchmarks/gpu_update.py runs at
# Qwen2.5-1.5B's shape, then at Qwen2.5-Math-7B's width with the layers that fit (--layers auto):
# 65,536 tokens an optimizer step, one warm-up and two timed updates with the synchronisations
# counted (--sync-debug), one profiled update, then the same through transformers as the
# reference. Each shape has 225 s (timeout) and writes OUT/<shape>.json (rewritten once the
# actor's part is done, so a stopped run keeps it) and OUT/<shape>.txt. TRACE=1 also writes the
# 1.5B update's Chrome trace, OUT/qwen2.5-1.5b.trace.json.gz; SHAPES="..." runs other shapes
# (SHAPES=tiny: the script's own check, on a CPU too).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-runs/gpu-update}}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/smoke-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/smoke-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
status=0
for shape in ${SHAPES:-qwen2.5-1.5b qwen2.5-math-7b-slice}; do
    trace=()
    if [ "${TRACE:-0}" = 1 ] && [ "$shape" = qwen2.5-1.5b ]; then
        trace=(--trace "$OUT/$shape.trace.json.gz")
    fi
    timeout 225 python3 benchmarks/gpu_update.py --shape "$shape" --sync-debug \
        --json "$OUT/$shape.json" ${trace[@]+"${trace[@]}"} 2>&1 | tee "$OUT/$shape.txt" || status=1
done
exit $status
