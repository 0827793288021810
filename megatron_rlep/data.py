"""Reading prompt sets into one example type.

Formats: verl/DAPO parquet (``data_source``, ``prompt``, ``reward_model.ground_truth``,
``extra_info``; repeated prompts are dropped, DAPO-Math-17k repeats each ~100 times), the RLEP
release parquet (the same plus ``reward_model.candidates``), the JSONL evaluation sets
(AIME, AMC, MATH-500, GSM8K's ``#### N``), a Hugging Face dataset id through ``datasets``, and
the built-in tasks (``megatron_rlep/tasks/``). Every reader returns ``list[Example]``
(``megatron_rlep/example.py``).

This module reads data; it does not tokenize, score or sample.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from megatron_rlep.example import DataError, Example  # noqa: F401 - their home for readers

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."
    "\n\n{problem}\n\nRemember to put your answer on its own line after \"Answer:\"."
)


# the evaluation sets shipped with the repository (aime24, aime25, amc23, math500; sources and
# licences in data/eval/README.md): names resolve here when data_dir does not hold them
EVAL_DIR = Path(__file__).resolve().parent.parent / "data" / "eval"


def dapo_prompt(problem: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": DAPO_TEMPLATE.format(problem=problem)},)


def problem_of(question: str) -> str:
    """The problem inside a question in the DAPO template; any other question as it is."""
    head, tail = DAPO_TEMPLATE.split("{problem}")
    if question.startswith(head) and question.endswith(tail):
        return question[len(head):len(question) - len(tail)]
    return question


def clean_answer(answer) -> str:
    """Ground truth as a string the verifier compares: ``27.0`` -> ``27``, ``033`` -> ``33``."""
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    text = str(answer).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    return text


# ---------------------------------------------------------------- parquet (verl / DAPO / RLEP)

def load_parquet(path: str | Path, data_source: str | None = None) -> list[Example]:
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except Exception as err:
        raise DataError(f"{path}: cannot be read as parquet ({err}); pass a verl/DAPO-format "
                        f"parquet file.") from None
    columns = set(table.column_names)
    for needed in ("prompt", "reward_model"):
        if needed not in columns:
            raise DataError(f"{path}: missing column '{needed}'; a verl/DAPO parquet needs "
                            f"'prompt' (chat messages) and 'reward_model.ground_truth'.")
    reward_fields = {f.name for f in table.schema.field("reward_model").type}
    if "ground_truth" not in reward_fields:
        raise DataError(f"{path}: column 'reward_model' has no field 'ground_truth' "
                        f"(fields: {sorted(reward_fields)}); add the answers there.")
    examples, seen = [], set()
    for i, row in enumerate(table.to_pylist()):
        prompt = tuple({"role": m["role"], "content": m["content"]} for m in row["prompt"])
        key = tuple((m["role"], m["content"]) for m in prompt)
        if key in seen:
            continue
        seen.add(key)
        extra = row.get("extra_info") or {}
        reward = row["reward_model"] or {}
        examples.append(Example(
            id=str(extra.get("index", i) if isinstance(extra, dict) else i),
            prompt=prompt,
            ground_truth=clean_answer(reward.get("ground_truth")),
            data_source=data_source or row.get("data_source") or path.stem,
            candidates=tuple(reward.get("candidates") or ()),
            extra_info=extra if isinstance(extra, dict) and extra else None,
        ))
    return examples


# ---------------------------------------------------------------- JSONL evaluation sets

_PROBLEM_KEYS = ("problem", "question", "prompt")
_ANSWER_KEYS = ("answer", "ground_truth", "final_answer")
_ID_KEYS = ("id", "idx", "unique_id")


def _answer_from_row(row: dict) -> str | None:
    for key in _ANSWER_KEYS:
        if key in row and row[key] is not None:
            value = row[key]
            if isinstance(value, str) and "####" in value:  # GSM8K: worked solution, then #### N
                value = value.rsplit("####", 1)[1].strip().replace(",", "")
            return clean_answer(value)
    return None


def examples_from_rows(rows, source: str, data_source: str) -> list[Example]:
    """Rows with a problem and an answer field (JSONL sets, hub datasets) -> examples."""
    examples = []
    for i, row in enumerate(rows):
        problem = next((row[k] for k in _PROBLEM_KEYS if isinstance(row.get(k), str)), None)
        answer = _answer_from_row(row)
        if problem is None or answer is None:
            missing = "problem" if problem is None else "answer"
            keys = _PROBLEM_KEYS if problem is None else _ANSWER_KEYS
            raise DataError(f"{source}: row {i} has no {missing} field; expected one of "
                            f"{', '.join(keys)} (found {', '.join(sorted(row))}).")
        ident = next((row[k] for k in _ID_KEYS if row.get(k) is not None), i)
        examples.append(Example(str(ident), dapo_prompt(problem), answer, data_source))
    return examples


def load_jsonl(path: str | Path, data_source: str | None = None) -> list[Example]:
    path = Path(path)
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(json.loads(line))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: line {n} is not JSON ({err.msg}); each line must be one "
                        f"JSON object.") from None
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror}); check the path.") from None
    return examples_from_rows(rows, str(path), data_source or path.stem)


# ---------------------------------------------------------------- hub datasets

def load_hub(name: str, split: str = "test", data_source: str | None = None) -> list[Example]:
    """A dataset through ``datasets.load_dataset`` (a hub id, or a local dataset directory)."""
    import datasets

    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as err:
        offline = " (the hub is not reachable from here)" if "Connection" in type(err).__name__ else ""
        raise DataError(f"{name}: cannot be loaded with datasets.load_dataset(split={split!r}) "
                        f"({type(err).__name__}{offline}); check the id and split, or download "
                        f"it where there is network (tools/get_data.py) and pass the file.") from None
    return examples_from_rows(rows, name, data_source or name.rstrip("/").split("/")[-1])


# ---------------------------------------------------------------- one entry point

def load_examples(spec: str, split: str = "train", data_dir: str | Path | None = None,
                  **builtin_kwargs) -> list[Example]:
    """Resolve ``spec`` to examples.

    ``spec`` is a built-in task (``arithmetic``, ``code``, ``logic``), a ``.parquet``/``.jsonl`` path, a name found
    as ``<data_dir>/<spec>.jsonl`` or ``.parquet`` (then under the shipped ``data/eval/``), or a
    Hugging Face dataset id. A spec that looks like a path but names no file stops here, so a
    mistyped path is never sent to the hub.
    """
    from megatron_rlep import tasks

    if spec in tasks.BUILTIN:
        return tasks.examples(spec, split=split, **builtin_kwargs)
    dirs = [Path(data_dir)] if data_dir is not None else []
    candidates = [Path(spec).expanduser()] + [d / f"{spec}{suffix}" for d in dirs + [EVAL_DIR]
                                              for suffix in (".jsonl", ".parquet")]
    for path in candidates:
        if path.is_file():
            if path.suffix == ".parquet":
                return load_parquet(path)
            if path.suffix in (".jsonl", ".json"):
                return load_jsonl(path)
            raise DataError(f"{path}: unknown file type '{path.suffix}'; use .parquet or .jsonl.")
    if looks_like_path(spec):
        raise DataError(f"dataset file {spec} does not exist (looked at {Path(spec).expanduser().resolve()}); "
                        f"check the path, which is relative to the directory the command runs "
                        f"in.")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return load_hub(spec, split=split)
    where = ", ".join(str(d) for d in dirs + [EVAL_DIR])
    raise DataError(f"dataset {spec!r} was not found as a file or as a name under {where}; pass "
                    f"a .parquet/.jsonl path, a name under data_dir, 'arithmetic', or a hub id.")


def looks_like_path(spec: str) -> bool:
    """A file suffix, a leading ``.``, ``/`` or ``~``, or a first part that is a local
    directory: meant as a file, not as a hub id."""
    first = spec.split("/", 1)[0]
    return (Path(spec).suffix in (".parquet", ".jsonl", ".json") or spec.startswith((".", "/", "~"))
            or ("/" in spec and Path(first).expanduser().is_dir()))
