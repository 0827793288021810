"""tools/plot.py: peaks and "reaches the other's peak" from metrics.jsonl files."""

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "plot.py"


def write_run(path: Path, values: dict[int, float]):
    path.mkdir(parents=True)
    lines = [{"step": s, "val/acc": v, "train/acc_fresh": 0.1} for s, v in values.items()]
    lines.insert(1, {"step": 1, "train/acc_fresh": 0.2})  # a step without validation
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_peaks_and_first_step_reaching_the_other_peak(tmp_path):
    write_run(tmp_path / "baseline", {0: 0.30, 10: 0.40, 20: 0.50, 30: 0.45})
    write_run(tmp_path / "rlep", {0: 0.30, 10: 0.52, 20: 0.55, 30: 0.60})
    out = tmp_path / "fig" / "curves.png"
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "baseline"),
                             str(tmp_path / "rlep"), "-o", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert (runs["baseline"]["peak"], runs["baseline"]["peak_step"]) == (0.50, 20)
    assert (runs["rlep"]["peak"], runs["rlep"]["peak_step"]) == (0.60, 30)
    assert runs["rlep"]["reaches_peak_of"]["baseline"] == 10
    assert runs["baseline"]["reaches_peak_of"]["rlep"] is None
    assert runs["baseline"]["curve"] == [[0, 0.3], [10, 0.4], [20, 0.5], [30, 0.45]]


def test_missing_run_is_one_clear_line(tmp_path):
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "nope")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and "metrics.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def write_validation(path: Path, right: dict[int, set]):
    """Per-answer records of 4 questions x 2 answers: question q is right at step s if in right[s]."""
    (path / "validation").mkdir()
    for step, ok in right.items():
        rows = [{"data_source": "d", "id": f"arithmetic/{q}", "sample_index": j, "correct": q in ok}
                for q in range(4) for j in range(2)]
        (path / "validation" / f"step-{step:06d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))


def test_a_metric_the_run_did_not_log_is_one_line_naming_what_it_did(tmp_path):
    write_run(tmp_path / "run", {0: 0.3, 10: 0.4})
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "run"), "--metric",
                             "val/accuracy", "-o", str(tmp_path / "c.png")], capture_output=True,
                            text=True)
    assert result.returncode == 2 and not (tmp_path / "c.png").exists()
    assert result.stderr.strip() == (f"error: {tmp_path / 'run'} logged no val/accuracy; pick "
                                     "--metric from its metrics: train/acc_fresh, val/acc")


def test_paired_runs_get_bands_and_the_difference_with_its_interval(tmp_path):
    write_run(tmp_path / "baseline", {0: 0.25, 2: 0.5})
    write_run(tmp_path / "rlep", {0: 0.25, 2: 0.75})
    write_validation(tmp_path / "baseline", {0: {0}, 2: {0, 1}})
    write_validation(tmp_path / "rlep", {0: {0}, 2: {0, 1, 2}})
    out = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "baseline"),
                             str(tmp_path / "rlep"), "-o", str(out), "--paired",
                             "--threshold", "0.7"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
    compared = json.loads(out.with_suffix(".json").read_text())["paired"]
    assert [(p["step"], p["diff"]) for p in compared["per_step"]] == [(0, 0.0), (2, 0.25)]
    assert compared["area"]["diff"] == 0.125  # (0 + 0.25) / 2 over two steps
    assert compared["to_threshold"]["fixed"]["b"]["step"] == 2
    assert compared["to_threshold"]["fixed"]["a"]["step"] is None
    # a run without per-answer records cannot be paired: one line
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "metrics.jsonl").write_text((tmp_path / "rlep" / "metrics.jsonl").read_text())
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "baseline"),
                             str(tmp_path / "bare"), "--paired", "-o", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "validation" in result.stderr


def test_replay_panel_draws_every_replay_metric_of_every_run(tmp_path):
    for name, share in (("uniform", 0.2), ("rescue", 0.05)):
        (tmp_path / name).mkdir()
        lines = [{"step": s, "train/replay_fraction": share, "train/replays_per_group": 2 * share,
                  "train/replay_age_mean": s + 1, "pool/answers": 10 + s} for s in (1, 2, 3)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "replay.png"
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "uniform"),
                             str(tmp_path / "rescue"), "-o", str(out), "--replay"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["train/replay_fraction"]["rescue"] == [[1, 0.05], [2, 0.05], [3, 0.05]]
    assert data["pool/answers"]["uniform"] == [[1, 11.0], [2, 12.0], [3, 13.0]]
    assert data["train/acc_replay"] == {"uniform": [], "rescue": []}  # not logged: empty


def test_the_timeline_takes_logged_idle_times_or_a_synchronous_runs_phases(tmp_path):
    (tmp_path / "async").mkdir()
    (tmp_path / "sync").mkdir()
    (tmp_path / "async" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "time/step_s": 10.0, "time/rollout_idle": 2.0, "time/learner_idle": 3.0},
        {"step": 2, "time/step_s": 8.0, "time/rollout_idle": 9.0, "time/learner_idle": 1.0}]))
    (tmp_path / "sync" / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "time/step_s": 10.0, "time/rollout_s": 4.0}) + "\n")
    out = tmp_path / "timeline.png"
    result = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "async"),
                             str(tmp_path / "sync"), "-o", str(out), "--timeline"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["async"] == [
        {"step": 1, "step_s": 10.0, "rollout_idle_s": 2.0, "learner_idle_s": 3.0},
        {"step": 2, "step_s": 8.0, "rollout_idle_s": 8.0, "learner_idle_s": 1.0}]  # capped
    assert data["sync"] == [{"step": 1, "step_s": 10.0, "rollout_idle_s": 6.0,
                             "learner_idle_s": 4.0}]
    assert out.stat().st_size > 10_000
