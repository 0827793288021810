"""benchmarks/memory_soak.py's parts: the slope and its interval on hand-made series, and modes
run at different times kept in one record; and the script end to end, both modes on a tiny model
for three steps."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch import env, why
from speed import scaled
from tiny import make_model

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import memory_soak  # noqa: E402


def test_the_slope_of_a_line_and_of_a_flat_series():
    steps = list(range(20, 30))
    assert memory_soak.slope(steps, [100 + 0.5 * s for s in steps]) == pytest.approx(0.5)
    assert memory_soak.slope(steps, [7.0] * 10) == 0.0
    # (20, 1), (21, 3), (22, 2): mean step 21, mean 2; (-1)(-1) + 0 + (1)(0) over 2 = 0.5
    assert memory_soak.slope([20, 21, 22], [1.0, 3.0, 2.0]) == pytest.approx(0.5)


def test_the_interval_holds_the_slope_of_a_noisy_line():
    steps = list(range(20, 300))
    noise = [((s * 7919) % 13 - 6) * 0.5 for s in steps]  # up to 3 MiB either way
    low, high = memory_soak.slope_interval(steps, [5000 + 0.25 * s + e
                                                   for s, e in zip(steps, noise)])
    assert low < 0.25 < high and high - low < 0.05
    low, high = memory_soak.slope_interval(steps, [5000 + e for e in noise])
    assert low < 0 < high  # a flat series: its interval holds 0


def test_a_mode_run_later_joins_the_record(tmp_path, monkeypatch):
    runs = []

    def fake_soak(mode, args, extra):  # the run itself is what the real soak measures
        runs.append(mode)
        kinds = ("", "uss_") if len(runs) > 1 else ("",)  # the first as an older record
        return {"mode": mode, "steps": [20, 21], **{k: v for kind in kinds for k, v in {
            f"{kind}mib": [5000.0, 5001.0 + len(runs)],
            f"{kind}slope_mib_per_step": float(len(runs)),
            f"{kind}slope_interval": [0.0, 2.0 * len(runs)],
            f"{kind}first_after_warmup_mib": 5000.0, f"{kind}last_mib": 5001.0}.items()}}

    monkeypatch.setattr(memory_soak, "soak", fake_soak)
    for modes in (["async"], ["sync"], ["async"]):
        monkeypatch.setattr(sys, "argv", ["memory_soak.py", "--modes", *modes, "--out",
                                          str(tmp_path)])
        memory_soak.main()
    record = json.loads((tmp_path / "memory_soak.json").read_text())
    assert [(r["mode"], r["slope_mib_per_step"]) for r in record] == [("sync", 2.0),
                                                                      ("async", 3.0)]
    assert (tmp_path / "memory_soak.png").stat().st_size > 0


@pytest.mark.e2e
def test_both_modes_are_sampled_step_by_step_on_a_tiny_model(tmp_path):
    model = make_model(tmp_path / "model")
    out = tmp_path / "out"
    argv = [sys.executable, str(REPO / "benchmarks" / "memory_soak.py"), "--steps", "3",
            "--warmup", "0", "--every", "0.2", "--out", str(out), f"model.path={model}",
            "rollout.engine=transformers", "data.train_size=16",
            "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=1",
            "algorithm.rollouts_per_prompt=2", "rollout.max_response_length=8",
            "algorithm.overlong_buffer=4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600), env=env(argv),
                          cwd=REPO)
    assert done.returncode == 0, why(done)
    record = {r["mode"]: r for r in json.loads((out / "memory_soak.json").read_text())}
    assert sorted(record) == ["async", "sync"]
    for r in record.values():
        assert r["steps"] and all(mib > 0 for mib in r["mib"] + r["anon_mib"])
        low, high = r["slope_interval"]
        assert low <= high and r["last_mib"] > 0
        assert "perf/host_memory_gib" in r["logged_gib"]  # the heap's too where the allocator tells
    assert "perf/rollout_host_memory_gib" in record["async"]["logged_gib"]
    assert (out / "memory_soak.png").stat().st_size > 1000
