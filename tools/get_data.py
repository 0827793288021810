"""Download the paper's model and data from the Hugging Face Hub, check them, and say how to use
them.

    python tools/get_data.py qwen2.5-math-7b dapo-math-17k [rlep-pool] --out /shared/rlep \
        [--revision NAME=COMMIT ...]

Each asset is fetched with ``huggingface_hub.snapshot_download`` into ``OUT/.hf-cache`` (a
killed download resumes; files already there are not fetched again) and linked as
``OUT/<asset>`` (``ASSETS``). Every asset is checked the way the trainer will read it (the model's
config and tokenizer load and its family is one the actor maps; the DAPO file reads as a
verl/DAPO parquet, its repeated prompts counted; the release pool has its answers), and
``OUT/<asset>.source.json`` records the repository, the revision asked for, the commit the hub
resolved it to, and every file's size: pass that commit with ``--revision`` on the next machine
to get the same bytes. The last lines are the ``export`` lines the paper presets read.

Revisions default to ``main`` because the project's build machine cannot reach the hub to read
commit hashes; the first download records the commit, and ``--revision`` pins it from then on.
On a machine without network the command reads what the cache holds (``HF_HUB_OFFLINE=1``), so
``OUT`` may be filled elsewhere and copied. The evaluation sets need no download: they ship in
``data/eval/`` (sources and licences in ``data/eval/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass(frozen=True)
class Asset:
    repo: str
    kind: str  # model | dataset
    patterns: tuple[str, ...]  # the files fetched
    env: str  # the variable the presets read
    what: str


ASSETS = {
    "qwen2.5-math-7b": Asset("Qwen/Qwen2.5-Math-7B", "model",
                             ("*.json", "*.safetensors", "*.txt", "tokenizer*", "*.model"),
                             "QWEN_MATH_7B", "the paper's base model (15 GB)"),
    "qwen3-8b": Asset("Qwen/Qwen3-8B", "model", ("*.json", "*.safetensors", "*.txt", "tokenizer*"),
                      "QWEN3_8B", "Qwen3-8B, dense (16 GB)"),
    "qwen3-30b-a3b": Asset("Qwen/Qwen3-30B-A3B", "model",
                           ("*.json", "*.safetensors", "*.txt", "tokenizer*"), "QWEN3_30B_A3B",
                           "Qwen3-30B-A3B, 128 experts (61 GB)"),
    "llama-3.1-8b": Asset("meta-llama/Llama-3.1-8B", "model",
                          ("*.json", "*.safetensors", "tokenizer*"), "LLAMA_31_8B",
                          "Llama-3.1-8B (16 GB; a gated repository: accept its licence on the "
                          "hub and log in with huggingface-cli first)"),
    "dapo-math-17k": Asset("BytedTsinghua-SIA/DAPO-Math-17k", "dataset", ("*.parquet",),
                           "DAPO_MATH_17K", "the paper's training set (about 17k questions)"),
    "rlep-pool": Asset("Kwai-Klear/RLEP_dataset", "dataset", ("*.parquet",), "RLEP_POOL",
                       "the RLEP authors' released experience pool"),
}


def fetch(asset: Asset, revision: str, cache: Path) -> Path:
    """The snapshot directory of ``asset`` at ``revision`` (named after the resolved commit)."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(asset.repo, repo_type=asset.kind, revision=revision,
                                  cache_dir=str(cache), allow_patterns=list(asset.patterns)))


def check(name: str, snapshot: Path) -> tuple[Path, str]:
    """(the path the trainer reads, a line saying what it holds); stops on anything it cannot
    read, in one sentence."""
    if ASSETS[name].kind == "model":
        from transformers import AutoConfig, AutoTokenizer

        from megatron_rlep.actor.hf import family, unsupported

        config = AutoConfig.from_pretrained(snapshot)
        family(config)  # a family the actor cannot map stops here, naming it
        if problem := unsupported(config):
            raise SystemExit(f"error: {snapshot}: {config.model_type}: {problem}")
        AutoTokenizer.from_pretrained(snapshot)
        shards = sorted(snapshot.glob("*.safetensors"))
        if not shards:
            raise SystemExit(f"error: {snapshot} holds no *.safetensors weights; the download is "
                             "incomplete, run the same command again to resume it")
        size = sum(p.stat().st_size for p in shards) / 2**30
        return snapshot, (f"{config.model_type}, {config.num_hidden_layers} layers, hidden "
                          f"{config.hidden_size}, {len(shards)} weight files, {size:.1f} GiB")
    import pyarrow.parquet as pq

    from megatron_rlep.data import load_parquet

    files = sorted(snapshot.rglob("*.parquet"))
    def is_pool(path):
        schema = pq.read_schema(path)
        return "reward_model" in schema.names and "candidates" in str(schema.field("reward_model").type)

    pools = [p for p in files if is_pool(p)]
    if name == "rlep-pool":
        if not pools:
            raise SystemExit(f"error: no parquet file under {snapshot} has "
                             "reward_model.candidates; this is not the RLEP release pool")
        table = pq.read_table(pools[0], columns=["reward_model"])
        answers = sum(len(r["candidates"] or ()) for r in table.column("reward_model").to_pylist())
        return pools[0], f"{table.num_rows} questions, {answers} verified answers"
    if not files:
        raise SystemExit(f"error: {snapshot} holds no parquet file; the download is incomplete, "
                         "run the same command again to resume it")
    rows = pq.read_metadata(files[0]).num_rows
    examples = load_parquet(files[0])
    return files[0], (f"{rows} rows, {len(examples)} distinct questions (repeats are dropped on "
                      "load)")


def source_record(name: str, revision: str, snapshot: Path, path: Path) -> dict:
    asset = ASSETS[name]
    files = sorted(p for p in snapshot.rglob("*") if p.is_file())
    return {"asset": name, "repo": asset.repo, "kind": asset.kind, "revision": revision,
            "commit": snapshot.name, "path": str(path),
            "files": {str(p.relative_to(snapshot)): p.stat().st_size for p in files}}


def link(target: Path, at: Path) -> None:
    """``at`` -> ``target``, replacing an older link (never a real file or directory)."""
    if at.is_symlink():
        at.unlink()
    elif at.exists():
        raise SystemExit(f"error: {at} exists and is not a link this tool made; move it away or "
                         "choose another --out")
    at.symlink_to(os.path.relpath(target, at.parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="assets:\n" + "\n".join(
                                         f"  {n:<16} {a.repo} ({a.what})" for n, a in ASSETS.items()))
    parser.add_argument("assets", nargs="+", metavar="ASSET")
    parser.add_argument("--out", type=Path, required=True, help="where the assets are linked")
    parser.add_argument("--revision", action="append", default=[], metavar="ASSET=REV",
                        help="a commit, tag or branch per asset (default: main)")
    args = parser.parse_args(argv)
    unknown = [a for a in args.assets if a not in ASSETS]
    if unknown:
        parser.error(f"unknown asset {', '.join(unknown)}; the assets are {', '.join(ASSETS)}")
    revisions = dict(r.split("=", 1) for r in args.revision if "=" in r)
    bad = [r for r in args.revision if "=" not in r or r.split("=", 1)[0] not in ASSETS]
    if bad:
        parser.error(f"--revision {bad[0]} is not ASSET=REV with one of {', '.join(ASSETS)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    exports = []
    for name in args.assets:
        asset, revision = ASSETS[name], revisions.get(name, "main")
        print(f"{name}: {asset.repo}@{revision} ({asset.kind}) ...", flush=True)
        try:
            snapshot = fetch(asset, revision, out / ".hf-cache")
        except Exception as err:  # noqa: BLE001 - the hub's errors are many; say which and stop
            print(f"error: {name} could not be fetched from {asset.repo}@{revision} "
                  f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                  "check the network or HF_TOKEN, or fill --out on a machine that has network "
                  "and copy it here", file=sys.stderr)
            return 2
        path, summary = check(name, snapshot)
        at = out / (name if path.is_dir() else f"{name}{path.suffix}")
        link(path, at)
        record = source_record(name, revision, snapshot, at)
        (out / f"{name}.source.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: {at} -> commit {snapshot.name}: {summary}", flush=True)
        exports.append(f"{asset.env}={at}")
    print("export " + " ".join(exports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
