"""The judge's side of the channel: runs an example's tests against an answer that lives in
another process, and reports how many passed.

Runs inside its own code sandbox (test files come with datasets: they are not trusted either)
as ``python -I -S main.py`` beside ``plain.py``, ``pytest.py`` (``judge_pytest.py``: the part of
pytest that test files use) and ``tests.json``; never imported by the trainer. The answer's
module appears here as ``solution``, whose functions, classes and objects are proxies
(``Remote``): calling one sends the arguments over the channel as plain data (``plain.py``)
and rebuilds the reply here, so every comparison a test makes is between the judge's own
objects. Nothing the candidate made is ever compared, called or printed here. A ``Remote``
forwards calls, attributes, indexing, ``len``, ``in``, ``str``, ``repr``, truth, iteration,
arithmetic, ``isinstance``, and ordering between two of the answer's objects; equality is
decided here: a ``Remote`` never equals plain data, and two of the answer's objects are equal
when they are the same object or, where their class defines equality, when their class names
and attributes (fetched as plain data) are equal. So an answer's ``__eq__`` (or ``__lt__``
against an expected number) never decides a test.

What real tests rely on is kept: arguments changed in place are copied back into the judge's
objects after each call; what the answer printed during a call is written to this process's
stdout and stderr (where ``capsys`` reads it); an exception it raised is raised here as the
same built-in or standard-library class, its own exception classes rebuilt as the judge's
(same names, same hierarchy, same built-in base); files a test writes under ``tmp_path`` are
copied to the answer before each call, and what it wrote there copied back. What cannot cross
(a generator, a module, an object of a class the test file defined) raises ``CannotCross``
with the reason, and that test fails. Tests that patch the candidate's objects (``mock.patch``
of ``solution``, ``monkeypatch`` on it) cannot reach them: they fail with that reason
(``code.needs_candidate_process`` finds them; ``docs/code_sandbox.md``).

Protocol: the first line in is the candidate's ``ready`` message (``candidate_host.py``),
then the reply to each request this process writes; the last line out is
``{"verdict": {"passed", "total", "detail"}}``.
"""

import builtins
import io
import json
import os
import sys
import types

sys.path.insert(0, os.getcwd())
import plain  # noqa: E402

DETAIL_LIMIT = 300
FILES_LIMIT = 1 << 22  # bytes of shared files sent with a request


class CandidateError(Exception):
    """The answer's process ended, replied nonsense, or raised what the judge will not raise."""


class Channel:
    def __init__(self):
        self.inbox = os.fdopen(os.dup(0), "r")
        self.outbox = os.fdopen(os.dup(1), "w")
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(2, 1)  # the tests' own prints go to stderr unless captured
        sys.stdin = io.StringIO("")
        self.gone = ""
        self.mirrors: dict = {}
        self.remotes: dict[int, "Remote"] = {}  # one proxy per object of the answer's

    def receive(self) -> dict:
        line = self.inbox.readline()
        if not line:
            raise CandidateError("the channel closed")
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError("a reply that is not an object")
        return message

    def send(self, message: dict) -> None:
        self.outbox.write(plain.dumps(message) + "\n")
        self.outbox.flush()

    def request(self, message: dict, stop_iteration: bool = False) -> dict:
        """The reply; what the answer printed goes to sys.stdout and sys.stderr; what it raised
        is raised here (StopIteration only where ``stop_iteration``: the end of its iterator)."""
        if self.gone:
            raise CandidateError(self.gone)
        folders = shared_folders()
        if folders:
            message = dict(message, files=collect_files(folders), folders=folders)
        self.send({"to": "candidate", **message})
        try:
            reply = self.receive()
        except Exception as err:  # noqa: BLE001 - any failure of the channel ends the answer
            self.gone = f"the answer's process ended or broke the channel ({reply_text(err)})"
            raise CandidateError(self.gone) from None
        if "gone" in reply:
            self.gone = f"the answer's process ended ({str(reply['gone'])[:200]})"
            raise CandidateError(self.gone)
        for stream, key in ((sys.stdout, "out"), (sys.stderr, "err")):
            if type(reply.get(key)) is str and reply[key]:
                stream.write(reply[key])
        if folders and type(reply.get("files")) is dict:
            write_files(folders, reply["files"])
        if "raise" in reply:
            raise self.exception(reply["raise"], stop_iteration)
        return reply

    def value(self, message: dict, stop_iteration: bool = False):
        return self.decode(self.request(message, stop_iteration).get("value"))

    def decode(self, data):
        try:
            return plain.decode(data, self.remote)
        except Exception as err:  # noqa: BLE001 - unreadable data is a failed test
            raise CandidateError(f"the answer's reply could not be read ({reply_text(err)})") \
                from None

    def remote(self, tag: dict):
        if type(tag.get("$handle")) is not int or type(tag.get("type")) is not str:
            raise ValueError("a malformed handle")
        if tag.get("kind") == "exception":
            return self.exception_class(tag)
        number = tag["$handle"]
        if number not in self.remotes:
            self.remotes[number] = Remote(self, tag)
        return self.remotes[number]

    def exception_class(self, lineage: dict, stop_iteration: bool = False) -> type:
        """The judge's class for an exception class of the answer's (``plain.exception_lineage``):
        its own classes rebuilt as the judge's, with the same names and bases, on top of
        built-in or standard-library classes (anything else: CandidateError)."""
        if lineage.get("name") is None:
            return self.standard_exception(lineage.get("base"), stop_iteration)
        classes = lineage.get("classes")

        def build(name, depth=0):
            bases = classes.get(name) if type(classes) is dict and depth < 50 else None
            if type(bases) is not list or not bases:
                return CandidateError
            parents = tuple(build(b["own"], depth + 1) if type(b) is dict and "own" in b else
                            self.standard_exception(b.get("std") if type(b) is dict else None,
                                                    stop_iteration) for b in bases)
            key = (str(name)[:100], parents)
            if key not in self.mirrors:
                try:
                    self.mirrors[key] = type(key[0], tuple(dict.fromkeys(parents)),
                                             {"__module__": "solution"})
                except TypeError:  # bases Python would not combine here either
                    self.mirrors[key] = CandidateError
            return self.mirrors[key]
        return build(lineage["name"])

    def standard_exception(self, base, stop_iteration: bool = False) -> type:
        """A built-in or standard-library exception class, if the judge may raise it."""
        try:
            parent = standard(*base)
        except Exception:  # noqa: BLE001 - not a standard-library class
            return CandidateError
        return parent if raisable(parent, stop_iteration) else CandidateError

    def exception(self, raised, stop_iteration: bool = False) -> Exception:
        if type(raised) is not dict:
            return CandidateError("the answer raised something unreadable")
        message = str(raised.get("message", ""))[:2000]
        cls = self.exception_class(raised, stop_iteration)
        if cls is CandidateError:  # SystemExit, a class of a package: not the judge's to raise
            return CandidateError(f"the answer raised {str(raised.get('type'))[:100]}: {message}")
        try:
            args = plain.decode(raised.get("args"))
            args = args if type(args) is tuple else (message,)
        except Exception:  # noqa: BLE001 - unreadable arguments: the message alone
            args = (message,)
        try:
            return cls(*args)
        except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
            error = cls.__new__(cls)
            error.args = args
            return error

    def send_value(self, value):
        """A test's value, encoded for the candidate: plain data and the candidate's own
        proxies; anything else of the judge's cannot cross."""
        def lend(obj):
            if type(obj) is Remote:
                return {"$handle": obj._judge_number()}
            raise plain.CannotCross(f"the test's {type(obj).__name__} object cannot be sent to "
                                    "the answer's process (only plain data and the answer's "
                                    "own objects can)")
        return plain.encode(value, lend)

    def call(self, target: dict, attr, args, kwargs):
        message = {"op": "call", "target": target, "args": [self.send_value(a) for a in args],
                   "kwargs": [[k, self.send_value(v)] for k, v in kwargs.items()]}
        if attr:
            message["attr"] = attr
        reply = self.request(message)
        value = self.decode(reply.get("value"))
        changed = reply.get("args")
        for i, arg in enumerate(args):
            if type(changed) is list and i < len(changed) and changed[i] is not None:
                copy_back(arg, self.decode(changed[i]))
        after = reply.get("kwargs")
        for key, arg in kwargs.items():
            if type(after) is dict and after.get(key) is not None:
                copy_back(arg, self.decode(after[key]))
        return value

    def operate(self, name: str, *args, stop_iteration: bool = False):
        return self.value({"op": "operator", "name": name,
                           "args": [self.send_value(a) for a in args]}, stop_iteration)


def shared_folders() -> list:
    """The folders a test shares with the answer (its ``tmp_path``s)."""
    shim = sys.modules.get("pytest")
    return list(getattr(shim, "SHARED", ()))


def collect_files(folders: list) -> dict:
    files, size = {}, 0
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    data = f.read(FILES_LIMIT - size + 1)
                size += len(data)
                if size > FILES_LIMIT:
                    raise plain.CannotCross(f"the test's files under {folder} are over "
                                            f"{FILES_LIMIT >> 20} MiB: too large to share")
                files[path] = data.hex()
    return files


def write_files(folders: list, files: dict) -> None:
    """What the answer wrote under the shared folders, written here; a path outside them is
    ignored."""
    for path, data in files.items():
        clean = os.path.normpath(str(path))
        if type(data) is not str or ".." in clean.split(os.sep) or not any(
                clean == os.path.normpath(f) or clean.startswith(os.path.normpath(f) + os.sep)
                for f in folders):
            continue
        os.makedirs(os.path.dirname(clean), exist_ok=True)
        with open(clean, "wb") as f:
            f.write(bytes.fromhex(data))


def raisable(parent, stop_iteration: bool = False) -> bool:
    """Whether the judge raises an exception of class ``parent`` as the answer's: not what
    ends the judge (SystemExit) or, but from an iterator's ``next``, ends a loop early
    (StopIteration: ``all(map(f, cases))`` would pass on the first call that raised it)."""
    if not (isinstance(parent, type) and issubclass(parent, Exception)):
        return False
    return stop_iteration or not issubclass(parent, (StopIteration, StopAsyncIteration))


def reply_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err)[:200]}"


def copy_back(old, new) -> None:
    """``old`` (the judge's argument) made equal to ``new`` (its state after the call) in place,
    keeping the judge's inner objects where their shapes still match."""
    if type(old) is list and type(new) is list:
        if len(old) == len(new):
            for i, (a, b) in enumerate(zip(old, new)):
                if type(a) is type(b) and type(a) in (list, dict, set, bytearray):
                    copy_back(a, b)
                else:
                    old[i] = b
        else:
            old[:] = new
    elif type(old) is dict and type(new) is dict:
        for key in [k for k in old if k not in new]:
            del old[key]
        for key, value in new.items():
            if key in old and type(old[key]) is type(value) and type(value) in (list, dict, set):
                copy_back(old[key], value)
            else:
                old[key] = value
    elif type(old) is set and type(new) is set:
        old.clear()
        old.update(new)
    elif type(old) is bytearray and type(new) is bytearray:
        old[:] = new


def _binary(name: str, reflected: bool = False):
    def method(self, other):
        left, right = (other, self) if reflected else (self, other)
        return arithmetic(self._judge_operate(name, left, right), type(other) is Remote)
    return method


def _ordering(name: str):
    def method(self, other):  # only between two of the answer's objects
        return self._judge_operate(name, self, other) if type(other) is Remote else NotImplemented
    return method


def _unary(name: str):
    return lambda self: arithmetic(self._judge_operate(name, self), False)


def arithmetic(result, both_answers: bool):
    """An operator's result on the answer's objects: plain data only from two of them (a dot
    product). From one, with plain data or alone, it must be one of the answer's objects:
    else ``abs(f(x) - y) < 1e-9`` would pass for any ``f`` returning an object whose ``-``
    or ``abs`` gives 0."""
    if not both_answers and type(result) is not Remote:
        raise TypeError("arithmetic on one of the answer's objects gave plain data: a function "
                        "expected to return a number must return a number")
    return result


class Remote:
    """One of the answer's functions, classes or objects, seen from the judge."""

    __slots__ = ("_judge_channel", "_judge_tag")  # names an answer's attributes will not use

    def __init__(self, channel, tag):
        object.__setattr__(self, "_judge_channel", channel)
        object.__setattr__(self, "_judge_tag", dict(tag))

    def _judge_number(self) -> int:
        return object.__getattribute__(self, "_judge_tag")["$handle"]

    def _judge_info(self, key):
        return object.__getattribute__(self, "_judge_tag").get(key)

    def _judge_operate(self, name, *args, **kwargs):
        return object.__getattribute__(self, "_judge_channel").operate(name, *args, **kwargs)

    def _judge_ask(self, op, **more):
        channel = object.__getattribute__(self, "_judge_channel")
        return channel.value({"op": op, "target": {"$handle": self._judge_number()}, **more})

    def __call__(self, *args, **kwargs):
        channel = object.__getattribute__(self, "_judge_channel")
        return channel.call({"$handle": self._judge_number()}, None, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._judge_ask("getattr", attr=name)

    def __setattr__(self, name, value):
        channel = object.__getattribute__(self, "_judge_channel")
        self._judge_ask("setattr", attr=name, value=channel.send_value(value))

    def __bool__(self):
        if self._judge_info("kind") in ("class", "exception"):
            return True
        return expect(self._judge_operate("truth", self), bool, "truth")

    def __len__(self):
        return expect(self._judge_operate("len", self), int, "len()")

    def __str__(self):
        return expect(self._judge_operate("str", self), str, "str()")

    def __repr__(self):
        try:
            return expect(self._judge_operate("repr", self), str, "repr()")
        except Exception:  # noqa: BLE001 - the answer's repr failed: say what it is
            return f"<the answer's {self._judge_info('type')}>"

    def __format__(self, spec):
        return expect(self._judge_operate("format", self, spec), str, "format()")

    def __iter__(self):
        if self._judge_info("kind") == "iterator":
            return self
        return Items(object.__getattribute__(self, "_judge_channel"), self)

    def __next__(self):
        return self._judge_operate("next", self, stop_iteration=True)

    def __contains__(self, item):
        return expect(self._judge_operate("contains", self, item), bool, "in")

    def __getitem__(self, key):
        return self._judge_operate("getitem", self, key)

    def __setitem__(self, key, value):
        self._judge_operate("setitem", self, key, value)

    def __delitem__(self, key):
        self._judge_operate("delitem", self, key)

    def __index__(self):
        return expect(self._judge_operate("index", self), int, "index()")

    def __instancecheck__(self, instance):
        return expect(self._judge_operate("isinstance", instance, self), bool, "isinstance()")

    def __subclasscheck__(self, subclass):
        return expect(self._judge_operate("issubclass", subclass, self), bool, "issubclass()")

    def __eq__(self, other):
        if other is self:
            return True
        if type(other) is not Remote:
            return NotImplemented  # plain data: never equal (the answer's __eq__ is not asked)
        if not (self._judge_info("value") and other._judge_info("value")):
            return False  # a class without equality of its own: only the same object
        mine, theirs = self._judge_ask("state"), other._judge_ask("state")
        return mine is not None and mine == theirs

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self):
        if self._judge_info("value"):
            if not self._judge_info("hashable"):
                raise TypeError(f"unhashable type: '{self._judge_info('type')}'")
            return hash(("solution", self._judge_info("type")))  # equal objects: the same hash
        return object.__hash__(self)

    __lt__, __le__, __gt__, __ge__ = (_ordering(n) for n in ("lt", "le", "gt", "ge"))
    __neg__, __pos__, __abs__, __invert__ = (_unary(n) for n in ("neg", "pos", "abs", "invert"))


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift",
              "rshift", "xor", "and_", "or_"):
    _dunder = _name.rstrip("_")
    setattr(Remote, f"__{_dunder}__", _binary(_name))
    setattr(Remote, f"__r{_dunder}__", _binary(_name, reflected=True))


class Items:
    """Iteration over one of the answer's objects: its items fetched a chunk at a time."""

    def __init__(self, channel: Channel, obj: Remote):
        self.channel = channel
        value = channel.request({"op": "iter", "target": {"$handle": obj._judge_number()}}).get(
            "value")
        self._take(value)
        self.iterator = value.get("iterator", {}).get("$handle") if type(
            value.get("iterator")) is dict else None
        if type(self.iterator) is not int:
            raise CandidateError("the answer's reply to iteration could not be read")

    def _take(self, value) -> None:
        if type(value) is not dict or type(value.get("done")) is not bool:
            raise CandidateError("the answer's reply to iteration could not be read")
        self.items = list(self.channel.decode(value.get("items")))
        self.items.reverse()
        self.done = value["done"]

    def __iter__(self):
        return self

    def __next__(self):
        if not self.items and not self.done:
            self._take(self.channel.request({"op": "more", "target": {
                "$handle": self.iterator}}).get("value"))
        if not self.items:
            raise StopIteration
        return self.items.pop()


def expect(value, kind: type, what: str):
    if type(value) is not kind:
        raise TypeError(f"the answer's {what} gave a {type(value).__name__}, not a "
                        f"{kind.__name__}")
    return value


class SolutionModule(types.ModuleType):
    """The answer's module as the judge sees it; patching it (``mock.patch("solution.f")``)
    would change nothing in the answer's process, so it raises instead."""

    __judge_proxy__ = True

    def __setattr__(self, name, value):
        if "__all__" in vars(self):
            raise TypeError(f"cannot patch solution.{name}: the answer's objects live in its "
                            "own process (verifier.code.in_process_patching runs such tests "
                            "there)")
        super().__setattr__(name, value)


def solution_module(channel: Channel, names: dict) -> types.ModuleType:
    """The answer's names as a module: plain values, proxies, and the judge's own copies of
    the standard-library modules, classes and functions it imported. Its ``__all__`` (what
    ``from solution import *`` and the asserts see) leaves out every name that would hide a
    built-in, a standard-library module or pytest from the tests: an ``abs`` that returns 0
    would pass ``assert abs(f(x) - y) < 1e-9``, a class ``math`` whose ``isclose`` says yes
    would pass ``math.isclose(f(x), y)``."""
    module, shared = SolutionModule("solution"), set()
    for name, data in names.items():
        try:
            if type(data) is dict and "$std" in data:
                setattr(module, name, standard(*data["$std"]))
                shared.add(name)
            else:
                setattr(module, name, plain.decode(data, channel.remote))
        except Exception:  # noqa: BLE001 - a name it cannot rebuild is left out
            continue
    module.__all__ = [n for n in vars(module) if not n.startswith("_") and (
        n in shared and getattr(module, n).__name__ == n or not protected(n))]
    return module


def standard(where: str, name: str):
    """The judge's own standard-library module ``where``, or its attribute ``name``."""
    import importlib

    if type(where) is not str or type(name) is not str or \
            where.split(".")[0] not in sys.stdlib_module_names:
        raise ValueError("not a standard-library name")
    value = importlib.import_module(where)
    for part in filter(None, name.split(".")):
        value = getattr(value, part)
    return value


def protected(name: str) -> bool:
    return hasattr(builtins, name) or name in sys.stdlib_module_names or name == "pytest"


def failure(err: BaseException) -> str:
    """One line: the exception and, for an assert, the test's line."""
    import traceback

    where = ""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename != __file__:
            where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" + \
                (f" ({frame.line.strip()[:120]})" if frame.line else "")
            break
    text = str(err)
    return f"{type(err).__name__}{where}{': ' + text if text else ''}"[:DETAIL_LIMIT]


def run_asserts(namespace: dict, asserts: list) -> list:
    results = []
    for statement in asserts:
        try:
            exec(compile(statement, "assert_case", "exec"), namespace)
            results.append(None)
        except Exception as err:  # noqa: BLE001 - a failed test
            results.append(failure(err))
    return results


def run_check(namespace: dict, test_code: str, entry_point) -> list:
    try:
        exec(compile(test_code, "test_code", "exec"), namespace)
        if entry_point not in namespace:
            return [f"the answer defines no {entry_point}"]
        namespace["check"](namespace[entry_point])
        return [None]
    except Exception as err:  # noqa: BLE001 - a failed test
        return [failure(err)]


def run_pytest() -> list:
    import pytest

    try:
        tests = __import__("test_solution")
    except Exception as err:  # noqa: BLE001 - a test file that does not load fails it all
        return [f"the test file did not load: {failure(err)}"]
    return pytest.run_module(tests, failure)


def main() -> None:
    channel = Channel()
    results: list = []
    try:
        spec = json.load(open("tests.json"))
        os.unlink("tests.json")
        ready = channel.receive()
        if "gone" in ready:
            results = [f"the answer's process ended before it loaded ({ready['gone']})"]
        elif ready.get("ready") is None:
            raised = channel.exception(ready.get("raise"))
            results = [f"the answer raised {type(raised).__name__} when loaded: {raised}"]
        else:
            module = solution_module(channel, ready["ready"])
            sys.modules["solution"] = module
            namespace = {"__name__": "__main__",
                         **{k: getattr(module, k) for k in module.__all__}}
            kind = spec["kind"]
            if kind == "assert":
                results = run_asserts(namespace, spec["asserts"])
            elif kind == "check":
                results = run_check(namespace, spec["test_code"], spec["entry_point"])
            else:
                results = run_pytest()
    except Exception as err:  # noqa: BLE001 - the judge itself failed: no test passes
        results = [f"the judge failed: {failure(err)}"]
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    failed = [r for r in results if r is not None]
    channel.send({"verdict": {"passed": len(results) - len(failed), "total": len(results),
                              "detail": failed[0] if failed else ""}})


if __name__ == "__main__":
    main()
