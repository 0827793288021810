"""benchmarks/async_speed.py: the step-time ratio is one of means, so steps that alternate (one
generating for two, one training what the other left) count at their mean, not their median."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import async_speed


def test_ratio_of_means_over_alternating_steps():
    sync = [[22.0, 22.0, 22.0], [22.0, 22.0, 22.0]]
    alternating = [[17.0, 30.0, 17.0], [17.0, 30.0, 17.0]]  # mean 64 / 3, median 17
    value, low, high = async_speed.ratio_interval(sync, alternating, draws=400)
    assert value == pytest.approx(22.0 / (64 / 3))
    assert low <= value <= high
    assert low >= 22.0 / 30.0 and high <= 22.0 / 17.0  # a resample's mean lies between the extremes


def test_ratio_interval_is_a_point_when_nothing_varies():
    assert async_speed.ratio_interval([[10.0, 10.0]], [[5.0, 5.0]], draws=50) == (2.0, 2.0, 2.0)
