"""Experience collection: sample answers per training question, verify them, keep the correct.

    python tools/build_pool.py model.path=RUN/hf data=... samples=64 temperature=0.7 \
        top_p=0.95 min_correct=2 out=DIR
    torchrun --nproc_per_node N tools/build_pool.py ...      # data-parallel ranks

Questions are cut into fixed shards of ``shard_size`` (in dataset order); shard k is sampled
with seed (seed, k) by rank k mod N, so the pool does not depend on the number of ranks. A shard
is written atomically as ``shard-XXXXX.parquet`` and then recorded by its sidecar
``shard-XXXXX.json`` (questions, counts, sha256). After a kill at any moment, rerunning the same
command redoes only shards without a valid sidecar: nothing is lost, duplicated or redone.
``manifest.json`` (schema version, model, sampling, verifier, counts, shard checksums) is written
last, by rank 0, once every shard is in. Settings are pinned in ``build.json``: a rerun with
different settings into the same directory is refused.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep.builtin_model import resolve_model_path  # noqa: E402
from megatron_rlep import jobs  # noqa: E402
from megatron_rlep.config import BuildPoolConfig  # noqa: E402
from megatron_rlep.data import Example, load_examples  # noqa: E402
from megatron_rlep.files import file_sha256, write_json_atomic  # noqa: E402
from megatron_rlep.pool import MANIFEST, SCHEMA_VERSION, pool_row, write_parquet_atomic  # noqa: E402
from megatron_rlep.rollout import engine_kind, engine_prompt, make_engine  # noqa: E402
from megatron_rlep.reward.scorer import Item, Scorer  # noqa: E402


def select(texts: list[str], lengths: list[int], limit: int | None, rule: str, key: str,
           seed: int) -> list[int]:
    """Indices of the answers to keep (all when ``limit`` is None)."""
    order = list(range(len(texts)))
    if limit is None or len(texts) <= limit:
        return order
    if rule == "shortest":
        return sorted(order, key=lambda i: (lengths[i], i))[:limit]
    if rule == "random":
        digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
        return sorted(random.Random(digest).sample(order, limit))
    # diverse: greedy farthest-first by word-set Jaccard distance, from the shortest answer
    words = [set(t.split()) for t in texts]
    chosen = [min(order, key=lambda i: (lengths[i], i))]
    while len(chosen) < limit:
        def nearest(i):
            return min(1 - len(words[i] & words[j]) / max(len(words[i] | words[j]), 1) for j in chosen)
        chosen.append(max((i for i in order if i not in chosen), key=lambda i: (nearest(i), -i)))
    return sorted(chosen)


def shard_rows(examples: list[Example], completions, scorer: Scorer, cfg: BuildPoolConfig):
    """Rows of the questions that keep at least ``min_correct`` verified answers (distinct ones
    with ``dedupe``; finished ones only with ``finished_only``: a replayed answer cut at the
    length limit would teach the policy to stop mid-sentence, EOS appended)."""
    rows, stats = [], {"samples": 0, "correct": 0, "unfinished_dropped": 0}
    scores = scorer.score([Item(ex.data_source, c.text, ex.ground_truth, ex.extra_info)
                           for ex, group in zip(examples, completions) for c in group])
    scorer.check(scores, f"the shard of {len(examples)} questions")
    verdicts = iter([score.correct for score in scores])
    for ex, group in zip(examples, completions):
        good = [c for c in group if next(verdicts)]
        stats["samples"] += len(group)
        stats["correct"] += len(good)
        if cfg.finished_only:
            stats["unfinished_dropped"] += sum(not c.finished for c in good)
            good = [c for c in good if c.finished]
        verified = {}  # key -> completion; with dedupe, exact duplicates share a key
        for i, c in enumerate(good):
            verified.setdefault(c.text if cfg.dedupe else i, c)
        if len(verified) < cfg.min_correct:
            continue
        kept = list(verified.values())
        keep = select([c.text for c in kept], [len(c.token_ids) for c in kept], cfg.max_keep,
                      cfg.keep, ex.question, cfg.seed)
        kept = [kept[i] for i in keep]
        rows.append(pool_row(ex, [c.text for c in kept], [len(c.token_ids) for c in kept],
                             len(good), len(group), [list(c.token_ids) for c in kept],
                             [list(c.logprobs) for c in kept],
                             [list(c.mask) for c in kept] if any(c.mask for c in kept) else None))
    return rows, stats


def settings(cfg: BuildPoolConfig, model_path: str, examples: list[Example]) -> dict:
    ids = hashlib.sha256("\n".join(e.id + "\x00" + e.question for e in examples).encode()).hexdigest()
    return {"model": model_path, "data": cfg.data.train, "split": cfg.split,
            "questions": len(examples), "questions_sha256": ids,
            "sampling": {"samples": cfg.samples, "temperature": cfg.temperature,
                         "top_p": cfg.top_p, "max_tokens": cfg.rollout.max_response_length,
                         "seed": cfg.seed},
            "verifier": cfg.verifier.mode, "function": cfg.verifier.function, "min_correct": cfg.min_correct, "dedupe": cfg.dedupe,
            "finished_only": cfg.finished_only, "tools": list(cfg.rollout.tools),
            "tool_format": cfg.rollout.tool_format if cfg.rollout.tools else None,
            "max_keep": cfg.max_keep, "keep": cfg.keep, "shard_size": cfg.shard_size}


def sample(engine, examples: list[Example], k: int, cfg: BuildPoolConfig):
    """Shard k's completions: ``samples`` per question, seeded by (seed, k)."""
    prompts = [engine_prompt(engine, e.prompt, cfg.data.max_prompt_length) for e in examples]
    return engine.generate(prompts, n=cfg.samples,
                           temperature=cfg.temperature, top_p=cfg.top_p,
                           max_tokens=cfg.rollout.max_response_length, seed=cfg.seed * 1000003 + k)


def build_shard(engine, examples: list[Example], k: int, out: Path, verifier: Scorer,
                cfg: BuildPoolConfig, writes: bool = True) -> dict:
    """Sample, verify and write shard k (parquet, then its sidecar); returns its counts. The
    other TP ranks of an engine (``writes`` false) sample with it and write nothing."""
    completions = sample(engine, examples, k, cfg)
    if not writes:
        return shard_rows(examples, completions, verifier, cfg)[1]
    return write_shard(examples, completions, k, out, verifier, cfg)


def write_shard(examples: list[Example], completions, k: int, out: Path, verifier: Scorer,
                cfg: BuildPoolConfig) -> dict:
    """Verify, select and write shard k from its completions."""
    rows, stats = shard_rows(examples, completions, verifier, cfg)
    digest = write_parquet_atomic(rows, out / f"shard-{k:05d}.parquet")
    write_json_atomic({"file": f"shard-{k:05d}.parquet", "sha256": digest,
                       "questions": [e.id for e in examples], "kept": len(rows),
                       "trajectories": sum(len(r["reward_model"]["candidates"]) for r in rows),
                       **stats}, out / f"shard-{k:05d}.json")
    return stats


def shard_done(out: Path, k: int) -> bool:
    sidecar, shard = out / f"shard-{k:05d}.json", out / f"shard-{k:05d}.parquet"
    if not (sidecar.is_file() and shard.is_file()):
        return False
    return json.loads(sidecar.read_text())["sha256"] == file_sha256(shard)


def build(cfg: BuildPoolConfig) -> None:
    from tqdm.auto import tqdm

    from megatron_rlep import platform

    rank, world = jobs.start()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(cfg.model.path)
    from megatron_rlep import tasks

    n = cfg.data.train_size if cfg.split == "train" else cfg.data.eval_size
    examples = load_examples(cfg.data.train, cfg.split, cfg.data.data_dir,
                             **tasks.loader_kwargs(cfg.data.train, cfg.data.levels, n, cfg.seed,
                                                   cfg.rollout.tool_format))
    wanted = settings(cfg, model_path, examples)
    jobs.pin_settings(out / "build.json", wanted, rank)
    shards = [examples[i:i + cfg.shard_size] for i in range(0, len(examples), cfg.shard_size)]
    tp = cfg.rollout.tensor_parallel if engine_kind(cfg.rollout.engine) == "vllm" else 1
    share, shares, writes = jobs.engines(rank, world, tp)
    todo = jobs.my_units(len(shards), share, shares, lambda k: shard_done(out, k))

    verifier = Scorer(cfg.verifier, sandbox=cfg.sandbox)
    # built on every rank: a vLLM engine's start-up is collective under torchrun, so a rank
    # without shards to do still takes part
    engine = make_engine(cfg.rollout, model_path, platform.compute_dtype(cfg.model.dtype), cfg.seed,
                         cfg.data.max_prompt_length + cfg.rollout.max_response_length,
                         tensor_parallel=tp, sandbox=cfg.sandbox)
    if rank == 0:
        print(f"{shares} engine(s) of tensor parallel size {tp} over {world} rank(s)", flush=True)
    bar = tqdm(total=sum(len(shards[k]) for k in todo), unit="question", desc=f"pool rank {rank}",
               disable=not cfg.progress, dynamic_ncols=True)
    seen = correct = samples = 0
    start = time.perf_counter()
    for k in todo:
        stats = build_shard(engine, shards[k], k, out, verifier, cfg, writes)
        seen += len(shards[k])
        correct += stats["correct"]
        samples += stats["samples"]
        elapsed = time.perf_counter() - start
        bar.set_postfix({"samples/s": f"{samples / elapsed:.1f}",
                         "pass": f"{correct / max(samples, 1):.1%}"}, refresh=False)
        bar.update(len(shards[k]))
    bar.close()
    verifier.close()
    jobs.barrier()
    if rank == 0:
        write_manifest(out, wanted, len(shards))
    jobs.barrier()


def write_manifest(out: Path, wanted: dict, n_shards: int) -> None:
    entries = []
    for k in range(n_shards):
        if not shard_done(out, k):
            raise RuntimeError(f"shard {k} of {out} is missing after every rank finished")
        entries.append(json.loads((out / f"shard-{k:05d}.json").read_text()))
    totals = {key: sum(e.get(key, 0) for e in entries)
              for key in ("kept", "trajectories", "samples", "correct", "unfinished_dropped")}
    write_json_atomic({
        "schema_version": SCHEMA_VERSION, **wanted,
        "counts": {"questions_seen": sum(len(e["questions"]) for e in entries),
                   "questions_kept": totals["kept"], "trajectories": totals["trajectories"],
                   "samples": totals["samples"], "verified_samples": totals["correct"],
                   "verified_unfinished_dropped": totals["unfinished_dropped"]},
        "shards": [{"file": e["file"], "sha256": e["sha256"], "questions": len(e["questions"]),
                    "kept": e["kept"], "trajectories": e["trajectories"]} for e in entries],
    }, out / MANIFEST)


if __name__ == "__main__":
    from megatron_rlep.cli import hydra_entry

    hydra_entry(build, "build_pool")
