"""benchmarks/memory_soak.py's parts: the slope and its interval on hand-made series, and modes
run at different times kept in one record."""

import json
import sys
from pathlib import Path

import pytest

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
