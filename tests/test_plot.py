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
