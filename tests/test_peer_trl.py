"""benchmarks/peer_trl.py at a tiny size, so it cannot silently rot: this trainer (transformers
engine) and TRL's GRPOTrainer each train one step of the same tiny job on a tiny random model
(SmolLM2's tokenizer and chat template) in their own process, their policies are evaluated by
tools/evaluate.py, and the table, JSON and picture are written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled
from tiny import make_model

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "peer_trl.py"
sys.path.insert(0, str(BENCH.parent))
import peer_trl  # noqa: E402

# 512 MiB touched, a forked child that keeps it (shared, copy-on-write), then 256 MiB more
FORKED = """
import os, time
a = bytearray(512 << 20)
if os.fork() == 0:
    time.sleep(1.5)
    os._exit(0)
b = bytearray(256 << 20)
time.sleep(1.5)
os.wait()
"""


@pytest.mark.parametrize("reading", ["cgroup", "pss"])
def test_a_forked_childs_shared_pages_count_once_in_the_peak(tmp_path, monkeypatch, reading):
    if reading == "pss":
        monkeypatch.setattr(peer_trl, "memory_cgroup", lambda: None)
    else:
        probe = peer_trl.memory_cgroup()
        if probe is None:
            pytest.skip("no memory cgroup can be made here (not root, or no cgroup v1)")
        probe.rmdir()
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    code, wall, peak, how = peer_trl.watched([sys.executable, str(script)], tmp_path / "log")
    assert code == 0 and wall > 1.5
    assert how == {"cgroup": "cgroup anonymous + shared", "pss": "proportional set sizes"}[reading]
    # 0.75 GiB and the interpreter; counted twice the shared 512 MiB would make it 1.25
    assert 0.75 <= peak < 1.0, peak


def test_a_job_that_does_not_divide_into_updates_is_refused_in_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--prompts", "3", "--per-update", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--prompts must be a multiple of --per-update" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before anything ran


@pytest.mark.e2e
@pytest.mark.parametrize("precision, rounds", [("fp32", 2), ("bf16", 1)])
def test_both_trainers_train_the_same_tiny_job_and_are_measured_and_evaluated(tmp_path, precision,
                                                                             rounds):
    out = tmp_path / "peer"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--precision", precision, "--modes", "ours-transformers",
         "trl", "--rounds", str(rounds), "--steps", "1",
         "--eval-at", "1", "--group", "2", "--prompts", "2", "--per-update", "1",
         "--max-tokens", "8", "--eval-questions", "6", "--eval-samples", "1",
         "--eval-engine", "transformers", "--model", str(make_model(tmp_path / "model")),
         "--out", str(out)],
        capture_output=True, text=True, timeout=scaled(900))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "peer_trl.json").read_text())
    assert result["modes"] == ["ours-transformers", "trl"]
    # each trainer ran in the precision asked for: its own record of it
    assert result["runs"]["ours-transformers"]["precision"] == \
        {"fp32": "float32", "bf16": "bfloat16"}[precision]
    assert result["runs"]["trl"]["precision"] == \
        {"fp32": "float32", "bf16": "float32 weights, bf16 autocast"}[precision]
    for mode in result["modes"]:
        run = result["runs"][mode]
        f = run["figures"]
        assert 0 < f["generation_s"] < f["step_s"], (mode, f)
        # the modes took turns: each trained once a round, its figures over every round
        assert len(run["rounds"]) == f["steps_timed"] == rounds, (mode, f)
        if rounds == 2:
            assert (out / "round-1" / mode / "timing.json").is_file(), mode
        for each in run["rounds"]:
            # one step: 2 prompts x 2 answers of at most 8 tokens, generated and trained
            step = each["steps"][0]
            assert 4 <= step["generated_tokens"] == step["trained_tokens"] <= 32, (mode, step)
            assert 0.1 < each["peak_gib"] <= run["peak_gib"] < 20, (mode, run["peak_gib"])
            assert each["wall_s"] > step["step_s"], (mode, each["wall_s"])
        policy = Path(run["policies"]["1"])
        assert (policy / "config.json").is_file() and (policy / "tokenizer_config.json").is_file()
        samples = (out / "eval" / f"{mode}-1" / "samples.jsonl").read_text().splitlines()
        assert len(samples) == 6, mode  # 6 held-out questions x 1 answer
    assert result["curve_steps"] == [0, 1]
    assert set(result["curves"]) == {"ours-transformers", "trl"}
    assert result["curves"]["ours-transformers"]["acc"][0] == result["curves"]["trl"]["acc"][0]
    assert result["curves"]["trl"]["area_vs_first"]["low"] <= \
        result["curves"]["trl"]["area_vs_first"]["diff"] <= \
        result["curves"]["trl"]["area_vs_first"]["high"]
    table = (out / "peer_trl.md").read_text()
    assert "| ours-transformers | " in table and "| trl | " in table
    assert (out / "peer_trl.png").stat().st_size > 1000
    # TRL trained on this trainer's schedule: the first step's updates at lr / 2 (a 2-step
    # warm-up); TRL's own default would log 1e-05
    trl_log = (out / "trl.log").read_text()
    assert "'learning_rate': '5e-06'" in trl_log
