"""pass@k, maj@k, mean@n and their layout, against numbers worked out by hand."""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rlep import metrics
from megatron_rlep.metrics import k_values, maj_at_k, majority_correct, pass_at_k

TOOL = Path(__file__).resolve().parent.parent / "tools" / "metrics.py"


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # 1 - C(7,4)/C(10,4)
    assert pass_at_k(4, 2, 3) == 1.0  # every 3-subset of 4 holds one of 2 correct


def test_pass_at_k_edges():
    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 0, 8) == 0.0  # c = 0
    assert pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 8, 8) == 1.0  # c = n
    assert pass_at_k(8, 1, 8) == 1.0  # k = n: any correct sample
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(200, 10, 100) == pytest.approx(1 - math.comb(190, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote_and_its_tie_rule():
    # a tie between "1" and "2": the prediction voted first wins
    assert majority_correct(["1", "2", "2", "1"], [True, False, False, True]) is True
    assert majority_correct(["2", "1", "1", "2"], [False, True, True, False]) is False
    # samples without an answer do not vote; no vote at all is wrong
    assert majority_correct([None, None, "3"], [False, False, True]) is True
    assert majority_correct([None, None], [False, False]) is False
    assert majority_correct(["4", "5", "5"], [True, False, False]) is False


def test_maj_at_k_over_subsets_by_hand():
    # preds a, a, b with a correct: pairs {0,1} a, {0,2} tie -> a (first), {1,2} tie -> a
    assert maj_at_k(["a", "a", "b"], [True, True, False], 2) == 1.0
    # preds b, a, a: {0,1} tie -> b, {0,2} tie -> b, {1,2} a  => 1/3
    assert maj_at_k(["b", "a", "a"], [False, True, True], 2) == pytest.approx(1 / 3)
    assert maj_at_k(["b", "a", "a"], [False, True, True], 3) == 1.0  # k = n: a has 2 votes
    assert maj_at_k(["b", "a", "a"], [False, True, True], 1) == pytest.approx(2 / 3)


def test_maj_at_k_estimate_is_fixed_and_close_to_exact():
    preds = ["7"] * 7 + ["8"] * 6 + [None] * 3  # n = 16, C(16, 8) = 12870 > MAJ_SUBSETS
    correct = [True] * 7 + [False] * 9
    first = maj_at_k(preds, correct, 8, key="q")
    assert first == maj_at_k(preds, correct, 8, key="q")  # same subsets every time
    exact = [majority_correct([preds[i] for i in s], [correct[i] for i in s])
             for s in itertools.combinations(range(16), 8)]
    assert first == pytest.approx(sum(exact) / len(exact), abs=0.05)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(4) == [1, 2, 4]
    assert k_values(6) == [1, 2, 4, 6]
    assert k_values(32) == [1, 2, 4, 8, 16, 32]


def rows(source, ident, preds, correct):
    return [{"data_source": source, "id": ident, "sample_index": i, "pred": p, "correct": c}
            for i, (p, c) in enumerate(zip(preds, correct))]


SAMPLES = (rows("aime", "1", ["5", "5"], [True, True]) + rows("aime", "2", ["3", "4"], [False, False])
           + rows("amc", "1", ["9", "2"], [False, True]))


def test_layout_means_and_standard_errors():
    m = metrics.compute(list(reversed(SAMPLES)))  # order of lines does not matter
    assert list(m) == ["amc", "aime", "all"]  # data sources in order of first appearance
    aime = m["aime"]
    assert aime["n"] == 2 and aime["questions"] == 2
    assert aime["mean@n"] == 0.5
    assert aime["pass@k"] == {"1": 0.5, "2": 0.5}
    assert aime["maj@k"] == {"1": 0.5, "2": 0.5}
    assert aime["stderr"]["mean@n"] == pytest.approx(0.5)  # std([1, 0]) / sqrt(2)
    amc = m["amc"]  # one question: 1 of 2 correct, the vote ties and "9" (wrong) wins
    assert amc["mean@n"] == 0.5 and amc["pass@k"]["2"] == 1.0 and amc["maj@k"]["2"] == 0.0
    assert amc["stderr"]["mean@n"] == 0.0
    assert m["all"]["questions"] == 3
    assert m["all"]["mean@n"] == pytest.approx(0.5)
    assert m["all"]["pass@k"]["2"] == pytest.approx(2 / 3)
    table = metrics.markdown(m)
    assert "| aime | 2 | 2 | 50.0 ± 50.0 |" in table


def test_metrics_tool_recomputes_from_samples(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in SAMPLES))
    out = tmp_path / "m.json"
    result = subprocess.run([sys.executable, str(TOOL), str(samples), "-o", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == json.loads(json.dumps(metrics.compute(SAMPLES)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"data_source": "x", "id": 1}\n')
    result = subprocess.run([sys.executable, str(TOOL), str(bad), "-o", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "line 1 lacks sample_index, pred, correct" in result.stderr
