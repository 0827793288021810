"""The experience pool: verified answers per training question, and replay sampling.

A pool is either a pool directory (``shard-XXXXX.parquet`` files plus ``manifest.json``, written
by ``tools/build_pool.py``, or a live pool written into a run's checkpoints) or a single RLEP
release parquet. Both carry the verl columns and ``reward_model.candidates``, a list of answer
texts; pool directories add per-answer columns (``PER_CANDIDATE``: length, sampled token ids and
behaviour log-probs, and a live pool's version and provenance). Questions are matched by their
prompt text (the last chat message), so a pool built from one copy of a dataset serves another.

``sample_replays`` is the replay rule: M answers per question, uniformly without replacement,
fresh each step, a pure function of (seed, step, question). Like the reference it draws from
the stored answers, repeats included (an answer stored twice is twice as likely and may be
replayed twice); ``distinct=True`` draws from the distinct texts instead.

This module does not tokenize, score or train.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from megatron_rlep.data import DataError, Example
from megatron_rlep.files import file_sha256, temporary_beside, write_json_atomic

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
# columns with one entry per candidate, in the candidates' order (None where a pool has none)
PER_CANDIDATE = ("candidate_lengths", "candidate_token_ids", "candidate_logprobs",
                 "candidate_versions", "candidate_provenance", "candidate_masks")


def question_key(example: Example) -> str:
    return example.question.strip()


@dataclass(frozen=True)
class Answer:
    """One verified answer of the pool and where it came from."""
    text: str
    version: int = -1  # the training step whose policy sampled it; -1: before this run
    token_ids: tuple[int, ...] = ()  # as sampled, EOS included (empty: not recorded)
    logprobs: tuple[float, ...] = ()  # their behaviour log-probs
    provenance: str = ""  # JSON: source run or pool, step, sampling settings, verifier mode
    # a tool-using answer's: True for the model's tokens, False for the tools' outputs (empty:
    # all the model's); it replays as recorded, its observations never run again
    mask: tuple[bool, ...] = ()


class ExperiencePool:
    """question key -> verified answers (``Answer``), with each question's pass rate when
    sampled. A frozen pool never changes; a live one (``algorithm.replay.refresh``) takes this
    run's verified fresh answers (``add``) and is written into checkpoints (``write``)."""

    def __init__(self, candidates: dict[str, tuple], source: str = "", rejected: int = 0,
                 pass_rates: dict[str, float] | None = None, rows: dict[str, dict] | None = None):
        self.entries = {k: [a if isinstance(a, Answer) else Answer(a) for a in v]
                        for k, v in candidates.items()}
        self.source = source
        self.rejected = rejected  # candidates the verifier rejected at load (kept or dropped)
        self.pass_rates = pass_rates or {}
        self.rows = rows or {}  # key -> the question's row (prompt, ground truth), for ``write``
        self.calls = None  # a live pool's: the format of its answers' tool calls, for ``write``

    @classmethod
    def load_live(cls, path: str | Path) -> "ExperiencePool":
        """The live pool a run saved beside a checkpoint: a built pool's files, or none at all
        when no answer had joined it yet (its manifest lists no shards)."""
        manifest = Path(path) / MANIFEST
        if manifest.is_file() and not json.loads(manifest.read_text()).get("shards"):
            return cls({}, "live")
        return cls.load(path)

    @classmethod
    def load(cls, path: str | Path, scorer=None, drop_rejected: bool = False,
             partial: bool = False) -> "ExperiencePool":
        """Read and check a pool; with a ``scorer``, count (and optionally drop) the
        candidates it rejects. ``partial``: a pool directory without its manifest (a build
        that has not finished) is read from the shards there instead of refused."""
        rows = check_rows(read_rows(path, partial), path)
        rejected = 0
        if scorer is not None:
            rows, rejected, _ = verify_rows(rows, scorer, drop_rejected)
        entries: dict[str, list[Answer]] = {}
        pass_rates, first = {}, {}
        for row in rows:  # rows of one question (two copies of a dataset) pool their answers
            key = row_key(row)
            entries.setdefault(key, []).extend(answers_of(row))
            first.setdefault(key, row)
            if row.get("pass_rate") is not None:
                pass_rates.setdefault(key, row["pass_rate"])
        return cls(entries, str(path), rejected, pass_rates, first)

    def __len__(self) -> int:
        return len(self.entries)

    def said(self, key: str):
        """What the manifest says of ``key``: tools/build_pool.py's at its top, a pool written
        from rows (``write_pool``) in its origin; None where it says nothing."""
        manifest = Path(self.source) / MANIFEST
        meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
        return meta.get(key) or meta.get("origin", {}).get(key)

    def tool_format(self) -> str | None:
        """The format of its tool-using answers' calls (``rollout.tool_format``), None when it
        holds none; fenced blocks where the manifest does not say (the only format before)."""
        if not any(a.mask for answers in self.entries.values() for a in answers):
            return None
        return self.said("tool_format") or "fence"

    def sampling(self) -> set[tuple[float, float]]:
        """The (temperature, top-p) pairs under which the answers with recorded log-probs were
        sampled: a built pool's manifest says it for all, a live pool's answers each."""
        built = self.said("sampling") or {}
        out = set()
        for answers in self.entries.values():
            for a in answers:
                if a.logprobs:
                    how = json.loads(a.provenance) if a.provenance else built
                    out.add((how.get("temperature"), how.get("top_p")))
        return out

    def coverage(self, examples: list[Example]) -> float:
        """The share of ``examples`` (the training questions) that have answers in the pool."""
        return sum(question_key(e) in self.entries for e in examples) / max(len(examples), 1)

    @property
    def candidates(self) -> dict[str, tuple[str, ...]]:
        return {k: tuple(a.text for a in v) for k, v in self.entries.items()}

    def answers(self, example: Example) -> tuple[str, ...]:
        return tuple(a.text for a in self.entries.get(question_key(example), ()))

    def versions(self, example: Example) -> tuple[int, ...]:
        return tuple(a.version for a in self.entries.get(question_key(example), ()))

    def pass_rate(self, example: Example) -> float | None:
        return self.pass_rates.get(question_key(example))

    def sampled_as(self, example: Example, text: str) -> tuple[list[int], list[float]] | None:
        """The token ids and behaviour log-probs ``text`` was sampled with, if recorded."""
        for a in self.entries.get(question_key(example), ()):
            if a.text == text and a.token_ids and a.logprobs:
                return list(a.token_ids), list(a.logprobs)
        return None

    def trajectory(self, example: Example, text: str) -> Answer | None:
        """The tool-using answer ``text`` (its tokens, observations and mask), if it is one."""
        return next((a for a in self.entries.get(question_key(example), ())
                     if a.text == text and a.mask and a.token_ids), None)

    def version_of(self, example: Example, text: str) -> int:
        return max((a.version for a in self.entries.get(question_key(example), ())
                    if a.text == text), default=-1)

    def add(self, example: Example, answers: list[Answer], cap: int) -> None:
        """Take ``answers`` for ``example``: an answer already there is renewed (it moves to the
        newest version), then the oldest versions go until at most ``cap`` remain."""
        key = question_key(example)
        if key not in self.rows:  # a question new to the pool: no pass rate from a build
            self.rows[key] = {**pool_row(example, [], [], 0, 0), "pass_rate": None, "samples": None}
        kept = self.entries.get(key, [])
        for answer in answers:
            kept = [a for a in kept if a.text != answer.text] + [answer]
        order = sorted(range(len(kept)), key=lambda i: (-kept[i].version, -i))[:cap]
        self.entries[key] = [kept[i] for i in sorted(order)]

    def write(self, out: str | Path, origin: dict) -> dict:
        """The pool as a pool directory (``write_pool``), provenance included."""
        rows = []
        for key, answers in self.entries.items():
            row = self.rows[key]
            rows.append({**row, "reward_model": {**row["reward_model"],
                                                 "candidates": [a.text for a in answers]},
                         "candidate_lengths": [len(a.token_ids) for a in answers]
                         if all(a.token_ids for a in answers) else None,
                         "candidate_token_ids": [list(a.token_ids) for a in answers],
                         "candidate_logprobs": [list(a.logprobs) for a in answers],
                         "candidate_versions": [a.version for a in answers],
                         "candidate_provenance": [a.provenance for a in answers],
                         "candidate_masks": [list(a.mask) for a in answers]
                         if any(a.mask for a in answers) else None})
        return write_pool(rows, out, {**origin, "tool_format": self.calls} if self.calls else origin)


def answers_of(row: dict) -> list[Answer]:
    """A pool row's candidates with what the row records of each."""
    texts = row["reward_model"]["candidates"]
    column = {c: row.get(c) or [None] * len(texts) for c in PER_CANDIDATE}
    return [Answer(text, -1 if version is None else int(version), tuple(ids or ()),
                   tuple(logprobs or ()), provenance or "", tuple(bool(m) for m in mask or ()))
            for text, ids, logprobs, version, provenance, mask in zip(
                texts, column["candidate_token_ids"], column["candidate_logprobs"],
                column["candidate_versions"], column["candidate_provenance"],
                column["candidate_masks"])]


def row_key(row: dict) -> str:
    return row["prompt"][-1]["content"].strip()


def row_id(row: dict, position: int) -> str:
    index = (row.get("extra_info") or {}).get("index")
    return str(position if index is None else index)


def shard_files(directory: Path, verify_checksums: bool = True, partial: bool = False) -> list[Path]:
    """The shards a pool directory's manifest lists; without a manifest (a build that has not
    finished) every shard file there when ``partial``, else a refusal."""
    manifest = directory / MANIFEST
    if manifest.is_file():
        meta = json.loads(manifest.read_text())
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise DataError(f"{manifest} has schema_version {meta.get('schema_version')!r}, this "
                            f"version reads {SCHEMA_VERSION}; rebuild the pool with this version")
        files = [directory / s["file"] for s in meta.get("shards", [])]
        for entry, file in zip(meta.get("shards", []), files):
            if not file.is_file():
                raise DataError(f"experience pool {directory}: shard {file.name} listed in the "
                                "manifest is missing; copy the whole pool directory again")
            if verify_checksums and entry.get("sha256") and file_sha256(file) != entry["sha256"]:
                raise DataError(f"experience pool {directory}: shard {file.name} does not match "
                                "its manifest checksum; it changed after it was written, so "
                                "rebuild or re-import the pool")
    elif partial:
        files = sorted(directory.glob("shard-*.parquet"))
    else:
        shards = len(list(directory.glob("shard-*.parquet")))
        raise DataError(f"experience pool {directory} has no {MANIFEST} ({shards} shard files): "
                        "its build has not finished (tools/build_pool.py writes the manifest "
                        "last); run the same build command again to finish it, or pass "
                        "algorithm.pool_partial=true (tools/pool.py --partial) to use the "
                        "shards there")
    if not files:
        raise DataError(f"experience pool {directory} holds no shards; build one with "
                        "tools/build_pool.py")
    return files


def pool_files(path: str | Path, partial: bool = False) -> list[Path]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"experience pool {path} does not exist; give the output directory of "
                        "tools/build_pool.py or the RLEP release parquet (algorithm.pool)")
    if path.is_dir():
        return shard_files(path, partial=partial)
    if path.is_file() and path.suffix == ".parquet":
        return [path]
    raise DataError(f"experience pool {path} is neither a pool directory nor a .parquet file; "
                    "give the output directory of tools/build_pool.py or the RLEP release parquet")


def read_rows(path: str | Path, partial: bool = False) -> list[dict]:
    """The rows of a pool directory or an RLEP release parquet, in the shard row format
    (``row_schema``; per-question statistics are None where the release has none).
    ``partial``: see ``shard_files``."""
    import pyarrow.parquet as pq

    rows = []
    for file in pool_files(path, partial):
        try:
            table = pq.read_table(file)
        except Exception as err:
            raise DataError(f"experience pool {file} cannot be read as parquet ({err}); give a "
                            "pool directory or the RLEP release parquet") from None
        reward = table.schema.field("reward_model").type if "reward_model" in table.column_names \
            else None
        fields = {f.name for f in reward} if reward is not None and hasattr(reward, "__iter__") else set()
        if "prompt" not in table.column_names or not {"ground_truth", "candidates"} <= fields:
            raise DataError(f"experience pool {file} lacks the columns prompt and "
                            "reward_model.{ground_truth, candidates}; it is not a pool: build "
                            "one with tools/build_pool.py or give the RLEP release parquet")
        for row in table.to_pylist():
            rows.append(_as_pool_row(row))
    return rows


def _as_pool_row(row: dict) -> dict:
    reward = row["reward_model"] or {}
    extra = row.get("extra_info") or {}
    return {"data_source": row.get("data_source") or "",
            "prompt": [{"content": m["content"], "role": m["role"]} for m in row["prompt"] or []],
            "ability": row.get("ability") or "math",
            "reward_model": {"ground_truth": None if reward.get("ground_truth") is None
                             else str(reward["ground_truth"]),
                             "style": reward.get("style") or "rule",
                             "candidates": list(reward.get("candidates") or [])},
            "extra_info": {"index": None if extra.get("index") is None else str(extra["index"])},
            "extra_info_json": row.get("extra_info_json") or json.dumps(extra, ensure_ascii=False),
            "pass_rate": row.get("pass_rate"), "samples": row.get("samples"),
            **{column: row.get(column) for column in PER_CANDIDATE}}


def check_rows(rows: list[dict], source) -> list[dict]:
    """Refuse a pool with a question that has no prompt, no ground truth or no candidates."""
    if not rows:
        raise DataError(f"experience pool {source} holds no questions; build one with "
                        "tools/build_pool.py")
    for position, row in enumerate(rows):
        ident = row_id(row, position)
        if not row["prompt"]:
            raise DataError(f"experience pool {source}: question {ident} has an empty prompt; "
                            "fix the row or drop it with tools/pool.py filter")
        if row["reward_model"]["ground_truth"] in (None, ""):
            raise DataError(f"experience pool {source}: question {ident} has no "
                            "reward_model.ground_truth; drop such questions with "
                            "tools/pool.py filter POOL -o OUT")
        if not row["reward_model"]["candidates"]:
            raise DataError(f"experience pool {source}: question {ident} has no candidates; "
                            "drop such questions with tools/pool.py filter POOL --min-correct 1 "
                            "-o OUT")
    return rows


def verify_rows(rows: list[dict], scorer, drop: bool) -> tuple[list[dict], int, int]:
    """Check every candidate with ``scorer`` (``reward/scorer.py``, one batch): (rows, rejected
    candidates, questions with a rejected one). With ``drop`` the rejected candidates go, and
    questions left with none."""
    from megatron_rlep.reward.scorer import Item

    items = [Item(row.get("data_source") or "", c, row["reward_model"]["ground_truth"],
                  row.get("extra_info") if isinstance(row.get("extra_info"), dict) else None)
             for row in rows for c in row["reward_model"]["candidates"]]
    correct = iter([score.correct for score in scorer.score(items)])
    out, rejected, questions = [], 0, 0
    for row in rows:
        verdicts = [next(correct) for _ in row["reward_model"]["candidates"]]
        bad = verdicts.count(False)
        rejected += bad
        questions += bad > 0
        if drop and bad:
            row = keep_candidates(row, [i for i, ok in enumerate(verdicts) if ok])
            if not row["reward_model"]["candidates"]:
                continue
        out.append(row)
    return out, rejected, questions


def keep_candidates(row: dict, keep: list[int]) -> dict:
    """``row`` with only the candidates at ``keep`` (their per-candidate columns follow)."""
    return {**row, "reward_model": {**row["reward_model"], "candidates":
                                    [row["reward_model"]["candidates"][i] for i in keep]},
            **{column: None if row.get(column) is None else [row[column][i] for i in keep]
               for column in PER_CANDIDATE}}


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
        ("extra_info_json", pa.string()),  # the source's whole extra_info, for export-release
        ("pass_rate", pa.float64()),  # verified answers / samples, before deduplication
        ("samples", pa.int64()),
        ("candidate_lengths", pa.list_(pa.int64())),  # answer lengths in tokens
        # as sampled, end-of-sequence included: token ids and their behaviour log-probs
        ("candidate_token_ids", pa.list_(pa.list_(pa.int64()))),
        ("candidate_logprobs", pa.list_(pa.list_(pa.float32()))),
        # a live pool's (algorithm.replay.refresh): the sampling step (-1: before the run) and
        # a JSON record of the source, sampling settings and verifier
        ("candidate_versions", pa.list_(pa.int64())),
        ("candidate_provenance", pa.list_(pa.string())),
        # tool-using answers: per token, the model's (true) or a tool's output (false)
        ("candidate_masks", pa.list_(pa.list_(pa.bool_()))),
    ])


def pool_row(example: Example, candidates: list[str], lengths: list[int], correct: int,
             samples: int, token_ids: list | None = None, logprobs: list | None = None,
             masks: list | None = None) -> dict:
    return {"data_source": example.data_source,
            "prompt": [{"content": m["content"], "role": m["role"]} for m in example.prompt],
            "ability": "math",
            "reward_model": {"ground_truth": example.ground_truth, "style": "rule",
                             "candidates": list(candidates)},
            "extra_info": {"index": str(example.id)},
            "extra_info_json": json.dumps({"index": str(example.id)}),
            "pass_rate": correct / max(samples, 1), "samples": samples,
            "candidate_lengths": list(lengths), "candidate_token_ids": token_ids,
            "candidate_logprobs": logprobs, "candidate_versions": None,
            "candidate_provenance": None, "candidate_masks": masks}


def write_parquet_atomic(rows: list[dict], path: Path) -> str:
    """Write ``rows`` to ``path`` through a temporary file and a rename; returns its sha256."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = temporary_beside(path)
    pq.write_table(pa.Table.from_pylist(rows, schema=row_schema()), tmp)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest


def write_pool(rows: list[dict], out: str | Path, origin: dict, shard_size: int = 256) -> dict:
    """A pool directory from ``rows``, all or nothing: shards and manifest go to
    ``OUT.partial``, renamed to ``OUT`` at the end. Returns the manifest."""
    import os
    import shutil

    out = Path(out)
    if out.exists():
        raise DataError(f"{out} already exists; give a new -o or remove it first")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards = []
    for k, first in enumerate(range(0, len(rows), shard_size)):
        chunk, name = rows[first:first + shard_size], f"shard-{k:05d}.parquet"
        shards.append({"file": name, "sha256": write_parquet_atomic(chunk, tmp / name),
                       "questions": len(chunk), "kept": len(chunk),
                       "trajectories": sum(len(r["reward_model"]["candidates"]) for r in chunk)})
    manifest = {"schema_version": SCHEMA_VERSION, "origin": origin,
                "counts": {"questions_kept": len(rows),
                           "trajectories": sum(s["trajectories"] for s in shards)},
                "shards": shards}
    write_json_atomic(manifest, tmp / MANIFEST)
    os.replace(tmp, out)
    return manifest


def sample_replays(answers: tuple[str, ...], m: int, seed: int, step: int, key: str,
                   distinct: bool = False) -> list[str]:
    """M of the stored answers drawn uniformly without replacement (all of them when fewer
    than M exist; with ``distinct``, of the distinct texts), deterministic from (seed, step,
    question key) and independent of everything else."""
    if distinct:
        answers = tuple(dict.fromkeys(answers))
    if m <= 0 or not answers:
        return []
    digest = hashlib.sha256(f"{seed}\x00{step}\x00{key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return rng.sample(list(answers), min(m, len(answers)))
