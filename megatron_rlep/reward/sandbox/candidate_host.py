"""The candidate's side of the judge's channel: loads an answer's program as the module
``solution`` and runs what the judge asks of it, one JSON line in, one JSON line out.

Runs inside the code sandbox as ``python -I -S main.py`` beside ``plain.py`` and
``solution.py`` (``code.py`` writes them there), never imported by the trainer. It decides
nothing: it calls the answer's functions with the arguments it is sent and replies with what
they returned, printed and raised, as plain data (``plain.py``). The program can read and
write this process's channel as it pleases; all it can put there is plain data, the same as
returning it, and the expected values are never sent here.

First line out: ``{"ready": names}`` (the module's names: plain values, handles, or
``{"$std": [module, name]}`` for what it imported from the standard library) or ``{"ready":
null, "raise": ...}`` when loading raised. Then one reply per request. Requests: ``call``
(``target``, ``attr``?, ``args``, ``kwargs``: a target is a handle or ``{"name": N}``, which
for a name the module lacks is a method of a fresh ``Solution()``, as LeetCode-style harnesses
call it), ``eval`` (``expr``, in the module's namespace), ``getattr``/``setattr``,
``operator`` (``name``, ``args``: one of ``OPERATORS`` applied here), ``state`` (an object's
class name and attributes, for equality decided by the judge), ``iter``/``more`` (an iterator's
items, a chunk at a time). A request may carry ``files`` (a directory the judge's test shares:
written here first, what changed sent back). Replies: ``{"value": V}`` or ``{"raise": {...}}``,
with ``out`` and ``err`` (what it printed) and, after a call, ``args``/``kwargs``: the
arguments that changed in place, so the judge can copy the changes into its own objects.
"""

import builtins
import io
import itertools
import json
import operator
import os
import sys
import types

sys.path.insert(0, os.getcwd())
import plain  # noqa: E402

OUT_LIMIT = 1 << 18  # printed characters kept per request
CHUNK = 1000  # an iterator's items per reply
MUTABLE = (list, dict, set, bytearray)
OPERATORS = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift",
    "and_", "or_", "xor", "neg", "pos", "abs", "invert", "lt", "le", "gt", "ge", "contains",
    "getitem", "setitem", "delitem", "truth", "index")}
OPERATORS.update({name: getattr(builtins, name) for name in (
    "len", "str", "repr", "isinstance", "issubclass", "next", "hash", "format")})
handles = plain.Handles()


def lend(obj) -> dict:
    """A handle for what the answer defined (its functions, classes and their objects);
    anything else cannot cross."""
    owner = obj if isinstance(obj, (type, types.FunctionType, types.MethodType)) else type(obj)
    if getattr(owner, "__module__", None) == "solution" and not isinstance(
            obj, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        return handles.tag(obj)
    what = type(obj).__name__
    raise plain.CannotCross(f"a {what} cannot be sent to the judge (only plain data and the "
                            "answer's own functions, classes and objects can)")


def describe(err: BaseException) -> dict:
    """An exception as plain data: its lineage (``plain.exception_lineage``), message and,
    where they are plain, its arguments."""
    try:
        message = str(err)[:2000]
    except BaseException:  # noqa: BLE001 - its __str__ is the answer's code
        message = "(its message could not be read)"
    try:
        args = plain.encode(tuple(err.args))
    except (plain.CannotCross, TypeError):
        args = None
    return {"type": type(err).__name__[:100], "message": message, "args": args,
            **plain.exception_lineage(type(err))}


def target(message: dict):
    spec = message.get("target") or {}
    if "$handle" in spec:
        obj = handles.get(spec)
    else:
        name = str(spec.get("name"))
        solution_class = getattr(module, "Solution", None)
        obj = getattr(module, name) if hasattr(module, name) or not isinstance(
            solution_class, type) else getattr(solution_class(), name)
    return getattr(obj, message["attr"]) if message.get("attr") else obj


def decoded(values) -> list:
    return [plain.decode(v, handles.get) for v in values]


def perform(message: dict) -> dict:
    op = message.get("op")
    if op == "eval":
        return {"value": plain.encode(eval(message["expr"], module.__dict__), lend)}
    if op == "operator":
        return {"value": plain.encode(OPERATORS[message["name"]](*decoded(message["args"])),
                                      lend)}
    obj = target(message)
    if op == "call":
        args, kwargs = decoded(message.get("args", [])), \
            {str(k): plain.decode(v, handles.get) for k, v in message.get("kwargs", [])}
        reply = {"value": plain.encode(obj(*args, **kwargs), lend)}
        reply["args"] = changed(args, message.get("args", []))
        reply["kwargs"] = {k: data for k, data in zip(kwargs, changed(
            list(kwargs.values()), [v for _, v in message.get("kwargs", [])])) if data is not None}
        return reply
    if op == "getattr":
        return {"value": plain.encode(obj, lend)}
    if op == "setattr":
        setattr(target(dict(message, attr=None)), message["attr"],
                plain.decode(message["value"], handles.get))
        return {"value": None}
    if op == "state":  # None: its class keeps object's equality (the same object only)
        if type(obj).__eq__ is object.__eq__:
            return {"value": None}
        state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and hasattr(obj, slot):
                    state[slot] = getattr(obj, slot)
        return {"value": plain.encode([type(obj).__qualname__, state], lend)}
    if op == "iter":
        iterator = iter(obj)
        return {"value": {"iterator": handles.tag(iterator, "iterator"), **chunk(iterator)}}
    if op == "more":
        return {"value": chunk(obj)}
    raise ValueError(f"unknown request {op!r}")


def chunk(iterator) -> dict:
    items = list(itertools.islice(iterator, CHUNK))
    return {"items": plain.encode(items, lend), "done": len(items) < CHUNK}


def changed(values: list, sent: list) -> list:
    """Each mutable argument's state after the call where it differs from what was sent."""
    out = []
    for value, before in zip(values, sent):
        after = plain.encode(value, lend) if type(value) in MUTABLE else None
        out.append(after if after is not None and after != before else None)
    return out


def receive_files(files: dict) -> dict:
    """The judge's shared files written here; returns what they held, to tell changes."""
    for path, data in files.items():
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(bytes.fromhex(data))
    return files


def changed_files(folders: list, sent: dict) -> dict:
    out = {}
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read(1 << 22).hex()
                except OSError:
                    continue
                if sent.get(path) != data:
                    out[path] = data
    return out


def answer(work, message: dict | None = None) -> dict:
    """``work()``'s reply, with what it printed, or what it raised."""
    sent = receive_files(message.get("files") or {}) if message else {}
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        reply = work()
    except BaseException as error:  # noqa: BLE001 - whatever the answer raised is the reply
        reply = {"raise": describe(error)}
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    reply["out"], reply["err"] = out.getvalue()[:OUT_LIMIT], err.getvalue()[:OUT_LIMIT]
    if message and message.get("folders"):
        reply["files"] = changed_files(message["folders"], sent)
    return reply


def load(source: str) -> dict:
    """The answer run as the module ``solution``; its names (plain values or handles; a
    module it imported, say, is not the judge's to reach)."""
    exec(compile(source, "solution.py", "exec"), module.__dict__)
    names = {}
    for name, value in list(vars(module).items()):
        if not (name.startswith("__") and name.endswith("__")):
            try:
                names[name] = standard(value) or plain.encode(value, lend)
            except plain.CannotCross:
                continue
    return {"ready": names}


def standard(value) -> dict | None:
    """``{"$std": [module, name]}`` for a standard-library module, class or function the
    answer imported (``import math``, ``from collections import deque``): the judge imports
    its own (asserts may use what the answer imported)."""
    if isinstance(value, types.ModuleType):
        where, name = value.__name__, ""
    elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        where, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    else:
        return None
    if not isinstance(where, str) or where.split(".")[0] not in sys.stdlib_module_names or \
            where == "solution":
        return None
    return {"$std": [where, name]}


def main() -> None:
    global module
    channel_in = os.fdopen(os.dup(0), "r")
    channel_out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the answer reads an empty input
    os.dup2(2, 1)  # and what it writes past print goes to stderr, not into the channel
    sys.stdin = io.StringIO("")
    module = types.ModuleType("solution")
    module.__file__ = os.path.join(os.getcwd(), "solution.py")
    sys.modules["solution"] = module
    with open("solution.py") as f:
        source = f.read()
    os.unlink("solution.py")
    reply = answer(lambda: load(source))
    reply.setdefault("ready", None)
    while True:
        channel_out.write(json.dumps(reply, separators=(",", ":")) + "\n")
        channel_out.flush()
        line = channel_in.readline()
        if not line:
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        reply = answer(lambda: perform(message), message)


if __name__ == "__main__":
    main()
