"""tools/get_data.py offline: the hub's cache filled by hand, HF_HUB_OFFLINE=1; each asset is
resolved to its commit, checked as the trainer reads it, linked and recorded."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import hub_cache  # noqa: E402
import tiny  # noqa: E402
from speed import scaled

REPO = Path(__file__).resolve().parent.parent
COMMIT = "a" * 40


def get_data(out, *args):
    return subprocess.run([sys.executable, str(REPO / "tools" / "get_data.py"), *args, "--out",
                           str(out)], capture_output=True, text=True, timeout=scaled(300),
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_assets_resolve_to_a_commit_are_checked_linked_and_recorded(tmp_path):
    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.data import load_parquet

    model = tiny.make_model(tmp_path / "model")
    examples = arithmetic.examples("train", [1], 5, 1)
    cache, out = tmp_path / "out" / ".hf-cache", tmp_path / "out"
    hub_cache.add_snapshot(cache, "Qwen/Qwen2.5-Math-7B", "model",
                           {p.name: p for p in model.iterdir()}, COMMIT)
    hub_cache.add_snapshot(cache, "BytedTsinghua-SIA/DAPO-Math-17k", "dataset", {
        "data/dapo-math-17k.parquet": hub_cache.dapo_parquet(tmp_path / "d.parquet", examples)},
        COMMIT)
    hub_cache.add_snapshot(cache, "Kwai-Klear/RLEP_dataset", "dataset", {
        "rlep_pool.parquet": tiny.make_pool(tmp_path / "p.parquet", 8, [1], 1)}, COMMIT)
    done = get_data(out, "qwen2.5-math-7b", "dapo-math-17k", "rlep-pool")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"dapo-math-17k: {out}/dapo-math-17k.parquet -> commit {COMMIT}: 15 rows, 5 distinct " \
           "questions" in done.stdout
    assert "rlep-pool: " in done.stdout and "6 questions, 14 verified answers" in done.stdout
    assert "llama, 2 layers, hidden 64, 1 weight files" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        f"export QWEN_MATH_7B={out}/qwen2.5-math-7b DAPO_MATH_17K={out}/dapo-math-17k.parquet "
        f"RLEP_POOL={out}/rlep-pool.parquet")
    assert len(load_parquet(out / "dapo-math-17k.parquet")) == 5  # the link reads
    record = json.loads((out / "dapo-math-17k.source.json").read_text())
    assert (record["repo"], record["revision"], record["commit"]) == \
        ("BytedTsinghua-SIA/DAPO-Math-17k", "main", COMMIT)
    assert list(record["files"]) == ["data/dapo-math-17k.parquet"]
    # the recorded commit pins it again; a second run replaces its own links
    again = get_data(out, "dapo-math-17k", "--revision", f"dapo-math-17k={COMMIT}")
    assert again.returncode == 0, again.stderr[-3000:]
    # what is not in the cache offline, and a name that is no asset: one sentence each
    missing = get_data(out, "dapo-math-17k", "--revision", "dapo-math-17k=" + "b" * 40)
    assert missing.returncode == 2 and missing.stderr.startswith(
        "error: dapo-math-17k could not be fetched from BytedTsinghua-SIA/DAPO-Math-17k@bbbb")
    unknown = get_data(out, "qwen3")
    assert unknown.returncode == 2 and "unknown asset qwen3; the assets are qwen2.5-math-7b" in \
        unknown.stderr
