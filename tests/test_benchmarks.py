"""benchmarks/ holds the scripts that reproduce a current figure of the docs, and each runs at a
tiny size in a test, so none can silently rot: which test runs which script (``TINY_RUNS``,
checked against the folder), and the tiny runs of the scripts that have no test file of their
own: the CPU step, the rollout engines, pool building, replay's step cost, the reward tool, the
sandbox and the tools' calls at once. Each runs as a subprocess on a random 2-layer model (tests/helpers/tiny.py) or a
handful of rows, and its figures are checked for being there and making sense, not for their
values. The studies (studies/) are tested where their own tests are."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch import env, why
from speed import scaled
import tiny

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
# each script and the test file that runs it at a tiny size
TINY_RUNS = {
    "actor_step.py": "test_benchmarks.py",
    "async_speed.py": "test_async_speed.py",
    "async_timeline.py": "test_async_timeline.py",
    "checkpoint_verify.py": "test_checkpoint_verify.py",
    "device_rewrite.py": "test_benchmarks.py",
    "gpu_update.py": "test_gpu_update.py",
    "memory_soak.py": "test_memory_soak.py",
    "peer_trl.py": "test_peer_trl.py",
    "pool_build.py": "test_benchmarks.py",
    "replay_step.py": "test_benchmarks.py",
    "rollout_engines.py": "test_benchmarks.py",
    "sandbox_latency.py": "test_benchmarks.py",
    "sandbox_throughput.py": "test_benchmarks.py",
    "score_throughput.py": "test_benchmarks.py",
    "step_profile.py": "test_step_profile.py",
    "suite_census.py": "test_benchmarks.py",
    "tool_calls.py": "test_benchmarks.py",
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny.make_model(tmp_path_factory.mktemp("bench") / "model")


def run(script: str, *args, timeout: float = 300, expect: int = 0, **extra_env) -> str:
    """The script's stdout; the test fails with its errors if its exit code is not ``expect``."""
    argv = [sys.executable, str(BENCHMARKS / script), *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout),
                          env=env(argv, **extra_env), cwd=REPO)
    assert done.returncode == expect, why(done)
    return done.stdout


def last_json(stdout: str) -> dict:
    """The JSON object a script prints last, after whatever the libraries printed before it."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))


def test_every_benchmark_has_a_test_that_runs_it_at_a_tiny_size():
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    assert scripts == sorted(TINY_RUNS), (
        "benchmarks/ holds the scripts that reproduce a current figure, each run at a tiny size "
        f"by a test: add the new script's test to TINY_RUNS, or drop the missing one: {scripts}")
    for script, test in TINY_RUNS.items():
        assert script.removesuffix(".py") in (REPO / "tests" / test).read_text(), (script, test)


def test_the_reward_tool_scores_rows_on_one_core():
    r = last_json(run("score_throughput.py", "--rows", 40, timeout=60))
    assert r["rows"] == 40 and r["error"] == 0 and r["rows_per_second"] > 0
    assert 0.3 < r["accuracy"] < 0.7  # half the rows are written correct


def test_the_sandbox_runs_programs_answers_and_the_judge():
    r = last_json(run("sandbox_throughput.py", "--programs", 1, "--workers", 1, timeout=120))
    assert r["trivial"]["per_s"] > 0 and r["half_second"]["s_each"] > 0.2
    assert r["code_answers_1_workers"]["per_s"] > 0
    assert set(r["judge"]) == {f"{a}_{t}" for a in ("trivial", "half_second")
                               for t in ("check", "pytest")}
    assert all(row[way]["per_s"] > 0 for row in r["judge"].values()
               for way in ("judge", "one_process"))


def test_the_sandbox_latency_is_measured_in_two_trees_taken_in_turn():
    r = last_json(run("sandbox_latency.py", "--calls", 2, "--rounds", 1, "--trees", REPO, REPO,
                      timeout=120))
    for key in ("trivial_program_ms", "tool_call_ms", "tool_calls_per_s_8_workers"):
        assert r[key]["A"] > 0 and r[key]["B"] > 0 and r[key]["B_over_A"] > 0, r


def test_tool_calls_at_once_and_one_after_another_make_the_same_answers():
    r = last_json(run("tool_calls.py", "--engine", "transformers", "--questions", 2,
                      "--samples", 1, "--max-tokens", 40, "--repeats", 1, timeout=240))
    assert r["answers"] == 2 and r["calls"] >= 1  # the built-in model calls the tool
    assert r["serial_tools_s"]["median"] > 0 and r["rollout_s_serial_over_parallel"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("mode", [[], ["--onednn", "--share-prompts", "2"]],
                         ids=["against-transformers", "onednn"])
def test_the_actor_step_is_timed_counted_and_compared(model, mode):
    r = last_json(run("actor_step.py", "--model", model, "--sequences", 4, "--prompt", 8,
                      "--response", 8, "--micro-batch-size", 2, "--repeats", 1,
                      "--peak-size", 256, *mode))
    a, b = ("onednn", "mkl") if mode else ("megatron", "transformers")
    assert r[a]["median_s"] > 0 and r[b]["median_s"] > 0
    assert r[f"ratio_{a}_over_{b}"] > 0 and r["flops"]["of_step"] == a
    assert r["flops"]["step_gflop"] > 0 and 0 < r["flops"]["share_of_peak"] < 1
    if mode:  # both from the same weights and optimizer state: equal to fp32 rounding
        assert r["weights_max_difference"] < 1e-5
    assert r["batch"]["sequences"] == 4


@pytest.mark.e2e
def test_the_rollout_engines_generate_sync_and_start(model, tmp_path):
    from megatron_rlep.rollout import vllm_unavailable

    if vllm_unavailable():
        pytest.skip("vLLM does not import here")
    out = run("rollout_engines.py", "--model", model, "--repeats", 1, "--max-tokens", 4,
              "--json", tmp_path / "engines.json", timeout=600)
    assert "| demo rollout |" in out and "| engine start-up (s) |" in out
    r = json.loads((tmp_path / "engines.json").read_text())
    assert set(r) == {"transformers", "vllm"}
    for engine in r.values():
        assert engine["start_s"] > 0 and engine["sync_s"] > 0
        for workload in ("demo rollout", "evaluation", "pool"):
            assert 0 < engine[workload]["tokens"] <= 4 * {"demo rollout": 24, "evaluation": 128,
                                                          "pool": 64}[workload]


def test_the_device_rewrite_is_timed_on_and_paused_with_the_same_answers(model, tmp_path):
    run("device_rewrite.py", "--model", model, "--pairs", 2, "--max-tokens", 4, "--engines",
        "transformers", "--json", tmp_path / "rewrite.json")
    r, = json.loads((tmp_path / "rewrite.json").read_text())
    assert r["engine"] == "transformers" and len(r["per_pair"]) == 2
    x = r["on_over_paused"]
    assert x["low"] <= x["ratio"] <= x["high"] and x["rounds"] == 2


def test_the_suite_census_counts_each_process_its_cpu_and_its_test(tmp_path):
    child = "sum(i * i for i in range(3_000_000))"  # a grandchild that burns some CPU
    run("suite_census.py", "--out", tmp_path, "--", sys.executable, "-c",
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}]); sys.exit(3)",
        expect=3)
    r = json.loads((tmp_path / "census.json").read_text())
    assert r["exit_code"] == 3 and r["processes"] == 2 and r["cpu_s"] > 0.05
    (kind, row), = r["by_kind"].items()
    assert kind == "python -c" and row["processes"] == 2
    assert row["cpu_s"] == pytest.approx(r["cpu_s"], abs=0.02)
    assert list(r["by_test_file"]) == ["tests/test_benchmarks.py"]  # inherited by both
    assert 0 <= r["idle_share"] <= 1
    again = run("suite_census.py", "--out", tmp_path, "--summary", expect=3)
    assert "2 processes" in again and json.loads((tmp_path / "census.json").read_text()) == r


@pytest.mark.e2e
def test_pool_building_and_bare_generation_draw_the_same_samples(model):
    r = last_json(run("pool_build.py", "--shards", 2, f"model.path={model}", "samples=2",
                      "shard_size=2", "data.train_size=4", "rollout.max_response_length=4"))
    assert r["shards"] == 2 and r["samples"] == 8
    assert r["bare_samples_per_s"] > 0 and r["build_samples_per_s"] > 0
    assert r["builder_work_s"] > 0


@pytest.mark.e2e
def test_replay_adds_its_answers_to_the_update_and_none_to_the_rollout(model, tmp_path):
    r = last_json(run("replay_step.py", "--steps", 1, f"model.path={model}",
                      "rollout.engine=transformers", "data.train_size=4", "data.eval_size=2",
                      "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
                      "algorithm.rollouts_per_prompt=2", "rollout.max_response_length=4",
                      "logging.progress=false", TMPDIR=str(tmp_path)))
    m0, m2 = r["M=0"], r["M=2"]
    assert (m0["sequences"], m2["sequences"]) == (4, 8)  # 2 prompts x (G = 2, G + M = 4)
    assert m2["update_tokens"] > m0["update_tokens"] and r["floor_from_response_tokens"] > 1
    assert r["ratio_step_time_M2_over_M0"] > 0 and r["G"] == 2
