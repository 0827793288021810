"""studies/staleness_study.py on demo trees written here by hand: the differences from the
synchronous arm, each arm's RLEP minus its baseline, the minutes each arm takes to reach the
synchronous baseline's peak, and the means of what the runs logged of their lags."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "studies"))
import staleness_study  # noqa: E402

QUESTIONS = ["q1", "q2", "q3", "q4"]


def write_run(seed_dir: Path, run: str, start: float, points: dict, final: list[int],
              code: str = "c0de", pool: Path | None = None) -> None:
    """A demo run: ``points`` {step: (seconds since start, [correct per question])}, after
    step 0's validation and step 1 of 10 s; its final evaluation's correct per question in
    ``eval-RUN``; the code that trained it (``code.jsonl``) and, for RLEP, the pool it replayed
    (the seed's own, as the synchronous arm builds it, unless ``pool``)."""
    run_dir = seed_dir / run
    (run_dir / "validation").mkdir(parents=True)
    (run_dir / "code.jsonl").write_text(json.dumps({"commit": "abc", "code": code,
                                                    "dirty": False, "step": 0}) + "\n")
    if run == "rlep":
        pool = pool or seed_dir.parent.parent / "pools" / seed_dir.name
        pool.mkdir(parents=True, exist_ok=True)
        (pool / "manifest.json").write_text(json.dumps({"seed": seed_dir.name}))
    (run_dir / "config.json").write_text(json.dumps({"algorithm": {"pool": str(pool)
                                                                   if pool else None}}))
    # the demo's first row: the validation before step 1, with no step time
    rows = [{"step": 0, "time": start - 5.0, "val/acc": 0.0},
            {"step": 1, "time": start + 10.0, "time/step_s": 10.0, "stale/lag_versions_max": 0,
             "stale/lag_versions_mean": 0.0, "stale/tokens_versions_0": 1.0,
             "correction/fresh/m2_masked_fraction": 0.0, "actor/clip_fraction": 0.0,
             "stale/lag_0/clip_fraction": 0.0}]
    for step, (seconds, correct) in sorted(points.items()):
        rows.append({"step": step, "time": start + seconds, "time/step_s": 10.0,
                     "val/acc": sum(correct) / len(correct), "stale/lag_versions_max": step // 2,
                     "stale/lag_versions_mean": step / 4, f"stale/tokens_versions_{step // 2}": 1.0,
                     "correction/fresh/m2_masked_fraction": step / 100,
                     "actor/clip_fraction": step / 100,
                     f"stale/lag_{step // 2}/clip_fraction": step / 100,
                     f"stale/lag_{step // 2}/kl_behaviour_proximal": step / 1000})
        (run_dir / "validation" / f"step-{step}.jsonl").write_text("".join(
            json.dumps({"id": q, "correct": c}) + "\n" for q, c in zip(QUESTIONS, correct)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (seed_dir / f"eval-{run}").mkdir()
    (seed_dir / f"eval-{run}" / "samples.jsonl").write_text("".join(
        json.dumps({"id": q, "correct": c}) + "\n" for q, c in zip(QUESTIONS, final)))
    (seed_dir / "report.json").write_text("{}")


def arms(tmp_path: Path) -> dict[str, Path]:
    for seed in (1, 2):
        sync = tmp_path / "n0" / f"seed-{seed}"
        write_run(sync, "baseline", 1000.0, {2: (60, [1, 0, 0, 0]), 4: (120, [1, 1, 0, 0])},
                  [1, 0, 0, 0])
        write_run(sync, "rlep", 5000.0, {2: (60, [1, 1, 0, 0]), 4: (120, [1, 1, 1, 0])},
                  [1, 1, 0, 0])
        stale = tmp_path / "n1" / f"seed-{seed}"
        # reaches the baseline's peak (0.5) at its step 4 (90 s) in baseline; never in RLEP
        write_run(stale, "baseline", 0.0, {2: (45, [0, 0, 0, 1]), 4: (90, [1, 1, 0, 0])},
                  [1, 1, 0, 0])
        write_run(stale, "rlep", 0.0, {2: (45, [0, 0, 0, 0]), 4: (90, [0, 1, 0, 0])},
                  [0, 0, 0, 0])
    return {"sync": tmp_path / "n0", "n1": tmp_path / "n1"}


def test_differences_and_minutes_to_the_synchronous_baselines_peak(tmp_path):
    result = staleness_study.study(arms(tmp_path))
    assert result["baseline_peaks"] == {1: 0.5, 2: 0.5}
    sync, stale = result["arms"]["sync"], result["arms"]["n1"]
    # the synchronous baseline reaches its own peak at its step 4: 120 s after step 1 began
    assert sync["minutes_to_peak"]["baseline"]["per_seed"] == {1: 2.0, 2: 2.0}
    assert sync["minutes_to_peak"]["rlep"]["per_seed"] == {1: 1.0, 2: 1.0}
    assert stale["minutes_to_peak"]["baseline"] == {"per_seed": {1: 1.5, 2: 1.5}, "reached": 2,
                                                    "mean": 1.5}
    assert stale["minutes_to_peak"]["rlep"] == {"per_seed": {1: None, 2: None}, "reached": 0,
                                                "mean": None}
    versus = stale["versus_reference"]
    assert versus["baseline"]["eval"]["mean"] == pytest.approx(0.25)  # 0.5 - 0.25
    assert versus["rlep"]["eval"]["mean"] == pytest.approx(-0.5)  # 0 - 0.5
    # areas (trapezoid over steps 2..4, divided by the 2 steps): baseline 0.375 vs 0.375
    assert versus["baseline"]["area"]["mean"] == pytest.approx(0.0)
    assert versus["rlep"]["area"]["mean"] == pytest.approx(0.125 - 0.625)
    assert versus["rlep"]["eval"]["low"] <= -0.5 <= versus["rlep"]["eval"]["high"]
    assert sync["versus_reference"] == {}
    # within each arm, RLEP minus its own baseline: 0.5 - 0.25 synchronously, 0 - 0.5 stale
    assert sync["rlep_minus_baseline"]["eval"]["mean"] == pytest.approx(0.25)
    assert stale["rlep_minus_baseline"]["eval"]["mean"] == pytest.approx(-0.5)
    # the lags logged at steps 1, 2 and 4 of both seeds: 0, 1, 2 (mean 0, 0.5, 1)
    assert stale["logged"]["rlep"]["stale/lag_versions_max"] == 2
    assert stale["logged"]["rlep"]["stale/lag_versions_mean"] == pytest.approx(0.5)
    assert stale["logged"]["rlep"]["stale/replay/advantage_mean"] is None
    # the share of tokens at each lag, over every step (0 where a step had none at that lag)
    assert [stale["logged"]["rlep"][f"stale/tokens_versions_{k}"] for k in range(3)] == \
        pytest.approx([1 / 3] * 3)
    # M2PO's masked share at steps 1, 2 and 4: 0, 0.02, 0.04
    assert stale["logged"]["rlep"]["correction/fresh/m2_masked_fraction"] == pytest.approx(0.02)
    table = staleness_study.markdown(result)
    assert "| n1 | baseline | 2 | +0.250 [" in table and "| n1 | rlep | 2 |" in table
    assert "| 1.5 | 2/2 |" in table and "|  | 0/2 |" in table
    assert "| n1 | -0.500 [" in table and "| n1 | rlep | 0.50, 2 |" in table
    # by lag: the shares, KL at lags 1 and 2 (steps 2 and 4), the clipped shares (all; fresh at
    # lags 0 / 1 / 2 from steps 1, 2, 4; no replays); no truncation logged; M2PO's masked share
    assert "| n1 | rlep | 0.50, 2 | 0.33 / 0.33 / 0.33 | " in table
    assert "| 2.0e-03 / 4.0e-03 |  | 0.0200; 0.0000 / 0.0200 / 0.0400; - | 0.0200 |" in table


def test_the_record_proves_its_pairing_and_unpaired_arms_are_refused(tmp_path):
    """Issue 78, item 1: per arm and seed the record holds the code, the pool's path and hash,
    each run's evaluation and validation points and its lag shares; an arm whose RLEP replayed
    another pool, or whose runs another (or uncommitted) code trained, is refused in one
    sentence naming it (on f6a37d0 nothing was recorded and anything pooled)."""
    roots = arms(tmp_path)
    record = staleness_study.study(roots)["arms"]["n1"]["per_seed"][1]
    sync = staleness_study.study(roots)["arms"]["sync"]["per_seed"][1]
    assert record["rlep"]["pool"] == sync["rlep"]["pool"] and \
        record["rlep"]["pool"]["path"].endswith("pools/seed-1")
    assert record["baseline"]["pool"] is None and record["baseline"]["code"] == "c0de"
    assert record["baseline"]["eval"] == 0.5 and record["rlep"]["eval"] == 0.0
    assert record["baseline"]["validation"] == {0: 0.0, 2: 0.25, 4: 0.5}
    assert record["rlep"]["lag_shares"] == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
    # a pool of its own for seed 2's RLEP in arm n1
    own = tmp_path / "own"
    (roots["n1"] / "seed-2" / "rlep" / "config.json").write_text(json.dumps(
        {"algorithm": {"pool": str(own)}}))
    own.mkdir()
    (own / "manifest.json").write_text("{}")
    with pytest.raises(staleness_study.Unpaired, match=rf"^arm n1, seed 2: its RLEP replayed "
                                                       rf"{own} and the reference arm sync's "):
        staleness_study.study(roots)
    (roots["n1"] / "seed-2" / "rlep" / "config.json").write_text(json.dumps(
        {"algorithm": {"pool": str(tmp_path / "pools" / "seed-2")}}))
    # another code, then uncommitted changes, for one run
    line = {"commit": "abd", "code": "c0df", "dirty": False, "step": 3}
    with open(roots["n1"] / "seed-1" / "baseline" / "code.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")  # a resume at another commit's code
    with pytest.raises(staleness_study.Unpaired, match=r"^arm n1, seed 1, run baseline has no "
                                                       r"single committed code"):
        staleness_study.study(roots)
    (roots["n1"] / "seed-1" / "baseline" / "code.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(staleness_study.Unpaired, match=r"ran code c0df, the reference arm "
                                                       r"sync's ran c0de: rerun it"):
        staleness_study.study(roots)
    assert staleness_study.study(roots, codes=False)["arms"]["n1"]["seeds"] == [1, 2]
    done = subprocess.run([sys.executable, str(REPO / "studies" / "staleness_study.py"),
                           "--arms", f"sync={roots['sync']}", f"n1={roots['n1']}"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: arm n1, seed 1, run baseline")
    # both arms' RLEP name one pool, but it is gone: equal paths prove nothing
    shutil.rmtree(tmp_path / "pools" / "seed-2")
    with pytest.raises(staleness_study.Unpaired, match=r"^arm sync, seed 2: the pool .*seed-2 "
                                                       r"its RLEP or the reference arm's replayed "
                                                       r"is not here"):
        staleness_study.study(roots, codes=False)
    # a pool in one file (the authors' parquet): that file's bytes
    one = tmp_path / "pool.parquet"
    one.write_bytes(b"PAR1")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"algorithm": {"pool": str(one)}}))
    assert staleness_study.pool_of(tmp_path / "run")["sha256"] == \
        hashlib.sha256(b".\0PAR1").hexdigest()


def test_an_arm_without_finished_seeds_is_refused_in_one_sentence(tmp_path):
    roots = arms(tmp_path)
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, str(REPO / "studies" / "staleness_study.py"),
                           "--arms", f"sync={roots['sync']}", f"n2={tmp_path / 'empty'}"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "holds no finished demo seed" in done.stderr and "demo_seeds.py --root" in done.stderr
    out = tmp_path / "study.json"
    done = subprocess.run([sys.executable, str(REPO / "studies" / "staleness_study.py"),
                           "--arms", f"sync={roots['sync']}", f"n1={roots['n1']}", "--json",
                           str(out)],
                          capture_output=True, text=True, check=True)
    assert json.loads(out.read_text())["arms"]["n1"]["minutes_to_peak"]["baseline"]["mean"] == 1.5


def test_the_estimand_is_the_difference_in_differences_with_both_intervals(tmp_path):
    """Issue 78, item 2, by hand. Synchronously RLEP gains 0.5 - 0.25 in evaluation and
    0.625 - 0.375 in area; in n1 0 - 0.5 and 0.125 - 0.375 (seed 1), so the
    difference-in-differences is -0.75 and -0.5. With seed 2's stale RLEP evaluated at 0.25
    its evaluation's is -0.5: per seed [-0.75, -0.5], the t-interval over two seeds
    -0.625 +- 12.706 * 0.125; the bootstrap draws one resample of the four shared
    questions for every seed drawn, so it stays within the per-question extremes."""
    roots = arms(tmp_path)
    (roots["n1"] / "seed-2" / "eval-rlep" / "samples.jsonl").write_text("".join(
        json.dumps({"id": q, "correct": c}) + "\n" for q, c in zip(QUESTIONS, [1, 0, 0, 0])))
    did = staleness_study.study(roots)["arms"]["n1"]["did"]
    assert did["eval"]["per_seed"] == pytest.approx([-0.75, -0.5])
    assert did["eval"]["mean"] == pytest.approx(-0.625)
    half = 12.706 * 0.125  # t(1) x the seeds' standard deviation 0.25 / sqrt(2), / sqrt(2)
    assert (did["eval"]["t_low"], did["eval"]["t_high"]) == pytest.approx((-0.625 - half,
                                                                           -0.625 + half))
    assert -2.0 <= did["eval"]["low"] <= -0.625 <= did["eval"]["high"] <= 0.0
    assert did["area"]["per_seed"] == pytest.approx([-0.5, -0.5])
    assert did["area"]["t_low"] == pytest.approx(-0.5) == did["area"]["t_high"]
    result = staleness_study.study(roots)
    assert "did" not in result["arms"]["sync"]  # the reference against itself: nothing
    table = staleness_study.markdown(result)
    assert table.startswith("Difference-in-differences: RLEP minus baseline in the arm, minus "
                            "the same in sync")
    assert "| n1 | 2 | -0.625 | [" in table and "| -0.500 | [-0.500, -0.500] |" in table


def test_the_delay_model_finds_a_shifted_curve_and_says_what_a_shift_leaves():
    """Issue 78, item 4, by hand: a curve that is the reference 1.5 steps later fits d = 1.5
    with no residual (unshifted it is 0.15 off at three of five points); one that stops short
    of the reference's plateau leaves a residual at any shift."""
    reference = {0: 0.0, 2: 0.2, 4: 0.4, 6: 0.6, 8: 0.6}
    assert staleness_study.at(reference, -1) == 0.0 and staleness_study.at(reference, 9) == 0.6
    assert staleness_study.at(reference, 4.5) == pytest.approx(0.45)
    late = {s: staleness_study.at(reference, s - 1.5) for s in reference}
    assert late == pytest.approx({0: 0.0, 2: 0.05, 4: 0.25, 6: 0.45, 8: 0.6})
    fit = staleness_study.delay_fit(reference, late, most=4)
    assert fit["delay"] == pytest.approx(1.5) and fit["rms"] == pytest.approx(0.0, abs=1e-12)
    assert fit["rms_unshifted"] == pytest.approx(0.15 * (3 / 5) ** 0.5)
    short = {0: 0.0, 2: 0.2, 4: 0.3, 6: 0.3, 8: 0.3}
    assert staleness_study.delay_fit(reference, short, most=4)["rms"] > 0.05


def test_the_study_fits_the_delay_per_seed_and_reports_it(tmp_path):
    """The hand-made arms: n1's baseline is the synchronous one's curve (d = 0); its RLEP
    (0, 0, 0.25 at steps 0, 2, 4) is best matched by the synchronous RLEP (0, 0.5, 0.75) at
    the largest shift allowed, 2 steps (half the last step), with 0.25 left at step 4."""
    result = staleness_study.study(arms(tmp_path))
    delay = result["arms"]["n1"]["delay"]
    assert delay["baseline"]["mean"] == 0.0 and delay["baseline"]["rms"] == 0.0
    assert delay["rlep"]["per_seed"][1] == pytest.approx(
        {"delay": 2.0, "rms": (0.25 ** 2 / 3) ** 0.5,
         "rms_unshifted": ((0.5 ** 2 + 0.5 ** 2) / 3) ** 0.5})
    assert "delay" not in result["arms"]["sync"]
    table = staleness_study.markdown(result)
    assert "Delay model: each arm's validation points against sync's" in table
    assert "| n1 | rlep | 2 | 2.00 [2.00, 2.00] | 0.50 | 0.144 | 0.408 |" in table
