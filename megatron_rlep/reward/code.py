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

Verdicts are never the candidate's to take. Standard-output tests compare its whole output here
(lines stripped of trailing blanks; a prefix is not a match). Every other format runs the
answer's program as the module ``solution`` in a sandbox of its own (``candidate_host.py``)
and talks to it through a channel that carries plain data only (``plain.py``): call-based
tests and asserts of the form ``assert CALL == LITERAL`` send the call there and compare the
rebuilt result here; other asserts, ``check`` functions and test files run in a second sandbox,
the judge (``judge.py``), where the answer's functions are proxies whose calls go through the
channel, relayed by this process. Nothing the candidate creates is ever compared, called or
printed by whoever decides, and the expected values never enter its sandbox. Credit is given
when every test passes (``partial``: the fraction that pass). A sandbox that could not start
is an infrastructure failure (``status="infra"``), never a wrong answer.

Test files that patch the candidate's objects (``mock.patch``, ``monkeypatch``: a function
that reads ``input()`` patched by its test, say) cannot reach them from the judge and fail
there; ``in_process=True`` (``verifier.code.in_process_patching``, opt-in) runs those files in
the candidate's own process instead, where a program written to defeat the harness can forge
a pass (``needs_candidate_process`` finds them; the trainer counts them at start-up).
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from megatron_rlep.reward import sandbox
from megatron_rlep.reward.sandbox import Limits, Sandbox, Session, plain
from megatron_rlep.reward.sources import source_kind

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


PATCHING = re.compile(r"\bmonkeypatch\b|\bmock\b|\bpatch\s*\(|\bpatch\.object\b")


def needs_candidate_process(tests: dict) -> bool:
    """Whether ``tests`` (``parse_tests``' dict) patch objects (``mock``, ``monkeypatch``): from
    the judge's process such patches cannot reach the candidate's objects."""
    text = tests.get("test") or tests.get("test_code") or "\n".join(tests.get("asserts") or [])
    return bool(PATCHING.search(text))


def census(examples) -> str | None:
    """One line on the code examples among ``examples``: how many by test format, and how many
    patch the candidate's objects; None when there are none."""
    from collections import Counter

    kinds, patching = Counter(), 0
    for example in examples:
        if source_kind(example.data_source) != "code":
            continue
        try:
            tests = parse_tests(example.ground_truth, example.extra_info)
        except (ValueError, TypeError, KeyError, AttributeError):
            kinds["unreadable"] += 1
            continue
        kinds[tests["kind"]] += 1
        patching += tests["kind"] in JUDGED and needs_candidate_process(tests)
    if not kinds:
        return None
    parts = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    return (f"code tests: {sum(kinds.values())} examples ({parts}); {patching} patch the "
            "candidate's objects (mock, monkeypatch): they fail in the judge unless "
            "verifier.code.in_process_patching=true runs them in the candidate's process")


JUDGED = ("assert", "check", "pytest")  # the formats whose tests run in the judge's sandbox


@cache
def _source(name: str) -> str:
    """A file of the sandbox package, sent into a sandbox as a program's own file."""
    return (Path(sandbox.__file__).with_name(name)).read_text()


def _candidate_files(program: str) -> dict:
    return {"main.py": _source("candidate_host.py"), "plain.py": _source("plain.py"),
            "solution.py": program}


def _message(line: str | None):
    """A line of the channel as a dict, or None."""
    try:
        message = json.loads(line) if line else None
    except ValueError:
        return None
    return message if type(message) is dict else None


def _why_gone(session: Session) -> str:
    if session.flooded:
        return "it wrote past the output limit"
    if session.timed_out():
        return f"it passed its wall clock of {session.sandbox.limits.wall_s:g} s"
    return "it exited" if session.ended else "it did not reply in time"


class _Opaque:
    """What a handle in a call's result becomes here: equal to no expected value."""

    def __init__(self, _tag):
        pass


def _token_driver(token: str, body: str) -> str:
    """The opt-in in-process path: runs ``body`` and prints ``token`` after it."""
    return (f"import os, sys\nTOKEN = {token!r}\nos.unlink(__file__)\n{body}\n"
            "sys.stdout.write('\\n' + TOKEN + ' all passed\\n')\n")


class CodeChecker:
    """Runs an answer's program against an example's tests; ``check`` returns a Verdict."""

    def __init__(self, limits: Limits = Limits(), partial: bool = False, in_process: bool = False,
                 **isolation):
        """``isolation``: ``Sandbox``'s ``allow_missing`` and ``packages``, the answer's and the
        judge's alike."""
        self.sandbox = Sandbox(limits, **isolation)
        # the judge outlives the answer by 2 s: an answer that runs out its clock still gets
        # a verdict on the tests before (its own limits otherwise: test files are data too).
        # The judge sleeps while the answer works, and a sleep counts on its clock: it is given
        # the answer's longest wall clock (a busy node's) so that load changes no verdict
        self.judge = Sandbox(replace(limits, wall_s=limits.wall_max_s + 2,
                                     cpu_s=limits.cpu_s + 2), **isolation)
        self.partial, self.in_process = partial, in_process

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
            requests = [{"op": "call", "target": {"name": tests["fn_name"]},
                         "args": [plain.encode(a) for a in _as_args(args)]}
                        for args in tests["inputs"]]
            return self._calls(program, requests, tests["outputs"], as_json=True)
        if kind == "assert":
            literal = [literal_assert(a) for a in tests["asserts"]]
            if all(literal):
                return self._calls(program, [{"op": "eval", "expr": c} for c, _ in literal],
                                   [e for _, e in literal])
        if self.in_process and needs_candidate_process(tests):
            return self._in_process(program, tests)
        return self._judged(program, tests)

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

    def _calls(self, program: str, requests: list[dict], expected: list,
               as_json: bool = False) -> Verdict:
        """Each request's result from the candidate's sandbox, compared here. ``as_json``: the
        expected values came from JSON (tuples are lists there, and APPS and Eurus wrap a
        return value in a one-element list), so results compare as JSON."""
        session = self.sandbox.start(_candidate_files(program))
        if not isinstance(session, Session):
            return Verdict(0, len(requests), "infra", session.reason)
        passed, detail = 0, ""
        ready = _message(session.receive())
        for i, (request, want) in enumerate(zip(requests, expected)):
            if ready is None or ready.get("ready") is None:
                detail = detail or ("it raised when loaded: " + str(ready.get("raise"))[:200]
                                    if ready else f"its process ended ({_why_gone(session)})")
                break
            reply = _message(session.receive()) if session.send(plain.dumps(request)) else None
            if reply is None:
                detail = detail or f"test {i}: its process ended ({_why_gone(session)})"
                break
            try:
                got = plain.decode(reply.get("value"), _Opaque) if "raise" not in reply else \
                    _Opaque(None)
            except Exception:  # noqa: BLE001 - unreadable data matches nothing
                got = _Opaque(None)
            if as_json:
                got = _jsonish(got)
                right = got == want or (isinstance(want, list) and len(want) == 1 and
                                        got == want[0])
            else:
                right = got == want  # as the assert would, between the judge's own values
            passed += bool(right)
            if not right and not detail:
                detail = f"test {i}: " + (f"raised {reply['raise'].get('type')}" if
                                          "raise" in reply else "a wrong result")
        outcome = session.close()
        if outcome.status == "infra":
            return Verdict(0, len(requests), "infra", outcome.reason)
        return Verdict(passed, len(requests), detail=detail)

    def _judged(self, program: str, tests: dict) -> Verdict:
        """The tests run in the judge's sandbox against the answer in its own, this process
        relaying the channel between the two."""
        total = len(tests["asserts"]) if tests["kind"] == "assert" else 1
        files = {"main.py": _source("judge.py"), "plain.py": _source("plain.py"),
                 "pytest.py": _source("judge_pytest.py"), "tests.json": json.dumps(tests)}
        if tests["kind"] == "pytest":
            files["test_solution.py"] = tests["test"]
        candidate = self.sandbox.start(_candidate_files(program))
        if not isinstance(candidate, Session):
            return Verdict(0, total, "infra", candidate.reason)
        judge = self.judge.start(files)
        if not isinstance(judge, Session):
            candidate.close()
            return Verdict(0, total, "infra", judge.reason)
        try:
            verdict = self._relay(candidate, judge)
        finally:
            candidate_outcome, judge_outcome = candidate.close(), judge.close()
        for outcome in (candidate_outcome, judge_outcome):
            if outcome.status == "infra":
                return Verdict(0, total, "infra", outcome.reason)
        if verdict is None:
            return Verdict(0, total, detail="the judge gave no verdict "
                           f"({judge_outcome.status}: {judge_outcome.stderr[-200:]})")
        return verdict

    def _relay(self, candidate: Session, judge: Session) -> Verdict | None:
        """Lines between the judge and the candidate until the judge's verdict: each of the
        judge's requests goes to the candidate, each reply back; a candidate that ended or
        replied nonsense is a ``gone`` reply, which fails the tests that follow."""
        def from_candidate() -> str:
            line = candidate.receive()
            return line if _message(line) is not None else \
                plain.dumps({"gone": _why_gone(candidate)})

        if not judge.send(from_candidate()):
            return None
        while True:
            message = _message(judge.receive())
            if message is None:
                return None
            if "verdict" in message:
                v = message["verdict"]
                passed, total = v.get("passed"), v.get("total")
                if type(passed) is not int or type(total) is not int or not 0 <= passed <= total:
                    return None
                return Verdict(passed, total, detail=str(v.get("detail", ""))[:300])
            message.pop("to", None)
            sent = candidate.send(plain.dumps(message))
            if not judge.send(from_candidate() if sent else
                              plain.dumps({"gone": _why_gone(candidate)})):
                return None

    def _in_process(self, program: str, tests: dict) -> Verdict:
        """The opt-in path for tests that patch the candidate's objects: tests and answer in
        one sandboxed process, passing when a per-run token is printed after the tests."""
        token = secrets.token_hex(16)
        load = ("namespace = {'__name__': '__main__'}\n"
                "exec(compile(open('solution.py').read(), 'solution.py', 'exec'), namespace)\n")
        files = {"solution.py": program}
        if tests["kind"] == "assert":
            body = load + "".join(f"exec({a!r}, namespace)\n" for a in tests["asserts"])
        elif tests["kind"] == "check":
            body = load + (f"exec({tests['test_code']!r}, namespace)\n"
                           f"namespace['check'](namespace[{tests['entry_point']!r}])\n")
        else:
            files.update({"test_solution.py": tests["test"],
                          "pytest.py": _source("judge_pytest.py")})
            body = ("sys.path.insert(0, '.')\nimport pytest, test_solution\n"
                    "failed = [r for r in pytest.run_module(test_solution, repr) if r]\n"
                    "assert not failed, failed[0]\n")
        outcome = self.sandbox.run({"main.py": _token_driver(token, body), **files})
        total = len(tests["asserts"]) if tests["kind"] == "assert" else 1
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
