"""The math rule (megatron_rlep/reward/math_rule.py): the DAPO rule's tricky cases,
equivalence, near misses, hostile input, and the shaped reward through the scorer."""

import concurrent.futures
import importlib.util
import multiprocessing
import os
import random
import signal
import sysconfig
import threading
import time
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.reward.equivalence import WALL_FACTOR, EquivalenceChecker, stacked_power
from megatron_rlep.reward.math_rule import (MathRule, dapo_verdict, normalize_final_answer,
                                            overlong_penalty)

# ------------------------------------------------------------------ the DAPO rule


@pytest.mark.parametrize("response, truth, correct, pred", [
    ("work...\nAnswer: 42", "42", True, "42"),
    ("Answer: 41\nmore work\nAnswer: 42", "42", True, "42"),  # the last Answer: line wins
    ("Answer: 42\nthen I changed my mind. Answer: 43", "42", False, "43"),
    ("answer : 42", "42", True, "42"),  # case-insensitive, spaces around the colon
    ("Answer: 5 cm", "5", True, "5"),  # unit words removed
    ("Answer: 12 dollars", "12", True, "12"),
    ("Answer: \\text{Evelyn}", "\\text{Evelyn}", True, "Evelyn"),
    ("Answer: \\boxed{7}", "7", True, "7"),
    ("Answer: $\\frac12$", "\\frac{1}{2}", True, "\\frac{1}{2}"),  # \frac12 shorthand
    ("Answer: \\sqrt2", "\\sqrt{2}", True, "\\sqrt{2}"),
    ("Answer: 1,000,000", "1000000", True, "1000000"),  # thousands commas
    ("Answer: x = 3", "3", True, "3"),  # the text after the last "="
    ("Answer: 30^\\circ", "30", True, "30"),
    ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # strict: equivalent forms do not match
    ("The answer is 42.", "42", False, None),  # no Answer: line
    ("Answer: 42" + "x" * 300, "42", False, None),  # beyond the last 300 characters
    ("y" * 1000 + "Answer: 42", "42", True, "42"),
])
def test_dapo_rule_cases(response, truth, correct, pred):
    assert dapo_verdict(response, truth) == (correct, pred)
    assert MathRule("dapo").verdict(response, truth)[0] is correct


def test_normalize_final_answer_steps():
    assert normalize_final_answer(" $\\boxed{\\frac{3}{4}}$. ") == "\\frac{3}{4}"
    assert normalize_final_answer("\\text{(A)}") == "(A)"
    assert normalize_final_answer("10,5") == "105"  # plain digits with commas lose them
    assert normalize_final_answer("1,5a") == "1,5a"
    assert normalize_final_answer("\\fracab") == "\\frac{a}{b}"


def _reference_rule():
    """The DAPO rule as shipped in verl 0.4.1, the rule of the RLEP era (installed with --no-deps
    by scripts/test.sh; never imported as a package, only this one file is loaded)."""
    site = Path(sysconfig.get_paths()["purelib"])
    path = site / "verl" / "utils" / "reward_score" / "math_dapo.py"
    if not path.is_file():
        pytest.skip("verl is not installed; scripts/test.sh installs it (no deps) as the oracle")
    spec = importlib.util.spec_from_file_location("reference_math_dapo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def _random_responses(n, seed=0):
    rng = random.Random(seed)
    pieces = ["Answer:", "answer :", "ANSWER:", "\n", " ", "=", "$", "\\boxed{", "}", "{", "\\text{",
              "\\frac", "12", "3", "\\sqrt", "cm", "dollars", ",", "000", ".", "a ", "an ", "^\\circ",
              "\\!", "\\$", "x", "-", "\\dfrac", "\\left(", "\\right)", "mbox", "\\text{m}", "\x00"]
    answers = ["42", "1,000", "\\frac{1}{2}", "\\frac12", "3\\sqrt{2}", "\\text{(B)}", "5 cm",
               "0.5", "x=4", "$7$", "\\boxed{9}", "(1,2]", "[INVALID]", ""]
    out = []
    for _ in range(n):
        body = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        filler = "w" * rng.choice([0, 10, 250, 400])
        tail = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        out.append((filler + body + rng.choice(["\nAnswer: ", "Answer:", ""]) +
                    rng.choice(answers) + tail, rng.choice(answers)))
    return out


def test_dapo_rule_matches_reference_on_random_responses():
    reference = _reference_rule()
    for response, truth in _random_responses(20000):
        ref = reference(response, truth)
        correct, pred = dapo_verdict(response, truth)
        assert correct == ref["acc"], (response, truth)
        assert (pred if pred is not None else "[INVALID]") == ref["pred"] or (
            pred is None and ref["pred"] == normalize_final_answer("[INVALID]")), (response, truth)


# ------------------------------------------------------------------ math mode


@pytest.fixture(scope="module")
def math_verifier():
    verifier = MathRule("math")
    yield verifier
    verifier.close()


@pytest.mark.parametrize("answer, truth", [
    ("1/2", "\\frac{1}{2}"), ("0.5", "\\frac12"), ("2\\sqrt{3}", "\\sqrt{12}"),
    ("1,000", "1000"), ("007", "7"), ("\\boxed{5}", "5"), ("30^\\circ", "30"),
    ("(1,2]", "(1, 2]"), ("x^2+2x+1", "(x+1)^2"), ("\\dfrac{3}{4}", "0.75"),
    ("\\{1,2\\}", "\\{2,1\\}"), ("27.0", "27"), ("x^3+3x^2+3x+1", "(x+1)^3"),
    ("x^2+y^2", "y^2+x^2"),
])
def test_math_mode_accepts_equivalent_forms(math_verifier, answer, truth):
    assert math_verifier.verdict(f"Work.\nAnswer: {answer}", truth)[0]
    assert not MathRule("dapo").verdict(f"Answer: {answer}", truth)[0] or \
        normalize_final_answer(answer) == normalize_final_answer(truth)


def test_math_mode_reads_boxed_answers(math_verifier):
    assert math_verifier.verdict("so the result is \\boxed{\\frac{1}{2}}.", "0.5")[0]
    assert math_verifier.verdict("nothing here", "0.5")[1] is None


@pytest.mark.parametrize("answer, truth", [
    ("0.51", "0.5"), ("3\\sqrt{2}", "\\sqrt{12}"), ("[1,2]", "(1,2]"), ("x^2+1", "x^2-1"),
    ("100", "1000"), ("-3", "3"), ("1/3", "1/4"), ("\\{1,2\\}", "\\{1,3\\}"), ("12", "21"),
    ("x^2+y^2", "x^2-y^2"),
])
def test_math_mode_rejects_near_misses(math_verifier, answer, truth):
    assert not math_verifier.verdict(f"Answer: {answer}", truth)[0]


HOSTILE = [
    "Answer: 9^{9^{9}}", "Answer: 2^{10^{100}}", "Answer: 9^{999999999}", "Answer: 100000000!",
    "Answer: " + "{" * 5000 + "1" + "}" * 5000, "Answer: " + "(" * 3000 + "1" + ")" * 3000,
    "x" * 2_000_000 + "\nAnswer: 5", "Answer: " + "9" * 2_000_000, "\x00" * 1000 + "Answer: \x005",
    "Answer: \\frac{1}{0}", "Answer: " + "\\sqrt{" * 2000 + "2" + "}" * 2000, "\\boxed{" * 10000,
]


def test_only_a_power_in_an_exponent_is_stacked():
    """Towers are refused without asking sympy; powers side by side are asked."""
    stacked = ["9^{9^{9}}", "2^3^4", "2^{10^{100}}", "e^{x^{2}}", "2^{\\frac{1}{2}^{9}}", "a^ {b}^c"]
    plain = ["x^2+y^2", "x^3+3x^2+3x+1", "(x^2)^{3}", "10^{-3}", "30^\\circ", "x^"]
    assert [stacked_power(a) for a in stacked] == [True] * len(stacked)
    assert [stacked_power(a) for a in plain] == [False] * len(plain)


@pytest.mark.parametrize("mode", ["dapo", "math"])
def test_hostile_input_is_wrong_within_a_second(mode, math_verifier):
    verifier = math_verifier if mode == "math" else MathRule("dapo")
    for response in HOSTILE:
        start = time.monotonic()
        correct, _ = verifier.verdict(response, "7")
        assert time.monotonic() - start < scaled(1.0), response[:40]
        assert correct is False


def test_a_runaway_check_is_killed_and_the_next_one_works():
    checker = EquivalenceChecker(timeout_s=1e-6)  # every reply misses this deadline
    assert checker.equivalent("1/2", "0.5") is False
    assert checker.timeouts == 1
    checker.timeout_s = 5.0
    assert checker.equivalent("1/2", "0.5") is True  # a fresh worker answered
    checker.close()


def test_the_deadline_counts_from_a_ready_worker_not_from_its_restart():
    """A check after a kill restarts math-verify's worker (about 0.6 s here); its deadline
    starts once the worker is ready, so a deadline shorter than the restart still gets the
    answer (before, the restart used it up and every check after a timeout failed)."""
    checker = EquivalenceChecker(timeout_s=1e-6)
    assert checker.equivalent("1/2", "0.5") is False  # killed: the next check restarts it
    checker.timeout_s = 0.3
    start = time.monotonic()
    assert checker.equivalent("2\\sqrt{3}", "\\sqrt{12}") is True
    assert time.monotonic() - start > 0.3  # the restart took longer than the deadline itself
    checker.close()


def test_the_deadline_is_the_workers_cpu_time_so_a_busy_machine_changes_no_verdict():
    """A worker kept off the CPU (stopped, as a loaded machine's scheduler might leave it) past
    its deadline of 0.2 s still answers: the deadline counts its CPU time. Stopped for good, it
    is killed at the wall-clock bound (WALL_FACTOR deadlines), and the next check works."""
    checker = EquivalenceChecker(timeout_s=0.2)
    assert checker.equivalent("1/2", "0.5") is True  # math-verify's imports done
    pid = checker._proc.pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (pid, signal.SIGCONT)).start()
    assert checker.equivalent("x^2+2x+1", "(x+1)^2") is True and checker.timeouts == 0
    os.kill(checker._proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    assert checker.equivalent("2\\sqrt{3}", "\\sqrt{12}") is False and checker.timeouts == 1
    assert WALL_FACTOR * 0.2 <= time.monotonic() - start < WALL_FACTOR * 0.2 + scaled(1.0)
    assert checker.equivalent("2\\sqrt{3}", "\\sqrt{12}") is True  # a fresh worker
    checker.close()


def test_math_mode_is_safe_in_threads(math_verifier):
    cases = [("Answer: 1/2", "0.5", True), ("Answer: 0.3", "0.5", False)] * 20 + \
        [(h, "7", False) for h in HOSTILE[:4]]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: math_verifier.verdict(c[0], c[1])[0], cases))
    assert results == [c[2] for c in cases]


def _score_in_worker(case):
    verifier = MathRule("math")
    try:
        return verifier.verdict(*case)[0]
    finally:
        verifier.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_math_mode_in_worker_processes(method):
    cases = [("Answer: 2\\sqrt{3}", "\\sqrt{12}"), ("Answer: 9^{9^{9}}", "7"), ("Answer: 4", "5")]
    with multiprocessing.get_context(method).Pool(2) as pool:
        assert pool.map(_score_in_worker, cases) == [True, False, False]


# ------------------------------------------------------------------ reward


def test_overlong_penalty_hand_computed():
    # L_max 3072, buffer 512: free up to 2560 tokens, then linear down to -1 at 3072.
    assert overlong_penalty(100, 3072, 512) == 0.0
    assert overlong_penalty(2560, 3072, 512) == 0.0
    assert overlong_penalty(2816, 3072, 512) == -0.5
    assert overlong_penalty(3072, 3072, 512) == -1.0
    assert overlong_penalty(2688, 3072, 512, factor=0.5) == -0.125
    assert overlong_penalty(5000, 3072, 0) == 0.0  # no buffer, no shaping


def test_reward_is_plus_minus_one_plus_penalty():
    from megatron_rlep.reward.scorer import Item, Scorer, settings

    scorer = Scorer(settings("dapo"), max_length=3072, overlong_buffer=512)
    try:
        rewards = [s.reward for s in scorer.score([
            Item("math", "Answer: 3", "3", length=10), Item("math", "Answer: 3", "3", length=2816),
            Item("math", "Answer: 4", "3", length=3072),
            Item("math", "Answer: 4", "3")])]  # length unknown: no shaping
    finally:
        scorer.close()
    assert rewards == [1.0, 0.5, -2.0, -1.0]


def test_unknown_mode_is_one_sentence():
    with pytest.raises(ValueError, match="math rule 'exact' is unknown"):
        MathRule("exact")


# Ground-truth forms found in the evaluation sets, GSM8K and DAPO-Math-17k
# (docs/reference_differences.md, "Ground truths"):
# (answer, ground truth as a file may give it, the DAPO rule's verdict, math mode's verdict).
# The loader already turns AIME's "025" and AMC's 27.0 into "25" and "27" (tests/test_data.py).
GROUND_TRUTH_FORMS = [
    ("025", "25", False, True),  # a leading zero in the answer
    ("25", "025", False, True),  # in the truth, as aime24.jsonl writes it before loading
    ("27", "27.0", False, True),  # amc23.jsonl's floats, before loading
    ("\\frac{270}{7}", "\\frac{270}7\\text{ degrees}", False, True),  # MATH-500: shorthand + unit
    ("90", "90^\\circ", True, True),
    ("Evelyn", "\\text{Evelyn}", True, True),
    ("5", "5\\text{ cm}", True, True),
    ("3,159", "3159", True, True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", False, True),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", False, True),
]


@pytest.mark.parametrize("answer, truth, dapo, math", GROUND_TRUTH_FORMS)
def test_ground_truth_forms_under_both_rules(math_verifier, answer, truth, dapo, math):
    response = f"Let me compute.\nAnswer: {answer}"
    assert dapo_verdict(response, truth)[0] is dapo
    assert math_verifier.verdict(response, truth)[0] is math
    if (Path(sysconfig.get_paths()["purelib"]) / "verl").is_dir():
        assert bool(_reference_rule()(response, truth)["acc"]) is dapo  # the reference agrees
