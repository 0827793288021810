"""tools/score.py as a user runs it: a subprocess on real files."""

import json
import subprocess
import sys
from pathlib import Path
from speed import scaled

ROOT = Path(__file__).resolve().parents[1]


def score(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "score.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=scaled(300))


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scores_each_line_and_summarises(tmp_path):
    rows = [{"id": 1, "response": "Answer: 1/2", "ground_truth": "0.5"},
            {"id": 2, "response": "so\nAnswer: 42", "ground_truth": "42", "length": 2816},
            {"id": 3, "response": "no answer here", "ground_truth": "3"}]
    src = write(tmp_path / "in.jsonl", rows)
    for mode, verdicts in (("dapo", [False, True, False]), ("math", [True, True, False])):
        out = tmp_path / f"{mode}.jsonl"
        done = score(src, "--mode", mode, "-o", out, "--max-length", 3072)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [line["correct"] for line in lines] == verdicts
        assert [line["id"] for line in lines] == [1, 2, 3]  # input fields are kept
        assert lines[1]["pred"] == "42" and lines[2]["pred"] is None
        assert lines[1]["reward"] == 0.5  # +1 and the overlong penalty at 2816 of 3072 tokens
        summary = json.loads(done.stderr.strip().splitlines()[-1])
        assert summary["rows"] == 3 and summary["accuracy"] == round(sum(verdicts) / 3, 6)
        assert summary["seconds"] >= 0


def test_bad_input_is_one_sentence_and_leaves_no_output(tmp_path):
    src = write(tmp_path / "in.jsonl", [{"response": "Answer: 1", "ground_truth": "1"},
                                        {"response": "Answer: 2"}])
    out = tmp_path / "out.jsonl"
    done = score(src, "-o", out)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {src}: line 2 has no 'ground_truth' field; each "
                                   f"line needs 'response' and 'ground_truth'.")
    assert not out.exists() and list(tmp_path.iterdir()) == [src]
    missing = score(tmp_path / "nope.jsonl", "-o", out)
    assert missing.returncode == 2 and "nope.jsonl does not exist" in missing.stderr


def test_existing_output_survives_a_failed_run(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{broken\n")
    assert score(bad, "-o", out).returncode == 2
    assert out.read_text() == "previous results\n"


def test_a_code_parquet_is_scored_by_its_tests_in_the_sandbox(tmp_path):
    """A verl parquet of the built-in code task's problems with a response column: each
    answer's program runs against its asserts in the sandbox."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rlep.tasks import code

    problems = code.examples("test", levels=[1], n=2, seed=0)
    rows = []
    for ex in problems:
        name = ex.question.split("function ")[1].split("(")[0]
        k = int(json.loads(ex.ground_truth)["assert_case"][0].split("== ")[1]) - \
            int(json.loads(ex.ground_truth)["assert_case"][0].split("(")[1].split(")")[0])
        right = f"```python\ndef {name}(x):\n    return x + {k}\n```"
        for response in (right, right.replace("x + ", "x - "), "no code at all"):
            rows.append({"data_source": ex.data_source, "prompt": list(ex.prompt),
                         "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
                         "response": response})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "answers.parquet")
    out = tmp_path / "scored.jsonl"
    done = score(tmp_path / "answers.parquet", "--mode", "code", "-o", out)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["correct"] for line in lines] == [True, False, False] * 2
    assert [line["pred"] for line in lines[:2]] == ["4/4", "0/4"]
    assert {line["status"] for line in lines} == {"ok"}
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["rows"] == 6 and summary["infra"] == 0
