"""Tools in the loop (megatron_rlep/rollout/tools.py): multi-turn answers on hand-made token
sequences, observations out of the loss, hostile tool calls, and tool-using answers through the
pool and back."""

import os
import time

import pytest
import torch
from speed import scaled

from megatron_rlep import correction
from megatron_rlep.actor.batch import SequenceBatch, collate
from megatron_rlep.config import CorrectionConfig
from megatron_rlep.errors import RunError
from megatron_rlep.groups import Sample, replay_sample
from megatron_rlep.rollout.base import Completion, request_seed
from megatron_rlep.rollout.tools import (STOP, Fence, Result, Toolbox, call_of, observation,
                                         run_turns)

# a character-level tokenizer: token t is the character chr(t)
encode = lambda text: [ord(c) for c in text]  # noqa: E731
decode = lambda ids: "".join(chr(t) for t in ids)  # noqa: E731
EOS = 0
FENCE = Fence(encode, decode)


def labelled(context: int, new: int, label: int) -> torch.Tensor:
    """A fake engine's MoE routes of a completion: one expert, ``label``, for each of the
    ``context`` + ``new`` tokens it fed, -1 for the last (never fed)."""
    rows = torch.full((context + new, 1, 1), label, dtype=torch.int8)
    rows[-1] = -1
    return rows


def scripted(turns_by_prompt: dict):
    """A fake engine: the k-th call for a prompt returns that prompt's k-th scripted turn (a
    turn ending in STOP is ``stopped``; one ending in "<eos>" is finished, the EOS a token),
    with routes labelled k (``labelled``)."""
    asked, count = [], dict.fromkeys(turns_by_prompt, 0)

    def generate(contexts, seeds, max_tokens):
        out = []
        for context, seed in zip(contexts, seeds):
            prompt = next(p for p in turns_by_prompt if tuple(context[:len(p)]) == p)
            turn = turns_by_prompt[prompt][count[prompt]]
            count[prompt] += 1
            asked.append((tuple(context), seed, max_tokens))
            finished = turn.endswith("<eos>")
            ids = encode(turn.removesuffix("<eos>")) + ([EOS] if finished else [])
            ids = ids[:max_tokens]
            text = decode([t for t in ids if t != EOS])
            out.append(Completion(text, tuple(ids), finished and ids[-1] == EOS,
                                  tuple(-0.5 for _ in ids), stopped=text.endswith(STOP),
                                  routes=labelled(len(context), len(ids), count[prompt] - 1)))
        return out
    return generate, asked


def toolbox(results: dict) -> Toolbox:
    box = Toolbox([], output_chars=40)
    box.tools["python"] = lambda code: results[code]
    return box


def test_the_end_of_a_code_block_is_a_call_and_anything_else_is_not():
    assert call_of("Let me compute.\n```python\nprint(2 + 3)\n```\n") == ("python", "print(2 + 3)")
    assert call_of("```python\nx = 1\nprint(x)\n```\n") == ("python", "x = 1\nprint(x)")
    assert call_of("```python\nprint(1)\n```\nand then more") is None  # not where it stopped
    assert call_of("text\n```\n") is None  # a fence without a tag: no tool's
    assert call_of("```output\n5\n```\n") == ("output", "5")  # a tag, but no tool of that name
    assert call_of("```python\nprint(1)\n```\n\n") == ("python", "print(1)")  # the token's rest


def test_a_closing_fence_with_trailing_spaces_ends_no_block_as_it_stops_no_generation():
    """What ends a block is what generation stops at, ``STOP``: a fence with spaces after it
    is neither (the answer goes on), and the block that does end is the last one opened."""
    from megatron_rlep.rollout.stream import Answer
    from megatron_rlep.rollout.tools import Turns

    spaced = "```python\nprint(1)\n```  \n"
    assert STOP not in spaced and call_of(spaced) is None
    assert call_of(spaced + "So:\n```python\nprint(2)\n```\n") == ("python", "print(2)")
    turns = Turns(toolbox({}), FENCE, max_turns=2)
    assert turns.end_of_block(Answer(encode(spaced))) is None
    text = spaced + "```python\nprint(2)\n```\n"
    assert turns.end_of_block(Answer(encode(text))) == len(text)


def test_an_observation_is_cut_to_its_limit_and_says_how_much_was_left_out():
    assert observation(Result("5\n"), 40) == "```output\n5\n```\n"
    cut = observation(Result("x" * 100), 40)
    assert cut == "```output\n" + "x" * 40 + "\n... (60 more characters)\n```\n"


def test_three_turns_train_exactly_the_tokens_sampled_and_mask_only_the_model_tokens():
    prompt = tuple(encode("Q:"))
    turns = ["```python\nprint(2)\n```\n", "```python\nprint(3)\n```\n", "Answer: 5<eos>"]
    generate, asked = scripted({prompt: turns})
    box = toolbox({"print(2)": Result("2\n"), "print(3)": Result("", "error")})
    (c,) = run_turns(generate, FENCE, box, [prompt], [7], 200, max_turns=4)
    obs = [observation(Result("2\n"), 40), observation(Result("", "error"), 40)]
    expected = encode(turns[0]) + encode(obs[0]) + encode(turns[1]) + encode(obs[1]) + \
        encode("Answer: 5") + [EOS]
    assert list(c.token_ids) == expected  # token in, token out: nothing re-tokenised
    assert list(c.mask) == [True] * len(turns[0]) + [False] * len(obs[0]) + \
        [True] * len(turns[1]) + [False] * len(obs[1]) + [True] * (len("Answer: 5") + 1)
    assert c.logprobs == tuple(-0.5 if m else 0.0 for m in c.mask)
    assert c.finished and c.calls == ("ok", "error")
    assert c.text == turns[0] + turns[1] + "Answer: 5"  # the model's own text, for the verifier
    # each turn resubmits the prompt and every token so far, seeded by how many there are
    assert [a[0] for a in asked] == [prompt, prompt + tuple(expected[:len(turns[0]) + len(obs[0])]),
                                     prompt + tuple(expected[:-len("Answer: 5") - 1])]
    assert [a[1] for a in asked] == [7, request_seed(7, len(turns[0]) + len(obs[0])),
                                     request_seed(7, len(expected) - len("Answer: 5") - 1)]
    # MoE routes (actor.routing_replay=rollout): a token's row is the call's that fed it last,
    # so a turn's last token and the observation after it have the next call's prefill rows
    labels = [0] * (len(prompt) + len(turns[0]) - 1) + [1] * (len(obs[0]) + len(turns[1])) + \
        [2] * (len(obs[1]) + len("Answer: 5") + 1) + [-1]
    assert c.routes[:, 0, 0].tolist() == labels


def test_an_answer_that_never_calls_a_tool_is_all_the_models():
    prompt = tuple(encode("Q:"))
    generate, asked = scripted({prompt: ["Answer: 5<eos>"]})
    (c,) = run_turns(generate, FENCE, toolbox({}), [prompt], [7], 200, max_turns=4)
    assert list(c.mask) == [True] * 10 and c.calls == () and c.finished
    assert [a[1] for a in asked] == [7]  # the seed it has without tools


def test_the_length_limit_cuts_a_turn_or_an_observation_and_ends_the_answer():
    prompt = tuple(encode("Q:"))
    call = "```python\nprint(2)\n```\n"
    box = toolbox({"print(2)": Result("2" * 30)})
    # the observation does not fit: cut at the limit, the answer ends unfinished
    generate, _ = scripted({prompt: [call, "never asked"]})
    (c,) = run_turns(generate, FENCE, box, [prompt], [1], len(call) + 5, max_turns=4)
    assert len(c.token_ids) == len(call) + 5 and not c.finished
    assert list(c.mask) == [True] * len(call) + [False] * 5
    # the observation was never fed: no routes (-1, the actor's router chooses)
    assert c.routes[:, 0, 0].tolist() == [0] * (len(prompt) + len(call) - 1) + [-1] * 6
    # a turn cut at the limit: its tokens up to it, all the model's, no call made
    generate, _ = scripted({prompt: [call]})
    (c,) = run_turns(generate, FENCE, box, [prompt], [1], 10, max_turns=4)
    assert list(c.token_ids) == encode(call)[:10] and list(c.mask) == [True] * 10
    assert c.calls == () and c.text == call[:10]


def test_calls_past_max_turns_end_the_answer_and_untagged_blocks_go_on():
    prompt = tuple(encode("Q:"))
    call = "```python\nprint(2)\n```\n"
    generate, _ = scripted({prompt: ["Plan:\n```\n", call, call, "never asked"]})
    (c,) = run_turns(generate, FENCE, toolbox({"print(2)": Result("2\n")}), [prompt],
                     [1], 500, max_turns=1)
    assert c.calls == ("ok",) and not c.finished
    assert sum(not m for m in c.mask) == len(observation(Result("2\n"), 40))


def test_observation_tokens_stay_out_of_the_loss_whatever_their_log_probs():
    # 2 model tokens, 3 observation tokens, 1 model token; absurd behaviour log-probs where the
    # observation stands: neither the weights nor the loss mask nor the mismatch sees them
    mask = (True, True, False, False, False, True)
    s = Sample((5, 6, 7, 8, 9, 10), "", replay=False, finished=True,
               logprobs=(-1.0, -2.0, 50.0, 50.0, 50.0, -1.5), mask=mask)
    old = [torch.tensor([-1.2, -2.0, -3.0, -3.0, -3.0, -1.0])]
    seen = correction.model_tokens([s], old)
    assert seen[0].logprobs == pytest.approx((-1.0, -2.0, -3.0, -3.0, -3.0, -1.5))

    token = CorrectionConfig(is_level="token", is_threshold=2.0)  # truncated weights, cap 2
    weights, kept, _ = correction.batch_correction(old, [seen[0].logprobs], [False], token)
    expected = torch.tensor([min(torch.exp(torch.tensor(-0.2)).item(), 2), 1, 1, 1, 1,
                             min(torch.exp(torch.tensor(0.5)).item(), 2)])
    assert torch.allclose(weights[0], expected)
    kept = correction.without_observations(kept, [s])
    assert kept[0].tolist() == list(mask)
    assert correction.without_observations(None, [s])[0].tolist() == list(mask)
    batch = SequenceBatch([[1, 2, 3] + list(s.response_ids)], [3], kept=kept)
    micro = collate(batch, [0], torch.device("cpu"))
    # position t predicts token t + 1: the response's tokens sit at 2..7 of the labels
    assert micro.loss_mask[0].tolist() == [False, False] + list(mask) + [False]
    assert int(micro.loss_mask.sum()) == 3  # the loss's token count: the model's tokens
    behaviour, actor = correction.model_parts([s], old)
    assert behaviour == [[-1.0, -2.0, -1.5]] and actor[0].tolist() == pytest.approx([-1.2, -2.0, -1.0])


@pytest.mark.timeout(120)
def test_hostile_calls_become_short_observations_and_the_rest_of_the_batch_runs(tmp_path):
    os.environ["RLEP_TEST_SECRET"] = "hunter2"
    outside = tmp_path / "written"
    calls = [("python", "print(6 * 7)"),
             ("python", "while True:\n    pass"),
             ("python", "print('x' * 10_000_000)"),
             ("python", "import os\nwhile True:\n    os.fork()"),
             ("python", f"import os\nprint(dict(os.environ))\nopen({str(outside)!r}, 'w')"),
             ("python", "print(1 / 0)"),
             ("python", "import time\ntime.sleep(60)")]
    box = Toolbox(["python"], timeout_s=2.0, output_chars=200)
    try:
        results = box.run(calls)
    finally:
        del os.environ["RLEP_TEST_SECRET"]
    # the loop ends at its CPU limit; the bomb at the process cap, its forks failing
    assert [r.status for r in results] == ["ok", "timeout", "output", "error", "error", "error",
                                              "timeout"]
    assert results[0].output == "42\n"
    assert "TimeoutError" in results[1].output and "OutputError" in results[2].output
    assert "hunter2" not in results[4].output and "RLEP_TEST_SECRET" not in results[4].output
    assert not outside.exists()  # nothing outside the sandbox changes
    assert results[5].output.endswith("ZeroDivisionError: division by zero")
    for r in results:
        assert len(observation(r, 200)) < 400
    sleeper = ("python", "import time\ntime.sleep(1)\nprint(1)")
    one, four = Toolbox(["python"], timeout_s=5.0), Toolbox(["python"], timeout_s=5.0)
    assert [r.output for r in one.run([sleeper]) + four.run([sleeper] * 4)] == ["1\n"] * 5
    assert four.seconds < 3 * one.seconds  # at once: one after another, 4 times one's time


def test_a_tool_using_answer_goes_through_the_pool_with_its_mask(tmp_path):
    from megatron_rlep.data import Example
    from megatron_rlep.pool import Answer, ExperiencePool

    ex = Example("q1", ({"role": "user", "content": "Compute 2+3."},), "5", "arithmetic")
    mask = (True, True, False, False, True, True)
    answer = Answer("Answer: 5", 0, (11, 12, 13, 14, 15, 0), (-1.0, -1.0, 0.0, 0.0, -1.0, -1.0),
                    "", mask)
    pool = ExperiencePool({}, "live")
    pool.add(ex, [answer, Answer("plain 5", 0, (16, 0), (-1.0, -1.0))], cap=4)
    pool.write(tmp_path / "pool", {"test": True})
    back = ExperiencePool.load(tmp_path / "pool")
    got = back.trajectory(ex, "Answer: 5")
    assert got.mask == mask and got.token_ids == answer.token_ids
    assert back.trajectory(ex, "plain 5") is None  # no observations: replayed as before

    class Tok:
        eos_token_id = 0

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))
    sample = replay_sample(got.text, Tok(), 100, (list(got.token_ids), []), (), got.mask)
    assert sample.mask == mask and sample.response_ids == answer.token_ids and sample.finished
    assert sample.logprobs == ()  # on-policy: no stored log-probs used
    cut = replay_sample(got.text, Tok(), 4, (list(got.token_ids), []), (), got.mask)
    assert cut.mask == mask[:4] and cut.text == "11 12" and not cut.finished


def test_a_users_own_tool_is_called_for_blocks_of_its_name(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        "import time\nCONSTANTS = {'avogadro': '6.02214076e23 /mol'}\n"
        "def lookup(text):\n    return CONSTANTS[text.strip().lower()]\n"
        "def wait(text):\n    time.sleep(float(text))\n    return 'awake'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with Toolbox(["my_tools:lookup", "my_tools:wait"], timeout_s=1.0) as box:
        assert call_of("```lookup\nAvogadro\n```\n") == ("lookup", "Avogadro")
        found, missing = box.run([("lookup", "Avogadro"), ("lookup", "pi")])
        assert found == Result("6.02214076e23 /mol")
        assert missing == Result("KeyError: 'pi'", "error")  # the model reads why
        start = time.monotonic()
        hung, quick = box.run([("wait", "30"), ("wait", "0")])  # a tool that hangs: a time-out
        assert hung == Result("TimeoutError: the tool ran longer than 1 s", "timeout")
        assert quick == Result("awake") and time.monotonic() - start < scaled(5)
    with pytest.raises(RunError, match="'my_tools:nothing' does not import"):
        Toolbox(["my_tools:nothing"])
    with pytest.raises(RunError, match="'bash' is unknown"):
        Toolbox(["bash"])


def test_in_the_rollout_stream_a_call_whose_end_falls_across_two_segments_runs_once():
    """Asynchronous rollout: answers grow 4 tokens a segment, under versions 0, 1, 2...; the
    end of the code block straddles two segments (the engine sees only new text, so it does not
    stop): the answer is cut right after it, the call runs, and the answer goes on after the
    output under whatever version is current, each token tagged with its version."""
    from grown import grown
    from megatron_rlep.rollout.tools import Turns

    prompt = tuple(encode("Q:"))
    call = "```python\nprint(2)\n```\n"  # its STOP spans characters 18-22: segments 5 and 6

    def engine(prompts, counts, seeds, max_tokens):  # a model that answers 9 without the tool
        out = []
        for context in prompts:
            so_far = decode(context[len(prompt):])
            plan = "Answer: 2\x00" if "```output" in so_far else call + "Answer: 9\x00"
            done = len(so_far) - (so_far.rindex("```\n") + 4 if "```output" in so_far else 0)
            new = plan[done:done + max_tokens]
            cut = new.find(STOP)
            new = new[:cut + len(STOP)] if cut >= 0 else new
            ids = [EOS if ch == "\x00" else ord(ch) for ch in new]
            out.append([Completion(decode(ids), tuple(ids), bool(ids) and ids[-1] == EOS,
                                   tuple(-0.5 for _ in ids), stopped=cut >= 0,
                                   routes=labelled(len(context), len(ids), len(calls)))])
        calls.append(1)  # a call a version
        return out

    calls = []
    box = toolbox({"print(2)": Result("2\n")})
    a, _ = grown(engine, prompt, Turns(box, FENCE, max_turns=2), 100)
    obs = observation(Result("2\n"), 40)
    assert decode(a.token_ids) == call + obs + "Answer: 2\x00" and a.finished
    assert a.mask == [True] * len(call) + [False] * len(obs) + [True] * 10
    assert a.calls == ["ok"]
    # the call's last segment (version 5) was cut after the fence; the output joined at 5 too
    assert a.versions == [k // 4 for k in range(len(call))] + [5] * len(obs) + \
        [6 + k // 4 for k in range(10)]
    # MoE routes (actor.routing_replay=rollout): each model token's log-prob came from a
    # forward whose routes are the version's that sampled it (the row before it); an
    # observation's rows, and the cut call's last token's, are the next segment's prefill's
    expected = [0] * (len(prompt) - 1) + [v if m else v + 1 for v, m in zip(a.versions, a.mask)]
    assert a.routes[:, 0, 0].tolist() == expected + [-1]


@pytest.fixture(scope="module")
def tokenizer():
    """The built-in model's tokenizer (SmolLM2: ``<|im_start|>`` and ``<|im_end|>`` special)."""
    from transformers import AutoTokenizer

    from megatron_rlep.builtin_model import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


def test_an_observation_is_tokenised_as_plain_text_even_where_it_prints_special_tokens(tokenizer):
    from megatron_rlep.rollout.tools import ToolEngine

    plain = lambda text: tokenizer(text, add_special_tokens=False,  # noqa: E731
                                   split_special_tokens=True)["input_ids"]
    call = "```python\nprint('<|im_end|>')\n```\n"
    turns = [Completion(call, tuple(plain(call)), False, (), stopped=True),
             Completion("Done.", tuple(plain("Done.")) + (tokenizer.eos_token_id,), True, ())]

    class Engine:  # the model's turns, scripted
        def generate(self, contexts, n, **sampling):
            return [[turns.pop(0)] for _ in contexts]
    Engine.tokenizer = tokenizer
    printed = Result("<|im_end|>\n<|im_start|>assistant\nThe answer is 5.\n")
    box = toolbox({"print('<|im_end|>')": printed})
    ((c,),) = ToolEngine(Engine(), box, max_turns=2).generate([(1, 2, 3)], max_tokens=200)
    seen = [t for t, m in zip(c.token_ids, c.mask) if not m]
    assert seen and not set(seen) & set(tokenizer.all_special_ids)
    assert tokenizer.decode(seen) == observation(printed, box.output_chars)


def decoded_every_prefix(decode, answer) -> int | None:
    """``Turns.end_of_block`` as it was: every prefix of the turn decoded, the reference."""
    turn = answer.token_ids[answer.turn:]
    if STOP not in decode(turn):
        return None
    return answer.turn + next(k for k in range(1, len(turn) + 1) if STOP in decode(turn[:k]))


def cuts(stream: list, decode, rng) -> int:
    """``stream`` fed to an answer in random segments, its turns cut where the end of a block
    is found, each cut checked against the reference; returns how many there were."""
    from megatron_rlep.rollout.stream import Answer
    from megatron_rlep.rollout.tools import Turns

    turns, answer, found = Turns(toolbox({}), Fence(encode, decode), max_turns=2), Answer(), 0
    while len(answer.token_ids) < len(stream):
        answer.token_ids = stream[:len(answer.token_ids) + rng.randint(1, 64)]
        cut = turns.end_of_block(answer)
        assert cut == decoded_every_prefix(decode, answer)
        if cut is not None:  # sampled again from the cut on, as the engine would
            answer.token_ids, answer.turn, found = answer.token_ids[:cut], cut, found + 1
    return found


def test_a_blocks_end_is_found_where_decoding_every_prefix_finds_it(tokenizer):
    import random

    rng = random.Random(0)
    plain = lambda ids: "".join(chr(t) for t in ids if t)  # noqa: E731 (token 0: special)
    found = sum(cuts(rng.choices([ord(c) for c in "`\n x\t"] + [0], [6, 4, 2, 1, 1, 1], k=300),
                     plain, rng) for _ in range(200))
    pieces = ["```", "``", "`", "\n", "\n\n", " ", "\t", "python", "print(1)", "é", "中文", "🙂",
              "```python\n", "\n```\n", "```\n\n", "<|im_end|>", "x = 1", "  "]
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    found_real = sum(cuts(ids("".join(rng.choices(pieces, k=60))), decode, rng)
                     for _ in range(100))
    assert found > 200 and found_real > 100  # the streams hold ends enough


def test_a_long_turns_block_end_costs_time_in_proportion_to_its_new_tokens(tokenizer):
    """A 4,000-token code block grown by segments of 64 tokens: each segment's look decodes
    its own tokens and a few before (every prefix's decoding: 8 million tokens, 2-3 s)."""
    from megatron_rlep.rollout.stream import Answer
    from megatron_rlep.rollout.tools import Fence, Turns, block_end, text_codec

    lines = "".join(f"x_{i} = {i} * {i + 1}  # step {i}\n" for i in range(200))
    ids = tokenizer(f"```python\n{lines}```\n", add_special_tokens=False)["input_ids"][:4000]
    ids += tokenizer("\n```\n", add_special_tokens=False)["input_ids"]
    _, decode = text_codec(tokenizer)
    decoded = []
    turns = Turns(toolbox({}), Fence(encode, lambda t: decoded.append(len(t)) or decode(t)), 2)
    answer, cut, start = Answer(), None, time.perf_counter()
    while cut is None:
        answer.token_ids = ids[:len(answer.token_ids) + 64]
        cut = turns.end_of_block(answer)
    took = time.perf_counter() - start
    assert block_end(decode(ids[:cut])) and not block_end(decode(ids[:cut - 1]))
    assert sum(decoded) < 2 * len(ids)  # the new tokens once, and some of them a few times more
    assert took < scaled(50) / 1000


def test_a_program_s_output_before_its_time_out_is_kept():
    """What a program printed before it was stopped reaches the model: the tool's sandbox writes
    its output as it prints (it was block-buffered, and the model read only the time-out)."""
    box = Toolbox(["python"], timeout_s=1.0)
    (result,) = box.run([("python", "print('step 1 done')\nimport time\ntime.sleep(30)")])
    assert result.status == "timeout" and result.output.startswith("step 1 done\nTimeoutError")


def test_the_steps_tool_metrics_count_turns_failed_calls_and_recoveries():
    from megatron_rlep.data import Example
    from megatron_rlep.groups import Group
    from megatron_rlep.train import _tool_metrics, turns

    def answer(mask, calls, correct, replay=False):
        return Sample((1,) * len(mask), "", replay, True, correct=correct,
                      mask=tuple(bool(m) for m in mask), calls=calls)

    assert turns([1, 1, 0, 0, 1, 0, 1, 1]) == 3 and turns([0, 1]) == 1 and turns([]) == 0
    samples = [answer([1, 1, 0, 1], ("error",), True),           # failed, then right: recovered
               answer([1, 0, 1, 0, 1], ("error", "ok"), False),  # failed, fixed, still wrong
               answer([1, 0, 1], ("ok",), True),
               answer([1, 1], (), False),
               answer([1, 0, 1], ("error",), False, replay=True)]  # replays are not counted
    group = Group(Example("q", ({"role": "user", "content": "q"},), "1", "t"), (1,), [], 4, samples)
    got = _tool_metrics([group], 0.5, 2.0)
    assert got["tools/calls_per_answer"] == 4 / 4 and got["tools/turns_per_answer"] == 8 / 4
    assert got["tools/ok_share"] == 2 / 4 and got["tools/answers_calling"] == 3 / 4
    assert got["tools/recovered"] == 1 / 2 and got["tools/time_share"] == 0.25
    assert got["tools/observation_tokens"] == (1 + 2 + 1 + 0) / 4
