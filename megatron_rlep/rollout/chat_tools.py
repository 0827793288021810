"""Tool calls in the chat template's own format (``rollout.tool_format=chat``), the one Qwen2.5,
Qwen3 and the Hermes models learned (``rollout/tools.py`` runs the calls; docs/tools.md)::

    <|im_start|>assistant
    Let me multiply.
    <tool_call>
    {"name": "python", "arguments": {"code": "print(1234 * 5678)"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    7006652
    </tool_response><|im_end|>
    <|im_start|>assistant
    Answer: 7006652<|im_end|>

The tools are declared to the tokenizer's chat template (``tools=[...]``, each with a JSON
schema of its arguments), which shows them to the model where it learned to read them. A turn
ends at the model's end of turn (an end-of-sequence id); every call in it runs, at once, and
their results come back as the template's tool messages. The *observation*, masked out of the
loss, is everything after the model's end of turn up to the next assistant header, role markers
included. Its markup is the template's own: rendered once per number of calls, with a marker in
place of each result, and tokenised with special tokens; each result is tokenised as plain text
(a printed ``<|im_end|>`` is its characters), so the model's tokens are never tokenised again.

A call that cannot run (not JSON, no tool of its name, an argument missing, unknown or of the
wrong type) is not run: the model reads why (``ToolCallError: ...``), status ``malformed``.
A template that shows no tools (the built-in model's) is refused unless ``rollout.chat_template``
names one that does: ``hermes`` (this directory's ``hermes.jinja``) or a Jinja file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from megatron_rlep.errors import RunError
from megatron_rlep.rollout.base import encode_prompt
from megatron_rlep.rollout.tools import Call, shown, text_codec

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPENING = "<tool_call>"
HOW = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
TEMPLATES = {"hermes": Path(__file__).with_name("hermes.jinja")}
TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
         "object": dict}
def load_template(name: str | None) -> str | None:
    """The Jinja text of ``rollout.chat_template`` (None: the tokenizer's own)."""
    if name is None:
        return None
    path = TEMPLATES.get(name, Path(name))
    try:
        return path.read_text()
    except OSError as error:
        raise RunError(f"rollout.chat_template={name!r} is neither a template of the project's "
                       f"({', '.join(TEMPLATES)}) nor a readable Jinja file ({error.strerror}); "
                       "name one of them or give the path of a file") from None


def wrong_arguments(name: str, arguments: dict, parameters: dict) -> str | None:
    """Why ``arguments`` do not fit the tool's JSON schema ``parameters``, None when they do:
    every required one given, none it lacks (unless it allows more), each of its type."""
    properties = parameters.get("properties", {})
    missing = [key for key in parameters.get("required", ()) if key not in arguments]
    if missing:
        return f"{name} needs the argument {', '.join(map(repr, missing))}"
    unknown = [key for key in arguments if key not in properties]
    if unknown and not parameters.get("additionalProperties", False):
        return (f"{name} has no argument {', '.join(map(repr, unknown))}; its arguments are "
                f"{', '.join(map(repr, properties)) or 'none'}")
    for key, value in arguments.items():
        kind = properties.get(key, {}).get("type")
        wanted = TYPES.get(kind) if isinstance(kind, str) else None
        if wanted and (not isinstance(value, wanted) or kind != "boolean" and
                       isinstance(value, bool)):
            return f"{name}'s argument {key!r} must be {'an' if kind[0] in 'aio' else 'a'} {kind}"
    return None


def parse(body: str, schemas: dict) -> Call:
    """The call a ``<tool_call>`` element's text asks for, checked against the tools' schemas."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return Call(None, error=f"the call is not valid JSON ({error.msg} at character "
                                f"{error.pos}); write {HOW}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return Call(None, error=f"the call names no tool; write {HOW}")
    name, arguments = call["name"], call.get("arguments", {})
    if name not in schemas:
        return Call(None, error=f"there is no tool named {name!r}; the tools are "
                                f"{', '.join(schemas)}")
    if isinstance(arguments, str):  # arguments written as a JSON string of an object
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return Call(None, error=f"the arguments of {name} must be a JSON object")
    return Call(name, arguments, wrong_arguments(name, arguments, schemas[name]["parameters"]))


class Chat:
    """The chat template's tool format for ``tokenizer``, the tools ``schemas`` (each ``name``,
    ``description``, ``parameters``) and ``template`` (Jinja text; None: the tokenizer's)."""

    stop = ()  # a turn ends at the end of sequence

    def __init__(self, tokenizer, schemas: list[dict], template: str | None = None):
        self.tokenizer, self.template = tokenizer, template
        self.schemas = {s["name"]: s for s in schemas}
        self.declared = [{"type": "function", "function": s} for s in schemas]
        self.encode, self.decode = text_codec(tokenizer)  # a result is plain text
        self._markup: dict[int, list[list[int]]] = {}
        shown = self.render([{"role": "user", "content": "?"}], add_generation_prompt=True)
        if not all(f'"{name}"' in shown for name in self.schemas):
            raise RunError("rollout.tool_format=chat: the chat template shows the model no tools; "
                           "set rollout.chat_template=hermes (the format of Qwen2.5 and Qwen3) "
                           "or the path of a template of your own that does")

    def render(self, messages: list[dict], **options) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.declared,
                                                  chat_template=self.template, tokenize=False,
                                                  **options)

    def prompt(self, messages, max_length: int | None = None) -> tuple[int, ...]:
        """A prompt's ids with the tools declared (``encode_prompt``'s otherwise)."""
        return encode_prompt(self.tokenizer, messages, max_length, tools=self.declared,
                             template=self.template)

    def calls(self, turn: str) -> list[Call]:
        """The calls in a turn the model ended: each ``<tool_call>`` element, and an opened one
        left unclosed as an error."""
        found = [parse(match.group(1).strip(), self.schemas) for match in CALL.finditer(turn)]
        if OPENING in CALL.sub("", turn):
            found.append(Call(None, error="the call is not closed; end it with </tool_call>"))
        return found

    def markup(self, count: int) -> list[list[int]]:
        """The template's token ids around ``count`` results after the model's end of turn:
        ``count + 1`` pieces (the first from just after the end-of-turn token, the last up to
        the next assistant header), rendered with a marker in place of each result."""
        if count not in self._markup:
            marks = [f"@@result-{i}@@" for i in range(count)]
            name, end = next(iter(self.schemas)), self.tokenizer.eos_token
            turn = [{"role": "user", "content": "?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"type": "function", "function": {"name": name, "arguments": {}}}] * count}]
            before = self.render(turn)
            after = self.render(turn + [{"role": "tool", "name": name, "content": m}
                                        for m in marks], add_generation_prompt=True)
            cut = before.rfind(end) + len(end) if end and end in before else -1
            pieces = re.split("|".join(map(re.escape, marks)), after[cut:])
            if cut < 0 or not after.startswith(before[:cut]) or len(pieces) != count + 1:
                raise RunError("rollout.tool_format=chat: the chat template does not put tool "
                               f"messages after the assistant's end of turn ({end!r}); set "
                               "rollout.chat_template=hermes or a template of your own that does")
            self._markup[count] = [self.tokenizer(piece, add_special_tokens=False)["input_ids"]
                                   for piece in pieces]
        return self._markup[count]

    def observation(self, results: list, limit: int) -> list[int]:
        """The ids of the tool messages that answer a turn's calls, each result cut to
        ``limit`` characters."""
        pieces = self.markup(len(results))
        ids = list(pieces[0])
        for result, piece in zip(results, pieces[1:]):
            ids += list(self.encode(shown(result, limit))) + piece
        return ids
