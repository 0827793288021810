"""The code checker (megatron_rlep/reward/code.py) on each public test format, and the reward
hacks other checkers fall for: an early exit before the asserts, output that is a prefix of the
expected one, printing expected values it could read. Every program runs in the real sandbox."""

import json

import pytest

from megatron_rlep.reward.code import CodeChecker, last_code_block, literal_assert, parse_tests
from megatron_rlep.reward.sandbox import Limits


@pytest.fixture(scope="module")
def checker():
    return CodeChecker(Limits(wall_s=5, cpu_s=4, memory_mb=512, nproc=16))


def answer(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


ADD = "def add(a, b):\n    return a + b"
ECHO_SUM = "a, b = map(int, input().split())\nprint(a + b)"


def test_the_last_fenced_python_block_is_the_program():
    text = "```python\nprint(1)\n```\nthen\n```\nprint(2)\n```\n```bash\nls\n```"
    assert last_code_block(text) == "print(2)\n"
    assert last_code_block("no code here") is None
    assert literal_assert("assert add(1, 2) == 3") == ("add(1, 2)", 3)
    assert literal_assert("assert abs(add(1, 2) - 3) < 1e-9") is None


@pytest.mark.parametrize("truth, right, wrong", [
    # PRIME's Eurus-2-RL-Data / APPS / TACO: standard input and output
    ({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}, ECHO_SUM,
     "a, b = map(int, input().split())\nprint(a * b)"),
    # the same with fn_name: call-based, APPS's one-element list around a return value
    ({"inputs": [[1, 2], [5, 7]], "outputs": [[3], [12]], "fn_name": "add"}, ADD,
     "def add(a, b):\n    return a * b"),
    # DeepCoder-Preview: a list of cases (stdin), and a functional one
    ([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}], ECHO_SUM, "print(0)"),
    ({"tests": [{"input": "1\n2", "output": "3", "testtype": "functional",
                 "metadata": {"func_name": "add"}}]}, ADD, "def add(a, b):\n    return 0"),
    # Skywork-OR1: assert_case, literal and not
    ({"assert_case": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}, ADD,
     "def add(a, b):\n    return 3"),
    ({"assert_case": ["assert abs(add(0.1, 0.2) - 0.3) < 1e-9"]}, ADD,
     "def add(a, b):\n    return 1"),
    # HumanEval-style test_code with entry_point
    ({"test_code": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
      "entry_point": "add"}, ADD, "def add(a, b):\n    return a - b"),
    # KodCode: a pytest file importing the solution
    ({"test": "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n"
              "\ndef test_negative():\n    assert add(-2, -3) == -5\n"}, ADD,
     "def add(a, b):\n    return abs(a + b)"),
], ids=["io", "call", "deepcoder-stdin", "deepcoder-functional", "assert-literal",
        "assert-expression", "check", "pytest"])
def test_each_format_passes_the_right_answer_and_fails_the_wrong_one(checker, truth, right, wrong):
    truth = json.dumps(truth)
    good = checker.check(answer(right), truth)
    assert good.correct and good.status == "ok", good
    bad = checker.check(answer(wrong), truth)
    assert not bad.correct and bad.status == "ok", bad
    assert not checker.check("I could not write it.", truth).correct


ASSERTS = json.dumps({"assert_case": ["assert abs(add(1, 2) - 3) < 1e-9",
                                      "assert abs(add(2, 2) - 4) < 1e-9"]})


@pytest.mark.parametrize("hack", [
    "import sys\nsys.exit(0)",
    "import os\nos._exit(0)",
    "raise SystemExit",
    "import atexit, os\natexit.register(lambda: print('all passed'))\nos._exit(0)",
])
def test_an_exit_before_the_asserts_earns_nothing(checker, hack):
    verdict = checker.check(answer(hack), ASSERTS)
    assert not verdict.correct and verdict.passed == 0, verdict


def test_output_that_is_a_prefix_of_the_expected_one_fails(checker):
    truth = json.dumps({"inputs": ["3\n"], "outputs": ["1\n2\n3\n"]})
    assert checker.check(answer("print(1)\nprint(2)\nprint(3)"), truth).correct
    assert not checker.check(answer("print(1)\nprint(2)"), truth).correct
    assert not checker.check(answer("print('1\\n2\\n3\\n4')"), truth).correct


def test_expected_values_it_could_read_are_not_there_to_read(checker):
    """Literal asserts and call-based tests send only the calls into the sandbox: the driver it
    runs under is deleted before its code runs and holds no expected value anyway."""
    truth = json.dumps({"assert_case": ["assert add(20, 22) == 42"]})
    snoop = ("import os\n"
             "seen = [open(f).read() for f in os.listdir('.') if os.path.isfile(f)]\n"
             "def add(a, b):\n"
             "    for text in seen:\n"
             "        if '== ' in text:\n"
             "            return int(text.split('== ')[1].split()[0])\n"
             "    return -1")
    verdict = checker.check(answer(snoop), truth)
    assert not verdict.correct, verdict
    # a result object that claims equality with anything compares here as its printed form
    liar = "class Anything:\n    def __eq__(self, other):\n        return True\n" \
           "def add(a, b):\n    return Anything()"
    assert not checker.check(answer(liar), truth).correct


def test_partial_credit_is_an_option_and_every_test_counts_by_default(checker):
    truth = json.dumps({"inputs": ["1 2\n", "5 7\n", "2 2\n"], "outputs": ["3\n", "12\n", "4\n"]})
    half = "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)"
    assert checker.check(answer(half), truth).correct is False
    partial = CodeChecker(checker.sandbox.limits, partial=True).check(answer(half), truth)
    assert (partial.passed, partial.total) == (2, 3)


def test_a_ground_truth_without_tests_is_refused():
    with pytest.raises(ValueError, match="name no test format"):
        parse_tests(json.dumps({"answer": 3}))
