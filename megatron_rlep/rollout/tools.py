"""Tools in the loop: multi-turn answers whose calls run, results appended, before the model
goes on (``rollout.tools``; docs/tools.md). The model calls in one of two
formats (``rollout.tool_format``): fenced code blocks (``Fence``, below) or the chat template's
own (``chat_tools.Chat``); everything else here serves both.

The fenced format (the built-in ``calculator`` task's prompt shows it once)::

    ```python
    print(1234 * 5678)
    ```
    ```output
    7006652
    ```
    Answer: 7006652

Generation stops at the end of a code block (the stop string ``STOP``). When the block's tag
names a tool (``python``, or a user's ``module:function`` whose function name is the tag), the
tool runs the block's text and its output, cut at ``rollout.tool_output_chars``, comes back in
an ``output`` block: the *observation*. Errors and time-outs come back as text the model sees.
Generation then goes on from the answer's tokens so far, up to ``rollout.max_turns`` tool calls
and the answer's token limit (observations count in it; one cut at the limit ends the answer).

Token in, token out: every turn resubmits the prompt and the answer's token ids as they are
(vLLM's prefix cache keeps their KV cache), and the observation is the only text tokenised here.
A completion's ``mask`` marks the model's tokens (True) and the observations' (False); the
trainer keeps observations out of the loss and its normaliser, and their log-probs are 0.0 and
never used. The verifier scores the model's own text, never an observation.

``python`` runs each block as a program in the code sandbox (``reward/sandbox``): no network,
no files of the trainer's, a clean environment, a wall-clock and a CPU limit, a process cap.

A user's tool, ``module:function``, is called with the block's text in a worker process of its
own (``tool_workers.py``), never in the trainer's, so it sees no trainer state. Whatever it does
becomes a short observation and the run goes on: its return value, as text and cut, is the
output (``ok``); what it raises, ``SystemExit`` and ``KeyboardInterrupt`` too, is ``Type:
message`` (``error``); past ``rollout.tool_timeout_s`` its process is killed (``timeout``); a
process that dies (``os._exit``, a crash) is an ``error``; what it prints is not shown anywhere.
It must not run the model's text as code (the ``python`` tool is for that).

A turn's calls, across all answers, run ``rollout.tool_workers`` at a time, each timed from its
own start.
"""

from __future__ import annotations

import functools
import math
import re
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch.distributed as dist

from megatron_rlep.errors import RunError
from megatron_rlep.rollout.base import (Completion, counts_and_seeds, joined_routes,
                                        padded_routes, request_seed)
from megatron_rlep.rollout.tool_workers import ToolWorkers, WorkerGone

STOP = "\n```\n"  # the end of a code block (an opening one has a tag: ```python)
CPU_KILLED = (137, 152, -9, -24)  # SIGKILL or SIGXCPU at the CPU-time limit
OPENING = re.compile(r"```([A-Za-z_][\w.]*)[ \t]*\n")  # a block's first line: ```python


PYTHON = {"name": "python",  # the ``python`` tool's declaration, for the chat format
          "description": "Runs a Python program in a sandbox and returns what it prints (its "
                         "standard output, then its error's last line if it fails).",
          "parameters": {"type": "object", "required": ["code"], "properties": {
              "code": {"type": "string", "description": "the program; print what you need"}}}}


@dataclass(frozen=True)
class Call:
    """A call found in a turn: the tool's name and its input (a fenced block's text, or the chat
    format's arguments), or ``error``, why it cannot run (the model reads it)."""
    tool: str | None
    input: object = None
    error: str | None = None


@dataclass(frozen=True)
class Result:
    """What a tool call gives the model: its ``output`` text and how it went (``ok`` | ``error``
    | ``timeout`` | ``output``, too much printed | ``infra``, the tool could not be run);
    ``more``: how many characters of the output were cut before it got here."""
    output: str
    status: str = "ok"
    more: int = 0


def block_end(text: str) -> int | None:
    """Where the first code block's end in ``text`` ends (just past its first ``STOP``, the
    string generation stops at), None when it holds none: what ends a block, for the parser
    (``call_of``) and for the rollout stream (``Turns``)."""
    at = text.find(STOP)
    return None if at < 0 else at + len(STOP)


def call_of(text: str) -> tuple[str, str] | None:
    """(tag, code) of the code block ``text`` ends with (after its end at most white space, the
    rest of the token that completed ``STOP``), or None: the block that made the engine stop,
    opened by the last tagged fence before its end."""
    end = block_end(text)
    if end is None or text[end:].strip():
        return None
    close = end - len(STOP)
    openings = list(OPENING.finditer(text, 0, close))
    return (openings[-1].group(1), text[openings[-1].end():close]) if openings else None


def shown(result: Result, limit: int) -> str:
    """A result's output as the model reads it: cut to ``limit`` characters, saying how much
    was left out."""
    text = result.output if result.more else result.output.rstrip("\n")
    more = max(len(text) - limit, 0) + result.more
    return f"{text[:limit]}\n... ({more} more characters)" if more else text


def observation(result: Result, limit: int) -> str:
    """The ``output`` block the model reads (``shown``)."""
    return f"```output\n{shown(result, limit)}\n```\n"


def text_codec(tokenizer):
    """(encode, decode) of ``tokenizer`` for answers with tools: ``encode`` tokenises an
    observation as plain text (a printed ``<|im_end|>`` is its characters' tokens, never the
    special token), ``decode`` gives the model's text without special tokens."""
    return (lambda text: tokenizer(text, add_special_tokens=False,
                                   split_special_tokens=True)["input_ids"],
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


class Fence:
    """Calls as Markdown code blocks (``rollout.tool_format=fence``, above): a turn ends at a
    block's end (``STOP``), and the block is a call where its tag names a tool; its result comes
    back as an ``output`` block. ``encode`` and ``decode``: ``text_codec``'s."""

    stop = (STOP,)

    def __init__(self, encode, decode):
        self.encode, self.decode = encode, decode

    def calls(self, turn: str) -> list[Call]:
        found = call_of(turn)
        return [Call(*found)] if found else []

    def observation(self, results: list[Result], limit: int) -> list[int]:
        (result,) = results
        return list(self.encode(observation(result, limit)))


class PythonTool:
    """``python``: a block runs as ``main.py`` in the code sandbox, the code answers' own
    (``sandbox``: the ``sandbox`` config, None for its defaults), its output unbuffered; the
    model sees its standard output (what it printed before a time-out too), then its error's
    last line if it failed."""

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, output_bytes: int = 65536,
                 sandbox=None):
        from megatron_rlep.reward.sandbox import Limits, Sandbox, isolation

        self.sandbox = Sandbox(Limits(wall_s=timeout_s, cpu_s=max(1, math.ceil(timeout_s)),
                                      memory_mb=memory_mb, output_bytes=output_bytes),
                               unbuffered=True, **isolation(sandbox))
        self.timeout_s, self.output_bytes = timeout_s, output_bytes
        self.cpu_s = self.sandbox.limits.cpu_s

    def __call__(self, code) -> Result:
        """``code``: a block's text, or the chat format's arguments (``{"code": ...}``)."""
        code = code["code"] if isinstance(code, dict) else code
        outcome = self.sandbox.run({"main.py": code})
        if outcome.status == "timeout":
            return Result(f"{outcome.stdout}TimeoutError: the program ran longer than "
                          f"{self.timeout_s:g} s and was stopped", "timeout")
        if outcome.status == "output":
            return Result(f"{outcome.stdout[:2000]}\nOutputError: the program printed more than "
                          f"{self.output_bytes} bytes and was stopped", "output")
        if outcome.status == "infra":
            return Result("the interpreter is unavailable", "infra")
        if outcome.exit_code in CPU_KILLED:
            return Result(f"{outcome.stdout}TimeoutError: the program used more than "
                          f"{self.cpu_s} s of CPU time and was stopped", "timeout")
        if outcome.exit_code:
            error = (outcome.stderr.strip().splitlines() or [f"exit status {outcome.exit_code}"])
            return Result(f"{outcome.stdout}{error[-1]}", "error")
        return Result(outcome.stdout)


class Toolbox:
    """The run's tools by tag, each a function from a block's text to a ``Result``; a user's
    tools run in worker processes (``tool_workers.py``), ended by ``close``."""

    def __init__(self, specs, timeout_s: float = 5.0, output_chars: int = 512, workers: int = 8,
                 sandbox=None):
        """``sandbox``: the ``sandbox`` config the ``python`` tool runs under (None: its
        defaults)."""
        for spec in specs:
            if spec != "python" and ":" not in spec:
                raise RunError(f"rollout.tools entry {spec!r} is unknown; use python or a "
                               "function of your own as module:function")
        self.tools = {"python": PythonTool(timeout_s, sandbox=sandbox)} if "python" in specs else {}
        self.output_chars, self.workers, self.timeout_s = output_chars, workers, timeout_s
        self.seconds = 0.0  # time spent running calls, summed over turns (not over calls)
        own = [spec for spec in specs if spec != "python"]
        self.processes = ToolWorkers(own, output_chars, workers)
        self._finalizer = weakref.finalize(self, self.processes.close)
        if own:
            self._import(own)

    def close(self) -> None:
        """The user's tools' worker processes ended (or, without a call to this, when the
        toolbox is collected or the trainer exits)."""
        self._finalizer()

    def _import(self, specs: list[str]) -> None:
        """The user's tools imported in a first worker, or a stop naming the one that fails."""
        try:
            errors = self.processes.start()
        except WorkerGone as gone:
            self.close()
            raise RunError(f"rollout.tools entries {', '.join(specs)} do not import ({gone}); "
                           "give module:function entries that import on the Python path") from None
        if errors:
            self.close()
            spec, why = next(iter(errors.items()))
            raise RunError(f"rollout.tools entry {spec!r} does not import ({why}); give a "
                           "built-in tool (python) or module:function on the Python path")
        for spec in specs:
            name = spec.partition(":")[2]
            self.tools[name] = functools.partial(self._call, name)

    def _call(self, name: str, code) -> Result:
        return Result(*self.processes.call(name, code, self.timeout_s))

    def schemas(self) -> list[dict]:
        """Each tool's name, description and JSON schema of its arguments, for the chat
        format (a user's tool's from its worker: ``tool_workers.schema_of``)."""
        return ([PYTHON] if "python" in self.tools else []) + \
            [self.processes.schemas[n] for n in self.tools if n != "python"]

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, calls: list[tuple], collective: bool = False) -> list[Result]:
        """Every (tool, input) call's result, in order. ``collective``: every rank holds the same
        calls; rank 0 runs them and every rank gets its results (a program's output may differ
        from run to run, and ranks must append the same tokens)."""
        if not calls:
            return []
        start = time.perf_counter()
        out = None
        if not collective or not dist.is_initialized() or dist.get_rank() == 0:
            out = self._run_all(calls)
        if collective and dist.is_initialized() and dist.get_world_size() > 1:
            box = [out]
            dist.broadcast_object_list(box, src=0)
            out = box[0]
        self.seconds += time.perf_counter() - start
        return out

    def _run_all(self, calls: list[tuple]) -> list[Result]:
        """The calls on threads, ``workers`` at a time. Each call ends itself: a user's tool at
        its deadline, a ``python`` call in the sandbox (on a busy machine later than its wall
        clock, so it is not timed here)."""
        def call(tag_code: tuple[str, str]) -> Result:
            tag, code = tag_code
            try:
                return self.tools[tag](code)
            except Exception as error:  # the tool's machinery failed, not the model's input
                return Result(f"the tool could not run ({type(error).__name__}: {error})",
                              "infra")
        with ThreadPoolExecutor(self.workers, thread_name_prefix="tool") as pool:
            return list(pool.map(call, calls))


@dataclass
class Trajectory:
    prompt_ids: tuple
    seed: int
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # each call's status, in order
    finished: bool = False
    done: bool = False
    text: str = ""  # the model's own text, turn after turn
    routes: object = None  # MoE routes of the tokens fed so far (base.joined_routes)

    def completion(self) -> Completion:
        return Completion(self.text, tuple(self.token_ids), self.finished, tuple(self.logprobs),
                          tuple(self.mask), tuple(self.calls), routes=padded_routes(
                              self.routes, len(self.prompt_ids) + len(self.token_ids)))


def run_calls(toolbox: Toolbox, found: list[list], collective: bool = False) -> list[list[Result]]:
    """The results of each answer's calls (``chat_tools.Call``), in order: those that can run
    run together (``Toolbox.run``), the others are their error."""
    ready = [c for calls in found for c in calls if c.error is None]
    results = iter(toolbox.run([(c.tool, c.input) for c in ready], collective))
    return [[Result(f"ToolCallError: {c.error}", "malformed") if c.error else next(results)
             for c in calls] for calls in found]


def observe(answer, results: list[Result], toolbox: Toolbox, fmt, max_tokens: int,
            version: int | None = None) -> bool:
    """Appends the observation of a turn's ``results`` in format ``fmt`` to ``answer``: its
    tokens cut at ``max_tokens``, masked out, log-prob 0.0, tagged with ``version`` when the
    answer tracks versions. True when the answer has reached ``max_tokens``."""
    answer.calls += [r.status for r in results]
    ids = fmt.observation(results, toolbox.output_chars)[:max_tokens - len(answer.token_ids)]
    answer.token_ids += ids
    answer.logprobs += [0.0] * len(ids)
    answer.mask += [False] * len(ids)
    if version is not None:
        answer.versions += [version] * len(ids)
    return len(answer.token_ids) >= max_tokens


def tool_calls(fmt, toolbox: Toolbox, turn: str) -> list:
    """The calls of a turn: the format's, less a fenced block whose tag is no tool's."""
    return [c for c in fmt.calls(turn) if c.error or c.tool in toolbox.tools]


def run_turns(generate, fmt, toolbox: Toolbox, prompts: list[tuple], seeds: list[int],
              max_tokens: int, max_turns: int) -> list[Completion]:
    """One multi-turn answer per prompt. ``generate(contexts, seeds, max_tokens)`` returns one
    ``Completion`` per context, stopping at ``fmt.stop``; ``fmt`` is the calls' format
    (``Fence`` or ``chat_tools.Chat``). Turn k > 0 of an answer is seeded from its seed and the
    number of tokens it has so far, so an answer that never calls a tool is the one sampled
    without tools. An answer ends at the token limit (an observation cut there too), at a turn
    whose calls would pass ``max_turns``, or at an end of sequence, unless (chat format) the turn
    it ends holds calls. A fenced block whose tag is no tool's lets it go on."""
    answers = [Trajectory(tuple(p), s) for p, s in zip(prompts, seeds)]
    at_eos = not fmt.stop  # the chat format's turns end at the end of sequence
    while active := [a for a in answers if not a.done]:
        left = [max_tokens - len(a.token_ids) for a in active]
        results = generate([a.prompt_ids + tuple(a.token_ids) for a in active],
                           [request_seed(a.seed, len(a.token_ids)) if a.token_ids else a.seed
                            for a in active], max(left))
        calls = []
        for answer, room, c in zip(active, left, results):
            ids = list(c.token_ids[:room])
            whole = len(ids) == len(c.token_ids)
            turn = c.text if whole else fmt.decode(ids)
            answer.token_ids += ids
            answer.logprobs += list(c.logprobs[:room])
            answer.mask += [True] * len(ids)
            answer.routes = joined_routes(answer.routes, c.routes, len(c.token_ids) - len(ids))
            answer.text += turn
            answer.finished = c.finished and whole
            paused = c.finished if at_eos else c.stopped
            if not (whole and paused) or not ids or len(answer.token_ids) >= max_tokens:
                answer.done = True  # an end of sequence, the token limit, or nothing sampled
                continue
            found = tool_calls(fmt, toolbox, turn)
            if not found:
                answer.done = at_eos  # the last turn, or a block that is no tool's: it goes on
                continue
            answer.finished = False
            if len(answer.calls) + len(found) > max_turns:
                answer.done = True
            else:
                calls.append((answer, found))
        for (answer, _), out in zip(calls, run_calls(toolbox, [f for _, f in calls])):
            answer.done = observe(answer, out, toolbox, fmt, max_tokens)
    return [a.completion() for a in answers]


class Turns:
    """Answers grown turn by turn in the rollout stream (``rollout/stream.py``), a segment at a
    time. After each segment an answer whose current turn has ended (format ``fmt``) and holds
    calls gets their observation, tagged with the version current then (never trained: masked).
    A fenced turn ends at the end of a code block: the answer is cut right after the token that
    completes it (the engine stops there, but the end may also fall across two segments)."""

    OVERLAP = 8  # tokens decoded again before the new ones (``end_of_block``)

    def __init__(self, toolbox: Toolbox, fmt, max_turns: int):
        self.toolbox, self.format, self.max_turns = toolbox, fmt, max_turns
        self.stop, self.decode = fmt.stop, fmt.decode

    def end_of_block(self, answer) -> int | None:
        """The length ``answer`` has once cut after the token that completes a block's end
        (``block_end``) in its current turn; None when its turn holds none.

        Only the tokens new since the last look are decoded (``answer.scanned``: up to there
        the turn holds no end), with ``OVERLAP`` tokens before them: an end that a new token
        completes starts at most 4 characters before it, ASCII ones, in at most 4 tokens, and 8
        leave room for tokens that decode to nothing (special ones) between them. Whether a
        prefix holds an end only grows with its length, so the completing token is found by
        bisection: the cost grows with the new tokens, not with the turn."""
        ids, first = answer.token_ids, max(answer.scanned, answer.turn)
        start = max(first - self.OVERLAP, answer.turn)

        def ends(stop: int) -> bool:
            return block_end(self.decode(ids[start:stop])) is not None
        if not ends(len(ids)):
            answer.scanned = len(ids)
            return None
        low, high = first, len(ids)  # the prefix to low holds no end, to high holds one
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if ends(middle) else (middle, high)
        return high

    def turn_end(self, answer) -> int | None:
        """Where ``answer``'s current turn ends, None while it goes on: the chat format's at its
        end of sequence, the fenced one's after a block's end (``end_of_block``)."""
        if self.stop:
            return self.end_of_block(answer)
        return len(answer.token_ids) if answer.finished and len(answer.token_ids) > answer.turn \
            else None

    def after(self, answers: list, version: int, max_tokens: int) -> None:
        calls = []
        for a in answers:
            cut = self.turn_end(a)
            if cut is None:
                continue
            if self.stop:  # cut where the engine would have stopped: the answer goes on
                if a.routes is not None:
                    a.routes = a.routes[:len(a.routes) - (len(a.token_ids) - cut)]
                for values in (a.token_ids, a.logprobs, a.versions, a.mask):
                    del values[cut:]
                a.finished, a.done = False, cut >= max_tokens
            text, a.turn = self.decode(a.token_ids[a.turn:cut]), cut
            found = tool_calls(self.format, self.toolbox, text)
            if cut >= max_tokens or not found:
                continue
            a.finished = False
            a.done = len(a.calls) + len(found) > self.max_turns
            if not a.done:
                calls.append((a, found))
        for (a, _), out in zip(calls, run_calls(self.toolbox, [f for _, f in calls],
                                                collective=True)):
            a.done = observe(a, out, self.toolbox, self.format, max_tokens, version)
            a.turn = len(a.token_ids)


class ToolEngine:
    """An engine whose answers may call tools: ``generate`` as any engine's (``n`` answers per
    prompt, per-prompt seeds; the j-th answer of a prompt seeded as the engine seeds it), each
    answer grown turn by turn (``run_turns``). Everything else is the wrapped engine's."""

    def __init__(self, engine, toolbox: Toolbox, max_turns: int, fmt=None):
        """``fmt``: the calls' format (``tool_format``; None: fenced blocks)."""
        self.engine, self.toolbox, self.max_turns = engine, toolbox, max_turns
        self.format = fmt or Fence(*text_codec(engine.tokenizer))

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, seed=0,
                 progress=False, stop=None) -> list[list[Completion]]:
        """Whole multi-turn answers; with ``stop`` one turn (or segment) of the wrapped engine's,
        for a caller that grows its answers itself (the rollout stream, ``Turns``)."""
        if stop is not None:
            return self.engine.generate(prompts, n, temperature=temperature, top_p=top_p,
                                        max_tokens=max_tokens, seed=seed, progress=progress,
                                        stop=stop)
        counts, seeds = counts_and_seeds(len(prompts), n, seed)
        jobs = [(i, seeds[i] + j) for i, c in enumerate(counts) for j in range(c)]

        def turn(contexts, turn_seeds, limit):
            out = self.engine.generate(contexts, 1, temperature=temperature, top_p=top_p,
                                       max_tokens=limit, seed=turn_seeds, stop=self.format.stop)
            return [group[0] for group in out]
        flat = run_turns(turn, self.format, self.toolbox,
                         [prompts[i] for i, _ in jobs], [s for _, s in jobs], max_tokens,
                         self.max_turns)
        out: list[list[Completion]] = [[] for _ in prompts]
        for (i, _), c in zip(jobs, flat):
            out[i].append(c)
        return out
