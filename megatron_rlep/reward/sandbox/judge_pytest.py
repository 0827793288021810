"""The part of pytest that code-RL test files use, for the judge's sandbox (which has no
site-packages): written there as ``pytest.py`` beside ``judge.py``, never imported here.

Test files (KodCode's, and those of the LeetCode-style sets) use ``raises`` (as a context
manager with ``match``, or called), ``approx``, ``mark.parametrize`` (stacked, with ``ids``
and ``param``), ``mark.skip``/``skipif``/``xfail``, ``fixture`` (with ``yield`` and fixtures
asking for fixtures) and the fixtures ``capsys``, ``tmp_path`` (shared with the answer's
process: ``SHARED``) and ``monkeypatch``, ``skip``,
``fail`` and ``importorskip``. ``run_module`` collects ``test*`` functions and ``Test*``
classes' ``test*`` methods in file order, expands their parameters, and returns one result per
test: None when it passed, else one line saying why. Skipped tests and expected failures count
as neither.
"""

import io
import itertools
import math
import re
import sys
import types

__version__ = "8.0.0 (the judge's subset)"
SHARED: list = []  # tmp_path folders: copied to the answer's process around each call


class Skipped(Exception):
    pass


class Failed(AssertionError):
    pass


def skip(reason: str = "", **_):
    raise Skipped(reason)


def fail(reason: str = "", pytrace: bool = True):
    raise Failed(reason)


def importorskip(name: str, *_, **__):
    try:
        return __import__(name)
    except ImportError:
        raise Skipped(f"no module {name}") from None


class raises:
    """``with raises(E, match=...)`` or ``raises(E, f, *args)``."""

    def __init__(self, expected, *args, match=None, **kwargs):
        self.expected, self.match, self.value = expected, match, None
        if args:
            with self:
                args[0](*args[1:], **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise Failed(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not re.search(self.match, str(value)):
            raise Failed(f"the message {str(value)[:100]!r} does not match {self.match!r}")
        self.value, self.type = value, kind
        return True


class approx:
    def __init__(self, expected, rel=None, abs=None, nan_ok=False):
        self.expected, self.rel, self.abs = expected, rel, abs

    def _close(self, want, got) -> bool:
        if isinstance(want, dict):
            return isinstance(got, dict) and want.keys() == got.keys() and \
                all(self._close(want[k], got[k]) for k in want)
        if isinstance(want, (list, tuple)):
            return isinstance(got, (list, tuple)) and len(want) == len(got) and \
                all(self._close(w, g) for w, g in zip(want, got))
        if type(got) not in (int, float, bool, complex) or \
                type(want) not in (int, float, bool, complex):
            return want == got
        if want == got:
            return True
        size = abs_(want)
        if self.rel is None:
            tol = max(1e-6 * size, 1e-12) if self.abs is None else self.abs
        else:
            tol = self.rel * size if self.abs is None else max(self.rel * size, self.abs)
        return not math.isinf(size) and abs_(want - got) <= tol

    def __eq__(self, other):
        return self._close(self.expected, other)

    def __repr__(self):
        return f"approx({self.expected!r})"

    __hash__ = None


abs_ = abs


class _Mark:
    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, args, kwargs or {}

    def __call__(self, *args, **kwargs):
        configured = self.args or self.kwargs or self.name != "parametrize"
        if len(args) == 1 and callable(args[0]) and not kwargs and configured:
            marks = getattr(args[0], "pytestmark", [])
            args[0].pytestmark = [self] + list(marks)
            return args[0]
        return _Mark(self.name, args, kwargs)


class _MarkGenerator:
    def __getattr__(self, name):
        return _Mark(name)


mark = _MarkGenerator()


class param:
    def __init__(self, *values, marks=(), id=None):
        self.values, self.marks, self.id = values, marks, id


def fixture(function=None, *, scope="function", params=None, autouse=False, name=None, **_):
    def register(fn):
        fn._judge_fixture = {"name": name or fn.__name__, "autouse": autouse}
        return fn
    return register(function) if callable(function) else register


class CaptureResult(tuple):
    out = property(lambda self: self[0])
    err = property(lambda self: self[1])


class CaptureFixture:
    def __init__(self):
        self._out, self._err = io.StringIO(), io.StringIO()
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self._out, self._err

    def readouterr(self):
        out, err = self._out.getvalue(), self._err.getvalue()
        for buffer in (self._out, self._err):
            buffer.seek(0)
            buffer.truncate()
        return CaptureResult((out, err))

    def close(self):
        sys.stdout, sys.stderr = self._saved


class MonkeyPatch:
    """setattr, setitem, setenv and their undoing; the answer's objects live in another
    process, so patching them raises."""

    def __init__(self):
        self._undo = []

    def setattr(self, target, name, value=None, raising=True):
        if isinstance(target, str):
            module, _, attr = target.rpartition(".")
            target, name, value = __import__(module, fromlist=[attr]), attr, name
        if getattr(target, "__judge_proxy__", False) or type(target).__name__ == "Remote":
            raise TypeError("monkeypatch cannot reach the answer's objects: they live in the "
                            "answer's own process")
        old = getattr(target, name)
        self._undo.append(lambda: setattr(target, name, old))
        setattr(target, name, value)

    def setitem(self, mapping, key, value):
        old = mapping.get(key, _missing)
        self._undo.append(lambda: mapping.pop(key, None) if old is _missing else
                          mapping.__setitem__(key, old))
        mapping[key] = value

    def setenv(self, name, value):
        import os
        self.setitem(os.environ, name, str(value))

    def delenv(self, name, raising=True):
        import os
        if name in os.environ:
            old = os.environ[name]
            self._undo.append(lambda: os.environ.__setitem__(name, old))
            del os.environ[name]

    def undo(self):
        while self._undo:
            self._undo.pop()()


_missing = object()


def _marks(fn) -> list:
    return list(getattr(fn, "pytestmark", []))


def _cases(fn) -> list:
    """(id, {argument: value}, marks) for each parameter combination of ``fn``."""
    axes = []
    for m in reversed(_marks(fn)):
        if m.name != "parametrize":
            continue
        names, values = m.args[0], m.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for value in values:
            marks = list(value.marks) if isinstance(value, param) else []
            value = value.values if isinstance(value, param) else value
            value = (value,) if len(names) == 1 else tuple(value)
            rows.append((dict(zip(names, value)), marks))
        axes.append(rows)
    cases = []
    for combo in itertools.product(*axes):
        args, marks = {}, []
        for values, more in combo:
            args.update(values)
            marks += more
        cases.append((args, marks))
    return cases or [({}, [])]


def _skip_reason(marks) -> str | None:
    for m in marks:
        if m.name == "skip":
            return m.kwargs.get("reason", "skipped")
        if m.name == "skipif" and (m.args[0] if m.args else m.kwargs.get("condition")):
            return m.kwargs.get("reason", "skipped")
    return None


class _Fixtures:
    def __init__(self, found: dict):
        self.found, self.values, self.teardown = found, {}, []

    def get(self, name: str, args: dict):
        if name in args:
            return args[name]
        if name in self.values:
            return self.values[name]
        if name == "capsys":
            value = CaptureFixture()
            self.teardown.append(value.close)
        elif name in ("tmp_path", "tmpdir"):
            import tempfile
            from pathlib import Path

            value = Path(tempfile.mkdtemp(dir="."))  # relative: the same path for the answer
            SHARED.append(str(value))
        elif name == "monkeypatch":
            value = MonkeyPatch()
            self.teardown.append(value.undo)
        elif name in self.found:
            fn = self.found[name]
            value = fn(**{p: self.get(p, args) for p in _parameters(fn)})
            if isinstance(value, types.GeneratorType):
                generator = value
                value = next(generator)
                self.teardown.append(lambda: next(generator, None))
        else:
            raise LookupError(f"fixture {name!r} not found")
        self.values[name] = value
        return value

    def close(self):
        while self.teardown:
            self.teardown.pop()()


def _one(found: dict, fn, args: dict, owner=None) -> None:
    fixtures = _Fixtures(found)
    try:
        for name, auto in found.items():
            if auto._judge_fixture["autouse"]:
                fixtures.get(name, args)
        if owner is not None and hasattr(owner, "setup_method"):
            owner.setup_method(fn)
        fn(**{p: fixtures.get(p, args) for p in _parameters(fn)})
        if owner is not None and hasattr(owner, "teardown_method"):
            owner.teardown_method(fn)
    finally:
        fixtures.close()


def _parameters(fn) -> list:
    """The names ``fn`` takes (a bound method's without its first); pytest's marks are
    attributes here, not wrappers, so the code object tells."""
    function = getattr(fn, "__func__", fn)
    code = function.__code__
    positional = code.co_argcount - len(function.__defaults__ or ())  # defaults: not fixtures
    names = list(code.co_varnames[:positional]) + [
        n for n in code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
        if n not in (function.__kwdefaults__ or {})]
    return names[1:] if isinstance(fn, types.MethodType) else names


def _tests(module):
    for name, value in list(vars(module).items()):
        if name.startswith("test") and isinstance(value, types.FunctionType):
            yield value, None
        elif name.startswith("Test") and isinstance(value, type):
            for attr, method in list(vars(value).items()):
                if attr.startswith("test") and isinstance(method, types.FunctionType):
                    yield method, value


def run_module(module, failure) -> list:
    """One result per collected test: None (passed) or why it failed (``failure(err)``: the
    judge's one line)."""
    found = {v._judge_fixture["name"]: v for v in vars(module).values()
             if callable(v) and hasattr(v, "_judge_fixture")}
    results = []
    for fn, cls in _tests(module):
        for args, marks in _cases(fn):
            marks = marks + _marks(fn) + (_marks(cls) if cls else [])
            if _skip_reason(marks) is not None:
                continue
            xfail = any(m.name == "xfail" for m in marks)
            try:
                owner = cls() if cls else None
                _one(found, getattr(owner, fn.__name__) if owner else fn, args, owner)
                if not xfail:
                    results.append(None)
            except Skipped:
                continue
            except Exception as err:  # noqa: BLE001 - a failed test
                if not xfail:
                    results.append(f"{fn.__name__}: {failure(err)}")
    return results
