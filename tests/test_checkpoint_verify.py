"""benchmarks/checkpoint_verify.py: its phase timers measure what they wrap and put the originals
back, and the whole benchmark runs on a tiny model, so it cannot silently rot."""

import json
import subprocess
import sys
import time
from pathlib import Path

from speed import scaled

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "helpers"))
import tiny  # noqa: E402
from checkpoint_verify import profiled, timed_phases  # noqa: E402
from launch import env  # noqa: E402


def test_phase_timers_count_what_they_wrap_and_restore_it(monkeypatch):
    from megatron.core import dist_checkpointing

    from megatron_rlep.actor import checkpoint

    def slow_write(*args, **kwargs):
        time.sleep(0.2)
        return "written"

    monkeypatch.setattr(dist_checkpointing, "save", slow_write)
    monkeypatch.setattr(checkpoint, "_publish", lambda *args: time.sleep(0.1))
    with timed_phases() as phases, profiled(2) as top:
        assert dist_checkpointing.save({}, "nowhere") == "written"
        checkpoint._publish(None, None, {})
    assert dist_checkpointing.save is slow_write  # the benchmark's wrappers are gone
    assert 0.2 <= phases["dist_checkpointing_save"] < 0.2 + scaled(1.8)
    assert 0.1 <= phases["manifest_publish"] < 0.1 + scaled(1.9)
    assert phases["sharded_state_dicts"] == 0.0
    assert len(top) == 2 and all(row["cumulative_s"] >= 0.1 for row in top), top


def test_the_benchmark_runs_on_a_tiny_model(tmp_path):
    model = tiny.make_model(tmp_path / "model")
    argv = [sys.executable, str(REPO / "benchmarks" / "checkpoint_verify.py"), "--model",
            str(model), "--repeats", "1", "--profile", "3", "--out", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(300),
                          env=env(argv), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{"):])
    phases = report["save_phases_s"]
    assert report["files"] >= 3 and report["checkpoint_mib"] > 0
    assert all(v > 0 for v in phases.values()) and sum(phases.values()) <= report["save_s"]
    assert report["manifest_serial_s"] > 0 and report["manifest_s"] > 0
    assert len(report["save_profile"]) == 3 and report["checksums_s"] > 0
