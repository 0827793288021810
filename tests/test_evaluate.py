"""tools/evaluate.py for real: the built-in model on every shipped evaluation set by name; a
tiny model on one rank and on two, resuming after a lost unit; its one-line errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402
from launch import env, launcher  # noqa: E402

from megatron_rlep.errors import ConfigError  # noqa: E402

TOOL = Path(__file__).resolve().parent.parent / "tools" / "evaluate.py"
EVAL_DATA = Path(__file__).resolve().parent.parent / "data" / "eval"  # shipped with the repo


def command(out, *extra, nproc=1, engine="transformers"):
    return [*launcher(nproc), str(TOOL), f"rollout.engine={engine}", "progress=false", f"out={out}",
            *extra]


def run(cmd, expect=0):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(900), env=env(cmd))
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.e2e
def test_every_shipped_eval_set_evaluates_by_name(tmp_path):
    from megatron_rlep.reward.math_rule import MathRule

    names = sorted(p.stem for p in EVAL_DATA.iterdir() if p.suffix in (".jsonl", ".parquet"))
    assert names == ["aime24", "aime25", "amc23", "math500"]
    out = tmp_path / "eval"
    # no data_dir: the names resolve to the sets shipped in data/eval/
    result = run(command(out, f"datasets=[{','.join(names)}]", "limit=2", "samples=2", "max_tokens=6", "chunk_size=2",
                         "logging=offline"))
    samples = read(out / "samples.jsonl")
    assert sorted({r["data_source"] for r in samples}) == names
    assert len(samples) == len(names) * 2 * 2
    assert {"data_source", "id", "sample_index", "response", "pred", "correct",
            "length"} <= set(samples[0])
    verifier = MathRule("dapo")
    for r in samples:
        assert r["correct"] == verifier.verdict(r["response"], r["ground_truth"])[0]
        assert 1 <= r["length"] <= 6
    m = json.loads((out / "metrics.json").read_text())
    assert sorted(m) == sorted(names + ["all"])
    assert m["all"]["questions"] == 2 * len(names) and m["all"]["n"] == 2
    assert set(m["all"]["pass@k"]) == {"1", "2"} == set(m["all"]["maj@k"])
    assert (out / "metrics.md").read_text() in result.stdout
    record = next((out / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"eval-eval" in record and b"eval/all/pass@2" in record  # artifact and summary
    recomputed = tmp_path / "again.json"
    run([sys.executable, str(TOOL.parent / "metrics.py"), str(out / "samples.jsonl"),
         "-o", str(recomputed)])
    assert json.loads(recomputed.read_text()) == m


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Sharding and resuming do not need a model that can add: the tiny random one is quicker."""
    return tiny.make_model(tmp_path_factory.mktemp("eval") / "model")


@pytest.mark.e2e
def test_two_ranks_equal_one_and_a_lost_unit_is_redone(tmp_path, tiny_model):
    args = ["datasets=[arithmetic]", "levels=[1,2]", "limit=6", "samples=3", "max_tokens=16",
            "temperature=1.0", "chunk_size=2", f"model.path={tiny_model}"]
    one, two = tmp_path / "one", tmp_path / "two"
    run(command(one, *args))
    run(command(two, *args, nproc=2))
    assert (one / "samples.jsonl").read_bytes() == (two / "samples.jsonl").read_bytes()
    assert (one / "metrics.json").read_text() == (two / "metrics.json").read_text()
    rows = read(one / "samples.jsonl")
    assert len(rows) == 6 * 3 and len({r["response"] for r in rows}) > 1  # sampled, not greedy
    assert {r["data_source"] for r in rows} == {"arithmetic-L1", "arithmetic-L2"}
    assert all(r["id"].startswith(r["data_source"][-2:]) for r in rows)  # a level's own rows

    parts = sorted((one / "parts").glob("unit-*.jsonl"))
    assert len(parts) == 3
    kept = {p: p.stat().st_mtime_ns for p in parts[1:]}
    parts[0].unlink()
    (one / "samples.jsonl").unlink()
    run(command(one, *args))
    assert (one / "samples.jsonl").read_bytes() == (two / "samples.jsonl").read_bytes()
    assert {p: p.stat().st_mtime_ns for p in parts[1:]} == kept  # finished units not redone
    result = run(command(one, *(a for a in args if a != "chunk_size=2"), "chunk_size=3"), expect=2)
    assert "other settings (chunk_size: 2 there, 3 now)" in result.stderr


@pytest.mark.e2e
def test_vllm_evaluation_on_one_rank_equals_a_resume_on_two_with_one_rank_idle(tmp_path):
    args = ["datasets=[arithmetic]", "levels=[1,2]", "limit=4", "samples=3", "max_tokens=16",
            "temperature=1.0", "chunk_size=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    run(command(one, *args, engine="vllm"))
    shutil.copytree(one, two)
    for path in (two / "parts" / "unit-00001.jsonl", two / "samples.jsonl"):
        path.unlink()  # unit 1 is rank 1's; rank 0 has nothing left but starts its engine
    run(command(two, *args, engine="vllm", nproc=2))
    assert (one / "samples.jsonl").read_bytes() == (two / "samples.jsonl").read_bytes()
    rows = read(one / "samples.jsonl")
    assert len(rows) == 4 * 3 and len({r["response"] for r in rows}) > 1


@pytest.mark.e2e
def test_a_tp2_vllm_engine_over_two_ranks_samples_every_unit_once(tmp_path, tiny_model):
    args = ["datasets=[arithmetic]", "levels=[1,2]", "limit=4", "samples=2", "max_tokens=8",
            "temperature=1.0", "chunk_size=2", "rollout.tensor_parallel=2",
            f"model.path={tiny_model}"]  # 2 heads: TP 2 divides them (the built-in has 9)
    out = tmp_path / "tp2"
    result = run(command(out, *args, engine="vllm", nproc=2))
    assert "1 engine(s) of tensor parallel size 2 over 2 rank(s)" in result.stdout
    rows = read(out / "samples.jsonl")
    assert len(list((out / "parts").glob("unit-*.jsonl"))) == 2
    assert len(rows) == 4 * 2  # written once, by the engine's first rank
    assert len({(r["data_source"], r["id"], r["sample_index"]) for r in rows}) == 8


def test_engines_of_tp_ranks_share_the_units():
    from megatron_rlep import jobs

    assert [jobs.engines(rank, 4, 2) for rank in range(4)] == [(0, 2, True), (0, 2, False),
                                                               (1, 2, True), (1, 2, False)]
    assert jobs.engines(2, 3, 1) == (2, 3, True)
    with pytest.raises(ConfigError, match="rollout.tensor_parallel=2 does not divide the 3 ranks"):
        jobs.engines(0, 3, 2)


def test_errors_are_one_sentence(tmp_path):
    out = tmp_path / "eval"
    result = run(command(out, "datasets=[no_such_set]", f"data_dir={tmp_path}"), expect=2)
    assert result.stderr.strip().count("\n") == 0
    assert "'no_such_set' was not found" in result.stderr and str(tmp_path) in result.stderr
    result = run(command(out, "samples=0"), expect=2)
    assert "samples=0 is out of range" in result.stderr
