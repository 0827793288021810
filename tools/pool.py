"""Inspect and reshape experience pools (a pool directory or an RLEP release parquet).

    python tools/pool.py stats POOL [--json] [--plot FILE.png] [--verify dapo|math]
    python tools/pool.py show POOL --id X
    python tools/pool.py merge A B [C ...] -o OUT
    python tools/pool.py filter POOL -o OUT [--min-correct K] [--max-tokens N] [--verify MODE]
    python tools/pool.py import-release FILE.parquet -o DIR [--tokenizer MODEL]
    python tools/pool.py export-release POOL -o FILE.parquet

Outputs are written all or nothing and never over an existing path. Pools are checked on
load (megatron_rlep/pool.py); a problem ends in one sentence on stderr with exit status 2. A
pool directory without its manifest (a build that has not finished) is refused unless
``--partial`` comes before the command (``tools/pool.py --partial stats DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep.config import VERIFIER_MODES  # noqa: E402
from megatron_rlep.data import DataError  # noqa: E402
from megatron_rlep.files import file_sha256, temporary_beside  # noqa: E402
from megatron_rlep.pool import (PER_CANDIDATE, check_rows, keep_candidates,  # noqa: E402
                                read_rows, row_id, row_key, verify_rows, write_pool)


def candidates(row: dict) -> list[str]:
    return row["reward_model"]["candidates"]


# ----------------------------------------------------------------------------- stats / show

def pool_stats(rows: list[dict]) -> dict:
    counts = [len(candidates(r)) for r in rows]
    rates = [r["pass_rate"] for r in rows if r.get("pass_rate") is not None]
    lengths = [n for r in rows for n in (r.get("candidate_lengths") or [])]
    return {"questions": len(rows), "trajectories": sum(counts),
            "candidates_per_question": {"min": min(counts, default=0),
                                        "median": statistics.median(counts) if counts else 0,
                                        "max": max(counts, default=0)},
            "mean_pass_rate": sum(rates) / len(rates) if rates else None,
            "mean_candidate_tokens": sum(lengths) / len(lengths) if lengths else None,
            "questions_without_candidates": counts.count(0),
            "data_sources": dict(Counter(r["data_source"] for r in rows).most_common())}


def plot_stats(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["pass_rate"] for r in rows if r.get("pass_rate") is not None]
    fig, axes = plt.subplots(1, 2 if rates else 1, figsize=(10 if rates else 5, 3.6), squeeze=False)
    counts = [len(candidates(r)) for r in rows]
    axes[0][0].hist(counts, bins=range(0, max(counts, default=0) + 2), color="#4c72b0")
    axes[0][0].set(xlabel="candidates per question", ylabel="questions")
    if rates:
        axes[0][1].hist(rates, bins=20, range=(0, 1), color="#55a868")
        axes[0][1].set(xlabel="pass rate when sampled", ylabel="questions")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = temporary_beside(path)
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)


def cmd_stats(args) -> None:
    rows = read_rows(args.pool, args.partial)
    stats = pool_stats(rows)
    if args.verify:
        stats["rejected_candidates"] = verify(rows, args.verify, drop=False, function=args.function)[1]
    if args.plot:
        plot_stats(rows, args.plot, str(args.pool))
    if args.json:
        print(json.dumps(stats, indent=1))
        return
    c = stats["candidates_per_question"]
    print(f"{args.pool}: {stats['questions']} questions, {stats['trajectories']} trajectories; "
          f"candidates per question min {c['min']} / median {c['median']} / max {c['max']}")
    if stats["mean_pass_rate"] is not None:
        print(f"mean pass rate when sampled: {stats['mean_pass_rate']:.3f}")
    if stats["mean_candidate_tokens"] is not None:
        print(f"mean candidate length: {stats['mean_candidate_tokens']:.1f} tokens")
    if "rejected_candidates" in stats:
        print(f"candidates the {args.verify} verifier rejects: {stats['rejected_candidates']}")


def cmd_show(args) -> None:
    rows = read_rows(args.pool, args.partial)
    found = [r for i, r in enumerate(rows) if row_id(r, i) == args.id]
    if not found:
        some = ", ".join(row_id(r, i) for i, r in enumerate(rows[:5]))
        raise DataError(f"{args.pool} has no question with id {args.id!r}; ids look like {some}")
    for row in found:
        print(json.dumps({"id": args.id, "data_source": row["data_source"],
                          "question": row_key(row),
                          "ground_truth": row["reward_model"]["ground_truth"],
                          "pass_rate": row.get("pass_rate"), "samples": row.get("samples"),
                          "candidate_lengths": row.get("candidate_lengths"),
                          "candidates": candidates(row)}, indent=1, ensure_ascii=False))


# ----------------------------------------------------------------------------- reshaping

def verify(rows, mode: str, drop: bool, function: str | None = None):
    from megatron_rlep.reward.scorer import Scorer, settings

    verifier = Scorer(settings(mode, function=function))
    try:
        return verify_rows(rows, verifier, drop)
    finally:
        verifier.close()


def merge_rows(pools: list[tuple[str, list[dict]]]) -> list[dict]:
    """Union per question (matched by prompt text): candidates deduplicated in order, pass
    rates weighted by samples where both pools have them."""
    merged: dict[str, tuple[str, dict]] = {}
    for name, rows in pools:
        for row in rows:
            key = row_key(row)
            if key not in merged:
                merged[key] = (name, row)
                continue
            first_name, first = merged[key]
            truths = first["reward_model"]["ground_truth"], row["reward_model"]["ground_truth"]
            if truths[0] != truths[1]:
                raise DataError(f"question {row_id(row, 0)} has ground truth {truths[0]!r} in "
                                f"{first_name} and {truths[1]!r} in {name}; fix one pool before "
                                "merging")
            merged[key] = (first_name, combine(first, row))
    return [row for _, row in merged.values()]


def combine(a: dict, b: dict) -> dict:
    texts = list(dict.fromkeys(candidates(a) + candidates(b)))
    columns = {}
    for column in PER_CANDIDATE:  # kept where both pools have the column
        columns[column] = None
        if a.get(column) is not None and b.get(column) is not None:
            known = dict(zip(candidates(b), b[column]))
            known.update(zip(candidates(a), a[column]))
            columns[column] = [known[t] for t in texts]
    rate = samples = None
    if a.get("samples") and b.get("samples") and a.get("pass_rate") is not None \
            and b.get("pass_rate") is not None:
        samples = a["samples"] + b["samples"]
        rate = (a["pass_rate"] * a["samples"] + b["pass_rate"] * b["samples"]) / samples
    return {**a, "reward_model": {**a["reward_model"], "candidates": texts}, **columns,
            "pass_rate": rate, "samples": samples}


def measure(rows: list[dict], tokenizer_name: str) -> list[dict]:
    """Rows with candidate lengths in tokens of ``tokenizer_name`` (end-of-sequence included,
    as tools/build_pool.py counts them)."""
    from transformers import AutoTokenizer

    from megatron_rlep.builtin_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tokenizer_name))
    return [{**r, "candidate_lengths": [len(ids) + 1 for ids in tokenizer(
        candidates(r), add_special_tokens=False)["input_ids"]] if candidates(r) else []}
        for r in rows]


def filter_rows(rows: list[dict], min_correct: int, max_tokens: int | None, source) -> list[dict]:
    out = []
    for position, row in enumerate(rows):
        if row["reward_model"]["ground_truth"] in (None, "") or not row["prompt"]:
            continue
        if max_tokens is not None:
            lengths = row.get("candidate_lengths")
            if lengths is None:
                raise DataError(f"{source}: question {row_id(row, position)} has no candidate "
                                "lengths (an imported release); give --tokenizer MODEL to "
                                "measure them")
            row = keep_candidates(row, [i for i, n in enumerate(lengths) if n <= max_tokens])
        if len(candidates(row)) >= min_correct:
            out.append(row)
    return out


def cmd_merge(args) -> None:
    pools = [(str(p), check_rows(read_rows(p, args.partial), p)) for p in args.pools]
    rows = merge_rows(pools)
    write_pool(rows, args.output, {"merged": [str(p) for p in args.pools]}, args.shard_size)
    print(f"{args.output}: {len(rows)} questions from {len(pools)} pools")


def cmd_filter(args) -> None:
    rows = read_rows(args.pool, args.partial)
    if args.tokenizer:
        rows = measure(rows, args.tokenizer)
    before = (len(rows), sum(len(candidates(r)) for r in rows))
    if args.verify:
        rows = verify(rows, args.verify, drop=True, function=args.function)[0]
    rows = filter_rows(rows, args.min_correct, args.max_tokens, args.pool)
    origin = {"filtered": str(args.pool), "min_correct": args.min_correct,
              "max_tokens": args.max_tokens, "verify": args.verify}
    write_pool(rows, args.output, origin, args.shard_size)
    print(f"{args.output}: kept {len(rows)} of {before[0]} questions and "
          f"{sum(len(candidates(r)) for r in rows)} of {before[1]} candidates")


def cmd_import(args) -> None:
    rows = check_rows(read_rows(args.release, args.partial), args.release)
    if args.tokenizer:
        rows = measure(rows, args.tokenizer)
    write_pool(rows, args.output, {"release": str(args.release),
                                   "sha256": file_sha256(args.release)}, args.shard_size)
    print(f"{args.output}: imported {len(rows)} questions from {args.release}")


def cmd_export(args) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if args.output.exists():
        raise DataError(f"{args.output} already exists; give a new -o or remove it first")
    rows = [{"data_source": r["data_source"], "prompt": r["prompt"], "ability": r["ability"],
             "reward_model": r["reward_model"], "extra_info": json.loads(r["extra_info_json"])}
            for r in check_rows(read_rows(args.pool, args.partial), args.pool)]
    tmp = temporary_beside(args.output)
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, args.output)
    print(f"{args.output}: {len(rows)} questions in the RLEP release format")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partial", action="store_true",
                        help="read a pool directory whose build has not finished (no manifest)")
    sub = parser.add_subparsers(dest="command", required=True)
    stats = sub.add_parser("stats", help="counts, pass rates and lengths of a pool")
    stats.add_argument("pool", type=Path)
    stats.add_argument("--json", action="store_true")
    stats.add_argument("--plot", type=Path, help="PNG with histograms of the pool")
    stats.add_argument("--verify", choices=VERIFIER_MODES, help="count rejected candidates")
    stats.add_argument("--function", help="--verify custom: the reward function, FILE.py:NAME")
    show = sub.add_parser("show", help="one question with its candidates")
    show.add_argument("pool", type=Path)
    show.add_argument("--id", required=True)
    for name, help_text in (("merge", "union of pools, per question"),
                            ("filter", "drop candidates and questions"),
                            ("import-release", "RLEP release parquet -> pool directory"),
                            ("export-release", "pool -> RLEP release parquet")):
        p = sub.add_parser(name, help=help_text)
        if name == "merge":
            p.add_argument("pools", type=Path, nargs="+")
        else:
            p.add_argument("release" if name == "import-release" else "pool", type=Path)
        p.add_argument("-o", "--output", type=Path, required=True)
        p.add_argument("--shard-size", type=int, default=256)
        if name in ("filter", "import-release"):
            p.add_argument("--tokenizer", help="measure candidate lengths with this model's "
                                               "tokenizer (a built-in name or a directory)")
        if name == "filter":
            p.add_argument("--min-correct", type=int, default=1)
            p.add_argument("--max-tokens", type=int, default=None)
            p.add_argument("--verify", choices=VERIFIER_MODES,
                           help="drop candidates this verifier rejects")
            p.add_argument("--function", help="--verify custom: the reward function, FILE.py:NAME")
    args = parser.parse_args(argv)
    if (getattr(args, "verify", None) == "custom") != bool(getattr(args, "function", None)):
        parser.error("give --verify custom and --function FILE.py:NAME together")
    return args


COMMANDS = {"stats": cmd_stats, "show": cmd_show, "merge": cmd_merge, "filter": cmd_filter,
            "import-release": cmd_import, "export-release": cmd_export}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
