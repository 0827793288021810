"""False negatives of the code checker (issue 50, item 2): correct solutions, written as the public
code-RL sets write their examples, must pass, and a plausible wrong variant of each must fail.

The fixtures are ``tests/fixtures/code_formats.json``: a list of ``{name, format, features,
ground_truth, extra_info?, right, wrong}``, ``ground_truth`` exactly as the dataset holds it
(``format``: io (Eurus/APPS/TACO standard input and output), call (APPS/TACO ``fn_name``),
deepcoder-stdin / deepcoder-functional (DeepCoder-Preview's list of cases), assert (Skywork-OR1's
``assert_case``), check (HumanEval's ``test_code`` + ``entry_point``), pytest (KodCode's test
files)). Every ``right`` passes and every ``wrong`` fails when run the ordinary way (real python,
real pytest, outside any sandbox); here each goes through ``CodeChecker`` and the real sandbox.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from megatron_rlep.reward.code import CodeChecker, parse_tests
from megatron_rlep.reward.sandbox import Limits

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "code_formats.json").read_text())

# issue 50's false-negative check: its minimums per format and per feature
MIN_TOTAL = 45
MIN_FORMAT = {"io": 6, "call": 5, "deepcoder": 4, "assert": 7, "check": 8, "pytest": 15}
MIN_FEATURE = {"in-place": 5, "printing": 4, "raising": 4, "class": 6}
KIND = {"io": "io", "call": "call", "deepcoder-stdin": "io", "deepcoder-functional": "call",
        "assert": "assert", "check": "check", "pytest": "pytest"}


@pytest.fixture(scope="module")
def checker():
    # a wall clock four times the CPU limit: beside the other pytest worker's jobs a right
    # answer's pytest run passed 5 s of wall clock on 2 cores (the sandbox counts wall time)
    return CodeChecker(Limits(wall_s=16, cpu_s=4, memory_mb=512, nproc=16))


def answer(code: str) -> str:
    return "```python\n" + code + "\n```"


def test_the_fixture_set_covers_every_format_and_feature():
    names = [f["name"] for f in FIXTURES]
    assert len(names) == len(set(names)), "fixture names must be unique"
    assert len(FIXTURES) >= MIN_TOTAL
    formats = Counter(f["format"] for f in FIXTURES)
    formats["deepcoder"] = formats["deepcoder-stdin"] + formats["deepcoder-functional"]
    assert formats["deepcoder-stdin"] and formats["deepcoder-functional"]
    for fmt, least in MIN_FORMAT.items():
        assert formats[fmt] >= least, (fmt, formats[fmt])
    features = Counter(feature for f in FIXTURES for feature in f["features"])
    for feature, least in MIN_FEATURE.items():
        assert features[feature] >= least, (feature, features[feature])


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_the_fixture_reads_as_its_format(fixture):
    assert set(fixture) <= {"name", "format", "features", "ground_truth", "extra_info", "right",
                            "wrong"}
    assert fixture["format"] in KIND and isinstance(fixture["features"], list)
    assert fixture["right"] != fixture["wrong"]
    truth = fixture["ground_truth"]
    assert isinstance(truth, list) == fixture["format"].startswith("deepcoder")
    tests = parse_tests(json.dumps(truth), fixture.get("extra_info"))
    assert tests["kind"] == KIND[fixture["format"]]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_the_right_solution_passes_and_the_wrong_one_fails(checker, fixture):
    truth, extra = json.dumps(fixture["ground_truth"]), fixture.get("extra_info")
    good = checker.check(answer(fixture["right"]), truth, extra)
    assert good.correct, f"false negative: {good}"
    bad = checker.check(answer(fixture["wrong"]), truth, extra)
    assert not bad.correct and bad.status == "ok", f"the wrong variant was credited: {bad}"
