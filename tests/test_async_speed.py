"""benchmarks/async_speed.py: the step-time ratio is one of means, so steps that alternate (one
generating for two, one training what the other left) count at their mean, not their median; and
the script end to end, its three modes on a tiny model for two steps."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch import env, why
from speed import scaled
from tiny import make_model

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "async_speed.py"
sys.path.insert(0, str(SCRIPT.parent))
import async_speed  # noqa: E402


def test_ratio_of_means_over_alternating_steps():
    sync = [[22.0, 22.0, 22.0], [22.0, 22.0, 22.0]]
    alternating = [[17.0, 30.0, 17.0], [17.0, 30.0, 17.0]]  # mean 64 / 3, median 17
    value, low, high = async_speed.ratio_interval(sync, alternating, draws=400)
    assert value == pytest.approx(22.0 / (64 / 3))
    assert low <= value <= high
    assert low >= 22.0 / 30.0 and high <= 22.0 / 17.0  # a resample's mean lies between the extremes


def test_ratio_interval_is_a_point_when_nothing_varies():
    assert async_speed.ratio_interval([[10.0, 10.0]], [[5.0, 5.0]], draws=50) == (2.0, 2.0, 2.0)


@pytest.mark.e2e
def test_the_three_modes_run_and_are_compared_with_the_synchronous_one(tmp_path):
    model = make_model(tmp_path / "model")
    argv = [sys.executable, str(SCRIPT), "--steps", "2", "--rounds", "1", "--out",
            str(tmp_path / "out"), f"model.path={model}", "rollout.engine=transformers",
            "data.train_size=16", "algorithm.prompts_per_rollout=2",
            "algorithm.prompts_per_update=1", "algorithm.rollouts_per_prompt=2",
            "rollout.max_response_length=8", "algorithm.overlong_buffer=4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600), env=env(argv))
    assert done.returncode == 0, why(done)
    r = json.loads((tmp_path / "out" / "async_speed.json").read_text())
    assert list(r["modes"]) == ["sync", "partial", "disaggregated"]
    assert r["modes"]["sync"]["sync_step_over_this"]["ratio"] == 1.0
    for mode in r["modes"].values():  # one timed step (step 2) a mode
        assert len(mode["steps_s"]) == 1 and len(mode["steps_s"][0]) == 1
        assert mode["step_s"] > 0 and mode["tokens_per_s"] > 0
        low, high = mode["sync_step_over_this"]["interval"]
        assert low <= mode["sync_step_over_this"]["ratio"] <= high
    assert r["modes"]["partial"]["staleness_mean"] >= 0
