"""The README's "Your own task" section run as written: its reward file and task script saved
under the names it gives, then its command, in a fresh directory."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

REPO = Path(__file__).resolve().parent.parent


def section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Your own task", 1)[1].split("\n## ", 1)[0]


@pytest.mark.e2e
def test_the_readme_own_task_section_runs_as_written(tmp_path):
    text = section()
    assert len([line for line in text.splitlines()[1:] if line.strip()]) <= 19  # heading: 20
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, re.S)
    assert [kind for kind, _ in blocks] == ["python", "python", "bash"]
    names = re.findall(r"`(\w+\.py)`", text.split("```", 1)[0])
    assert names == ["my_reward.py", "make_task.py"]
    for name, (_, code) in zip(names, blocks):
        (tmp_path / name).write_text(code)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               PYTHONWARNINGS="ignore")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks[2][1]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=scaled(900), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "my-task"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "time/step_s" in x] == [1, 2]
    assert "val/acc" in lines[0] and "val/acc" in lines[-1]
    assert all(x.get("reward/errors", 0) == 0 for x in lines)
    assert "rewards: verifier.function=my_reward.py:compute_score" in done.stdout
    assert all(-2.0 <= x["train/reward"] <= 1.0 for x in lines if "train/reward" in x)
    assert (run / "hf" / "config.json").is_file()
