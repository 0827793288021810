"""Plain data across the judge's channel: values that carry no code, encoded as one JSON line.

A code answer's functions run in one sandboxed process and the tests that judge them in another
(``code.py``); what passes between the two is what this module encodes: None, bools, ints,
floats, strings, bytes, complex numbers, lists, tuples, dicts, sets, and the containers of the
standard library that tests compare with (deque, Counter, OrderedDict, Decimal, Fraction).
Everything is rebuilt from its JSON by ``decode``, which makes only those types: an object the
candidate made can never reach the judge, so no ``__eq__``, ``__repr__`` or ``__bool__`` of the
candidate's ever runs there. An object that is not plain data crosses as a *handle*, an
opaque number the side that owns the object can resolve (``Handles``); on the other side it is
whatever ``decode``'s ``handle`` function makes of it (the judge: a proxy whose calls go back
through the channel).

Standard library only: the sandboxes load this file by itself (``python -I -S``).
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict, deque
from decimal import Decimal
from fractions import Fraction

MAX_DEPTH = 200  # deeper values are refused (a recursion bomb) rather than crash the decoder
MAX_INT_BITS = 1 << 20  # integers cross as hex past 2,048 bits, up to a million bits
FRACTION = frozenset("-0123456789/")


class CannotCross(TypeError):
    """A value that is not plain data and has no handle: a generator, a function returned, a
    module, an object of a type this side does not share."""


def encode(value, handle=None, depth: int = 0):
    """``value`` as JSON-ready data. Containers are read through their base types' own
    methods, never the value's. ``handle(obj)`` gives the tag of an object that is not plain
    (or raises CannotCross); without it such an object raises CannotCross."""
    if depth > MAX_DEPTH:
        raise CannotCross(f"a value nested more than {MAX_DEPTH} deep")
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        bits = value.bit_length()
        if bits > MAX_INT_BITS:
            raise CannotCross(f"an integer of more than {MAX_INT_BITS} bits")
        return value if bits <= 2048 else {"$int": hex(value)}
    if kind is float:
        return value if value == value and abs(value) != float("inf") else {"$float": repr(value)}
    down = depth + 1
    if kind is list:
        return [encode(v, handle, down) for v in list.__iter__(value)]
    if kind is tuple:
        return {"$tuple": [encode(v, handle, down) for v in tuple.__iter__(value)]}
    if kind in (set, frozenset):
        return {"$" + kind.__name__: [encode(v, handle, down) for v in kind.__iter__(value)]}
    if isinstance(value, dict) and (handle is None or kind.__module__ in ("builtins",
                                                                          "collections")):
        tag = {Counter: "$counter", OrderedDict: "$odict"}.get(kind, "$dict")
        return {tag: [[encode(k, handle, down), encode(v, handle, down)]
                      for k, v in dict.items(value)]}
    if kind is deque:
        return {"$deque": [encode(v, handle, down) for v in deque.__iter__(value)]}
    if kind in (bytes, bytearray):
        return {"$" + kind.__name__: bytes(value).hex()}
    if kind is complex:
        return {"$complex": [value.real, value.imag]}
    if kind in (Decimal, Fraction):
        return {"$" + kind.__name__.lower(): str(value)}
    if handle is None:
        raise CannotCross(f"a {kind.__name__} is not plain data")
    return handle(value)


def decode(data, handle=None, depth: int = 0):
    """The value ``data`` (``encode``'s output, as JSON parsed it) stands for; ValueError for
    anything else. ``handle(tag)`` makes what a ``{"$handle": ...}`` tag becomes here."""
    if depth > MAX_DEPTH:
        raise ValueError(f"a value nested more than {MAX_DEPTH} deep")
    kind = type(data)
    if data is None or kind in (bool, int, str, float):
        return data
    down = depth + 1
    if kind is list:
        return [decode(v, handle, down) for v in data]
    if kind is not dict or len(data) != 1 and "$handle" not in data:
        raise ValueError(f"not an encoded value: a {kind.__name__}")
    if "$handle" in data:
        if handle is None:
            raise ValueError("a handle where only plain data may be")
        return handle(data)
    (tag, body), = data.items()
    items = lambda: [decode(v, handle, down) for v in _list(body)]  # noqa: E731
    if tag == "$tuple":
        return tuple(items())
    if tag in ("$set", "$frozenset"):
        return (set if tag == "$set" else frozenset)(items())
    if tag == "$deque":
        return deque(items())
    if tag in ("$dict", "$counter", "$odict"):
        pairs = [(decode(k, handle, down), decode(v, handle, down)) for k, v in
                 (_pair(p) for p in _list(body))]
        return {"$dict": dict, "$counter": Counter, "$odict": OrderedDict}[tag](dict(pairs))
    if tag in ("$bytes", "$bytearray"):
        raw = bytes.fromhex(_str(body))
        return raw if tag == "$bytes" else bytearray(raw)
    if tag == "$int":
        text = _str(body)
        if len(text) > MAX_INT_BITS // 4 + 4:
            raise ValueError("an integer too large")
        return int(text, 16)
    if tag == "$complex":
        real, imag = _list(body)
        return complex(float(real), float(imag))
    if tag == "$float":
        text = _str(body)
        if text not in ("inf", "-inf", "nan"):
            raise ValueError(f"not a special float: {text[:20]!r}")
        return float(text)
    if tag == "$decimal":
        return Decimal(_str(body))
    if tag == "$fraction":  # digits and a slash only: an exponent could be a costly power
        text = _str(body)
        if not set(text) <= FRACTION or len(text) > 10_000:
            raise ValueError("not a fraction")
        return Fraction(text)
    raise ValueError(f"unknown tag {tag[:20]!r}")


def _list(body) -> list:
    if type(body) is not list:
        raise ValueError("a tag's body must be a list")
    return body


def _str(body) -> str:
    if type(body) is not str:
        raise ValueError("a tag's body must be a string")
    return body


def _pair(pair) -> list:
    if type(pair) is not list or len(pair) != 2:
        raise ValueError("a dict item must be a [key, value] pair")
    return pair


class Handles:
    """The objects one side lends the other, by number; ``tag(obj)`` lends one."""

    def __init__(self):
        self.objects: list = []
        self.numbers: dict[int, int] = {}  # id(obj) -> number (the list keeps obj alive)

    def tag(self, obj, kind: str | None = None) -> dict:
        """The handle of ``obj``: its number, its type's name, its kind (class, exception: a
        class deriving from BaseException, iterator, or object) and, for objects, whether
        their class defines equality (``value``: else two are equal only if the same)."""
        number = self.numbers.get(id(obj))
        if number is None:
            number = self.numbers[id(obj)] = len(self.objects)
            self.objects.append(obj)
        name = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        tag = {"$handle": number, "type": str(name)[:100], "kind": kind or kind_of(obj)}
        if tag["kind"] == "exception":
            tag.update(exception_lineage(obj))
        elif tag["kind"] == "object":
            tag["value"] = type(obj).__eq__ is not object.__eq__
            tag["hashable"] = type(obj).__hash__ is not None
        return tag

    def get(self, data: dict):
        number = data.get("$handle")
        if type(number) is not int or not 0 <= number < len(self.objects):
            raise ValueError("an unknown handle")
        return self.objects[number]


def kind_of(obj) -> str:
    if isinstance(obj, type):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "object"


def exception_lineage(cls: type) -> dict:
    """An exception class as the judge rebuilds it: its name, and for each of the answer's own
    classes in its MRO the direct bases, each another of the answer's (``{"own": name}``) or a
    class of the standard library's (``{"std": [module, name]}``: a built-in such as KeyError,
    or json's JSONDecodeError)."""
    classes = {}
    for c in cls.__mro__:
        if c.__module__ == "solution":
            classes[str(c.__name__)[:100]] = [
                {"own": str(b.__name__)[:100]} if b.__module__ == "solution" else
                {"std": [str(b.__module__), str(b.__qualname__)]} for b in c.__bases__]
    name = str(cls.__name__)[:100] if classes else None
    return {"name": name, "classes": classes,
            "base": None if classes else [str(cls.__module__), str(cls.__qualname__)]}


def dumps(message: dict) -> str:
    return json.dumps(message, separators=(",", ":"))
