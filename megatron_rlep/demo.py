"""The two-phase method on one machine: DAPO baseline -> experience pool -> RLEP -> evaluation
-> report.

    python -m megatron_rlep.demo [seed=1] [out=runs/demo] [replay_per_prompt=2] \
        [experiment=cpu_demo] [task=arithmetic|calculator|chain|code|logic] \
        [algorithm.total_steps=12 ...]

The demo's own keys are those of ``DemoConfig`` (megatron_rlep/config.py); every other
``key=value`` is a training override given to both runs. ``task=code`` (or ``logic``, and
``calculator`` or ``chain`` with a Python tool) runs it on another built-in task, with the preset
``<experiment>_<task>`` (its levels, response length, reward and tools:
``conf/experiment/cpu_demo_code.yaml``, ``cpu_demo_logic.yaml``, ...).

1. the baseline: ``python -m megatron_rlep.train experiment=<experiment>`` with M = 0;
2. the pool: ``tools/build_pool.py`` samples ``pool_samples`` answers per training question from
   the baseline's final policy and keeps questions with ``min_correct`` verified answers;
3. RLEP: the same preset, seed and overrides, from the base model, with M = ``replay_per_prompt``
   and that pool;
4. ``tools/evaluate.py`` on the held-out questions the runs validated on, for both final policies;
5. ``tools/plot.py`` and ``tools/pool.py stats`` draw ``curves.png`` and ``pool.png``; the report
   (``report.md``, ``report.json``) is put together from the runs' ``metrics.jsonl``, the
   evaluations' ``metrics.json`` and the pool statistics.

``compare=matched`` adds a compute-matched control after RLEP: DAPO with G + M fresh rollouts per
prompt (RLEP's group size and sequences per step, no pool), evaluated like the others; the
report then compares RLEP with it as it compares RLEP with the baseline.

Each stage is the project's own command in a child process (the same commands slurm/pipeline.sh
chains on a cluster); its output goes to ``OUT/logs/<stage>.log`` and a live bar follows its
files. A finished stage is recorded in ``OUT/stages.json`` and not redone when the same command
runs again; a stage cut short resumes, since every command here resumes. The settings are
pinned in ``OUT/demo.json``: a rerun with others into the same ``out`` is refused.

This module only orchestrates and reports; it trains, samples and scores nothing itself.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

from megatron_rlep import jobs, paired, tasks
from megatron_rlep.config import Config, ConfigError, DemoConfig, compose
from megatron_rlep.files import write_json_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("baseline", "rlep")
POOL_SHARD = 8  # questions per pool shard: the pool stage's unit of progress and resuming
EVAL_CHUNK = 32  # questions per evaluation unit (larger batches generate faster)


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the demo's own overrides, the training overrides) of a command line."""
    own = {f.name for f in fields(DemoConfig)}
    mine = [a for a in argv if a.split("=", 1)[0].lstrip("+~") in own]
    return mine, [a for a in argv if a not in mine]


def runs_of(cfg: DemoConfig) -> tuple[str, ...]:
    """The training runs: baseline and RLEP, and the compute-matched control when asked."""
    return RUNS + (("matched",) if cfg.compare == "matched" else ())


def training_overrides(cfg: DemoConfig, extra: list[str], run: str, out: Path,
                       group: int | None = None) -> list[str]:
    """The trainer's command line for ``run``: the shared preset and overrides, then what tells
    the runs apart (M and the pool; for ``matched``, ``group`` = G + M fresh rollouts)."""
    shared = [f"experiment={preset(cfg)}", f"seed={cfg.seed}", *extra,
              f"logging.wandb={cfg.wandb}", "logging.progress=false", f"run_dir={out / run}"]
    if run == "baseline":
        return shared + ["algorithm.replay_per_prompt=0"]
    if run == "matched":
        return shared + ["algorithm.replay_per_prompt=0", f"algorithm.rollouts_per_prompt={group}"]
    return shared + ["algorithm.name=rlep", f"algorithm.replay_per_prompt={cfg.replay_per_prompt}",
                     f"algorithm.pool={pool_dir(cfg, out)}"]


def pool_dir(cfg: DemoConfig, out: Path) -> Path:
    """The pool RLEP replays: the demo's own (built from its baseline) or ``pool``."""
    return Path(cfg.pool).resolve() if cfg.pool else out / "pool"


def preset(cfg: DemoConfig) -> str:
    """The training preset: ``experiment`` for the arithmetic task, ``<experiment>_<task>``
    (``conf/experiment/cpu_demo_code.yaml``) for another built-in task."""
    return cfg.experiment if cfg.task == "arithmetic" else f"{cfg.experiment}_{cfg.task}"


def verifier_arguments(train: Config) -> list[str]:
    """The training run's reward as the pool and evaluation tools take it."""
    v = train.verifier
    return [f"verifier={v.mode}", f"verifier.math_rule={v.math_rule}"] + \
        ([f"verifier.function={v.function}"] if v.function else [])


def _listing(values) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


@dataclass
class Stage:
    """One child command, and how far it got: ``count()`` of ``total`` units, read off its files."""
    name: str
    title: str
    argv: list[str]
    total: int
    unit: str
    count: Callable[[], int]


def _sizes(train: Config) -> tuple[int, list[int]]:
    """(training questions, questions of each held-out set) as the trainer will load them."""
    from megatron_rlep.data import load_examples

    from megatron_rlep import tasks

    data = train.data
    if data.train in tasks.BUILTIN:
        return data.train_size, [data.eval_size] * len(data.eval)
    return (len(load_examples(data.train, "train", data.data_dir)),
            [len(load_examples(name, "test", data.data_dir)) for name in data.eval])


def tool_arguments(rollout) -> list[str]:
    """The training runs' tools, for the pool build and the evaluations (none without)."""
    if not rollout.tools:
        return []
    return [f"rollout.tools={_listing(rollout.tools)}", f"rollout.max_turns={rollout.max_turns}",
            f"rollout.tool_timeout_s={rollout.tool_timeout_s}",
            f"rollout.tool_output_chars={rollout.tool_output_chars}",
            f"rollout.tool_workers={rollout.tool_workers}"]


def plan(cfg: DemoConfig, extra: list[str], train: Config, out: Path) -> list[Stage]:
    """The five stages, with pool and evaluation settings read off the training config so they
    sample the same questions at the same response limit."""
    py = sys.executable
    data, rollout = train.data, train.rollout
    n_train, n_eval = _sizes(train)
    task = [f"data.data_dir={data.data_dir}"] if data.data_dir else []
    pool_argv = [py, str(ROOT / "tools" / "build_pool.py"), f"model.path={out / 'baseline' / 'hf'}",
                 f"data.train={data.train}", f"data.levels={_listing(data.levels)}",
                 f"data.train_size={data.train_size}", *task, f"samples={cfg.pool_samples}",
                 f"temperature={cfg.pool_temperature}", f"top_p={cfg.pool_top_p}",
                 f"min_correct={cfg.min_correct}", f"dedupe={cfg.pool_dedupe}",
                 f"rollout.engine={rollout.engine}",
                 f"rollout.max_response_length={rollout.max_response_length}",
                 f"rollout.batch_size={rollout.batch_size}", *verifier_arguments(train),
                 *tool_arguments(rollout),
                 f"seed={cfg.seed}", f"shard_size={POOL_SHARD}", f"out={out / 'pool'}",
                 "progress=false"]

    def eval_argv(run):
        return [py, str(ROOT / "tools" / "evaluate.py"), f"model.path={out / run / 'hf'}",
                f"datasets={_listing(data.eval)}", f"levels={_listing(data.levels)}",
                f"limit={max(n_eval)}", *([f"data_dir={data.data_dir}"] if data.data_dir else []),
                f"samples={cfg.eval_samples}", f"temperature={rollout.temperature}",
                f"top_p={rollout.top_p}", f"max_tokens={rollout.max_response_length}",
                f"rollout.engine={rollout.engine}", f"rollout.batch_size={rollout.batch_size}",
                *verifier_arguments(train), *tool_arguments(rollout), f"seed={cfg.seed}",
                f"chunk_size={EVAL_CHUNK}",
                f"out={out / ('eval-' + run)}", f"logging.wandb={cfg.wandb}", "progress=false"]

    steps, group = train.algorithm.total_steps, train.algorithm.rollouts_per_prompt
    units = sum(math.ceil(n / EVAL_CHUNK) for n in n_eval)

    # disaggregated placement (docs/training.md): one learner and the rollout ranks, torchrun's
    launch = [py] if rollout.placement != "disaggregated" else \
        [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(1 + rollout.ranks)]

    def training(run, title):
        argv = training_overrides(cfg, extra, run, out, group + cfg.replay_per_prompt)
        return Stage(run, title, [*launch, "-m", "megatron_rlep.train", *argv], steps, "step",
                     lambda: _steps_logged(out / run))

    matched = [training("matched", f"compute-matched DAPO, G={group + cfg.replay_per_prompt} "
                        f"fresh rollouts, {steps} steps")] if cfg.compare == "matched" else []
    build = [] if cfg.pool else [
        Stage("pool", f"experience pool, {cfg.pool_samples} samples per training question",
              pool_argv, math.ceil(n_train / POOL_SHARD), "shard",
              lambda: len(list((out / "pool").glob("shard-*.json"))))]
    return [
        training("baseline", f"DAPO baseline, M=0, {steps} steps"),
        *build,
        training("rlep", f"RLEP from the base model, M={cfg.replay_per_prompt}, {steps} steps"),
        *matched,
        *(Stage(f"eval-{run}", f"evaluation of the {run} policy, {cfg.eval_samples} samples "
                f"per held-out question", eval_argv(run), units, "unit",
                lambda run=run: len(list((out / f"eval-{run}" / "parts").glob("unit-*.jsonl"))))
          for run in runs_of(cfg)),
    ]


def _logged(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl (none before it exists)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _average(records: list[dict], key: str) -> float:
    """The mean of ``key`` over the records that logged it (0 when none did)."""
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else 0.0


def _steps_logged(run_dir: Path) -> int:
    return len({r["step"] for r in _logged(run_dir) if "time/step_s" in r})


class Interrupted(Exception):
    pass


def run_stage(stage: Stage, log: Path, index: int, count: int, started: float,
              progress: bool) -> float:
    """Run ``stage`` with its output in ``log`` and a bar over its progress files; returns its
    seconds. A SIGTERM or SIGINT reaches the child as SIGTERM (the trainer then finishes its step
    and checkpoints), a second one as SIGKILL; a demo killed outright takes the stage with it."""
    from tqdm.auto import tqdm

    from megatron_rlep.cli import die_with_parent

    log.parent.mkdir(parents=True, exist_ok=True)
    live = sys.stderr.isatty()  # a bar on a terminal; in a log file a line per finished unit
    name = f"[{index}/{count}] {stage.name}"
    bar = tqdm(total=stage.total, unit=stage.unit, desc=name, disable=not (progress and live),
               dynamic_ncols=True, mininterval=1, initial=min(stage.count(), stage.total))

    shown = [min(stage.count(), stage.total)]  # a disabled bar does not count, so count here

    def advance():
        done = min(stage.count(), stage.total)
        if done > shown[0] and progress and not live:
            print(f"{name}: {done}/{stage.total} {stage.unit} "
                  f"(demo {_clock(time.perf_counter() - started)})", file=sys.stderr, flush=True)
        bar.update(done - shown[0])
        shown[0] = done

    begin = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(stage.argv)}\n")
        sink.flush()
        # its own session: a terminal's Ctrl-C reaches the stage only through ``forward``
        child = subprocess.Popen(stage.argv, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=die_with_parent)
        stopping = []

        def forward(signum, frame):  # first signal: stop at the step end; second: at once
            stopping.append(signum)
            child.send_signal(signal.SIGTERM if len(stopping) == 1 else signal.SIGKILL)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while child.poll() is None:
                time.sleep(1.0)
                bar.set_postfix_str(f"demo {_clock(time.perf_counter() - started)}", refresh=False)
                advance()
                bar.refresh()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    advance()
    bar.close()
    if stopping:
        raise Interrupted(stage.name)
    if child.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        said = [line for line in lines if line.startswith("error: ")]
        tail = "\n".join(lines[-15:])
        raise ConfigError(said[-1][7:] if said else
                          f"stage {stage.name} failed (exit {child.returncode}); the end of its "
                          f"log {log}:\n{tail}")
    return time.perf_counter() - begin


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _tool(argv: list[str], log: Path) -> str:
    """Run a quick tool; returns its stdout, its stderr goes to ``log``."""
    with log.open("a") as sink:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=sink, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{Path(argv[1]).name} failed (exit {done.returncode}); see {log}")
    return done.stdout


def make_report(cfg: DemoConfig, extra: list[str], train: Config, out: Path,
                seconds: dict) -> dict:
    """report.json / report.md / curves.png / pool.png (and curves-matched.png) from the stages'
    own files."""
    py, logs = sys.executable, out / "logs"

    def draw(a, b, png):  # two runs' curves with the paired difference (tools/plot.py)
        _tool([py, str(ROOT / "tools" / "plot.py"), str(out / a), str(out / b), "--names", a, b,
               "--metric", "val/acc", "-o", str(out / png), "--paired", "--threshold",
               str(cfg.threshold), "--seed", str(cfg.seed)], logs / "report.log")
        return json.loads((out / png).with_suffix(".json").read_text())

    def evaluation(a, b):  # b minus a on the final evaluation's questions
        return paired.difference(*(paired.question_accuracy(
            json.loads(line) for line in (out / f"eval-{run}" / "samples.jsonl").read_text().splitlines())
            for run in (a, b)), seed=cfg.seed)

    drawn = draw("baseline", "rlep", "curves.png")
    curves, compared = dict(drawn["runs"]), drawn["paired"]
    pool = json.loads(_tool([py, str(ROOT / "tools" / "pool.py"), "stats", str(pool_dir(cfg, out)),
                             "--json", "--plot", str(out / "pool.png")], logs / "report.log"))
    matched = None
    if cfg.compare == "matched":
        drawn_matched = draw("matched", "rlep", "curves-matched.png")
        curves["matched"] = drawn_matched["runs"]["matched"]
        c = drawn_matched["paired"]
        versus_baseline = paired.curves(*(paired.validation_records(out / r)
                                          for r in ("baseline", "matched")), cfg.threshold,
                                        seed=cfg.seed)
        matched = {"rlep_minus_matched": {"validation": c["per_step"], "area": c["area"],
                                          "evaluation": evaluation("matched", "rlep")},
                   "matched_minus_baseline": {"validation": versus_baseline["per_step"],
                                              "area": versus_baseline["area"],
                                              "evaluation": evaluation("baseline", "matched")}}
    runs = {}
    for run in runs_of(cfg):
        c = curves[run]
        evaluation_all = json.loads((out / f"eval-{run}" / "metrics.json").read_text())["all"]
        logged = _logged(out / run)
        steps = [r for r in logged if "train/replay_fraction" in r]
        errors = [r["val/acc_stderr"] for r in logged if r.get("val/acc_stderr") is not None]
        runs[run] = {"curve": c["curve"], "peak": c["peak"], "peak_step": c["peak_step"],
                     "final": c["final"], "wall_s": round(seconds[run], 1),
                     "sequences": sum(r["train/sequences"] for r in steps),
                     "replay_fraction": _average(steps, "train/replay_fraction"),
                     "effective_m": _average(steps, "train/replays_per_group"),
                     "distinct_replays": _average(steps, "train/distinct_replays_per_group"),
                     # the largest standard error (over held-out questions) of a validation point
                     "val_stderr_max": max(errors) if errors else None,
                     "eval": {"n": evaluation_all["n"], "mean@n": evaluation_all["mean@n"],
                              "pass@n": evaluation_all["pass@k"][str(evaluation_all["n"])],
                              "maj@n": evaluation_all["maj@k"][str(evaluation_all["n"])],
                              "stderr_mean@n": evaluation_all["stderr"]["mean@n"]}}
        if any("tools/calls_per_answer" in r for r in steps):
            runs[run]["tools"] = tool_summary(steps)
    a, data = train.algorithm, train.data
    n_train, n_eval = _sizes(train)
    report = {
        "seed": cfg.seed, "experiment": preset(cfg), "train_overrides": list(extra),
        "settings": {"G": a.rollouts_per_prompt, "M": cfg.replay_per_prompt,
                     "steps": a.total_steps, "prompts_per_step": a.prompts_per_rollout,
                     "data": data.train, "heldout": list(data.eval),
                     "levels": list(data.levels) if data.train in tasks.BUILTIN else None,
                     "train_questions": n_train, "heldout_questions": sum(n_eval),
                     "val_samples": train.validation.n, "eval_samples": cfg.eval_samples,
                     "max_response_length": train.rollout.max_response_length, "lr": a.lr,
                     "compare": cfg.compare},
        "runs": runs,
        "rlep_steps_to_baseline_peak": curves["rlep"]["reaches_peak_of"]["baseline"],
        "paired": {"validation": compared["per_step"], "area": compared["area"],
                   "to_threshold": compared["to_threshold"],
                   "evaluation": evaluation("baseline", "rlep"),
                   "questions": compared["questions"]},
        "matched": matched,
        "pool": {k: pool[k] for k in ("questions", "trajectories", "candidates_per_question",
                                      "mean_pass_rate")},
        "stage_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "total_seconds": round(sum(seconds.values()), 1),
    }
    write_json_atomic(report, out / "report.json")
    write_text_atomic(markdown(report), out / "report.md")
    return report


# what a tool run logs each step (train._tool_metrics), in the order of the by-step columns
TOOL_STEP_KEYS = ("tools/calls_per_answer", "tools/ok_share", "tools/turns_per_answer",
                  "tools/recovered")


def tool_summary(steps: list[dict]) -> dict:
    """A tool run's calls over its steps (``train._tool_metrics``): calls and model turns per
    answer, the share of calls that ran without error, the share of answers with a failed call
    that ended right (recovered), and the seconds and share of each step's rollout spent running
    them; by step: [step, calls, without error, turns, recovered]."""
    return {"calls_per_answer": _average(steps, "tools/calls_per_answer"),
            "ok_share": _average(steps, "tools/ok_share"),
            "turns_per_answer": _average(steps, "tools/turns_per_answer"),
            # None where no step had a failed call
            "recovered": _average(steps, "tools/recovered") if any(
                r.get("tools/recovered") is not None for r in steps) else None,
            "seconds_per_step": _average(steps, "time/tools_s"),
            "time_share": _average(steps, "tools/time_share"),
            "per_step": [[r["step"], *(r.get(k) for k in TOOL_STEP_KEYS)] for r in steps]}


def _share(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def tool_lines(runs: dict) -> list[str]:
    """The report's lines on the tools, for the runs that had them."""
    rows = [f"| {name} | {t['calls_per_answer']:.2f} | {t.get('turns_per_answer', 0):.2f} | "
            f"{t['ok_share']:.1%} | {_share(t.get('recovered'))} | "
            f"{t['seconds_per_step']:.2f} s ({t['time_share']:.1%}) |"
            for name, r in runs.items() if (t := r.get("tools"))]
    if not rows:
        return []
    return ["| run | tool calls per answer | model turns per answer | calls without error | "
            "answers right after a failed call | a step's rollout in tools |",
            "|---|---|---|---|---|---|", *rows, ""]


def markdown(report: dict) -> str:
    s, runs = report["settings"], report["runs"]
    n = runs["baseline"]["eval"]["n"]
    lines = [f"# RLEP demo: DAPO baseline against RLEP (seed {report['seed']})", "",
             f"Preset `{report['experiment']}`" + (f" with {', '.join(report['train_overrides'])}"
                                                  if report["train_overrides"] else "") +
             f": {s['data'] + ' levels ' + str(s['levels']) if s['levels'] else s['data']}, "
             f"{s['train_questions']} training and "
             f"{s['heldout_questions']} held-out questions, {s['prompts_per_step']} prompts a step, "
             f"G = {s['G']} fresh rollouts (RLEP adds M = {s['M']} replays), {s['steps']} steps, "
             f"responses up to {s['max_response_length']} tokens, lr {s['lr']}. Validation: "
             f"{s['val_samples']} answer(s) per held-out question at temperature 1"
             f"{_stderr_note(runs)}.", "",
             f"| run | peak val acc | step of peak | final val acc | eval mean@{n} | "
             f"eval pass@{n} | eval maj@{n} | sequences trained | training time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        e = r["eval"]
        lines.append(f"| {name} | {r['peak']:.3f} | {r['peak_step']} | {r['final']:.3f} | "
                     f"{e['mean@n']:.3f} ± {e['stderr_mean@n']:.3f} | {e['pass@n']:.3f} | "
                     f"{e['maj@n']:.3f} | {r.get('sequences', '-')} | {_clock(r['wall_s'])} |")
    reached = report["rlep_steps_to_baseline_peak"]
    base = runs["baseline"]
    lines += ["", f"The baseline peaks at {base['peak']:.3f} at step {base['peak_step']}; " +
              (f"RLEP first reaches that at step {reached}." if reached is not None else
               f"RLEP does not reach it within {s['steps']} steps."), ""]
    g_prime = s["G"] + s["M"]
    rlep = runs["rlep"]
    lines += [f"Replayed answers were {rlep['replay_fraction']:.1%} of RLEP's sequences "
              f"(M/G' = {s['M'] / g_prime:.1%} when every question has M pool answers; a "
              "question with fewer gets fresh rollouts in the free slots): an effective M of "
              f"{rlep['effective_m']:.2f} replays per group, {rlep['distinct_replays']:.2f} of "
              "them distinct texts.", ""]
    lines += paired_lines(report["paired"])
    lines += tool_lines(runs)
    if report.get("matched"):
        lines += matched_lines(report["matched"], g_prime)
    p = report["pool"]
    rate = f" (their pass rate when sampled: {p['mean_pass_rate']:.3f} on average)" \
        if p["mean_pass_rate"] is not None else ""
    lines += [f"Pool: {p['questions']} of {s['train_questions']} training questions kept with "
              f"{p['trajectories']} verified answers{rate}.", "",
              "![held-out accuracy](curves.png)", "", "![pool](pool.png)", "",
              *(["![RLEP against the compute-matched control](curves-matched.png)", ""]
                if report.get("matched") else []),
              "| stage | time |", "|---|---|"]
    lines += [f"| {k} | {_clock(v)} |" for k, v in report["stage_seconds"].items()]
    lines += [f"| total | {_clock(report['total_seconds'])} |", "",
              "Validation accuracy is `val/acc` of each run's `metrics.jsonl`; evaluation numbers "
              "are `all` of `eval-<run>/metrics.json`, ± one standard error over questions.", ""]
    return "\n".join(lines)


def _stderr_note(runs: dict) -> str:
    errors = [r.get("val_stderr_max") for r in runs.values()]
    if any(e is None for e in errors):
        return ""
    return f"; the largest standard error of a point, over questions, is {max(errors):.3f}"


def paired_lines(c: dict) -> list[str]:
    """The report's comparison: RLEP minus baseline with 95% paired bootstrap intervals."""
    def d(x):
        return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    def reach(run):
        step = run["step"]
        span = f"{run['low']}-{run['high']}" if run["low"] is not None else "never"
        return (f"step {step}" if step is not None else "not reached") + \
            f" (95%: {span}; reached in {run['reached_share']:.0%} of resamples)"

    t = c["to_threshold"]
    lines = [f"RLEP minus baseline on the same {c['questions']} held-out questions and sampling "
             "seeds, with 95% intervals from a paired bootstrap over questions:", "",
             "| step | baseline | RLEP | RLEP - baseline [95%] |", "|---|---|---|---|"]
    lines += [f"| {p['step']} | {p['a']:.3f} | {p['b']:.3f} | {d(p)} |" for p in c["validation"]]
    lines += ["", f"- Area under the validation curve (mean accuracy over training): baseline "
              f"{c['area']['a']:.3f}, RLEP {c['area']['b']:.3f}, difference {d(c['area'])}.",
              f"- Final evaluation ({c['evaluation']['questions']} questions): {d(c['evaluation'])}.",
              f"- First step at accuracy {t['fixed']['level']:.2f}: baseline "
              f"{reach(t['fixed']['a'])}, RLEP {reach(t['fixed']['b'])}.",
              f"- First step at the baseline's best ({t['a_best']['level']:.3f}): baseline "
              f"{reach(t['a_best']['a'])}, RLEP {reach(t['a_best']['b'])}.", ""]
    return lines


def matched_lines(m: dict, g_prime: int) -> list[str]:
    """The compute-matched control's lines: RLEP against DAPO with G' fresh rollouts."""
    def d(x):
        return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"

    r, b = m["rlep_minus_matched"], m["matched_minus_baseline"]
    return [f"Compute-matched control (DAPO with G = {g_prime} fresh rollouts per prompt, RLEP's "
            "group size, no replays), with the same 95% paired intervals:", "",
            f"- RLEP minus matched: area {d(r['area'])}, last point {d(r['validation'][-1])}, "
            f"final evaluation {d(r['evaluation'])}.",
            f"- Matched minus baseline: area {d(b['area'])}, last point "
            f"{d(b['validation'][-1])}, final evaluation {d(b['evaluation'])}.", ""]


def run(cfg: DemoConfig, extra: list[str]) -> dict:
    """The five stages (those not done before), then the report."""
    out = Path(cfg.out).resolve()
    train = compose(training_overrides(cfg, extra, "rlep", out))  # checks preset and overrides
    if cfg.pool and not (pool_dir(cfg, out) / "manifest.json").is_file():
        raise ConfigError(f"demo key pool={cfg.pool} is not a finished pool directory (it has no "
                          "manifest.json); give the pool/ of a finished demo, or leave pool "
                          "unset to build one from this demo's baseline")
    out.mkdir(parents=True, exist_ok=True)
    # compare adds stages without changing the others: a demo may be rerun with it; task and
    # pool at their defaults are left out, as demos before those keys pinned them
    settings = {k: v for k, v in asdict(cfg).items()
                if k not in ("out", "progress", "wandb", "compare")
                and (k, v) not in (("task", "arithmetic"), ("pool", None))}
    jobs.pin_settings(out / "demo.json", {**settings, "train_overrides": extra}, rank=0)
    stages = plan(cfg, extra, train, out)
    record = out / "stages.json"
    seconds = json.loads(record.read_text()) if record.is_file() else {}
    started = time.perf_counter()
    control = ", the compute-matched control" if cfg.compare == "matched" else ""
    print(f"RLEP demo into {out}: baseline, pool, RLEP{control}, evaluations, report; stage logs "
          f"in {out / 'logs'}", flush=True)
    for index, stage in enumerate(stages, 1):
        if stage.name in seconds:
            print(f"[{index}/{len(stages)}] {stage.name}: done before ({_clock(seconds[stage.name])})",
                  flush=True)
            continue
        if cfg.progress:
            print(f"[{index}/{len(stages)}] {stage.title}", flush=True)
        seconds[stage.name] = run_stage(stage, out / "logs" / f"{stage.name}.log", index,
                                        len(stages), started, cfg.progress)
        write_json_atomic(seconds, record)
    report = make_report(cfg, extra, train, out, seconds)
    print(markdown(report).split("\n![")[0].split("\n\n", 1)[1], flush=True)
    print(f"wrote {out / 'report.md'}, report.json, curves.png, pool.png", flush=True)
    return report


def main(argv: list[str]) -> int:
    from megatron_rlep.cli import USER_ERRORS, fail

    mine, extra = split_arguments(argv)
    try:
        run(compose(mine, "demo"), extra)
    except USER_ERRORS as err:
        fail(err)
    except Interrupted as stop:
        print(f"stopped during stage {stop}; the same command resumes from there",
              file=sys.stderr, flush=True)
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
