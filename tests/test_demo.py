"""The two-phase demo (python -m megatron_rlep.demo): a shortened run on the built-in model,
its report checked against the files the stages logged; rerun, resume and refusal."""

import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.config import compose
from megatron_rlep.demo import plan, split_arguments, training_overrides

# Two steps on four training questions, so every question is drawn and the pool is used.
SHORT = ["algorithm.total_steps=2", "data.levels=[1,2]", "data.train_size=4", "data.eval_size=8",
         "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
         "algorithm.rollouts_per_prompt=2", "logging.eval_every=1", "pool_samples=6",
         "eval_samples=2"]


def demo(out: Path, *extra: str, timeout=scaled(900)) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"out={out}", *SHORT,
                           *extra], capture_output=True, text=True, timeout=timeout)


def test_own_keys_stay_with_the_demo_and_the_rest_train_both_runs(tmp_path):
    mine, extra = split_arguments(["seed=3", "algorithm.lr=2e-5", "out=x", "data.levels=[1,2]",
                                   "replay_per_prompt=1"])
    assert mine == ["seed=3", "out=x", "replay_per_prompt=1"]
    assert extra == ["algorithm.lr=2e-5", "data.levels=[1,2]"]
    cfg = compose(mine, "demo")
    base = compose(training_overrides(cfg, extra, "baseline", tmp_path))
    rlep = compose(training_overrides(cfg, extra, "rlep", tmp_path))
    assert (base.algorithm.replay_per_prompt, rlep.algorithm.replay_per_prompt) == (0, 1)
    assert rlep.algorithm.pool == str(tmp_path / "pool") and base.algorithm.pool is None
    assert base.seed == rlep.seed == 3 and base.algorithm.lr == rlep.algorithm.lr == 2e-5
    # apart from M, the pool, the name and the run directory, the two runs are one config
    for cfg_ in (base, rlep):
        cfg_.algorithm.replay_per_prompt, cfg_.algorithm.pool, cfg_.algorithm.name = 0, None, "x"
        cfg_.run_dir = ""
    assert base == rlep


def test_stage_sizes_follow_the_training_and_heldout_files(tmp_path):
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not shared.is_dir():
        pytest.skip("../shared/data is not beside the repo")
    cfg = compose([], "demo")
    extra = [f"data.train={shared / 'train' / 'gsm8k_train.jsonl'}",
             f"data.eval=[{shared / 'eval' / 'amc23.jsonl'},{shared / 'eval' / 'aime24.jsonl'}]"]
    stages = {s.name: s for s in plan(cfg, extra, compose(training_overrides(
        cfg, extra, "rlep", tmp_path)), tmp_path)}
    assert stages["pool"].total == math.ceil(7473 / 8)  # every GSM8K training question
    assert stages["eval-rlep"].total == math.ceil(40 / 32) + math.ceil(30 / 32)
    assert "limit=40" in stages["eval-rlep"].argv  # whole sets, not the built-in eval_size
    assert stages["baseline"].count() == stages["pool"].count() == 0


def test_the_tool_demos_give_their_tools_to_every_stage_and_report_the_calls(tmp_path):
    from megatron_rlep.config import compose as load
    from megatron_rlep.demo import tool_lines, tool_summary

    for task in ("calculator", "chain"):
        cfg = load([f"task={task}"], "demo")
        train = load(training_overrides(cfg, [], "rlep", tmp_path))
        assert list(train.rollout.tools) == ["python"] and train.data.train == task
        stages = {s.name: s for s in plan(cfg, [], train, tmp_path)}
        for name in ("pool", "eval-baseline", "eval-rlep"):  # sampled as the runs sample
            assert "rollout.tools=[python]" in stages[name].argv
            assert f"rollout.max_turns={train.rollout.max_turns}" in stages[name].argv
    steps = [{"step": 1, "tools/calls_per_answer": 1.0, "tools/ok_share": 0.5,
              "tools/turns_per_answer": 2.0, "tools/recovered": 0.25,
              "time/tools_s": 0.2, "tools/time_share": 0.01},
             {"step": 2, "tools/calls_per_answer": 0.5, "tools/ok_share": 1.0,
              "tools/turns_per_answer": 1.5, "tools/recovered": None,
              "time/tools_s": 0.4, "tools/time_share": 0.03}]
    summary = tool_summary(steps)
    assert summary["calls_per_answer"] == 0.75 and summary["ok_share"] == 0.75
    assert summary["turns_per_answer"] == 1.75 and summary["recovered"] == 0.25
    assert summary["per_step"] == [[1, 1.0, 0.5, 2.0, 0.25], [2, 0.5, 1.0, 1.5, None]]
    assert tool_lines({"rlep": {"tools": summary}, "baseline": {}})[2] == \
        "| rlep | 0.75 | 1.75 | 75.0% | 25.0% | 0.30 s (2.0%) |"
    # no failed call in any step: no share of recoveries to show
    calm = tool_summary([{**r, "tools/recovered": None} for r in steps])
    assert calm["recovered"] is None and "| 75.0% | - |" in tool_lines({"rlep": {"tools": calm}})[2]


def test_a_given_pool_replaces_the_pool_stage_and_must_be_a_finished_pool(tmp_path):
    """pool=DIR: RLEP replays DIR and no pool is built (the arms of a study share one); a
    directory without a manifest is refused in one sentence before any stage runs."""
    shared = tmp_path / "sync" / "pool"
    cfg = compose([f"pool={shared}"], "demo")
    rlep = compose(training_overrides(cfg, [], "rlep", tmp_path / "arm"))
    assert rlep.algorithm.pool == str(shared.resolve())
    stages = [s.name for s in plan(cfg, [], rlep, tmp_path / "arm")]
    assert stages == ["baseline", "rlep", "eval-baseline", "eval-rlep"]
    done = subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"out={tmp_path / 'arm'}",
                           f"pool={shared}"], capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 2 and f"pool={shared} is not a finished pool directory" in \
        done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "arm" / "demo.json").exists()


def test_a_wrong_training_key_is_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, "-m", "megatron_rlep.demo", f"out={tmp_path}",
                           "algorithm.total_stepz=3"], capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: config key algorithm.total_stepz is unknown")
    assert not (tmp_path / "demo.json").exists()


def _curve(run_dir: Path) -> list[list]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [[r["step"], r["val/acc"]] for r in rows if r.get("val/acc") is not None]


@pytest.mark.e2e
def test_shortened_demo_reports_what_its_stages_logged(tmp_path):
    out = tmp_path / "demo"
    # SIGTERM once the baseline logged a step: the stage stops, the demo says how to go on
    first = subprocess.Popen([sys.executable, "-m", "megatron_rlep.demo", f"out={out}", *SHORT],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + scaled(600)
    while time.time() < deadline and not (
            (out / "baseline" / "metrics.jsonl").is_file() and
            '"time/step_s"' in (out / "baseline" / "metrics.jsonl").read_text()):
        time.sleep(1)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=scaled(600))
    assert first.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == ("stopped during stage baseline; the same command "
                                            "resumes from there")
    assert (out / "baseline" / "checkpoints" / "latest").is_file()
    assert not (out / "stages.json").exists()
    done = demo(out)
    assert done.returncode == 0, done.stderr[-3000:]
    # stderr is no terminal here: one line per finished unit of progress, as in a Slurm log
    rlep_lines = re.findall(r"^\[3/5\] rlep: (\d)/2 step \(demo \d+:\d\d\)$", done.stderr, re.M)
    assert rlep_lines == ["1", "2"], done.stderr
    report = json.loads((out / "report.json").read_text())
    for name in ("curves.png", "pool.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = report["runs"]
    for run in ("baseline", "rlep"):
        r, curve = runs[run], _curve(out / run)
        assert r["curve"] == curve and [s for s, _ in curve] == [0, 1, 2]
        best = max(v for _, v in curve)
        assert r["peak"] == best and r["peak_step"] == min(s for s, v in curve if v == best)
        assert r["final"] == curve[-1][1]
        evaluation = json.loads((out / f"eval-{run}" / "metrics.json").read_text())["all"]
        assert r["eval"]["mean@n"] == evaluation["mean@n"] and r["eval"]["n"] == 2
        assert r["eval"]["pass@n"] == evaluation["pass@k"]["2"]
        samples = (out / f"eval-{run}" / "samples.jsonl").read_text().splitlines()
        assert len(samples) == 8 * 2
        assert 0 < r["wall_s"] <= report["total_seconds"]
        errors = [json.loads(line).get("val/acc_stderr") for line in
                  (out / run / "metrics.jsonl").read_text().splitlines()]
        assert r["val_stderr_max"] == max(e for e in errors if e is not None) > 0
    # the paired comparison: each point is the two logged curves' values, the final one the
    # two evaluations' mean@n, each difference inside its interval
    compared = report["paired"]
    (steps, base), (_, rlep) = (zip(*runs[r]["curve"]) for r in ("baseline", "rlep"))
    assert [p["step"] for p in compared["validation"]] == list(steps)
    assert [p["a"] for p in compared["validation"]] == pytest.approx(list(base))
    assert [p["b"] for p in compared["validation"]] == pytest.approx(list(rlep))
    for p in [*compared["validation"], compared["area"], compared["evaluation"]]:
        assert p["low"] - 1e-12 <= p["diff"] <= p["high"] + 1e-12
    assert compared["evaluation"]["diff"] == pytest.approx(
        runs["rlep"]["eval"]["mean@n"] - runs["baseline"]["eval"]["mean@n"])
    assert compared["questions"] == 8 and "95% intervals" in (out / "report.md").read_text()
    # the effective M: replays per group, as the RLEP run logged them
    logged = [json.loads(line) for line in (out / "rlep" / "metrics.jsonl").read_text().splitlines()]
    per_group = [r["train/replays_per_group"] for r in logged if "train/replays_per_group" in r]
    assert runs["rlep"]["effective_m"] == pytest.approx(sum(per_group) / len(per_group))
    assert 0 < runs["rlep"]["distinct_replays"] <= runs["rlep"]["effective_m"] <= 2
    # both runs start from the same base model with the same seed
    assert runs["baseline"]["curve"][0] == runs["rlep"]["curve"][0]
    peak = runs["baseline"]["peak"]
    assert report["rlep_steps_to_baseline_peak"] == next(
        (s for s, v in runs["rlep"]["curve"] if v >= peak), None)
    # the pool came from the baseline's final policy and RLEP replayed from it; the baseline not
    manifest = json.loads((out / "pool" / "manifest.json").read_text())
    assert manifest["model"] == str(out / "baseline" / "hf")
    assert report["pool"]["questions"] == manifest["counts"]["questions_kept"] >= 1
    assert report["pool"]["trajectories"] == manifest["counts"]["trajectories"]

    def logged(run, key):
        return [json.loads(line).get(key) for line in
                (out / run / "metrics.jsonl").read_text().splitlines()[1:]]

    assert set(logged("baseline", "train/replay_fraction")) == {0.0}
    assert max(logged("rlep", "train/replay_fraction")) > 0
    fractions = logged("rlep", "train/replay_fraction")
    assert runs["rlep"]["replay_fraction"] == sum(fractions) / len(fractions)
    assert max(v for v in logged("rlep", "train/acc_replay") if v is not None) == 1.0
    md = (out / "report.md").read_text()
    for run in ("baseline", "rlep"):
        assert f"| {run} | {runs[run]['peak']:.3f} | {runs[run]['peak_step']} |" in md
    assert "[5/5] eval-rlep" in done.stderr  # the live display named every stage

    # the same command again: every stage is done, the report is rebuilt from the same files
    again = demo(out, timeout=scaled(300))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("done before") == 5
    assert json.loads((out / "report.json").read_text()) == report
    # a stage not recorded as done is run again; the others are not
    stages = json.loads((out / "stages.json").read_text())
    del stages["eval-rlep"]
    (out / "stages.json").write_text(json.dumps(stages))
    resumed = demo(out, timeout=scaled(300))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("done before") == 4
    assert (out / "logs" / "eval-rlep.log").read_text().count("$ ") == 2
    assert (out / "logs" / "baseline.log").read_text().count("$ ") == 2  # stopped, resumed
    # the compute-matched control added to the finished demo: two more stages, the rest kept
    matched = demo(out, "compare=matched", timeout=scaled(600))
    assert matched.returncode == 0, matched.stderr[-3000:]
    assert matched.stdout.count("done before") == 5 and "[4/7] matched" in matched.stderr
    with_control = json.loads((out / "report.json").read_text())
    seqs = {run: r["sequences"] for run, r in with_control["runs"].items()}
    assert seqs == {"baseline": 8, "rlep": 16, "matched": 16}  # 2 steps x 2 prompts x G or G'
    assert "algorithm.replay_per_prompt=0 algorithm.rollouts_per_prompt=4" in \
        (out / "logs" / "matched.log").read_text().splitlines()[1]
    m = with_control["matched"]["rlep_minus_matched"]
    assert m["evaluation"]["diff"] == pytest.approx(
        with_control["runs"]["rlep"]["eval"]["mean@n"] - with_control["runs"]["matched"]["eval"]["mean@n"])
    assert [p["step"] for p in m["validation"]] == [0, 1, 2]
    assert "Compute-matched control (DAPO with G = 4" in (out / "report.md").read_text()
    assert with_control["runs"]["rlep"] == runs["rlep"]
    # other settings into the same directory are refused in one sentence, nothing is lost
    refused = demo(out, "replay_per_prompt=1", timeout=scaled(120))
    assert refused.returncode == 2
    assert "was started with other settings (replay_per_prompt: 2 there, 1 now)" in refused.stderr
    assert json.loads((out / "report.json").read_text())["runs"]["rlep"] == runs["rlep"]


def test_table_of_several_reports_with_means(tmp_path):
    def report(seed, base_peak, rlep_peak, reached):
        run = {"peak": 0.0, "peak_step": 4, "final": 0.5, "eval": {"mean@n": 0.25}}
        return {"seed": seed, "rlep_steps_to_baseline_peak": reached, "total_seconds": 600.0,
                "pool": {"questions": 10, "trajectories": 30},
                "runs": {"baseline": {**run, "peak": base_peak},
                         "rlep": {**run, "peak": rlep_peak, "final": 0.75}}}

    for seed, values in ((1, (0.5, 0.75, 2)), (2, (0.625, 0.5, None))):
        (tmp_path / str(seed)).mkdir()
        (tmp_path / str(seed) / "report.json").write_text(json.dumps(report(seed, *values)))
    tool = Path(__file__).resolve().parent.parent / "tools" / "demo_table.py"
    done = subprocess.run([sys.executable, str(tool), str(tmp_path / "1"), str(tmp_path / "2")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == ("| 1 | 0.500 | 4 | 0.750 | 4 | 2 | 0.500 | 0.750 | 0.250 | 0.250 | 10 | "
                        "30 | 10.000 |")
    assert "| 0.625 | 4 | 0.500 | 4 | never |" in lines[3]
    assert lines[4] == ("| mean | 0.562 | 4.000 | 0.625 | 4.000 | 1 of 2 reach it | 0.500 | 0.750 "
                        "| 0.250 | 0.250 | 10.000 | 30.000 | 10.000 |")
    missing = subprocess.run([sys.executable, str(tool), str(tmp_path)], capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "hold no report.json" in missing.stderr


def test_seed_study_pools_the_paired_differences_over_seeds(tmp_path):
    def diff(x):
        return {"diff": x, "low": x - 0.1, "high": x + 0.1}

    for seed, (ev, ar) in ((1, (0.10, 0.02)), (2, (0.00, 0.04)), (3, (0.05, 0.06))):
        out = tmp_path / f"seed-{seed}"
        (out / "rlep").mkdir(parents=True)
        (out / "rlep" / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in [{"step": 0}, {"step": 1, "train/replay_advantage_share": 0.2},
                                                   {"step": 2, "train/replay_advantage_share": 0.4}]))
        run = {"peak": 0.5, "peak_step": 4, "final": 0.5, "replay_fraction": 0.25, "effective_m": 2.0}
        (out / "report.json").write_text(json.dumps({
            "seed": seed, "total_seconds": 600.0, "pool": {"questions": 10, "mean_pass_rate": 0.5},
            "runs": {"baseline": run, "rlep": run},
            "paired": {"evaluation": diff(ev), "area": diff(ar), "validation": [diff(0.0)]}}))
    tool = Path(__file__).resolve().parent.parent / "studies" / "demo_seeds.py"
    done = subprocess.run([sys.executable, str(tool), "--seeds", "1", "2", "3", "--root",
                           str(tmp_path), "--json", str(tmp_path / "seeds.json")],
                          capture_output=True, text=True)  # every seed is there: nothing runs
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "seeds.json").read_text())
    # eval: mean 0.05, sd 0.05, half-width t(2) 4.303 * 0.05 / sqrt(3) = 0.1242
    assert result["pooled"]["eval"]["mean"] == pytest.approx(0.05)
    assert result["pooled"]["eval"]["high"] - 0.05 == pytest.approx(4.303 * 0.05 / 3 ** 0.5)
    assert result["pooled"]["area"]["mean"] == pytest.approx(0.04)
    assert [r["replay_advantage_share"] for r in result["seeds"]] == pytest.approx([0.3] * 3)
    assert "| pooled (3 seeds, 95% t-interval) | +0.050 [-0.074, +0.174] |" in done.stdout


def test_seed_study_tabulates_the_calls_of_runs_with_tools(tmp_path):
    """Per run: calls per answer at step 1 and over the steps, the share without error over the
    steps that logged one, and the medians of a step's seconds and share in tools over the steps
    without validation (step 2's 6 s of validation calls left out)."""
    def diff(x):
        return {"diff": x, "low": x - 0.1, "high": x + 0.1}

    for seed, calls in ((1, 0.5), (2, 1.0)):
        out = tmp_path / f"seed-{seed}"
        run = {"peak": 0.5, "peak_step": 2, "final": 0.5, "replay_fraction": 0.25,
               "effective_m": 2.0, "curve": [[0, 0.25], [2, 0.5 * calls + 0.25]]}
        for name in ("baseline", "rlep"):
            (out / name).mkdir(parents=True)
            steps = [{"step": 0, "val/acc": 0.25},
                     {"step": 1, "tools/calls_per_answer": calls, "tools/ok_share": None,
                      "tools/turns_per_answer": 1 + calls, "tools/recovered": None,
                      "time/tools_s": 0.5, "tools/time_share": 0.05},
                     {"step": 2, "tools/calls_per_answer": 1.0, "tools/ok_share": 0.8,
                      "time/tools_s": 6.0, "tools/time_share": 0.6, "val/acc": 0.5},
                     {"step": 3, "tools/calls_per_answer": 1.0, "tools/ok_share": 1.0,
                      "time/tools_s": 1.5, "tools/time_share": 0.15}]
            (out / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
        (out / "report.json").write_text(json.dumps({
            "seed": seed, "total_seconds": 600.0, "pool": {"questions": 10, "mean_pass_rate": 0.5},
            "runs": {"baseline": run, "rlep": run},
            "paired": {"evaluation": diff(0.0), "area": diff(0.0), "validation": [diff(0.0)]}}))
    tool = Path(__file__).resolve().parent.parent / "studies" / "demo_seeds.py"
    done = subprocess.run([sys.executable, str(tool), "--seeds", "1", "2", "--root",
                           str(tmp_path), "--json", str(tmp_path / "seeds.json")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tools = json.loads((tmp_path / "seeds.json").read_text())["tools"]
    assert tools["1"]["rlep"]["first_calls"] == 0.5
    assert tools["1"]["rlep"]["calls_per_answer"] == pytest.approx(2.5 / 3)
    assert tools["1"]["rlep"]["ok_share"] == pytest.approx(0.9)
    assert (tools["1"]["rlep"]["tools_s"], tools["1"]["rlep"]["time_share"]) == \
        (pytest.approx(1.0), pytest.approx(0.1))
    assert "| 1 | baseline | 0.250 / 0.500 | 0.50; 0.83 | 90.0% | 1.00 s (10.0%) |" in done.stdout
    # the means over the two seeds: curves 0.25 / (0.5 + 0.75) / 2, calls at step 1 0.75
    assert "| mean of 2 | rlep | 0.250 / 0.625 | 0.75; 0.92 | 90.0% | 1.00 s (10.0%) |" \
        in done.stdout
    # by step (every 4: step 1 only here): calls 0.75, turns 1.75; no seed logged a share
    # without error or a recovery
    assert "| rlep | 0.75 calls, 1.75 turns |" in done.stdout


def test_seed_study_compares_rlep_with_the_compute_matched_control(tmp_path):
    """Per seed every run answers both held-out questions alike, so only the seeds vary in the
    two-level bootstrap: RLEP - matched is +0.5 (seed 1) and +1.0 (seed 2) at the last point."""
    def records(path, accuracy):  # two answers per question, the share right = accuracy
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"data_source": "t", "id": q, "sample_index": j,
                                            "correct": j < round(2 * accuracy)}) + "\n"
                                for q in ("q1", "q2") for j in range(2)))

    def diff(x):
        return {"diff": x, "low": x - 0.1, "high": x + 0.1}

    last = {1: {"baseline": 0.0, "matched": 0.5, "rlep": 1.0},
            2: {"baseline": 0.0, "matched": 0.0, "rlep": 1.0}}
    for seed, acc in last.items():
        out = tmp_path / f"seed-{seed}"
        for run, value in acc.items():
            records(out / run / "validation" / "step-000000.jsonl", 0.0)
            records(out / run / "validation" / "step-000002.jsonl", value)
            records(out / f"eval-{run}" / "samples.jsonl", value)
            (out / run / "metrics.jsonl").write_text('{"step": 0}\n')
        run = {"peak": 0.5, "peak_step": 2, "final": 0.5, "replay_fraction": 0.25,
               "effective_m": 2.0, "sequences": 96, "wall_s": 60.0}
        rm, mb = acc["rlep"] - acc["matched"], acc["matched"] - acc["baseline"]
        (out / "report.json").write_text(json.dumps({
            "seed": seed, "total_seconds": 600.0, "pool": {"questions": 10, "mean_pass_rate": 0.5},
            "runs": {"baseline": dict(run, sequences=72), "rlep": run, "matched": run},
            "paired": {"evaluation": diff(1.0), "area": diff(0.5), "validation": [diff(1.0)]},
            "matched": {"rlep_minus_matched": {"evaluation": diff(rm), "area": diff(rm / 2),
                                               "validation": [diff(rm)]},
                        "matched_minus_baseline": {"evaluation": diff(mb), "area": diff(mb / 2),
                                                   "validation": [diff(mb)]}}}))
    tool = Path(__file__).resolve().parent.parent / "studies" / "demo_seeds.py"
    done = subprocess.run([sys.executable, tool, "--seeds", "1", "2", "--root", str(tmp_path),
                           "--json", str(tmp_path / "seeds.json"), "compare=matched"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "seeds.json").read_text())
    boot = result["matched_bootstrap"]["rlep_minus_matched"]
    # last point and evaluation: 0.5 and 1.0, pooled 0.75; the draws of two seeds average
    # 0.5, 0.75 or 1.0; areas (trapezoid over steps 0-2) are half of that
    for key, scale in (("last", 1.0), ("eval", 1.0), ("area", 0.5)):
        assert boot[key]["mean"] == pytest.approx(0.75 * scale)
        assert (boot[key]["low"], boot[key]["high"]) == (pytest.approx(0.5 * scale),
                                                         pytest.approx(1.0 * scale))
    t = result["matched_pooled"]["rlep_minus_matched"]["last"]
    assert t["high"] - t["mean"] == pytest.approx(12.706 * 0.5 / 2 ** 0.5 / 2 ** 0.5)
    assert result["matched_bootstrap"]["matched_minus_baseline"]["eval"]["mean"] == \
        pytest.approx(0.25)
    assert result["bootstrap"]["last"]["mean"] == pytest.approx(1.0)  # RLEP - baseline
    assert "| 1 | +0.500 [+0.400, +0.600] |" in done.stdout
    assert "72 / 96 / 96 | 1.0 / 1.0 / 1.0 |" in done.stdout  # sequences and minutes per run
    assert "| pooled (2 seeds, 95% bootstrap, seeds x questions) | +0.750 [+0.500, +1.000] |" \
        in done.stdout


def test_strategy_study_compares_each_arm_with_the_baseline_point_by_point(tmp_path):
    def write_run(run_dir, step_s, sequences, right):  # right[step]: questions right (of 4)
        (run_dir / "validation").mkdir(parents=True)
        (run_dir / "hf").mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
            {"step": 0}, *({"step": s, "time/step_s": step_s, "train/sequences": sequences,
                            "train/replay_fraction": 0.25,
                            "train/groups_with_replays": 0.5, "train/replay_advantage_share": 0.1}
                           for s in (1, 2))]))
        for step, n in enumerate(right):
            (run_dir / "validation" / f"step-{step:06d}.jsonl").write_text("".join(
                json.dumps({"data_source": "t", "id": f"q{i}", "sample_index": 0, "pred": "1",
                            "correct": i < n}) + "\n" for i in range(4)))

    for seed in (1, 2):
        out = tmp_path / f"seed-{seed}"
        write_run(out / "baseline", 2.0, 8, [1, 1, 1])
        write_run(out / "rlep", 3.0, 10, [1, 2, 3])
        write_run(out / "rescue", 2.5, 9, [1, 1, 2 + seed])
        write_run(out / "matched", 2.4, 10, [1, 1, 2])  # G + M fresh rollouts, no replays
        (out / "report.json").write_text("{}")
    tool = Path(__file__).resolve().parent.parent / "studies" / "replay_strategies.py"
    done = subprocess.run([sys.executable, str(tool), "--seeds", "1", "2", "--root", str(tmp_path),
                           "--arms", "uniform", "rescue", "matched", "--json",
                           str(tmp_path / "arms.json")],
                          capture_output=True, text=True)  # every run is there: nothing runs
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "arms.json").read_text())
    uniform, rescue = result["table"]["uniform"]["1"], result["table"]["rescue"]
    # uniform: +0, +1/4, +2/4 over steps 0-2: area +0.25, last point +0.5; 1.5x the step time,
    # 10 sequences a step against 8
    assert uniform["area"]["diff"] == pytest.approx(0.25) and uniform["last"]["diff"] == 0.5
    assert uniform["step_time_ratio"] == pytest.approx(1.5)
    assert uniform["sequences_ratio"] == pytest.approx(1.25)
    assert rescue["1"]["sequences_ratio"] == pytest.approx(1.125)
    assert [rescue[s]["last"]["diff"] for s in ("1", "2")] == [0.5, 0.75]
    assert result["pooled"]["rescue"]["last"]["mean"] == pytest.approx(0.625)
    matched = result["table"]["matched"]["1"]  # the compute-matched control: RLEP's sequences
    assert matched["last"]["diff"] == 0.25 and matched["sequences"] == 20
    assert matched["sequences_ratio"] == pytest.approx(1.25)
    assert matched["minutes"] == pytest.approx(2 * 2.4 / 60)


def _gone(pid: int, seconds: float = 10.0) -> bool:
    """The process has exited (a zombie nobody reaps counts as gone)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_entry_point_or_demo_leaves_no_process_behind(tmp_path):
    # a process an entry point forks (Megatron-Core's checkpoint writers are forked so)
    forks = ("import multiprocessing as mp, time\n"
             "from megatron_rlep.cli import helpers_die_with_me\n"
             "helpers_die_with_me()\n"
             "p = mp.get_context('fork').Process(target=time.sleep, args=(120,)); p.start()\n"
             "print(p.pid, flush=True); time.sleep(120)\n")
    # a demo stage (started with exec)
    stages = ("import sys, time\n"
              "from pathlib import Path\n"
              "from megatron_rlep.demo import Stage, run_stage\n"
              f"pid = Path({str(tmp_path / 'stage.pid')!r})\n"
              "argv = [sys.executable, '-c', f'import os, time; open({str(pid)!r}, \"w\")"
              ".write(str(os.getpid())); time.sleep(120)']\n"
              "run_stage(Stage('s', 's', argv, 1, 'x', lambda: 0), pid.with_suffix('.log'), 1, 1,"
              " time.perf_counter(), False)\n")
    for script, pid_file in ((forks, None), (stages, tmp_path / "stage.pid")):
        parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        if pid_file is None:
            child = int(parent.stdout.readline())
        else:
            deadline = time.time() + scaled(60)
            while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
                time.sleep(0.1)
            child = int(pid_file.read_text())
        assert not _gone(child, 0.5), "the child never ran"
        parent.kill()
        parent.wait()
        assert _gone(child), f"process {child} outlived its killed parent"
