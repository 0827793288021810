"""The processes a user's own tools (``rollout.tools`` entries ``module:function``) run in: both
ends of their protocol. Standard library only: the trainer runs this file by its path as each
worker's program (``python -I tool_workers.py``), so it must import neither the package (whose
imports pull in torch) nor anything of the trainer's.

A worker gets the trainer's ``sys.path``, imports the user's functions once, then answers calls
one at a time as JSON lines on a private pipe. Its standard input, output and error point at
/dev/null: what a tool prints, from Python or C, reaches neither the protocol nor the trainer's
log, and a tool that reads its input reads nothing. Whatever a call does becomes an answer: an
exception of any kind (``SystemExit`` and ``KeyboardInterrupt`` too) is ``error``, its type's
name and message; a return value is ``ok``, its text (``str``, else ``repr``, else its type's
name; bytes decoded as UTF-8), cut to the trainer's limit before it is sent.

The trainer's end (``ToolWorkers``) keeps up to ``size`` idle workers and starts one when a call
finds none. Each call's deadline counts from when its worker gets it; past it the worker is
killed (SIGKILL to its process group, so whatever it started goes too) and a later call starts
another. A worker that dies mid-call (``os._exit``, a crash) is an ``error`` answer. A worker
ends at the end of its input (the trainer closed it, or ended), or within a second of its parent
going.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

START_S = 60.0  # the longest a worker may take to start and import the tools
STATUSES = ("ok", "error", "timeout", "output", "infra")  # rollout/tools.py's Result.status
JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
              "list": "array", "dict": "object"}


# ---------------------------------------------------------------------- the worker's end

def name_of(value) -> str:
    try:
        return type(value).__name__
    except BaseException:
        return "object"


def text_of(value) -> str:
    """A tool's return value as text, whatever it is."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    for show in (str, repr):
        try:
            return show(value)
        except BaseException:
            pass
    return name_of(value)


def error_text(error: BaseException) -> str:
    """``Type: message``, or the type's name alone when the message is empty or fails."""
    try:
        message = str(error)
    except BaseException:
        message = ""
    return f"{name_of(error)}: {message}" if message else name_of(error)


def schema_of(function, name: str) -> dict:
    """The chat format's declaration of a tool (``rollout.tool_format=chat``): its ``name``,
    ``description`` and JSON schema of its ``parameters``. A function's own ``schema``
    attribute (the parameters' schema, or the whole declaration) is taken as it is; otherwise
    it is read from the signature (annotations ``str``, ``int``, ``float``, ``bool``, ``list``,
    ``dict``; a parameter without a default is required) and the docstring (its first paragraph,
    and ``name: text`` lines under ``Args:``)."""
    given = getattr(function, "schema", None)
    if isinstance(given, dict):
        return {"name": name, **given} if "parameters" in given else \
            {"name": name, "description": "", "parameters": given}
    doc = inspect.getdoc(function) or ""
    described, args = {}, doc.partition("Args:")[2]
    for line in args.splitlines():
        key, colon, text = line.strip().partition(":")
        if colon and key.split(" (")[0].isidentifier():
            described[key.split(" (")[0]] = text.strip()
    properties, required, more = {}, [], False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            more = more or parameter.kind == parameter.VAR_KEYWORD
            continue
        hint = parameter.annotation
        hint = getattr(hint, "__name__", hint)  # a type, or its name under postponed annotations
        kind = JSON_TYPES.get(hint)
        properties[parameter.name] = {**({"type": kind} if kind else {}),
                                      "description": described.get(parameter.name, "")}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {"name": name, "description": doc.split("\n\n")[0].replace("\n", " "),
            "parameters": {"type": "object", "properties": properties, "required": required,
                           **({"additionalProperties": True} if more else {})}}


def answer(function, given, limit: int) -> dict:
    """A call's answer: its text cut to ``limit`` characters (``more``: how many were cut,
    trailing newlines aside) and its status (a returned ``Result``'s own, where it is one of
    ``STATUSES``). ``given``: a block's text, or the chat format's arguments (keywords)."""
    try:
        value = function(**given) if isinstance(given, dict) else function(given)
        text, status = text_of(value), "ok"
        if type(value).__name__ == "Result" and hasattr(value, "output"):  # rollout/tools.py's
            text = text_of(value.output)
            status = value.status if getattr(value, "status", None) in STATUSES else "ok"
    except BaseException as error:
        text, status = error_text(error), "error"
    end = len(text)
    while end > limit and text[end - 1] == "\n":
        end -= 1
    head = text[:limit].encode("utf-8", "replace").decode("utf-8")  # lone surrogates: "?"
    return {"output": head, "status": status, "more": max(end - limit, 0)}


def serve(specs: list[str], limit: int) -> None:
    """Imports ``specs``, says which did not import and what the others take (a JSON line),
    then answers calls."""
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    parent = os.getppid()

    def watch() -> None:  # a call may hang while the trainer is gone: no orphans
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()

    functions, errors, schemas = {}, {}, {}
    for spec in specs:
        module, _, name = spec.partition(":")
        try:
            functions[name] = getattr(importlib.import_module(module), name)
            if not callable(functions[name]):
                raise TypeError(f"{spec} is a {name_of(functions[name])}, not a function")
            schemas[name] = schema_of(functions[name], name)
        except BaseException as error:
            errors[spec] = error_text(error)
    replies.write(json.dumps({"errors": errors, "schemas": schemas}).encode() + b"\n")
    replies.flush()
    for line in requests:
        call = json.loads(line)
        replies.write(json.dumps(answer(functions[call["tool"]], call["input"], limit)).encode()
                      + b"\n")
        replies.flush()


# ---------------------------------------------------------------------- the trainer's end

class WorkerGone(Exception):
    """A worker's process ended before it answered; its message says how."""


class Worker:
    """One worker process."""

    def __init__(self, specs: list[str], limit: int):
        config = json.dumps({"path": sys.path, "specs": specs, "limit": limit})
        self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), config],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def send(self, tool: str, given) -> None:
        try:
            self.proc.stdin.write(json.dumps({"tool": tool, "input": given}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise WorkerGone(self.end()) from None

    def read(self, deadline: float):
        """The worker's next JSON line, or None when ``deadline`` (a ``time.monotonic()``)
        passes first."""
        fd, line = self.proc.stdout.fileno(), b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerGone(self.end())
            line += chunk
        return json.loads(line)

    def end(self) -> str:
        """The worker and everything in its process group killed; how it had ended."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if code >= 0:
            return f"exit status {code}"
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"

    def close(self) -> None:
        """Ended at the end of its input, or killed after a second."""
        try:
            self.proc.stdin.close()
            self.proc.wait(1.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.end()


class ToolWorkers:
    """Up to ``size`` idle workers for the tools ``specs``; ``call`` takes one (or starts one),
    and may run in as many threads at once as there are calls."""

    def __init__(self, specs: list[str], limit: int, size: int):
        self.specs, self.limit, self.size = specs, limit, size
        self.idle: list[Worker] = []
        self.schemas: dict = {}  # each tool's declaration (``schema_of``), once one has started
        self.lock = threading.Lock()
        self.closed = False

    def start(self) -> dict:
        """A worker started and kept idle: the specs that did not import in it, each with why.
        A worker that does not start raises ``WorkerGone``."""
        worker, errors = self._new()
        self._give_back(worker)
        return errors

    def call(self, tool: str, code, timeout_s: float) -> tuple[str, str, int]:
        """(output, status, characters cut) of ``tool`` run on ``code`` (a text, or keyword
        arguments), within ``timeout_s``
        of when its worker got the call (a worker's start is not the call's time)."""
        with self.lock:
            worker = self.idle.pop() if self.idle else None
        if worker is None:
            try:
                worker, errors = self._new()
            except WorkerGone as gone:
                return f"the tool could not start: {gone}", "infra", 0
            if errors:
                worker.end()
                why = "; ".join(errors.values())
                return f"the tool could not start: it no longer imports ({why})", "infra", 0
        try:
            worker.send(tool, code)
            reply = worker.read(time.monotonic() + timeout_s)
        except WorkerGone as gone:
            return f"the tool's process ended before it answered ({gone})", "error", 0
        if reply is None:
            worker.end()
            return f"TimeoutError: the tool ran longer than {timeout_s:g} s", "timeout", 0
        self._give_back(worker)
        return reply["output"], reply["status"], reply["more"]

    def _new(self) -> tuple[Worker, dict]:
        """A new worker, and the specs that did not import in it."""
        worker = Worker(self.specs, self.limit)
        try:
            reply = worker.read(time.monotonic() + START_S)
        except WorkerGone as gone:
            raise WorkerGone(f"the process ended while importing the tools ({gone})") from None
        if reply is None:
            worker.end()
            raise WorkerGone(f"importing the tools took longer than {START_S:g} s")
        self.schemas = reply["schemas"]
        return worker, reply["errors"]

    def _give_back(self, worker: Worker) -> None:
        with self.lock:
            keep = not self.closed and len(self.idle) < self.size
            if keep:
                self.idle.append(worker)
        if not keep:
            worker.close()

    def close(self) -> None:
        """Every idle worker ended; a busy one ends when its call does."""
        with self.lock:
            self.closed, idle, self.idle = True, self.idle, []
        for worker in idle:
            worker.close()


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    sys.path[:] = settings["path"]
    serve(settings["specs"], settings["limit"])
