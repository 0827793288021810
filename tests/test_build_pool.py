"""tools/build_pool.py for real: the built-in model on the built-in task, SIGKILL and resume,
and two ranks under torchrun against one."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402
from launch import env, launcher  # noqa: E402
from megatron_rlep.data import Example  # noqa: E402

TOOL = Path(__file__).resolve().parent.parent / "tools" / "build_pool.py"


def command(out, *extra, model="smollm2-135m", nproc=1, engine="transformers"):
    return [*launcher(nproc), str(TOOL), f"model.path={model}", f"rollout.engine={engine}",
            "progress=false", f"out={out}", *extra]


def run(cmd, timeout=scaled(900)):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(cmd))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


def shards(out: Path) -> dict:
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("shard-*.json"))}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny.make_model(tmp_path_factory.mktemp("pool") / "model")


TINY = ["data.levels=[1,2]", "data.train_size=20", "samples=3", "rollout.max_response_length=6",
        "shard_size=4", "min_correct=1"]


@pytest.fixture(scope="module")
def straight(tiny_model, tmp_path_factory):
    """The tiny model's pool built in one uninterrupted run on one rank (read only)."""
    out = tmp_path_factory.mktemp("straight") / "pool"
    run(command(out, *TINY, model=tiny_model))
    return out


@pytest.mark.e2e
def test_builtin_model_pool_reverifies_and_manifest_matches(tmp_path):
    from megatron_rlep.data import load_parquet
    from megatron_rlep.reward.math_rule import MathRule

    out = tmp_path / "pool"
    run(command(out, "data.levels=[1]", "data.train_size=6", "samples=6", "temperature=1.0",
                "rollout.max_response_length=24", "shard_size=3", "min_correct=1"))
    manifest = json.loads((out / "manifest.json").read_text())
    verifier = MathRule("dapo")
    kept = trajectories = 0
    for entry in manifest["shards"]:
        rows = load_parquet(out / entry["file"])
        kept += len(rows)
        for ex in rows:
            assert len(set(ex.candidates)) == len(ex.candidates) >= 1
            assert all(verifier.verdict(c, ex.ground_truth)[0] for c in ex.candidates)
            trajectories += len(ex.candidates)
        assert entry["kept"] == len(rows)
    assert manifest["counts"]["questions_seen"] == 6
    assert (kept, trajectories) == (manifest["counts"]["questions_kept"], manifest["counts"]["trajectories"])
    assert kept > 0, "the built-in model verified nothing on level 1"


@pytest.mark.e2e
def test_kill_and_resume_finishes_without_loss_duplication_or_redone_shards(tiny_model, straight,
                                                                           tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed, *TINY, model=tiny_model), env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + scaled(300)
    while not (killed / "shard-00001.json").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "manifest.json").exists(), "the kill came after the end; nothing tested"
    before = {p.name: p.stat().st_mtime_ns for p in killed.glob("shard-*.json")}
    run(command(killed, *TINY, model=tiny_model))
    after = {p.name: p.stat().st_mtime_ns for p in killed.glob("shard-*.json")}
    assert all(after[name] == stamp for name, stamp in before.items()), "a finished shard was redone"
    a, b = shards(straight), shards(killed)
    questions = [q for s in b.values() for q in s["questions"]]
    assert len(questions) == len(set(questions)) == 20
    assert [s["questions"] for s in a.values()] == [s["questions"] for s in b.values()]
    assert [s["sha256"] for s in a.values()] == [s["sha256"] for s in b.values()]
    assert (killed / "manifest.json").is_file()
    assert not list(killed.glob(".*tmp*"))


@pytest.mark.e2e
def test_two_ranks_build_the_same_pool_as_one(tiny_model, straight, tmp_path):
    run(command(tmp_path / "two", *TINY, model=tiny_model, nproc=2))
    one, two = shards(straight), shards(tmp_path / "two")
    assert one.keys() == two.keys() and len(one) == 5
    assert [s["sha256"] for s in one.values()] == [s["sha256"] for s in two.values()]


@pytest.mark.e2e
def test_vllm_pool_on_one_rank_equals_a_resume_on_two_with_one_rank_idle(tiny_model, tmp_path):
    # two ranks: shards 0, 2, 4 belong to rank 0 and are done, so rank 0 has no work but must
    # still start its engine (a collective under torchrun) and wait for rank 1's shard 1
    one, two = tmp_path / "one", tmp_path / "two"
    run(command(one, *TINY, model=tiny_model, engine="vllm"))
    shutil.copytree(one, two)
    for name in ("shard-00001.json", "shard-00001.parquet", "manifest.json"):
        (two / name).unlink()
    run(command(two, *TINY, model=tiny_model, engine="vllm", nproc=2))
    assert [s["sha256"] for s in shards(one).values()] == [s["sha256"] for s in shards(two).values()]
    assert json.loads((one / "manifest.json").read_text()) == json.loads((two / "manifest.json").read_text())
    assert shards(one)["shard-00001.json"]["samples"] == 4 * 3


@pytest.mark.e2e
def test_a_tp2_vllm_engine_over_two_ranks_builds_every_shard_once(tiny_model, tmp_path):
    out = tmp_path / "tp2"
    result = subprocess.run(cmd := command(out, *TINY, "rollout.tensor_parallel=2", model=tiny_model,
                                           engine="vllm", nproc=2),
                            capture_output=True, text=True, timeout=scaled(900), env=env(cmd))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "1 engine(s) of tensor parallel size 2 over 2 rank(s)" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) == 5 and manifest["counts"]["questions_seen"] == 20
    assert manifest["counts"]["samples"] == 20 * 3  # each shard sampled by one engine, once


def test_other_settings_into_the_same_directory_are_refused(tiny_model, straight, tmp_path):
    shutil.copytree(straight, tmp_path / "pool")
    result = subprocess.run(command(tmp_path / "pool", *TINY, "temperature=1.0", model=tiny_model),
                            capture_output=True, text=True, env=env(), timeout=scaled(600))
    assert result.returncode == 2
    assert "other settings (sampling" in result.stderr and "new out=" in result.stderr


def test_dedupe_counts_identical_answers_once_and_off_keeps_them_all():
    sys.path.insert(0, str(TOOL.parent))
    from build_pool import shard_rows

    from megatron_rlep.config import BuildPoolConfig
    from megatron_rlep.data import dapo_prompt
    from megatron_rlep.reward.scorer import Scorer, settings
    from megatron_rlep.rollout.base import Completion

    example = Example("q1", dapo_prompt("Compute $2 + 3$."), "5", "arithmetic-L1")
    same = Completion("2 + 3 = 5.\nAnswer: 5", (1, 2, 3), True)
    group = [same, Completion("Answer: 6", (4,), True), same, same]
    verifier = Scorer(settings("dapo"))
    try:
        rows, stats = shard_rows([example], [group], verifier, BuildPoolConfig(min_correct=2))
        assert rows == [] and stats == {"samples": 4, "correct": 3, "unfinished_dropped": 0}
        rows, stats = shard_rows([example], [group], verifier,
                                 BuildPoolConfig(min_correct=2, dedupe=False))
    finally:
        verifier.close()
    assert stats == {"samples": 4, "correct": 3, "unfinished_dropped": 0}
    (row,) = rows
    assert row["reward_model"]["candidates"] == [same.text] * 3
    assert (row["pass_rate"], row["samples"], row["candidate_lengths"]) == (0.75, 4, [3, 3, 3])


def test_answers_cut_at_the_length_limit_stay_out_of_the_pool_unless_asked():
    sys.path.insert(0, str(TOOL.parent))
    from build_pool import shard_rows

    from megatron_rlep.config import BuildPoolConfig
    from megatron_rlep.reward.scorer import Scorer, settings
    from megatron_rlep.rollout.base import Completion

    ex = Example("q", ({"role": "user", "content": "2 + 3?"},), "5", "t")
    group = [Completion("2 + 3 = 5.\nAnswer: 5", (1, 2, 0), True),
             Completion("The sum is 5.\nAnswer: 5", (1, 2), False),  # verified, but cut at the limit
             Completion("Answer: 6", (1, 0), True)]
    verifier = Scorer(settings("dapo"))
    rows, stats = shard_rows([ex], [group], verifier, BuildPoolConfig(min_correct=1))
    assert rows[0]["reward_model"]["candidates"] == ["2 + 3 = 5.\nAnswer: 5"]
    assert stats == {"samples": 3, "correct": 2, "unfinished_dropped": 1}
    rows, stats = shard_rows([ex], [group], verifier,
                             BuildPoolConfig(min_correct=1, finished_only=False))
    assert len(rows[0]["reward_model"]["candidates"]) == 2 and stats["unfinished_dropped"] == 0
    # min_correct counts finished answers only
    assert shard_rows([ex], [group], verifier, BuildPoolConfig(min_correct=2))[0] == []

