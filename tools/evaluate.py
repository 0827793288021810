"""Evaluation: n sampled answers per held-out question, scored, with mean@n, pass@k and maj@k.

    python tools/evaluate.py model.path=RUN/hf datasets=[aime24,aime25,amc23] samples=32 \
        temperature=1.0 top_p=1.0 max_tokens=3072 out=DIR
    torchrun --nproc_per_node N tools/evaluate.py ...      # data-parallel ranks

Dataset names resolve to ``<data_dir>/<name>.jsonl`` or ``.parquet`` (``data_dir`` defaults to
$RLEP_EVAL_DIR), then to the sets shipped in ``data/eval/`` (aime24, aime25, amc23, math500),
to file paths, to hub ids, or to a built-in task's test split (``arithmetic``, ``code``, ``logic``). Questions are cut into units of ``chunk_size``; unit u is sampled
with seed (seed, u) by rank u mod N, so the samples do not depend on the number of ranks, and
is written atomically to ``DIR/parts/``; a rerun of the same command after a kill redoes only
missing units. Rank 0 then writes ``DIR/samples.jsonl`` (one line per sample: data_source, id,
sample_index, response, pred, correct, length, finished, ground_truth), ``DIR/metrics.json``
and ``DIR/metrics.md`` (megatron_rlep/metrics.py defines the numbers), and prints the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron_rlep import jobs, metrics  # noqa: E402
from megatron_rlep.builtin_model import resolve_model_path  # noqa: E402
from megatron_rlep.config import ConfigError, EvaluateConfig  # noqa: E402
from megatron_rlep.data import Example, load_examples  # noqa: E402
from megatron_rlep.files import write_json_atomic, write_text_atomic  # noqa: E402
from megatron_rlep.rollout import engine_kind, engine_prompt, make_engine  # noqa: E402
from megatron_rlep import tasks  # noqa: E402
from megatron_rlep.reward.scorer import Item, Scorer  # noqa: E402

ARITHMETIC_QUESTIONS = 64  # the built-in task's test questions when no limit is given
PROMPT_TOKENS = 1024  # prompt room in the engine's context (the trainer's data.max_prompt_length)


def load_datasets(cfg: EvaluateConfig) -> dict[str, list[tuple[str, Example]]]:
    """dataset name -> [(row id, example)], the first ``limit`` questions of each dataset. Row
    ids are the dataset's ids, or positions where its ids repeat. Rows are reported under each
    example's data source (the file's stem; a level of the built-in task)."""
    out, owner = {}, {}
    for name in cfg.datasets:
        kwargs = tasks.loader_kwargs(name, cfg.levels, cfg.limit or ARITHMETIC_QUESTIONS, cfg.seed,
                                     cfg.rollout.tool_format)
        examples = load_examples(name, "test", cfg.data_dir, **kwargs)[:cfg.limit]
        for source in {e.data_source for e in examples}:
            if owner.setdefault(source, name) != name:
                raise ConfigError(f"config key datasets: {owner[source]} and {name} both hold "
                                  f"data source {source!r}; give each dataset once.")
        ids = [e.id for e in examples]
        unique = len(set(ids)) == len(ids)
        out[name] = [(e.id if unique else str(i), e) for i, e in enumerate(examples)]
    return out


def units_of(datasets: dict, size: int) -> list[tuple[str, int]]:
    """(dataset, first question) of every unit, in dataset order."""
    return [(name, start) for name, items in datasets.items()
            for start in range(0, len(items), size)]


def settings(cfg: EvaluateConfig, model_path: str, datasets: dict, max_tokens: int) -> dict:
    questions = {name: hashlib.sha256("\n".join(i + "\x00" + e.question for i, e in items)
                                         .encode()).hexdigest() for name, items in datasets.items()}
    return {"model": model_path, "datasets": questions, "samples": cfg.samples,
            "temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": max_tokens,
            "seed": cfg.seed, "verifier": cfg.verifier.mode, "function": cfg.verifier.function,
            "chunk_size": cfg.chunk_size}


def sample_rows(items, completions, scorer: Scorer) -> list[dict]:
    scored = scorer.score([Item(ex.data_source, c.text, ex.ground_truth, ex.extra_info)
                           for (_, ex), group in zip(items, completions) for c in group])
    scorer.check(scored, f"{len(items)} questions")
    scores = iter(scored)
    rows = []
    for (ident, ex), group in zip(items, completions):
        for index, c in enumerate(group):
            score = next(scores)
            correct, pred = score.correct, score.pred
            rows.append({"data_source": ex.data_source, "id": ident, "sample_index": index,
                         "response": c.text, "pred": pred, "correct": bool(correct),
                         "length": len(c.token_ids), "finished": c.finished,
                         "ground_truth": ex.ground_truth,
                         **({"tool_calls": list(c.calls)} if c.mask else {})})
    return rows


def write_jsonl_atomic(rows: list[dict], path: Path) -> None:
    write_text_atomic("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), path)


def write_reports(rows: list[dict], out: Path) -> dict:
    """metrics.json and metrics.md of ``rows`` in ``out``; returns the metrics."""
    result = metrics.compute(rows)
    write_json_atomic(result, out / "metrics.json")
    write_text_atomic(metrics.markdown(result), out / "metrics.md")
    return result


def to_wandb(cfg: EvaluateConfig, result: dict, out: Path) -> None:
    """The metrics as a wandb run's summary, and the output files as an artifact."""
    from dataclasses import asdict

    import wandb

    from megatron_rlep.monitor import log_artifact

    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=cfg.logging.project, name=cfg.logging.name or f"eval-{out.name}",
                     config=asdict(cfg), dir=str(out), mode=cfg.logging.wandb, job_type="eval")
    for source, m in result.items():
        run.summary[f"eval/{source}/mean@{m['n']}"] = m["mean@n"]
        for kind in ("pass@k", "maj@k"):
            for k, value in m[kind].items():
                run.summary[f"eval/{source}/{kind[:-1]}{k}"] = value
    log_artifact(run, [out / n for n in ("metrics.json", "metrics.md", "samples.jsonl")],
                 f"eval-{out.name}", "evaluation")
    run.finish()


def evaluate(cfg: EvaluateConfig) -> dict | None:
    from tqdm.auto import tqdm

    from megatron_rlep import platform

    rank, world = jobs.start()
    out, parts = Path(cfg.out), Path(cfg.out) / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(cfg.model.path)
    max_tokens = cfg.max_tokens or cfg.rollout.max_response_length
    datasets = load_datasets(cfg)
    jobs.pin_settings(out / "eval.json", settings(cfg, model_path, datasets, max_tokens), rank)
    units = units_of(datasets, cfg.chunk_size)

    def part(u):
        return parts / f"unit-{u:05d}.jsonl"

    tp = cfg.rollout.tensor_parallel if engine_kind(cfg.rollout.engine) == "vllm" else 1
    share, shares, writes = jobs.engines(rank, world, tp)
    todo = jobs.my_units(len(units), share, shares, lambda u: part(u).is_file())
    verifier = Scorer(cfg.verifier, sandbox=cfg.sandbox)
    # built on every rank: a vLLM engine's start-up is collective under torchrun
    engine = make_engine(cfg.rollout, model_path, platform.compute_dtype(cfg.model.dtype),
                         cfg.seed, PROMPT_TOKENS + max_tokens, tensor_parallel=tp,
                         sandbox=cfg.sandbox)
    if rank == 0:
        print(f"{shares} engine(s) of tensor parallel size {tp} over {world} rank(s)", flush=True)
    bar = tqdm(total=sum(len(datasets[s][i:i + cfg.chunk_size]) for s, i in (units[u] for u in todo)),
               unit="question", desc=f"eval rank {rank}", disable=not cfg.progress,
               dynamic_ncols=True)
    samples = correct = 0
    start = time.perf_counter()
    for u in todo:
        name, first = units[u]
        items = datasets[name][first:first + cfg.chunk_size]
        prompts = [engine_prompt(engine, e.prompt, PROMPT_TOKENS) for _, e in items]
        completions = engine.generate(prompts, n=cfg.samples,
                                      temperature=cfg.temperature, top_p=cfg.top_p,
                                      max_tokens=max_tokens, seed=cfg.seed * 1000003 + u)
        rows = sample_rows(items, completions, verifier)
        if writes:  # the engine's other TP ranks sampled the same rows
            write_jsonl_atomic(rows, part(u))
        samples += len(rows)
        correct += sum(r["correct"] for r in rows)
        bar.set_postfix({"samples/s": f"{samples / (time.perf_counter() - start):.1f}",
                         "acc": f"{correct / max(samples, 1):.1%}"}, refresh=False)
        bar.update(len(items))
    bar.close()
    verifier.close()
    jobs.barrier()
    result = None
    if rank == 0:
        rows = [json.loads(line) for u in range(len(units))
                for line in part(u).read_text(encoding="utf-8").splitlines()]
        write_jsonl_atomic(rows, out / "samples.jsonl")
        result = write_reports(rows, out)
        print(metrics.markdown(result), end="")
        print(f"wrote {out / 'samples.jsonl'}, {out / 'metrics.json'}, {out / 'metrics.md'}")
        if cfg.logging.wandb != "disabled":
            to_wandb(cfg, result, out)
    jobs.barrier()
    return result


if __name__ == "__main__":
    from megatron_rlep.cli import hydra_entry

    hydra_entry(evaluate, "evaluate")
