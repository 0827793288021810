"""Code answers checked against an example's tests in the sandbox, verdicts taken here.

The answer's program is its last fenced code block (```python ... ``` or ``` ... ```). The tests
come in the ground truth (verl's ``reward_model.ground_truth``, a JSON string) in the formats of
the public code-RL sets:

* ``{"inputs": [...], "outputs": [...]}``: standard input and output (PRIME's Eurus-2-RL-Data,
  APPS, TACO); with ``"fn_name"`` the inputs are argument lists and the outputs return values
  (call-based);
* a list of ``{"input", "output"}`` cases, or ``{"tests": [...]}`` (DeepCoder-Preview);
  ``"testtype": "functional"`` cases call ``metadata.func_name`` with one JSON argument a line;
* ``{"assert_case": ["assert f(1) == 2", ...]}`` (Skywork-OR1);
* ``{"test_code": "def check(candidate): ...", "entry_point": "f"}`` (HumanEval style);
* ``{"test": "from solution import f\\ndef test_...(): ..."}`` (KodCode's pytest files, run by a
  small runner: each ``test_*`` function called in turn).

Verdicts never trust the program's exit status. Standard-output tests compare its whole output
here (lines stripped of trailing blanks; a prefix is not a match). Call-based tests and asserts
of the form ``assert CALL == LITERAL`` send only the call into the sandbox and compare its
printed result with the literal here: the expected values never enter the sandbox, so an answer
cannot print them. Other asserts, ``check`` functions and test files run in the sandbox, and
pass only if a random per-run token is printed after the last of them (``sys.exit(0)``,
``os._exit(0)`` or ``raise SystemExit`` before the asserts print none); the driver removes its
own file first, but a program written to defeat the harness could still find the token in its
process's memory, so those formats are only as strong as that. Credit is given when every test
passes (``partial``: the fraction that pass). A sandbox that could not start is an
infrastructure failure (``status="infra"``), never a wrong answer.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass

from megatron_rlep.reward.sandbox import Limits, Sandbox

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


def last_code_block(text: str) -> str | None:
    """The last fenced block of ``text`` tagged python (or untagged), or None."""
    blocks = [body for tag, body in FENCE.findall(text) if tag.lower() in ("", "python", "py",
                                                                            "python3")]
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    status: str = "ok"  # ok | infra
    detail: str = ""  # the first failing test, for logs

    @property
    def correct(self) -> bool:
        return self.status == "ok" and self.total > 0 and self.passed == self.total


def same_output(got: str, expected: str) -> bool:
    """Whole standard outputs compared line by line, trailing blanks and blank lines ignored."""
    def lines(text):
        out = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(got) == lines(expected)


def parse_tests(ground_truth, extra_info=None) -> dict:
    """The tests of ``ground_truth`` (a JSON string or an already-parsed object) as one dict:
    ``{"kind": io | call | assert | check | pytest, ...}``; ValueError when it holds none."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    extra = extra_info or {}
    if isinstance(data, dict) and "tests" in data:
        data = data["tests"]
        data = json.loads(data) if isinstance(data, str) else data
    if isinstance(data, list):  # DeepCoder: [{"input", "output", "testtype"?, "metadata"?}]
        if data and data[0].get("testtype") == "functional":
            name = (data[0].get("metadata") or {}).get("func_name") or extra.get("func_name")
            args = [[json.loads(a) for a in str(c["input"]).splitlines() if a.strip()]
                    for c in data]
            return {"kind": "call", "fn_name": name, "inputs": args,
                    "outputs": [json.loads(c["output"]) for c in data]}
        return {"kind": "io", "inputs": [c["input"] for c in data],
                "outputs": [c["output"] for c in data]}
    if not isinstance(data, dict):
        raise ValueError("the ground truth holds no tests")
    if "inputs" in data and "outputs" in data:
        name = data.get("fn_name") or extra.get("fn_name")
        return {"kind": "call" if name else "io", "fn_name": name, "inputs": data["inputs"],
                "outputs": data["outputs"]}
    if "assert_case" in data:
        return {"kind": "assert", "asserts": list(data["assert_case"])}
    if "test_code" in data:
        return {"kind": "check", "test_code": data["test_code"],
                "entry_point": data.get("entry_point") or extra.get("entry_point")}
    if "test" in data:
        return {"kind": "pytest", "test": data["test"]}
    raise ValueError(f"the ground truth's fields {sorted(data)} name no test format")


def literal_assert(statement: str) -> tuple[str, object] | None:
    """(call source, expected value) of ``assert CALL == LITERAL``, else None."""
    try:
        tree = ast.parse(statement.strip())
    except SyntaxError:
        return None
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare) or \
            len(node.test.ops) != 1 or not isinstance(node.test.ops[0], ast.Eq):
        return None
    try:
        expected = ast.literal_eval(node.test.comparators[0])
    except ValueError:
        return None
    return ast.unparse(node.test.left), expected


def _results_driver(token: str, calls: list[str]) -> str:
    """Runs solution.py, then each call expression, printing ``token`` + repr(result) (or an
    error marker) a line each; the expected values are not in it."""
    return (f"import os, sys\nos.unlink(__file__)\nTOKEN = {token!r}\n"
            "namespace = {'__name__': '__main__'}\n"
            "exec(compile(open('solution.py').read(), 'solution.py', 'exec'), namespace)\n"
            f"for call in {calls!r}:\n"
            "    try:\n"
            "        value = repr(eval(call, namespace))\n"
            "    except BaseException as err:\n"
            "        value = '!error ' + type(err).__name__\n"
            "    sys.stdout.write('\\n' + TOKEN + value + '\\n')\n"
            "    sys.stdout.flush()\n")


def _token_driver(token: str, body: str) -> str:
    """Runs ``body`` (asserts, a check, a test runner) and prints ``token`` after it; the token
    is read before the answer's code runs and the driver's file is gone by then."""
    return (f"import os, sys\nTOKEN = {token!r}\nos.unlink(__file__)\n{body}\n"
            "sys.stdout.write('\\n' + TOKEN + ' all passed\\n')\n")


def _printed_results(stdout: str, token: str) -> list[object]:
    values = []
    for line in stdout.splitlines():
        if line.startswith(token):
            text = line[len(token):]
            try:
                values.append(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                values.append(("!unparsable", text[:80]))
    return values


class CodeChecker:
    """Runs an answer's program against an example's tests; ``check`` returns a Verdict."""

    def __init__(self, limits: Limits = Limits(), partial: bool = False, require: bool = True):
        self.sandbox = Sandbox(limits, require)
        self.partial = partial

    def check(self, response: str, ground_truth, extra_info=None) -> Verdict:
        program = last_code_block(response)
        try:
            tests = parse_tests(ground_truth, extra_info)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"code ground truth unusable: {err}") from None
        if program is None:
            return Verdict(0, max(len(tests.get("inputs") or tests.get("asserts") or [1]), 1),
                           detail="no fenced code block")
        kind = tests["kind"]
        if kind == "io":
            return self._io(program, tests["inputs"], tests["outputs"])
        if kind == "call":
            calls = [f"{tests['fn_name']}(*{_as_args(a)!r})" for a in tests["inputs"]]
            return self._calls(program, calls, tests["outputs"], as_json=True)
        if kind == "assert":
            literal = [literal_assert(a) for a in tests["asserts"]]
            if all(literal):
                return self._calls(program, [c for c, _ in literal], [e for _, e in literal])
            body = ("namespace = {'__name__': '__main__'}\n"
                    "exec(compile(open('solution.py').read(), 'solution.py', 'exec'), namespace)\n"
                    + "".join(f"exec({a!r}, namespace)\n" for a in tests["asserts"]))
            return self._token(program, body, len(tests["asserts"]))
        if kind == "check":
            body = ("namespace = {'__name__': '__main__'}\n"
                    "exec(compile(open('solution.py').read(), 'solution.py', 'exec'), namespace)\n"
                    f"exec({tests['test_code']!r}, namespace)\n"
                    f"namespace['check'](namespace[{tests['entry_point']!r}])\n")
            return self._token(program, body, 1)
        body = ("import importlib\nsys.path.insert(0, '.')\n"
                "tests = importlib.import_module('test_solution')\n"
                "for name in sorted(n for n in dir(tests) if n.startswith('test')):\n"
                "    if callable(getattr(tests, name)):\n"
                "        getattr(tests, name)()\n")
        return self._token(program, body, 1, {"test_solution.py": tests["test"]})

    def _io(self, program: str, inputs, outputs) -> Verdict:
        passed, detail = 0, ""
        for i, (given, expected) in enumerate(zip(inputs, outputs)):
            outcome = self.sandbox.run({"main.py": program}, stdin=_text(given))
            if outcome.status == "infra":
                return Verdict(passed, len(inputs), "infra", outcome.reason)
            if outcome.status == "ok" and same_output(outcome.stdout, _text(expected)):
                passed += 1
            elif not detail:
                detail = f"test {i}: {outcome.status} {outcome.exit_code}"
            if detail and not self.partial:
                break
        return Verdict(passed, len(inputs), detail=detail)

    def _calls(self, program: str, calls: list[str], expected: list,
               as_json: bool = False) -> Verdict:
        """``as_json``: the expected values came from JSON (tuples are lists there, and APPS
        and Eurus wrap a return value in a one-element list), so results compare as JSON."""
        token = secrets.token_hex(16)
        outcome = self.sandbox.run({"main.py": _results_driver(token, calls),
                                    "solution.py": program})
        if outcome.status == "infra":
            return Verdict(0, len(calls), "infra", outcome.reason)
        got = _printed_results(outcome.stdout, token)
        if as_json:
            got = [_jsonish(g) for g in got]
            passed = sum(g == e or (isinstance(e, list) and len(e) == 1 and g == e[0])
                         for g, e in zip(got, expected))
        else:
            passed = sum(g == e for g, e in zip(got, expected))  # as the assert would
        detail = "" if passed == len(calls) else \
            f"{len(got)} results for {len(calls)} calls, {passed} right ({outcome.status})"
        return Verdict(passed, len(calls), detail=detail)

    def _token(self, program: str, body: str, total: int, more: dict | None = None) -> Verdict:
        token = secrets.token_hex(16)
        files = {"main.py": _token_driver(token, body), "solution.py": program, **(more or {})}
        outcome = self.sandbox.run(files)
        if outcome.status == "infra":
            return Verdict(0, total, "infra", outcome.reason)
        ok = outcome.status == "ok" and f"{token} all passed" in outcome.stdout.splitlines()
        return Verdict(total if ok else 0, total, detail="" if ok else
                       f"{outcome.status} {outcome.exit_code}: {outcome.stderr[-200:]}")


def _as_args(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _jsonish(value):
    """A value as JSON would give it back: tuples as lists, throughout."""
    if isinstance(value, (list, tuple)):
        return [_jsonish(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonish(v) for k, v in value.items()}
    return value


def _text(value) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)
