"""A Hugging Face Hub cache filled by hand, as ``snapshot_download`` leaves it: for tests of
tools/get_data.py with HF_HUB_OFFLINE=1 (no network)."""

import shutil
from pathlib import Path


def add_snapshot(cache: Path, repo: str, kind: str, files: dict[str, Path],
                 commit: str = "0123456789abcdef0123456789abcdef01234567",
                 ref: str = "main") -> Path:
    """Put ``files`` ({path in the repo: local file}) in ``cache`` as ``repo``@``commit`` with
    ``ref`` pointing at it; returns the snapshot directory."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for name, source in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, snapshot / name)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snapshot


def dapo_parquet(path: Path, examples, repeats: int = 3) -> Path:
    """A DAPO-Math-17k-format parquet of ``examples``, each row repeated as in the real file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "math_dapo", "prompt": list(ex.prompt), "ability": "MATH",
             "reward_model": {"ground_truth": ex.ground_truth, "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": ex.id}}
            for _ in range(repeats) for ex in examples]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
