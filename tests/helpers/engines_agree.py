"""Both rollout engines on one model, for tests/test_rollout.py (in a child process, so vLLM's
changes to torch's thread settings stay out of the test process): greedy token ids of each, and
the largest gap between vLLM's behaviour log-probs of sampled answers and a transformers forward
pass at the same temperature. Prints one JSON object.

    python tests/helpers/engines_agree.py MODEL QUESTIONS MAX_TOKENS
"""

import json
import sys

import torch


def main(model: str, questions: int, max_tokens: int) -> None:
    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.builtin_model import resolve_model_path
    from megatron_rlep.rollout import TransformersEngine, encode_prompt
    from megatron_rlep.rollout.vllm_engine import VllmEngine

    path = resolve_model_path(model)
    reference = TransformersEngine(path)
    engine = VllmEngine(path, max_model_len=1024, dtype="float32")
    examples = arithmetic.examples("test", (1, 2, 3), questions, seed=0)
    prompts = [encode_prompt(reference.tokenizer, e.prompt) for e in examples]
    greedy = [engine.generate(prompts, 1, temperature=0.0, max_tokens=max_tokens),
              reference.generate(prompts, 1, temperature=0.0, max_tokens=max_tokens)]
    sampled = engine.generate(prompts[:4], 2, temperature=0.7, max_tokens=max_tokens, seed=1)
    gap = 0.0
    for prompt, group in zip(prompts, sampled):
        for c in group:
            ids = torch.tensor([list(prompt) + list(c.token_ids)])
            with torch.no_grad():
                logits = reference.model(ids).logits[0, len(prompt) - 1:-1] / 0.7
            expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
            gap = max(gap, (torch.tensor(c.logprobs) - expected).abs().max().item())
    # with a Python tool: each engine's greedy multi-turn answers, as the segments of their
    # masks (model's or observation's, and how long) and their calls, in the fenced format
    from megatron_rlep.rollout.tools import ToolEngine, Toolbox
    from megatron_rlep.tasks import calculator

    questions = [encode_prompt(reference.tokenizer, e.prompt)
                 for e in calculator.examples("test", (1, 2, 3, 4), 4, seed=0)]
    turns = {}
    for name, each in (("vllm", engine), ("transformers", reference)):
        tooled = ToolEngine(each, Toolbox(["python"]), max_turns=2)
        turns[name] = [[segments(c.mask), list(c.calls), c.text] for (c,) in
                       tooled.generate(questions, 1, temperature=0.0, max_tokens=64)]
    # the same in the chat template's format, each answer begun with "<tool_call>" in its
    # prompt (greedy, the built-in model writes the tool's response itself; docs/usage.md), and
    # its first turn read with it
    from megatron_rlep.rollout.chat_tools import Chat, load_template
    from megatron_rlep.rollout.tools import PYTHON

    class Begun(Chat):
        def calls(self, turn):
            opened, closed = turn.find("<tool_call>"), turn.find("</tool_call>")
            if closed >= 0 and not 0 <= opened < closed:
                turn = "<tool_call>\n" + turn
            return super().calls(turn)
    chat = Begun(reference.tokenizer, [PYTHON], load_template("hermes"))
    begun = reference.tokenizer("<tool_call>\n", add_special_tokens=False)["input_ids"]
    questions = [chat.prompt(e.prompt) + tuple(begun) for e in
                 calculator.examples("test", (1, 2, 3, 4), 4, seed=0, tool_format="chat")]
    chat_turns = {}
    for name, each in (("vllm", engine), ("transformers", reference)):
        tooled = ToolEngine(each, Toolbox(["python"]), max_turns=2, fmt=chat)
        chat_turns[name] = [[segments(c.mask), list(c.calls), c.text] for (c,) in
                            tooled.generate(questions, 1, temperature=0.0, max_tokens=96)]
    print(json.dumps({"vllm": [list(g[0].token_ids) for g in greedy[0]],
                      "transformers": [list(g[0].token_ids) for g in greedy[1]],
                      "sampled_logprob_gap": gap,
                      "sampled_lengths": [len(c.token_ids) for g in sampled for c in g],
                      "tools": turns, "chat_tools": chat_turns}))


def segments(mask) -> list:
    """[[is the model's, length], ...]: a mask's runs."""
    out = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return out


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
