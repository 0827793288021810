"""The scorer (megatron_rlep/reward/scorer.py): reward plug-ins in verl's signature, dispatch by
data source, answers that raise or hang counted and scored 0, the stop past
``verifier.max_failures``, and a reward file that does not load said in one sentence. Real
worker processes throughout."""

import json
import time
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.config import ConfigError, RunError
from megatron_rlep.reward.scorer import Item, Scorer, settings

PLUGIN = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "raise" in solution_str:
        raise KeyError("no such field")
    if "hang" in solution_str:
        time.sleep(60)
    if "dict" in solution_str:
        return {"score": 0.5, "acc": solution_str.endswith(ground_truth), "pred": "seen"}
    bonus = (extra_info or {}).get("bonus", 0.0)
    return (1.0 if solution_str.strip().endswith(ground_truth) else -0.5) + bonus
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(PLUGIN)
    return f"{path}:compute_score"


def scored(scorer, items):
    try:
        return scorer.score(items)
    finally:
        scorer.close()


def test_a_plugin_in_verls_signature_float_or_dict(plugin):
    scores = scored(Scorer(settings("custom", function=plugin)), [
        Item("my_task", "the answer is 7", "7"),
        Item("my_task", "the answer is 8", "7"),
        Item("my_task", "dict ... 7", "7"),
        Item("my_task", "dict ... 8", "7"),
        Item("my_task", "so 7", "7", extra_info={"bonus": 0.25}),
    ])
    assert [(s.reward, s.correct, s.status) for s in scores] == [
        (1.0, True, "ok"), (-0.5, False, "ok"),  # a float: verified when above 0
        (0.5, True, "ok"), (0.5, False, "ok"),  # a dict: its acc decides, whatever the score
        (1.25, True, "ok")]  # extra_info reached the function
    assert scores[2].pred == "seen"


def test_custom_dispatches_math_and_code_sources_as_verl_does(plugin):
    code = json.dumps({"assert_case": ["assert double(3) == 6"]})
    scores = scored(Scorer(settings("custom", function=plugin)), [
        Item("math_dapo", "Answer: 12", "12"),  # math: the DAPO rule (+1 / -1)
        Item("aime24", "Answer: 13", "12"),
        Item("codecontests", "```python\ndef double(x):\n    return 2 * x\n```", code),
        Item("my_task", "12", "12"),  # anything else: the function
    ])
    assert [(s.reward, s.correct) for s in scores] == [(1.0, True), (-1.0, False), (1.0, True),
                                                       (1.0, True)]
    assert scores[2].pred == "1/1"  # the code checker's: tests passed of tests run


def test_an_answer_that_raises_or_hangs_scores_0_is_counted_and_the_rest_go_on(plugin):
    scorer = Scorer(settings("custom", function=plugin, timeout_s=2.0, workers=2))
    start = time.monotonic()
    scores = scorer.score([Item("t", "7", "7"), Item("t", "raise", "7"), Item("t", "hang", "7"),
                           Item("t", "still 7", "7")])
    took = time.monotonic() - start
    counts = scorer.take_counts()
    try:
        assert [s.status for s in scores] == ["ok", "error", "timeout", "ok"]
        assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 1.0]
        assert scores[1].error == "KeyError: 'no such field'"
        assert took < scaled(10), took  # the hanging one cost its deadline, not a minute
        assert counts == {"reward/errors": 1, "reward/timeouts": 1, "reward/infra": 0}
        # a worker killed for its deadline is replaced: the next batch scores as usual
        assert [s.correct for s in scorer.score([Item("t", "7", "7")] * 3)] == [True] * 3
        # 2 of 4 failed, above max_failures 0.1: the stop names the function and the first error
        with pytest.raises(RunError) as stop:
            scorer.check(scores, "step 3")
        assert str(stop.value) == (
            f"2 of 4 rewards in step 3 failed (1 raised, 1 passed verifier.timeout_s=2) with "
            f"{plugin}; the first: KeyError: 'no such field': fix the reward, or raise "
            "verifier.timeout_s or verifier.max_failures")
        scorer.check(scores[:1] * 9 + scores[1:2], "step 4")  # 1 in 10: within the share
    finally:
        scorer.close()


@pytest.mark.parametrize("function, message", [
    ("missing.py:compute_score", "verifier.function=missing.py:compute_score: "),
    ("{plugin_dir}/my_reward.py:score", "has no function score"),
    ("no_colon", "must be FILE.py:NAME or module:NAME"),
    ("megatron_rlep.nope:f", "module megatron_rlep.nope does not import"),
])
def test_a_reward_that_does_not_load_is_one_sentence(plugin, function, message):
    function = function.format(plugin_dir=Path(plugin.split(":")[0]).parent)
    with pytest.raises(ConfigError, match=message) as err:
        Scorer(settings("custom", function=function))
    assert "\n" not in str(err.value)


def test_a_reward_that_prints_cannot_garble_the_replies(tmp_path):
    noisy = tmp_path / "noisy.py"
    noisy.write_text("import os, sys\n"
                     "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    print('a print')\n"
                     "    os.write(1, b'a raw write to fd 1\\n')\n"
                     "    sys.__stdout__.write('to sys.__stdout__\\n')\n"
                     "    sys.__stdout__.flush()\n"
                     "    return 1.0\n")
    scores = scored(Scorer(settings("custom", function=f"{noisy}:compute_score")),
                    [Item("t", "a", "b")] * 3)
    assert [(s.reward, s.status) for s in scores] == [(1.0, "ok")] * 3


def test_the_built_in_logic_task_scores_through_the_plugin_path():
    from megatron_rlep.tasks import logic

    scores = scored(Scorer(settings(**logic.VERIFIER)), [
        Item("logic-L3", "Hana is first.\nAnswer: Hana.", "Hana"),
        Item("logic-L5", "Answer: ODD", "odd"),
        Item("logic-L6", "Answer: 3", "2")])
    assert [s.correct for s in scores] == [True, True, False]


NON_FINITE = '''
import math

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "dict-nan": {"score": math.nan},
            "true": True, "false": False, "text": "1.0", "list": [1.0],
            "dict-text": {"score": "0.5"}}[solution_str]
'''


def test_a_reward_must_be_a_finite_number_and_nan_or_infinity_is_an_error(tmp_path):
    path = tmp_path / "finite.py"
    path.write_text(NON_FINITE)
    scorer = Scorer(settings("custom", function=f"{path}:compute_score"))
    names = ["nan", "inf", "-inf", "dict-nan", "true", "false", "text", "list", "dict-text"]
    try:
        scores = scorer.score([Item("my_task", name, "x") for name in names])
        counts = scorer.take_counts()
        with pytest.raises(RunError, match=r"^6 of 9 rewards in step 1 failed \(6 raised.*"
                                           r"the first: ValueError: returned a score of nan.*"
                                           r"fix the reward"):
            scorer.check(scores, "step 1")
    finally:
        scorer.close()
    assert [(s.status, s.reward, s.correct) for s in scores] == [
        ("error", 0.0, False)] * 4 + [("ok", 1.0, True), ("ok", 0.0, False)] + [
        ("error", 0.0, False)] * 2 + [("ok", 0.5, True)]
    assert scores[0].error == ("ValueError: returned a score of nan, which is not a finite "
                               "number; return a finite float (an answer it cannot score: "
                               "raise, and it is counted as an error)")
    assert scores[1].error.startswith("ValueError: returned a score of inf, which is not")
    assert scores[3].error.startswith("ValueError: returned 'score' of nan, which is not")
    assert scores[6].error == ("TypeError: returned a score of type str; return a float or a "
                               "dict with 'score'")
    assert counts["reward/errors"] == 6
