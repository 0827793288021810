"""The built-in code, logic and chain tasks (megatron_rlep/tasks/): disjoint deterministic splits,
one sentence for a bad level, every code level solvable (a reference program per level passes
its asserts in the sandbox, a wrong one fails), every logic answer right by its own checker,
every chain answer right and its worked examples what the python tool shows."""

import re

import pytest

from megatron_rlep import tasks
from megatron_rlep.example import DataError
from megatron_rlep.reward.code import CodeChecker
from megatron_rlep.reward.sandbox import Limits
from megatron_rlep.tasks import logic

REFERENCE = {  # level: the body of a right answer, from the question's wording
    1: lambda q: f"return {q['arg']} + {q['k']}",
    2: lambda q: f"return {q['arg']} * {q['k']}",
    3: lambda q: f"return {q['arg']} - {q['k']}",
    4: lambda q: f"return {q['a']} * {q['arg']} + {q['b']}",
    5: lambda q: f"return {q['arg']} * {q['k']}",
    6: lambda q: f"return sum({q['arg']})",
    7: lambda q: f"return max({q['arg']}, {q['k']})",
}


def wording(question: str) -> dict:
    name, arg = re.search(r"function (\w+)\((\w+)\)", question).groups()
    numbers = [int(x) for x in re.findall(r"\b(\d+)\b", question.split(")", 1)[1])]
    found = {"name": name, "arg": arg, "k": numbers[0] if numbers else None}
    if len(numbers) == 2:
        found.update(a=numbers[0], b=numbers[1])
    return found


@pytest.mark.parametrize("task", ["code", "logic", "chain"])
def test_splits_are_disjoint_and_the_same_for_a_seed(task):
    train = tasks.examples(task, "train", [1, 2, 3], 60, seed=4)
    test = tasks.examples(task, "test", [1, 2, 3], 30, seed=4)
    assert not {e.question + e.ground_truth for e in train} & \
        {e.question + e.ground_truth for e in test}
    assert [e.ground_truth for e in tasks.examples(task, "test", [1, 2, 3], 30, seed=4)] == \
        [e.ground_truth for e in test]
    assert {e.data_source.rsplit("-", 1)[1] for e in train} == {"L1", "L2", "L3"}
    with pytest.raises(DataError, match=rf"^{task} levels=\[9\] has unknown levels \[9\]; "):
        tasks.examples(task, "train", [9], 4)


def test_every_code_level_is_solvable_and_a_wrong_answer_fails():
    checker = CodeChecker(Limits(wall_s=5, cpu_s=4))
    for ex in tasks.examples("code", "test", list(range(1, 8)), 7, seed=0):
        level = int(ex.data_source.rsplit("L", 1)[1])
        q = wording(ex.question)
        right = f"```python\ndef {q['name']}({q['arg']}):\n    {REFERENCE[level](q)}\n```"
        verdict = checker.check(right, ex.ground_truth)
        assert verdict.correct and verdict.total == 4, (ex.question, verdict)
        wrong = f"```python\ndef {q['name']}({q['arg']}):\n    return None\n```"
        assert not checker.check(wrong, ex.ground_truth).correct


def test_every_logic_answer_is_right_by_its_checker_and_a_wrong_one_is_not():
    for ex in tasks.examples("logic", "test", list(range(1, 8)), 21, seed=0):
        right = logic.compute_score(ex.data_source, f"I think so.\nAnswer: {ex.ground_truth}.",
                                    ex.ground_truth)
        assert right == {"score": 1.0, "acc": True, "pred": logic.normalize(ex.ground_truth)}
        assert not logic.compute_score(ex.data_source, "Answer: nobody", ex.ground_truth)["acc"]
        assert not logic.compute_score(ex.data_source, ex.ground_truth, ex.ground_truth)["acc"]
    # spot checks of the puzzles' own answers
    larger = tasks.examples("logic", "test", [1], 5, seed=1)
    assert all(e.ground_truth == str(max(map(int, re.findall(r"\d+", e.question))))
               for e in larger)
    parity = tasks.examples("logic", "test", [5], 5, seed=1)
    assert all(e.ground_truth == ("even" if int(re.findall(r"\d+", e.question)[0]) % 2 == 0
                                  else "odd") for e in parity)


def test_chain_answers_its_questions_and_its_worked_examples_are_what_the_tool_shows():
    from megatron_rlep.rollout.tools import PythonTool
    from megatron_rlep.tasks import chain

    for ex in tasks.examples("chain", "test", [1, 2, 3, 4], 12, seed=0):
        level = int(ex.data_source.rsplit("L", 1)[1])
        a, b = map(int, re.search(r"\$(\d+) \\times (\d+)\$", ex.question).groups())
        c = re.search(r"subtract \$(\d+)\$", ex.question)
        product = a * b
        assert ex.ground_truth == str({1: product * 10, 2: product + 1,
                                       3: product - int(c[1]) if c else None,
                                       4: sum(map(int, str(product)))}[level]), ex.question
        assert ex.prompt[1]["content"] == chain.worked(level, *chain.EXAMPLES[0])[0]
    # each worked example's calls as the python tool runs them
    tool = PythonTool()
    for level in chain.LEVELS:
        for numbers in chain.EXAMPLES:
            _, calls, _ = chain.worked(level, *numbers)
            assert [tool(code).output.strip() for code, _ in calls] == [out for _, out in calls]
    assert chain.worked(4, 4821, 37, 0)[2] == str(sum(map(int, str(4821 * 37))))
    prompt = tasks.examples("chain", "test", [3], 1, seed=0, tool_format="chat")[0].prompt
    example = ["user"] + ["assistant", "tool"] * 2 + ["assistant"]  # two calls, the answer
    assert [m["role"] for m in prompt] == ["system", *example, *example, "user"]
