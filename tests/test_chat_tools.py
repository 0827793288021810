"""Tools in the chat template's format (rollout/chat_tools.py): hand-made turns of the built-in
model's tokenizer under the project's Hermes template, run through the same turn loop as fenced
calls."""

from __future__ import annotations

import json

import pytest
from speed import scaled

from megatron_rlep.errors import RunError
from megatron_rlep.rollout.base import Completion
from megatron_rlep.rollout.chat_tools import Chat, load_template, parse
from megatron_rlep.rollout.tools import Result, Toolbox, run_turns


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from megatron_rlep.builtin_model import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


def toolbox(results: dict) -> Toolbox:
    """``python`` answering each program from ``results``."""
    box = Toolbox(["python"], output_chars=400)
    box.tools["python"] = lambda arguments: results[arguments["code"]]
    return box


def call(code: str) -> str:
    return '\n<tool_call>\n{"name": "python", "arguments": ' + json.dumps({"code": code}) + \
        '}\n</tool_call>'


def scripted(tokenizer, turns: list[str]):
    """A fake engine answering one prompt: its k-th call returns turn k, ended by the model's
    end of turn (``<|im_end|>``, sampled: a token of the answer)."""
    asked = []

    def generate(contexts, seeds, max_tokens):
        (context,) = contexts
        asked.append(tuple(context))
        text = turns[len(asked) - 1]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [Completion(text, tuple(ids), True, tuple(-0.5 for _ in ids))]
    return generate, asked


def test_a_three_call_answer_trains_the_tokens_sampled_and_masks_exactly_the_tool_messages(
        tokenizer):
    chat = Chat(tokenizer, [Toolbox(["python"]).schemas()[0]], load_template("hermes"))
    question = [{"role": "user", "content": "What is 2 + 3 + 4?"}]
    prompt = chat.prompt(question)
    turns = ["I will add." + call("print(2 + 3)"),
             "Now both ways." + call("print(5 + 4)") + call("print(4 + 5)"),
             "Answer: 9"]
    generate, asked = scripted(tokenizer, turns)
    box = toolbox({"print(2 + 3)": Result("5\n"), "print(5 + 4)": Result("9\n"),
                   "print(4 + 5)": Result("", "error")})
    (c,) = run_turns(generate, chat, box, [prompt], [7], 500, max_turns=4)
    assert c.finished and c.calls == ("ok", "ok", "error") and len(asked) == 3
    # the model's tokens are the sampled ones, untouched; everything between them is masked
    model = [t for t, m in zip(c.token_ids, c.mask) if m]
    sampled = [t for turn in turns for t in tokenizer(turn, add_special_tokens=False)["input_ids"]
               + [tokenizer.eos_token_id]]
    assert model == sampled and c.text == "".join(turns)
    assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.mask) if not m)
    # the masked runs are exactly the template's tool messages, role markers included: the whole
    # answer reads as the template renders the conversation
    masked = "".join(tokenizer.decode([t]) if not m else "\x00" for t, m in zip(c.token_ids, c.mask))
    assert [run for run in masked.split("\x00") if run] == [
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\n<tool_response>\n9\n</tool_response>\n<tool_response>\n\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"]
    conversation = question + [
        {"role": "assistant", "content": "I will add.", "tool_calls": [
            {"function": {"name": "python", "arguments": {"code": "print(2 + 3)"}}}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "Now both ways.", "tool_calls": [
            {"function": {"name": "python", "arguments": {"code": "print(5 + 4)"}}},
            {"function": {"name": "python", "arguments": {"code": "print(4 + 5)"}}}]},
        {"role": "tool", "content": "9"}, {"role": "tool", "content": ""},
        {"role": "assistant", "content": "Answer: 9"}]
    rendered = chat.render(conversation)  # its last "\n" follows the answer's end of turn
    assert tokenizer.decode(list(prompt) + list(c.token_ids)) + "\n" == rendered
    # each turn resubmits the prompt and every token so far
    assert asked[1] == tuple(prompt) + c.token_ids[:len(asked[1]) - len(prompt)]


def test_the_tools_are_declared_in_the_system_turn_and_a_template_without_them_is_refused(
        tokenizer):
    schema = Toolbox(["python"]).schemas()[0]
    text = Chat(tokenizer, [schema], load_template("hermes")).render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and \
        json.dumps({"type": "function", "function": schema}) in text
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(RunError, match="shows the model no tools; set rollout.chat_template=hermes"):
        Chat(tokenizer, [schema])  # SmolLM2's own template ignores tools
    with pytest.raises(RunError, match="rollout.chat_template='nowhere.jinja' is neither"):
        load_template("nowhere.jinja")


def test_malformed_calls_become_error_observations_that_say_what_was_wrong(tokenizer):
    schemas = {"python": Toolbox(["python"]).schemas()[0]}
    assert parse('{"name": "python", "arguments": {"code": "print(1)"}}', schemas).error is None
    assert parse('{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}', schemas).input == \
        {"code": "1"}  # arguments as a JSON string of an object, as some models write them
    cases = {'{"name": "python", "arguments": {"code": "print(1)"}': "not valid JSON",
             '{"name": "bash", "arguments": {}}': "no tool named 'bash'; the tools are python",
             '{"name": "python", "arguments": {}}': "python needs the argument 'code'",
             '{"name": "python", "arguments": {"code": "1", "x": 2}}': "has no argument 'x'",
             '{"name": "python", "arguments": {"code": 12}}': "'code' must be a string",
             '{"arguments": {}}': "names no tool",
             '{"name": "python", "arguments": [1]}': "must be a JSON object"}
    for body, why in cases.items():
        assert why in parse(body, schemas).error, body
    chat = Chat(tokenizer, list(schemas.values()), load_template("hermes"))
    turn = "Try." + "\n<tool_call>\n{'name': 'python'}\n</tool_call>" + call("print(7)") + \
        "\n<tool_call>\n{\"name\": \"python\""
    generate, _ = scripted(tokenizer, [turn, "Answer: 7"])
    (c,) = run_turns(generate, chat, toolbox({"print(7)": Result("7\n")}), [(1, 2)], [1], 500, 4)
    assert c.calls == ("malformed", "ok", "malformed")
    observed = tokenizer.decode([t for t, m in zip(c.token_ids, c.mask) if not m])
    assert "ToolCallError: the call is not valid JSON (Expecting property name enclosed in " \
           "double quotes at character 1)" in observed
    assert "<tool_response>\n7\n</tool_response>" in observed
    assert "ToolCallError: the call is not closed; end it with </tool_call>" in observed


def test_a_turns_calls_past_max_turns_end_the_answer_unfinished(tokenizer):
    chat = Chat(tokenizer, [Toolbox(["python"]).schemas()[0]], load_template("hermes"))
    generate, asked = scripted(tokenizer, ["Two." + call("print(1)") + call("print(2)")])
    (c,) = run_turns(generate, chat, toolbox({}), [(1,)], [1], 500, max_turns=1)
    assert not c.finished and c.calls == () and all(c.mask) and len(asked) == 1


USER_TOOLS = '''
import os, time


def convert(amount: float, unit: str, precise: bool = False):
    """Converts an amount to metres.

    Args:
        amount: how many
        unit (str): km or mi
    """
    return round(amount * {"km": 1000, "mi": 1609.344}[unit], 3 if precise else 0)


def meet(name: str, other: str):
    """Waits up to 5 s for ``other`` to arrive: two calls that run at once meet."""
    open(os.path.join(os.environ["MEET_DIR"], name), "w").close()
    for _ in range(500):
        if os.path.exists(os.path.join(os.environ["MEET_DIR"], other)):
            return "met"
        time.sleep(0.01)
    return "alone"


def lookup(query):
    return query.upper()


lookup.schema = {"description": "Looks a word up.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
'''


def test_a_users_tools_declare_their_schemas_and_two_calls_of_one_turn_run_at_once(
        tokenizer, tmp_path, monkeypatch):
    (tmp_path / "chat_user_tools.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MEET_DIR", str(tmp_path))
    specs = ["chat_user_tools:convert", "chat_user_tools:meet", "chat_user_tools:lookup"]
    with Toolbox(specs, timeout_s=scaled(20)) as box:
        convert, meet, lookup = box.schemas()
        assert convert == {"name": "convert", "description": "Converts an amount to metres.",
                           "parameters": {"type": "object", "required": ["amount", "unit"],
                                          "properties": {
                                              "amount": {"type": "number", "description": "how many"},
                                              "unit": {"type": "string", "description": "km or mi"},
                                              "precise": {"type": "boolean", "description": ""}}}}
        assert lookup["description"] == "Looks a word up." and \
            lookup["parameters"]["required"] == ["query"]
        chat = Chat(tokenizer, box.schemas(), load_template("hermes"))
        prompt = tokenizer.decode(chat.prompt([{"role": "user", "content": "?"}]))
        assert json.dumps({"type": "function", "function": convert}) in prompt
        turn = "".join('\n<tool_call>\n' + json.dumps({"name": n, "arguments": a}) +
                       '\n</tool_call>' for n, a in (
                           ("meet", {"name": "a", "other": "b"}),
                           ("meet", {"name": "b", "other": "a"}),
                           ("convert", {"amount": 2, "unit": "mi", "precise": True}),
                           ("convert", {"amount": 2, "unit": "mi", "precise": "yes"})))
        generate, _ = scripted(tokenizer, [turn, "Done."])
        (c,) = run_turns(generate, chat, box, [(1,)], [1], 800, max_turns=8)
    observed = tokenizer.decode([t for t, m in zip(c.token_ids, c.mask) if not m])
    assert observed.count("<tool_response>\nmet\n</tool_response>") == 2  # neither waited alone
    assert "<tool_response>\n3218.688\n</tool_response>" in observed
    assert "ToolCallError: convert's argument 'precise' must be a boolean" in observed
    assert c.calls == ("ok", "ok", "ok", "malformed") and c.finished


def test_in_the_rollout_stream_a_turn_ended_by_the_model_gets_its_results_under_the_current_version(
        tokenizer):
    """Asynchronous rollout: the answer grows 4 tokens a segment, a version a segment; its
    first turn ends (end of sequence) in segment 3 with a call, which runs; the tool message
    joins at that version, and the answer goes on to its last turn."""
    from grown import grown

    from megatron_rlep.rollout.tools import Turns

    chat = Chat(tokenizer, [Toolbox(["python"]).schemas()[0]], load_template("hermes"))
    eos, prompt = tokenizer.eos_token_id, (1, 2)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    first, last = ids(call("print(2)").lstrip("\n")) + [eos], ids("Answer: 2") + [eos]

    box = toolbox({"print(2)": Result("2\n")})
    observed = chat.observation([Result("2\n")], box.output_chars)

    def engine(prompts, counts, seeds, max_tokens):
        out = []
        for context in prompts:
            done = len(context) - len(prompt)
            new = (first[done:] if done < len(first) else
                   last[done - len(first) - len(observed):])[:max_tokens]
            out.append([Completion(tokenizer.decode(new, skip_special_tokens=True), tuple(new),
                                   bool(new) and new[-1] == eos, tuple(-0.5 for _ in new))])
        return out

    a, last_version = grown(engine, prompt, Turns(box, chat, max_turns=2), 200)
    assert a.token_ids == first + observed + last and a.finished and a.calls == ["ok"]
    assert a.mask == [True] * len(first) + [False] * len(observed) + [True] * len(last)
    segments = -(-len(first) // 4)  # the call's turn ends in its last segment
    assert a.versions[len(first):len(first) + len(observed)] == [segments - 1] * len(observed)
    assert a.versions[-1] == last_version


def test_a_pool_records_its_tool_format_and_a_run_of_the_other_format_refuses_it(tmp_path):
    from megatron_rlep.config import compose
    from megatron_rlep.data import Example
    from megatron_rlep.pool import Answer, ExperiencePool
    from megatron_rlep.producer import load_pool
    from megatron_rlep.reward.scorer import Scorer, settings

    ex = Example("q1", ({"role": "user", "content": "Compute 2+3."},), "5", "arithmetic")
    tooled = Answer("Answer: 5", 0, (11, 12, 0), (-1.0, 0.0, -1.0), "", (True, False, True))
    chat_run = ["rollout.tools=[python]", "rollout.tool_format=chat", "rollout.chat_template=hermes",
                "algorithm.replay_per_prompt=1"]
    live = load_pool(compose(chat_run), None, [ex])  # a run's own pool writes its format
    live.add(ex, [tooled], cap=4)
    live.write(tmp_path / "chat", {"test": True})
    fenced = ExperiencePool({}, "live")  # written before pools said their format: fenced
    fenced.add(ex, [tooled], cap=4)
    fenced.write(tmp_path / "fence", {"test": True})
    plain = ExperiencePool({}, "live")  # no tool-using answers: any run may replay it
    plain.add(ex, [Answer("Answer: 5", 0, (11, 0), (-1.0, -1.0))], cap=4)
    plain.write(tmp_path / "plain", {"test": True})
    assert [ExperiencePool.load(tmp_path / p).tool_format() for p in ("chat", "fence", "plain")] \
        == ["chat", "fence", None]

    def load(pool, *run):
        return load_pool(compose([*run, f"algorithm.pool={tmp_path / pool}"]),
                         Scorer(settings("dapo")), [ex])
    got = load("chat", *chat_run)  # replayed with its tokens, tool messages and mask
    assert got.trajectory(ex, "Answer: 5").mask == tooled.mask
    assert len(load("plain", *chat_run)) == 1 and len(load("fence", "rollout.tools=[python]",
                                                           "algorithm.replay_per_prompt=1")) == 1
    with pytest.raises(RunError, match=r"holds tool calls in the fence format and this run's are "
                                       r"in the chat format \(rollout.tool_format\), so its "
                                       r"replays would teach the other one; rebuild"):
        load("fence", *chat_run)


def test_a_chat_template_without_the_chat_format_is_refused_in_one_sentence():
    from megatron_rlep.config import ConfigError, compose

    with pytest.raises(ConfigError, match=r"rollout.chat_template='hermes' is for tools in the "
                                          r"chat format; set rollout.tool_format=chat or drop it"):
        compose(["rollout.tools=[python]", "rollout.chat_template=hermes"])
