"""The dataset layer: the shipped evaluation sets, every file in ../shared/data, the formats,
and the error messages."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megatron_rlep.tasks import arithmetic
from megatron_rlep.data import (DAPO_TEMPLATE, EVAL_DIR, DataError, clean_answer, dapo_prompt,
                                load_examples, load_hub, load_jsonl, load_parquet, problem_of)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside the repo")


@needs_shared
@pytest.mark.parametrize("name, rows, first_answer", [
    ("aime24", 30, "204"), ("aime25", 30, "70"), ("amc23", 40, "27"), ("math500", 500, None),
    ("gsm8k_test", 1319, "18"),
])
def test_every_eval_file_loads_by_name(name, rows, first_answer):
    examples = load_examples(name, data_dir=SHARED / "eval")
    assert len(examples) == rows
    assert len({e.id for e in examples}) == rows
    if first_answer is not None:
        assert examples[0].ground_truth == first_answer
    assert all(e.ground_truth for e in examples)
    assert examples[0].data_source == name
    assert examples[0].prompt[0]["content"].startswith("Solve the following math problem")


@pytest.mark.parametrize("name, rows, first_answer", [
    ("aime24", 30, "204"), ("aime25", 30, "70"), ("amc23", 40, "27"), ("math500", 500, None)])
def test_shipped_eval_sets_load_by_name_with_no_data_dir(name, rows, first_answer, tmp_path):
    examples = load_examples(name, "test")
    assert len(examples) == rows == len({e.id for e in examples})
    assert first_answer is None or examples[0].ground_truth == first_answer
    assert f"`{name}.jsonl`" in (EVAL_DIR / "README.md").read_text()  # source and licence named
    # a data_dir is searched first: a file of the same name there wins
    (tmp_path / f"{name}.jsonl").write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    assert len(load_examples(name, "test", data_dir=tmp_path)) == 1


@pytest.mark.parametrize("spec", ["data/dapo-math-17k.parquet", "./train.jsonl", "tests/nothing",
                                  "~/data/x.parquet"])
def test_a_path_that_names_no_file_is_never_sent_to_the_hub(spec):
    with pytest.raises(DataError, match=r"^dataset file .* does not exist \(looked at /.*\); "
                                        r"check the path, which is relative"):
        load_examples(spec)


@needs_shared
def test_answer_cleaning_on_the_real_files():
    aime = load_jsonl(SHARED / "eval" / "aime24.jsonl")
    assert "25" in {e.ground_truth for e in aime}  # "025" in the file
    assert "33" in {e.ground_truth for e in aime}  # "033"
    math500 = load_jsonl(SHARED / "eval" / "math500.jsonl")
    assert math500[0].ground_truth == "\\left( 3, \\frac{\\pi}{2} \\right)"
    gsm = load_jsonl(SHARED / "train" / "gsm8k_train.jsonl")
    assert len(gsm) == 7473 and gsm[0].ground_truth == "72"


@needs_shared
def test_dapo_parquet_drops_repeated_prompts():
    path = SHARED / "dapo" / "aime-2024.parquet"
    assert pq.read_table(path).num_rows == 960
    examples = load_parquet(path)
    assert len(examples) == 30  # 30 problems, each repeated 32 times in the file
    assert examples[0].data_source == "math_dapo"
    assert examples[0].prompt[0]["content"].startswith("Solve the following math problem")
    assert all(e.candidates == () for e in examples)


def _release_table(with_candidates=True, with_truth=True):
    reward = {"ground_truth": "5", "style": "rule"}
    if with_candidates:
        reward["candidates"] = ["2 + 3 = 5\nAnswer: 5", "Answer: 5"]
    if not with_truth:
        reward.pop("ground_truth")
    row = {"data_source": "toy", "prompt": [{"role": "user", "content": "2+3?"}],
           "ability": "MATH", "reward_model": reward, "extra_info": {"index": 7}}
    return pa.Table.from_pylist([row, row])


def test_release_parquet_keeps_candidates(tmp_path):
    pq.write_table(_release_table(), tmp_path / "pool.parquet")
    (example,) = load_parquet(tmp_path / "pool.parquet")
    assert example.candidates == ("2 + 3 = 5\nAnswer: 5", "Answer: 5")
    assert example.id == "7" and example.ground_truth == "5" and example.data_source == "toy"


def test_parquet_errors_name_file_and_column(tmp_path):
    pq.write_table(_release_table(with_truth=False), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: column 'reward_model' has no field "
                                        r"'ground_truth'"):
        load_parquet(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"prompt": ["x"]}), tmp_path / "noreward.parquet")
    with pytest.raises(DataError, match=r"noreward\.parquet: missing column 'reward_model'"):
        load_parquet(tmp_path / "noreward.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: cannot be read as parquet"):
        load_parquet(tmp_path / "junk.parquet")


def test_jsonl_errors_name_file_and_field(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "solution": "2"}) + "\n")
    with pytest.raises(DataError, match=r"set\.jsonl: row 0 has no answer field; expected one of "
                                        r"answer"):
        load_jsonl(path)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"set\.jsonl: line 1 is not JSON"):
        load_jsonl(path)
    with pytest.raises(DataError, match="was not found"):
        load_examples("no-such-set", data_dir=tmp_path)


def test_hub_code_path_on_a_local_dataset(tmp_path):
    folder = tmp_path / "hub_like"
    folder.mkdir()
    rows = [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in range(5)]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_hub(str(folder), split="test")
    assert [e.ground_truth for e in examples] == ["1", "2", "3", "4", "5"]
    assert examples[0].prompt[0]["content"] == DAPO_TEMPLATE.format(problem="0+1?")
    with pytest.raises(DataError, match="datasets.load_dataset"):
        load_hub(str(tmp_path / "missing"), split="test")


@pytest.mark.parametrize("raw, clean", [(27.0, "27"), ("033", "33"), (70, "70"), (2.5, "2.5"),
                                        ("\\frac{1}{2}", "\\frac{1}{2}"), (" -04 ", "-4")])
def test_clean_answer(raw, clean):
    assert clean_answer(raw) == clean


def test_arithmetic_is_deterministic_with_disjoint_splits():
    train = arithmetic.examples("train", levels=[1, 2, 3, 4, 5], n=300, seed=0)
    test = arithmetic.examples("test", levels=[1, 2, 3, 4, 5], n=40, seed=0)
    assert train == arithmetic.examples("train", levels=[1, 2, 3, 4, 5], n=300, seed=0)
    assert train != arithmetic.examples("train", levels=[1, 2, 3, 4, 5], n=300, seed=1)
    questions = lambda xs: {e.question for e in xs}  # noqa: E731
    assert not questions(train) & questions(test)
    assert not questions(train) & questions(arithmetic.examples("test", levels=[1, 2, 3, 4, 5],
                                                                 n=40, seed=5))
    assert len(questions(train)) == 300
    for example in train[:50]:
        expression = example.question.split("$")[1]  # "Compute $a + b$."
        value = eval(expression.replace("\\times", "*"))  # noqa: S307 - our own generated text
        assert str(value) == example.ground_truth
        assert example.question == f"Compute ${expression}$."
        # a system line asking for the verifier's "Answer:" line, then one worked example
        assert [m["role"] for m in example.prompt] == ["system", "user", "assistant", "user"]
        assert '"Answer:"' in example.prompt[0]["content"]
        assert example.prompt[2]["content"].endswith("Answer: 17")


def test_arithmetic_bad_level_is_one_sentence():
    with pytest.raises(ValueError, match=r"unknown levels \[99\]"):
        arithmetic.examples("train", levels=[99])


def test_problem_of_unwraps_the_dapo_template_only():
    assert problem_of(dapo_prompt("Compute $2 + 3$.")[0]["content"]) == "Compute $2 + 3$."
    assert problem_of("Compute $2 + 3$.") == "Compute $2 + 3$."
