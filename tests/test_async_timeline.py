"""benchmarks/async_timeline.py: the step simulator's pure parts on numbers worked out by hand, and
the script end to end (verl's check, the paper's sweep, its JSON and PNG)."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import async_timeline as at

# A toy GPU on which an engine's step costs 10 ms to read the weights and 1 ms an answer
TOY = at.Gpu("toy", hbm=2 * at.P_7B / (at.ETA_BW * 0.010), flops=2 * at.P_7B / (at.ETA_F * 0.001),
              memory=1e15)
PER_CTX = 0.010 * at.KV_BYTES / (2 * at.P_7B)  # seconds a context token adds to a step (3.8e-8)


def toy(**kw) -> at.Setup:
    base = {"name": "toy", "gpu": TOY, "prompts": 2, "answers": 2, "replays": 0, "prompt_tokens": 0,
            "max_len": 100, "mean_len": 4.0, "switch_s": 0.5, "train_rate": 8.0,
            "sync_gbps": 2 * at.P_7B / 1e9 / 0.01, "bucket_latency": 0.0}
    return at.Setup(**{**base, **kw})


def test_step_costs_and_k_steps_in_closed_form():
    fixed, per_answer, per_ctx, per_prompt = at.step_coefficients(toy(t0=0.002))
    assert fixed == pytest.approx(0.012) and per_answer == pytest.approx(0.001)
    assert per_ctx == pytest.approx(PER_CTX) and per_prompt == pytest.approx(0.001)
    # 3 steps of 2 answers holding 100 context tokens at first: 3 x (12 + 2) ms, and the context
    # read 100 + 102 + 104 = 306 times
    assert at.decode_time(toy(t0=0.002), 2, 100, 3) == pytest.approx(3 * 0.014 + 306 * PER_CTX)


def test_one_engine_batches_continuously_and_queues_beyond_its_concurrency():
    # one answer at a time: 2 steps of 11 ms, then 3 more; contexts 0+1, then 0+1+2
    finish = at.run_engine(toy(), np.array([2.0, 3.0]), concurrency=1)
    assert finish == pytest.approx([0.022 + 1 * PER_CTX, 0.055 + 4 * PER_CTX])
    # both at once: 2 steps of 12 ms (contexts 0 + 0, 1 + 1), then one of 11 ms (context 2)
    finish = at.run_engine(toy(), np.array([2.0, 3.0]), concurrency=2)
    assert finish == pytest.approx([0.024 + 2 * PER_CTX, 0.035 + 4 * PER_CTX])


def test_a_synchronous_step_with_every_answer_the_same_length(monkeypatch):
    monkeypatch.setattr(at, "SIGMA", 0.0)  # every answer exactly 4 tokens
    r = at.simulate(toy(), "synchronous", gpus=2)
    # 2 engines x 2 answers: 4 steps of 12 ms (contexts 0, 2, 4, 6); update 2 x 2 x 4 tokens on
    # 2 GPUs at 8 a second
    generate = 0.048 + 12 * PER_CTX
    assert r["generate"] == pytest.approx(generate)
    assert r["train"] == pytest.approx(1.0) and r["switch"] == 0.5
    assert r["step"] == pytest.approx(generate + 1.5)
    assert r["trainer_idle"] == pytest.approx(generate + 0.5) and r["rollout_idle"] == pytest.approx(1.5)


def test_one_step_off_where_the_rollout_dominates(monkeypatch):
    monkeypatch.setattr(at, "SIGMA", 0.0)
    r = at.simulate(toy(train_rate_alone=1000.0), "one-step-off", gpus=2, rollout_gpus=1)
    # one engine, 4 answers at once: 4 steps of 14 ms (contexts 0, 4, 8, 12); the update: 16
    # tokens at 1000 a second on 1 GPU; the broadcast 10 ms
    generate = 0.056 + 24 * PER_CTX
    assert r["generate"] == pytest.approx(generate) and r["train"] == pytest.approx(0.016)
    assert r["sync"] == pytest.approx(0.010)
    assert r["step"] == pytest.approx(0.010 + generate)
    assert r["rollout_idle"] == 0 and r["trainer_idle"] == pytest.approx(generate - 0.016)


def test_the_weight_sync_is_bytes_over_bandwidth_plus_a_latency_a_bucket():
    s = toy(sync_gbps=15.24, bucket_bytes=1 << 30, bucket_latency=0.005)
    # 15.24 GB at 15.24 GB/s, in 15 buckets of 1 GiB (15.24e9 / 2^30 = 14.2)
    assert at.broadcast_s(s) == pytest.approx(1.0 + 15 * 0.005)


def test_streaming_engines_hold_length_biased_answers_and_the_staleness_bound():
    s = toy(prompt_tokens=10, max_num_seqs=2, in_flight=100.0)
    lengths = np.array([1.0, 3.0])
    rate, a_step, refill = at.streaming(s, 1, lengths)
    # a running answer's mean context: 10 + E[L^2] / (2 E[L]) = 10 + 5 / 4
    assert a_step == pytest.approx(at.decode_time(s, 2, 2 * 11.25, 1))
    assert rate == pytest.approx(1 / (a_step / 2 + 10 * 0.001 / 2)) and refill == 0
    assert at.streaming(replace(s, recompute_kv=True), 1, lengths)[2] == pytest.approx(2 * 11.25 * 0.001)
    # answers of 100 and 300 tokens at 0.1 s a step, steps of 20 s: the longer spans 2 versions
    assert at.stale_share(np.array([100.0, 300.0]), 0.1, 20.0, 1) == 0.5
    assert at.stale_share(np.array([100.0, 300.0]), 0.1, 20.0, 2) == 0.0


def test_answer_lengths_have_the_mean_and_the_limit():
    lengths = at.answer_lengths(1000, 0.75, 10 ** 6, 20000)
    assert lengths.mean() == pytest.approx(1000, rel=0.01)
    assert at.answer_lengths(1000, 0.75, 1500, 1000).max() == 1500
    assert set(at.answer_lengths(7, 0.0, 100, 5)) == {7.0}
    assert at.solve(lambda x: x * x, 2.0, 0.0, 2.0) == pytest.approx(2 ** 0.5, abs=1e-5)


def test_the_script_writes_the_check_the_paper_sweep_and_the_picture(tmp_path, capsys):
    assert at.main(["--out", str(tmp_path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "| fully async, FSDP2, 128 H20" in out and "best one-step-off" in out
    result = json.loads((tmp_path / "async_timeline.json").read_text())
    assert (tmp_path / "async_timeline.png").stat().st_size > 10_000
    assert {p["name"] for p in result["parameters"]} >= {"answer lengths' log-sd", "weight broadcast"}
    for row in result["check"]:  # the synchronous rows are what the fit reproduces
        assert row["simulated_sync_step"] == pytest.approx(row["published_sync_step"], rel=0.01)
    central = next(iter(result["paper"].values()))
    baseline = central["synchronous"]["step"] - central["synchronous"]["train"] / 9  # M = 2 of G' = 18
    assert baseline == pytest.approx(at.PAPER_STEP_S, rel=0.01)
    assert set(central["best"]) == {"one-step-off", "fully async, N = 2",
                                    "fully async, N = 2, KV prefilled again", "fully async, N unbounded"}
