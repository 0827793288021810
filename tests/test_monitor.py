"""Where a run's numbers go (megatron_rlep/monitor.py): the wandb group of a run, and a wandb
that cannot start online stopping the run in one sentence with the offline fix."""

import pytest

from megatron_rlep.config import LoggingConfig, RunError
from megatron_rlep.monitor import Monitor


def test_one_wandb_group_per_run_name(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    groups = {}
    for name, group, env in (("rlep-a", None, None), ("rlep-b", "paper", None),
                             ("rlep-c", None, "from-env")):
        if env:
            monkeypatch.setenv("WANDB_RUN_GROUP", env)
        monitor = Monitor(tmp_path / name, LoggingConfig(wandb="offline", name=name, group=group,
                                                         progress=False), {"seed": 1})
        groups[name] = monitor.wandb.group
        monitor.close()
    assert groups == {"rlep-a": "rlep-a", "rlep-b": "paper", "rlep-c": "from-env"}


def test_wandb_online_that_cannot_start_is_one_sentence_with_the_offline_fix(tmp_path, monkeypatch):
    # a compute node that never logged in (no key): wandb.init fails at once
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    with pytest.raises(RunError) as info:
        Monitor(tmp_path / "run", LoggingConfig(wandb="online", name="x", progress=False), {})
    text = str(info.value)
    assert text.startswith("wandb could not start online (UsageError: ") and "\n" not in text
    assert "set logging.wandb=offline" in text
    assert f"`wandb sync {tmp_path / 'run'}/wandb/offline-run-*`" in text
