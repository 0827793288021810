"""Paired bootstrap statistics of two runs (megatron_rlep/paired.py) on hand-computed cases."""

import pytest

from megatron_rlep import paired


def test_question_accuracy_averages_each_questions_answers():
    rows = [{"data_source": "s", "id": "1", "correct": True},
            {"data_source": "s", "id": "1", "correct": False},
            {"data_source": "s", "id": "2", "correct": True},
            {"data_source": "t", "id": "1", "correct": False}]
    assert paired.question_accuracy(rows) == {"s/1": 0.5, "s/2": 1.0, "t/1": 0.0}


def test_difference_and_its_interval_by_hand():
    # B solves q1 where A does not: resampled mean differences are 0, 0.5 or 1 with chances
    # 1/4, 1/2, 1/4, so the 95% interval is [0, 1] around 0.5
    a, b = {"q1": 0.0, "q2": 0.0}, {"q1": 1.0, "q2": 0.0}
    assert paired.difference(a, b, reps=4000) == {"diff": 0.5, "low": 0.0, "high": 1.0,
                                                   "questions": 2}
    same = paired.difference(a, a)
    assert (same["diff"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same questions"):
        paired.difference(a, {"q1": 1.0})


def test_paired_interval_is_narrower_than_the_accuracy_noise():
    # 100 questions of mixed difficulty, B right exactly where A is plus 5 more: every
    # resample keeps B >= A, so the interval of the difference never crosses 0
    a = {f"q{i}": float(i % 2) for i in range(100)}
    b = dict(a, **{f"q{i}": 1.0 for i in range(0, 10, 2)})
    d = paired.difference(a, b, reps=1000, seed=3)
    assert d["diff"] == pytest.approx(0.05) and 0.0 < d["low"] <= 0.05 <= d["high"] < 0.1


def test_area_is_the_mean_accuracy_over_the_steps_spanned():
    assert paired.area([0, 2, 4], [0.5, 0.5, 1.0]) == pytest.approx((1.0 + 1.5) / 4)
    assert paired.area([0, 1, 3], [0.0, 1.0, 1.0]) == pytest.approx((0.5 + 2.0) / 3)
    assert paired.area([5], [0.25]) == 0.25


def test_curves_compare_every_step_the_area_and_the_steps_to_a_threshold():
    questions = ["q1", "q2", "q3", "q4"]
    acc = lambda *right: {q: float(q in right) for q in questions}  # noqa: E731
    a = {0: acc("q1"), 2: acc("q1", "q2"), 4: acc("q1", "q2")}  # 0.25, 0.5, 0.5
    b = {0: acc("q1"), 2: acc("q1", "q2", "q3"), 4: acc(*questions), 6: acc()}  # step 6: not in A
    out = paired.curves(a, b, threshold=0.75, reps=500, seed=1)
    assert out["steps"] == [0, 2, 4] and out["questions"] == 4
    assert [(p["a"], p["b"], p["diff"]) for p in out["per_step"]] == \
        [(0.25, 0.25, 0.0), (0.5, 0.75, 0.25), (0.5, 1.0, 0.5)]
    assert out["per_step"][0]["low"] == out["per_step"][0]["high"] == 0.0
    # areas: A (0.75 + 1.0) / 4 = 0.4375, B (1.0 + 1.75) / 4 = 0.6875
    assert out["area"]["a"] == pytest.approx(0.4375) and out["area"]["b"] == pytest.approx(0.6875)
    assert out["area"]["diff"] == pytest.approx(0.25) and out["area"]["low"] >= 0.0
    fixed, best = out["to_threshold"]["fixed"], out["to_threshold"]["a_best"]
    assert fixed["level"] == 0.75 and fixed["a"]["step"] is None and fixed["b"]["step"] == 2
    assert best["level"] == 0.5 and best["a"]["step"] == 2 and best["b"]["step"] == 2
    assert best["a"]["reached_share"] == 1.0  # A always reaches its own best
    assert 0 < fixed["b"]["reached_share"] <= 1 and fixed["a"]["reached_share"] < 1


def test_nested_bootstrap_over_seeds_and_questions_by_hand():
    # two seeds whose difference is the same on every question (0.2 and 0.4): only the seeds
    # vary; draws of two seeds average 0.2, 0.3 or 0.4 (chances 1/4, 1/2, 1/4)
    def flat(value):
        return paired.point_difference({"q1": 0.0, "q2": 0.0}, {"q1": value, "q2": value})

    out = paired.nested([flat(0.2), flat(0.4)], reps=4000)
    assert out["mean"] == pytest.approx(0.3) and out["seeds"] == 2
    assert (out["low"], out["high"]) == (pytest.approx(0.2), pytest.approx(0.4))
    # one seed: only its questions vary, as in the one-level bootstrap (0, 0.5, 1; [0, 1])
    one = paired.nested([paired.point_difference({"q1": 0.0, "q2": 0.0}, {"q1": 1.0, "q2": 0.0})],
                        reps=4000)
    assert (one["mean"], one["low"], one["high"]) == (0.5, 0.0, 1.0)


def test_area_difference_on_a_sample_of_questions():
    a = {0: {"q1": 0.0, "q2": 0.0}, 2: {"q1": 0.0, "q2": 0.0}}
    b = {0: {"q1": 0.0, "q2": 0.0}, 2: {"q1": 1.0, "q2": 0.0}}
    questions, stat = paired.curve_area_difference(a, b)
    # B's curve: 0 then 0.5 (both questions) or 1 (q1 twice): areas 0.25 and 0.5
    assert questions == ["q1", "q2"]
    assert stat(["q1", "q2"]) == pytest.approx(0.25) and stat(["q1", "q1"]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no validation step in common"):
        paired.curve_area_difference(a, {5: {"q1": 1.0}})


def test_a_difference_in_differences_over_seeds_that_share_their_questions():
    """``difference_of`` of two runs' differences, and ``joint``: the mean over seeds and each
    seed's value; every resample uses one draw of the shared questions, so with a statistic
    that is 1 on q1 and 0 on q2 in every seed the interval is the one-seed bootstrap's [0, 1];
    seeds on other questions are refused."""
    a = {"q1": 0.0, "q2": 0.5}
    b = {"q1": 1.0, "q2": 0.5}  # B - A: 1 on q1, 0 on q2
    unit = paired.difference_of(paired.point_difference(a, a), paired.point_difference(a, b))
    assert unit[0] == ["q1", "q2"] and unit[1](["q1", "q1"]) == 1.0
    result = paired.joint([unit, unit, unit])
    assert result["per_seed"] == [0.5, 0.5, 0.5] and result["mean"] == 0.5
    assert (result["low"], result["high"]) == (0.0, 1.0) and result["seeds"] == 3
    # resampling each seed's questions on its own treats one set as three: narrower
    assert paired.nested([unit, unit, unit])["low"] > 0.1
    with pytest.raises(ValueError, match="same questions"):
        paired.joint([unit, paired.point_difference({"q3": 0.0}, {"q3": 1.0})])
