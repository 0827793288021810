"""A run with a Python tool in the loop, for real: the built-in model on the built-in calculator
task builds a pool of tool-using answers (tools/build_pool.py), an asynchronous RLEP run
(partial rollouts, one version of staleness) replays them with their masks, is killed with
SIGKILL in its second step, and the same command resumes it; then the same with the calls in the
chat template's format and the engine on a rollout rank of its own."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from launch import env, kill_job, launcher  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["rollout.tools=[python]", "rollout.max_turns=2", "rollout.max_response_length=64",
         "rollout.engine=transformers", "data.train=calculator", "data.levels=[1,2,3,4]",
         "data.train_size=4"]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_tool_run_replays_its_pools_trajectories_and_resumes_after_kill_9(tmp_path):
    from megatron_rlep.pool import ExperiencePool

    pool_dir = tmp_path / "pool"
    built = subprocess.run([sys.executable, str(ROOT / "tools" / "build_pool.py"), *TOOLS,
                            "samples=2", "min_correct=1", f"out={pool_dir}", "progress=false"],
                           capture_output=True, text=True, env=env(), timeout=scaled(300))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    pool = ExperiencePool.load(pool_dir)
    answers = [a for v in pool.entries.values() for a in v]
    assert answers and all(a.mask for a in answers)  # the built-in model calls the tool
    assert any(not m for a in answers for m in a.mask)  # observations recorded, masked
    assert json.loads((pool_dir / "manifest.json").read_text())["tools"] == ["python"]

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron_rlep.train", "experiment=cpu_demo_calculator", *TOOLS,
           "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
           "algorithm.rollouts_per_prompt=2", "algorithm.replay_per_prompt=1",
           f"algorithm.pool={pool_dir}", "algorithm.total_steps=2", "data.eval_size=2",
           # asynchronous: answers grow 16 tokens a segment, a weight update between turns
           "algorithm.max_staleness=1", "rollout.partial=true", "rollout.segment_tokens=16",
           "logging.eval_every=0", "logging.save_every=1", "logging.keep_checkpoints=1",
           "logging.wandb=disabled", "logging.progress=false", "logging.dump_batches=true",
           f"run_dir={run_dir}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(), start_new_session=True)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + scaled(400)
    while proc.poll() is None and time.time() < deadline and not latest.exists():
        time.sleep(0.2)
    time.sleep(3)  # into the second step's rollout
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert latest.read_text().strip() == "step-000001", out[-3000:]
    resumed = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=scaled(400))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "at step 1" in resumed.stdout
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert x["tools/calls_per_answer"] > 0 and 0 <= x["tools/time_share"] < 1
    for step in (0, 1):
        for group in json.loads((run_dir / "batches" / f"step-{step:06d}.json").read_text()):
            for s in group["samples"]:
                if s["replay"]:  # as the pool recorded it, observations never run again
                    (a,) = [a for a in answers if a.text == s["text"]]
                    assert s["response_ids"] == list(a.token_ids)
                    assert s["mask"] == [int(m) for m in a.mask]
                else:
                    assert len(s["mask"]) == len(s["response_ids"]) == len(s["logprobs"]) == \
                        len(s["versions"])
                    assert all(lp == 0.0 for lp, m in zip(s["logprobs"], s["mask"]) if not m)
                    assert all(step - 1 <= v <= step for v in s["versions"])

    # the chat template's format (rollout/chat_tools.py) on a rollout rank of its own: its engine
    # runs the calls, masks cross the bridge; killed in its second step, resumed by the same
    # command. Its tool messages are the template's, role markers included.
    apart = tmp_path / "apart"
    argv = [*launcher(2), *[a for a in cmd[1:] if not a.startswith(
                ("run_dir=", "algorithm.pool=", "algorithm.replay_per_prompt="))],
            "algorithm.replay_per_prompt=0", "rollout.tool_format=chat",
            "rollout.chat_template=hermes", "rollout.placement=disaggregated", "rollout.ranks=1",
            f"run_dir={apart}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(argv), start_new_session=True)
    latest, deadline = apart / "checkpoints" / "latest", time.time() + scaled(400)
    while proc.poll() is None and time.time() < deadline and not latest.exists():
        time.sleep(0.05)
    kill_job(proc.pid)  # at once: its second step takes under 3 s
    out, _ = proc.communicate(timeout=60)
    assert latest.read_text().strip() == "step-000001", out[-3000:]
    done = subprocess.run(argv, capture_output=True, text=True, env=env(argv),
                          timeout=scaled(400))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "at step 1" in done.stdout
    lines = [json.loads(x) for x in (apart / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and lines[0]["tools/time_share"] is None
    from transformers import AutoTokenizer

    from megatron_rlep.builtin_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    messages = []  # each run of masked tokens, decoded
    for step in (0, 1):
        for group in json.loads((apart / "batches" / f"step-{step:06d}.json").read_text()):
            for s in group["samples"]:
                marks = "".join("m" if kept else "o" for kept in s["mask"])
                for run in re.finditer("o+", marks):
                    messages.append(tokenizer.decode(s["response_ids"][run.start():run.end()]))
    assert sum(x["tools/calls_per_answer"] for x in lines) > 0 and messages
    head = "\n<|im_start|>user\n<tool_response>\n"  # or as much of it as the token limit left
    assert all(m.startswith(head) or head.startswith(m) for m in messages)
