"""The Hydra config tree: every group option and preset composes; bad keys are one sentence."""

import subprocess
import sys

import pytest

from megatron_rlep.config import CONF_DIR, ConfigError, check_overrides, compose

GROUPS = ["model", "data", "algorithm", "rollout", "parallel", "logging", "verifier"]


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    assert options
    for option in options:
        compose([f"{group}={option}"])


def test_every_experiment_preset_composes():
    presets = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    assert "quickstart" in presets
    for preset in presets:
        compose([f"experiment={preset}"])


def test_algorithm_groups_differ_as_documented():
    grpo, dapo, rlep = (compose([f"algorithm={a}"]).algorithm for a in ("grpo", "dapo", "rlep"))
    assert (grpo.clip_high, dapo.clip_high) == (0.2, 0.28)
    assert (grpo.loss_agg, dapo.loss_agg) == ("seq-mean-token-mean", "token-mean")
    assert (dapo.replay_per_prompt, rlep.replay_per_prompt) == (0, 2)
    assert rlep.clip_high == dapo.clip_high and rlep.overlong_buffer == 512


@pytest.mark.parametrize("override, message", [
    ("algorithm.clip_lo=0.3", "config key algorithm.clip_lo is unknown; the keys of algorithm are"),
    ("+algorithm.clip_lo=0.3", "config key algorithm.clip_lo is unknown"),
    ("sed=3", "config key sed is unknown; the keys of the top level are"),
    ("algorithm.clip_low=abc", "config key algorithm.clip_low has a wrong value"),
    ("algorithm.clip_low=1.5", "config key algorithm.clip_low=1.5 is out of range"),
    ("verifier.mode=fuzzy", "config key verifier.mode='fuzzy' is not allowed; use one of dapo, math"),
    ("algorithm=ppo", "Could not find 'algorithm/ppo'"),
    ("algorithm.prompts_per_update=7", "algorithm.prompts_per_update=7 does not divide"),
])
def test_bad_keys_and_values_are_one_sentence(override, message):
    with pytest.raises(ConfigError) as info:
        check_overrides([override])
    text = str(info.value)
    assert message in text
    assert "\n" not in text and text.endswith(".")


def test_sweeps_are_checked_job_by_job():
    check_overrides(["algorithm.replay_per_prompt=0,2", "seed=1,2", "-m"])
    with pytest.raises(ConfigError, match="config key seed has a wrong value"):
        check_overrides(["algorithm.replay_per_prompt=0,2", "seed=1,x"])


def test_entry_point_prints_one_line_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "megatron_rlep.quickstart", "samples=0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: config key samples=0 is out of range; it must be "
                                     ">= 1.")


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_preset_composes_and_validates(preset):
    cfg = compose([f"experiment={preset}"])
    assert cfg.algorithm.prompts_per_rollout % cfg.algorithm.prompts_per_update == 0
