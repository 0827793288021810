"""tools/pool.py and pool validation on load: release round trip, stats, show, merge, filter,
and one-sentence errors for broken pools."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402

from megatron_rlep.data import DataError  # noqa: E402
from megatron_rlep.errors import RunError  # noqa: E402
from megatron_rlep.pool import ExperiencePool, read_rows  # noqa: E402
from megatron_rlep.reward.scorer import Scorer, settings  # noqa: E402

TOOL = Path(__file__).resolve().parent.parent / "tools" / "pool.py"
DAPO = Path(__file__).resolve().parents[2] / "shared" / "data" / "dapo" / "aime-2024.parquet"


def pool_tool(*args, expect=0):
    result = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                            text=True, timeout=scaled(300))
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture
def release(tmp_path):
    return tiny.make_pool(tmp_path / "release.parquet", 12, [1, 2], 3)  # 9 questions kept


def release_columns(path):
    table = pq.read_table(path)
    return [{k: row[k] for k in ("data_source", "prompt", "ability", "reward_model", "extra_info")}
            for row in table.to_pylist()]


def test_release_round_trip(tmp_path, release):
    pool_tool("import-release", release, "-o", tmp_path / "pool", "--shard-size", 4)
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 3 and manifest["counts"]["questions_kept"] == 9
    assert manifest["origin"]["release"] == str(release)
    pool_tool("export-release", tmp_path / "pool", "-o", tmp_path / "back.parquet")
    assert release_columns(tmp_path / "back.parquet") == release_columns(release)
    # the pool directory serves the trainer exactly as the release does
    assert ExperiencePool.load(tmp_path / "pool").candidates == ExperiencePool.load(release).candidates
    # nothing is written over an existing output
    result = pool_tool("import-release", release, "-o", tmp_path / "pool", expect=2)
    assert "already exists" in result.stderr


@pytest.mark.skipif(not DAPO.is_file(), reason="../shared/data is not beside the repo")
def test_release_round_trip_keeps_a_rich_extra_info(tmp_path):
    table = pq.read_table(DAPO).drop(["__index_level_0__"]).slice(0, 5).to_pylist()
    for row in table:
        row["reward_model"]["candidates"] = [f"Answer: {row['reward_model']['ground_truth']}"]
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "release.parquet")
    pool_tool("import-release", tmp_path / "release.parquet", "-o", tmp_path / "pool")
    pool_tool("export-release", tmp_path / "pool", "-o", tmp_path / "back.parquet")
    back = release_columns(tmp_path / "back.parquet")
    assert back == release_columns(tmp_path / "release.parquet")
    assert back[0]["extra_info"]["raw_problem"] and isinstance(back[0]["extra_info"]["index"], int)


def test_stats_show_and_plot(tmp_path, release):
    result = pool_tool("stats", release, "--json", "--plot", tmp_path / "stats.png",
                       "--verify", "dapo")
    stats = json.loads(result.stdout)
    rows = read_rows(release)
    counts = sorted(len(r["reward_model"]["candidates"]) for r in rows)
    assert stats["questions"] == 9 and stats["trajectories"] == sum(counts) == 3 * 1 + 6 * 3
    assert stats["candidates_per_question"] == {"min": 1, "median": 3, "max": 3}
    assert stats["mean_pass_rate"] is None  # a release carries no sampling statistics
    assert stats["rejected_candidates"] == 0
    assert (tmp_path / "stats.png").stat().st_size > 1000
    ident = rows[0]["extra_info"]["index"]
    shown = json.loads(pool_tool("show", release, "--id", ident).stdout)
    assert shown["candidates"] == rows[0]["reward_model"]["candidates"]
    result = pool_tool("show", release, "--id", "nope", expect=2)
    assert "no question with id 'nope'" in result.stderr and result.stderr.count("\n") == 1


def test_merge_unions_candidates_and_refuses_conflicting_truths(tmp_path, release):
    rows = read_rows(release)
    other = [dict(r, reward_model=dict(r["reward_model"], candidates=[
        f"Another way.\nAnswer: {r['reward_model']['ground_truth']}"])) for r in rows[:4]]
    pq.write_table(pa.Table.from_pylist(other), tmp_path / "other.parquet")
    pool_tool("merge", release, tmp_path / "other.parquet", "-o", tmp_path / "merged")
    merged = {r["prompt"][-1]["content"]: r["reward_model"]["candidates"]
              for r in read_rows(tmp_path / "merged")}
    assert len(merged) == 9
    for r in rows[:4]:
        assert merged[r["prompt"][-1]["content"]] == r["reward_model"]["candidates"] + \
            [f"Another way.\nAnswer: {r['reward_model']['ground_truth']}"]
    wrong = [dict(other[0], reward_model=dict(other[0]["reward_model"], ground_truth="-1"))]
    pq.write_table(pa.Table.from_pylist(wrong), tmp_path / "wrong.parquet")
    result = pool_tool("merge", release, tmp_path / "wrong.parquet", "-o", tmp_path / "m2", expect=2)
    assert "fix one pool before merging" in result.stderr and not (tmp_path / "m2").exists()


def test_filter_by_count_length_and_verifier(tmp_path, release):
    rows = read_rows(release)
    rows[1]["reward_model"]["candidates"].append("Answer: 12345")  # a wrong candidate
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dirty.parquet")
    result = pool_tool("filter", tmp_path / "dirty.parquet", "-o", tmp_path / "f1",
                       "--max-tokens", 8, expect=2)
    assert "--tokenizer" in result.stderr  # a release has no lengths yet
    pool_tool("filter", tmp_path / "dirty.parquet", "-o", tmp_path / "f2", "--min-correct", 2,
              "--verify", "dapo")
    kept = read_rows(tmp_path / "f2")
    assert len(kept) == 6 and all("12345" not in c for r in kept for c in r["reward_model"]["candidates"])
    # the user's own reward in verl's signature, as everywhere answers are scored
    (tmp_path / "mine.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip().endswith(str(ground_truth)))\n")
    pool_tool("filter", tmp_path / "dirty.parquet", "-o", tmp_path / "f4", "--min-correct", 2,
              "--verify", "custom", "--function", f"{tmp_path / 'mine.py'}:compute_score")
    assert read_rows(tmp_path / "f4") == kept
    refused = pool_tool("filter", tmp_path / "dirty.parquet", "-o", tmp_path / "f5",
                        "--verify", "custom", expect=2)
    assert "give --verify custom and --function FILE.py:NAME together" in refused.stderr
    pool_tool("filter", release, "-o", tmp_path / "f3", "--tokenizer", "smollm2-135m",
              "--max-tokens", 30)
    short = read_rows(tmp_path / "f3")
    assert short and all(n <= 30 for r in short for n in r["candidate_lengths"])
    assert all("Long reasoning" not in c for r in short for c in r["reward_model"]["candidates"])


def write_rows(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_validation_on_load_is_one_sentence(tmp_path, release):
    rows = read_rows(release)
    plain = tmp_path / "plain.parquet"  # a prompt set, not a pool
    write_rows(plain, [{"prompt": r["prompt"], "reward_model": {"ground_truth": "1"}} for r in rows])
    with pytest.raises(DataError, match="lacks the columns prompt and reward_model"):
        ExperiencePool.load(plain)
    empty = [dict(r) for r in rows]
    empty[2] = dict(empty[2], reward_model=dict(empty[2]["reward_model"], candidates=[]))
    with pytest.raises(DataError, match=r"has no candidates; drop such questions with tools/pool.py"):
        ExperiencePool.load(write_rows(tmp_path / "empty.parquet", empty))
    missing = [dict(r) for r in rows]
    missing[0] = dict(missing[0], reward_model=dict(missing[0]["reward_model"], ground_truth=None))
    with pytest.raises(DataError, match="has no reward_model.ground_truth"):
        ExperiencePool.load(write_rows(tmp_path / "missing.parquet", missing))
    pool_tool("import-release", release, "-o", tmp_path / "pool")
    shard = tmp_path / "pool" / "shard-00000.parquet"
    write_rows(shard, rows[:2])  # changed after it was written
    with pytest.raises(DataError, match="does not match its manifest checksum"):
        ExperiencePool.load(tmp_path / "pool")
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    (tmp_path / "pool" / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 9}))
    with pytest.raises(DataError, match="schema_version 9"):
        ExperiencePool.load(tmp_path / "pool")


def test_rejected_candidates_are_counted_and_optionally_dropped(tmp_path, release):
    rows = read_rows(release)
    for r in rows[:2]:
        r["reward_model"]["candidates"].append("Answer: 12345")
    dirty = write_rows(tmp_path / "dirty.parquet", rows)
    verifier = Scorer(settings("dapo"))
    kept = ExperiencePool.load(dirty, verifier)
    assert kept.rejected == 2 and sum(len(v) for v in kept.candidates.values()) == 21 + 2
    dropped = ExperiencePool.load(dirty, verifier, drop_rejected=True)
    assert dropped.rejected == 2 and sum(len(v) for v in dropped.candidates.values()) == 21


def test_an_unfinished_pool_is_refused_unless_asked_for(tmp_path, release):
    pool_tool("import-release", release, "-o", tmp_path / "pool", "--shard-size", 4)
    (tmp_path / "pool" / "manifest.json").unlink()  # as a build killed before its end leaves it
    with pytest.raises(DataError, match=r"has no manifest.json \(3 shard files\): its build has "
                                        r"not finished .* algorithm.pool_partial=true"):
        ExperiencePool.load(tmp_path / "pool")
    assert len(ExperiencePool.load(tmp_path / "pool", partial=True)) == 9
    refused = pool_tool("stats", tmp_path / "pool", expect=2)
    assert refused.stderr.startswith("error: experience pool") and "--partial" in refused.stderr
    assert "9 questions" in pool_tool("--partial", "stats", tmp_path / "pool").stdout
    gone = pool_tool("stats", tmp_path / "nowhere", expect=2)
    assert gone.stderr.startswith(f"error: experience pool {tmp_path / 'nowhere'} does not exist;")


def test_the_trainer_says_the_pools_coverage_and_stops_below_the_minimum(tmp_path, release, capsys):
    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.config import compose
    from megatron_rlep.producer import load_pool

    def load(train_levels, *extra):  # the trainer's pool check, before its actor and engine
        return load_pool(compose([f"algorithm.pool={release}", *extra]),
                         Scorer(settings("dapo")), arithmetic.examples("train", train_levels, 12, 3))

    assert len(load([1, 2])) == 9  # the release was built from these 12 questions
    assert "it covers 75.0% of the 12 training questions" in capsys.readouterr().out
    with pytest.raises(RunError, match=r"covers 0.0% of the training questions, below "
                                       r"algorithm.pool_min_coverage=0.1; questions match by "
                                       r"their prompt text"):
        load([5, 6])  # other questions: RLEP would silently be DAPO
    assert len(load([5, 6], "algorithm.pool_min_coverage=0")) == 9
