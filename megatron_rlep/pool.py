"""The experience pool: verified answer texts per training question, and replay sampling.

A pool is either a pool directory (``shard-XXXXX.parquet`` files plus ``manifest.json``, written
by ``tools/build_pool.py``) or a single RLEP release parquet. Both carry the verl columns and
``reward_model.candidates``, a list of answer texts. Questions are matched by their prompt
text (the last chat message), so a pool built from one copy of a dataset serves another.

``sample_replays`` is the replay rule: M answers per question, uniformly without replacement,
fresh each step, a pure function of (seed, step, question).

This module does not tokenize, score or train.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from megatron_rlep.data import DataError, Example, load_parquet

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1


def question_key(example: Example) -> str:
    return example.question.strip()


class ExperiencePool:
    """question text -> verified answers (the pool is never changed during training)."""

    def __init__(self, candidates: dict[str, tuple[str, ...]], source: str = ""):
        self.candidates = candidates
        self.source = source

    @classmethod
    def load(cls, path: str | Path) -> "ExperiencePool":
        path = Path(path)
        if path.is_dir():
            files = shard_files(path)
        elif path.is_file() and path.suffix == ".parquet":
            files = [path]
        else:
            raise DataError(f"experience pool {path} is neither a pool directory nor a .parquet "
                            "file; give the output directory of tools/build_pool.py or the RLEP "
                            "release parquet")
        candidates: dict[str, tuple[str, ...]] = {}
        for file in files:
            for ex in load_parquet(file):
                if not ex.candidates:
                    raise DataError(f"experience pool {file}: question {ex.id} has no "
                                    "reward_model.candidates; rebuild the pool or filter it with "
                                    "tools/pool.py filter")
                key = question_key(ex)
                merged = dict.fromkeys(candidates.get(key, ()) + tuple(ex.candidates))
                candidates[key] = tuple(merged)
        return cls(candidates, str(path))

    def __len__(self) -> int:
        return len(self.candidates)

    def answers(self, example: Example) -> tuple[str, ...]:
        return self.candidates.get(question_key(example), ())


def shard_files(directory: Path) -> list[Path]:
    """The shards a pool directory's manifest lists (or, without one, every shard file)."""
    manifest = directory / MANIFEST
    if manifest.is_file():
        meta = json.loads(manifest.read_text())
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise DataError(f"{manifest} has schema_version {meta.get('schema_version')!r}, this "
                            f"version reads {SCHEMA_VERSION}; rebuild the pool with this version")
        files = [directory / s["file"] for s in meta.get("shards", [])]
    else:
        files = sorted(directory.glob("shard-*.parquet"))
    if not files:
        raise DataError(f"experience pool {directory} holds no shards; build one with "
                        "tools/build_pool.py")
    return files


# ----------------------------------------------------------------------------- shard files

def row_schema():
    """The columns of a pool shard: the RLEP release's (verl columns plus
    ``reward_model.candidates``) and per-question statistics of the sampling."""
    import pyarrow as pa

    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    return pa.schema([
        ("data_source", pa.string()), ("prompt", pa.list_(message)), ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string()),
                                    ("candidates", pa.list_(pa.string()))])),
        ("extra_info", pa.struct([("index", pa.string())])),
        ("pass_rate", pa.float64()),  # verified answers / samples, before deduplication
        ("samples", pa.int64()),
        ("candidate_lengths", pa.list_(pa.int64())),  # answer lengths in tokens
    ])


def pool_row(example: Example, candidates: list[str], lengths: list[int], correct: int,
             samples: int) -> dict:
    return {"data_source": example.data_source,
            "prompt": [{"content": m["content"], "role": m["role"]} for m in example.prompt],
            "ability": "math",
            "reward_model": {"ground_truth": example.ground_truth, "style": "rule",
                             "candidates": list(candidates)},
            "extra_info": {"index": str(example.id)}, "pass_rate": correct / max(samples, 1),
            "samples": samples, "candidate_lengths": list(lengths)}


def write_parquet_atomic(rows: list[dict], path: Path) -> str:
    """Write ``rows`` to ``path`` through a temporary file and a rename; returns its sha256."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(pa.Table.from_pylist(rows, schema=row_schema()), tmp)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest


def write_json_atomic(data, path: Path) -> None:
    import os

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sample_replays(answers: tuple[str, ...], m: int, seed: int, step: int, key: str) -> list[str]:
    """M answers drawn uniformly without replacement (all of them when fewer than M exist),
    deterministic from (seed, step, question key) and independent of everything else."""
    if m <= 0 or not answers:
        return []
    digest = hashlib.sha256(f"{seed}\x00{step}\x00{key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return rng.sample(list(answers), min(m, len(answers)))
