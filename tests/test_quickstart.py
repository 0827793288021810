"""The README's main command on the built-in default, end to end (a short run)."""

import re
import subprocess
import sys

import pytest


@pytest.mark.e2e
def test_quickstart_prints_verified_answers_and_a_pass_rate():
    done = subprocess.run(
        [sys.executable, "-m", "megatron_rlep.quickstart", "experiment=quickstart", "questions=2",
         "samples=2", "rollout.max_response_length=24", "run_dir=/tmp/megatron_rlep_quickstart"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = re.findall(r"^  (CORRECT|wrong  ) pred=", done.stdout, flags=re.M)
    assert len(verdicts) == 4
    rate = re.search(r"pass rate: (\d+)/4 = ", done.stdout)
    assert rate and int(rate.group(1)) == verdicts.count("CORRECT")
    assert "ground truth" in done.stdout
