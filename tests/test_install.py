"""scripts/torch_cpu.sh (sourced by scripts/env.sh) with a recording stand-in for pip: torch's
CPU build comes from the configured sources when they have it, else from PyTorch's CPU index."""

import os
import platform
import subprocess
from pathlib import Path

import pytest
from speed import scaled

REPO = Path(__file__).resolve().parent.parent
WANTED = "torch==2.13.0+cpu" if (platform.system(), platform.machine()) == ("Linux", "x86_64") \
    else "torch==2.13.0"


def install(tmp_path, sources_have_it: bool):
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls"
    # the configured sources lack the CPU build: only a call naming PyTorch's index succeeds
    (stub / "pip").write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in *extra-index-url*) exit 0;; esac
exit {0 if sources_have_it else 1}
""")
    (stub / "pip").chmod(0o755)
    done = subprocess.run(["bash", "-c", f"source {REPO / 'scripts' / 'torch_cpu.sh'} && "
                                         "install_torch_cpu"],
                          env=dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}"),
                          capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    return done.stdout, calls.read_text().splitlines()


@pytest.mark.parametrize("sources_have_it", [True, False])
def test_torch_cpu_build_from_the_sources_else_from_pytorchs_index(tmp_path, sources_have_it):
    said, calls = install(tmp_path, sources_have_it)
    assert calls[0] == f"install -q {WANTED}"
    if sources_have_it:
        assert calls == [f"install -q {WANTED}"] and "from the configured package sources" in said
    else:
        assert calls[1] == f"install -q {WANTED} --extra-index-url https://download.pytorch.org/whl/cpu"
        assert "is not in the configured package sources: taking it from" in said
