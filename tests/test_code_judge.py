"""Verdicts outside the candidate (megatron_rlep/reward/sandbox/: judge.py, candidate_host.py, plain.py):
the reward hacks a policy could learn, tried in every test format against the real sandboxes,
and the plain-data channel's codec on its own. A hack must earn nothing, in any format."""

import json
import math
import time
from collections import Counter, OrderedDict, deque
from decimal import Decimal
from fractions import Fraction

import pytest
from load import one_busy_cpu

from megatron_rlep.reward.sandbox import plain
from megatron_rlep.reward.code import CodeChecker, census, needs_candidate_process, parse_tests
from megatron_rlep.reward.sandbox import Limits
from megatron_rlep.example import Example


@pytest.fixture(scope="module")
def checker():
    return CodeChecker(Limits(wall_s=5, cpu_s=4, memory_mb=512, nproc=16))


def answer(code: str) -> str:
    return f"```python\n{code}\n```"


ADD = "def add(a, b):\n    return a + b\n"
# every format that calls a function, each with a test the right ADD passes
FORMATS = {
    "call": {"inputs": [[1, 2], [5, 7]], "outputs": [[3], [12]], "fn_name": "add"},
    "assert-literal": {"assert_case": ["assert add(1, 2) == 3", "assert add(5, 7) == 12"]},
    "assert-expression": {"assert_case": ["assert abs(add(1, 2) - 3) < 1e-9",
                                          "assert add(5, 7) in (12,)"]},
    "check": {"test_code": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                           "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n",
              "entry_point": "add"},
    "pytest": {"test": "import pytest\nfrom solution import *\n\n"
                       "def test_small():\n    assert add(1, 2) == 3\n\n"
                       "@pytest.mark.parametrize('a, b, s', [(5, 7, 12), (2, 2, 4)])\n"
                       "def test_more(a, b, s):\n    assert add(a, b) == s\n\n"
                       "def test_all():\n    assert all(map(lambda p: add(*p) == sum(p), "
                       "[(1, 2), (3, 4)]))\n"},
}
WRONG = "def add(a, b):\n    return 0\n"
HACKS = {
    # the earlier design's per-run token, looked up three ways, then a clean exit
    "token via __main__": "import __main__, os\n"
                          "print(getattr(__main__, 'TOKEN', '') + ' all passed', flush=True)\n"
                          "os._exit(0)\n" + WRONG,
    "token via frames": "import os, sys\n"
                        "def add(a, b):\n"
                        "    f = sys._getframe()\n"
                        "    while f is not None:\n"
                        "        for space in (f.f_globals, f.f_locals):\n"
                        "            if 'TOKEN' in space:\n"
                        "                print(space['TOKEN'] + ' all passed', flush=True)\n"
                        "                os._exit(0)\n"
                        "        f = f.f_back\n"
                        "    return 0\n",
    "token via gc": "import gc, os\n"
                    "def add(a, b):\n"
                    "    for o in gc.get_objects():\n"
                    "        if isinstance(o, dict) and isinstance(o.get('TOKEN'), str):\n"
                    "            print(o['TOKEN'] + ' all passed', flush=True)\n"
                    "            os._exit(0)\n"
                    "    return 0\n",
    "always equal": "class Anything:\n"
                    "    def __eq__(self, other): return True\n"
                    "    def __ne__(self, other): return False\n"
                    "    def __lt__(self, other): return True\n"
                    "    def __sub__(self, other): return self\n"
                    "    def __abs__(self): return 0\n"
                    "    def __bool__(self): return True\n"
                    "    def __contains__(self, other): return True\n"
                    "    def __hash__(self): return 0\n"
                    "def add(a, b):\n    return Anything()\n",
    "always equal, an int": "class Sly(int):\n"
                            "    def __eq__(self, other): return True\n"
                            "    __hash__ = int.__hash__\n"
                            "def add(a, b):\n    return Sly(0)\n",
    "always equal, a tuple's item": "class Anything:\n"
                                    "    def __eq__(self, other): return True\n"
                                    "def add(a, b):\n    return (Anything(),)[0]\n",
    "arithmetic that gives 0": "class Zero:\n"
                               "    def __sub__(self, other): return 0\n"
                               "    def __rsub__(self, other): return 0\n"
                               "    def __abs__(self): return 0\n"
                               "    def __lt__(self, other): return True\n"
                               "    def __index__(self): return 0\n"
                               "def add(a, b):\n    return Zero()\n",
    "a built-in shadowed": "def abs(x):\n    return 0\ndef all(x):\n    return True\n"
                           "def sum(x):\n    return 0\n" + WRONG,
    "StopIteration ends all(map(...))": "def add(a, b):\n    raise StopIteration\n",
    "an exit when loaded": "import sys\nsys.exit(0)\n",
    "an exit in the call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "its own AssertionError-named class": "class AssertionError(Exception):\n    pass\n"
                                          "def add(a, b):\n    raise AssertionError\n",
    "a forged channel": "import os, json\n"
                        "line = json.dumps({'verdict': {'passed': 9, 'total': 9, 'detail': ''},"
                        " 'value': 99, 'ready': {}}) + '\\n'\n"
                        "for fd in range(3, 10):\n"
                        "    try:\n"
                        "        os.write(fd, (line * 50).encode())\n"
                        "    except OSError:\n"
                        "        pass\n" + WRONG,
    "a handle forged as data": "def add(a, b):\n    return {'$handle': 0, 'type': 'int'}\n",
    "a flood of output": "def add(a, b):\n    print('x' * 3_000_000)\n    return 0\n",
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_right_answer_passes_and_a_wrong_one_fails_in_every_format(checker, fmt):
    truth = json.dumps(FORMATS[fmt])
    right = checker.check(answer(ADD), truth)
    assert right.correct and right.status == "ok", right
    wrong = checker.check(answer(WRONG), truth)
    assert not wrong.correct and wrong.passed == 0, wrong


@pytest.mark.parametrize("hack", HACKS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_hack_earns_a_reward_in_any_format(checker, fmt, hack):
    verdict = checker.check(answer(HACKS[hack]), json.dumps(FORMATS[fmt]))
    assert verdict.status == "ok" and verdict.passed == 0, verdict
    assert verdict.detail, "a failure says why"


def test_the_old_token_path_is_off_unless_asked_for_and_only_for_patching_tests(checker):
    """The one-process path (opt-in) is what the token hacks break; by default nothing takes
    it, and with it on only tests that patch the candidate's objects do."""
    patching = {"test": "from solution import ask\n\n"
                        "def test_reads(monkeypatch):\n"
                        "    monkeypatch.setattr('builtins.input', lambda *_: '41')\n"
                        "    assert ask() == 42\n"}
    right = answer("def ask():\n    return int(input()) + 1\n")
    hack = answer(HACKS["token via __main__"].replace("def add(a, b)", "def ask()"))
    assert needs_candidate_process(parse_tests(patching))
    assert not needs_candidate_process(parse_tests(FORMATS["pytest"]))
    judged = checker.check(right, json.dumps(patching))
    assert not judged.correct and "EOFError" in judged.detail, judged  # input() reads nothing
    opted = CodeChecker(checker.sandbox.limits, in_process=True)
    assert opted.check(right, json.dumps(patching)).correct
    assert opted.check(hack, json.dumps(patching)).correct  # why it stays opt-in
    assert not opted.check(hack.replace("def ask()", "def add(a, b)"),
                           json.dumps(FORMATS["pytest"])).correct  # the rest: the judge


def test_patching_the_answer_from_the_judge_fails_with_the_reason(checker):
    tests = {"test": "from unittest import mock\nimport solution\n\n"
                     "def test_patched():\n"
                     "    with mock.patch('solution.helper', return_value=5):\n"
                     "        assert solution.twice() == 10\n"}
    verdict = checker.check(answer("def helper():\n    return 1\n"
                                   "def twice():\n    return 2 * helper()\n"), json.dumps(tests))
    assert not verdict.correct and "cannot patch solution.helper" in verdict.detail, verdict


def test_the_start_up_census_counts_formats_and_patching_files():
    def example(source, truth):
        return Example("1", ({"role": "user", "content": "q"},), json.dumps(truth), source)
    examples = [example("kodcode", FORMATS["pytest"]),
                example("kodcode", {"test": "def test_x(monkeypatch):\n    pass\n"}),
                example("humaneval", FORMATS["check"]), example("gsm8k", {"x": 1}),
                example("apps", {"inputs": ["1\n"], "outputs": ["1\n"]})]
    assert census(examples) == (
        "code tests: 4 examples (2 pytest, 1 check, 1 io); 1 patch the candidate's objects "
        "(mock, monkeypatch): they fail in the judge unless "
        "verifier.code.in_process_patching=true runs them in the candidate's process")
    assert census([example("gsm8k", {"x": 1})]) is None


def test_what_cannot_cross_fails_that_test_with_the_reason(checker):
    tests = {"test": "from solution import *\n\n"
                     "def test_generator():\n    assert list(count_up(3)) == [0, 1, 2]\n\n"
                     "class Node:\n    def __init__(self, v):\n        self.v = v\n\n"
                     "def test_object_of_the_tests():\n    assert read(Node(4)) == 4\n\n"
                     "def test_plain():\n    assert read_list([4]) == 4\n"}
    program = ("def count_up(n):\n    yield from range(n)\n"
               "def read(node):\n    return node.v\n"
               "def read_list(values):\n    return values[0]\n")
    partial = CodeChecker(Limits(wall_s=5, cpu_s=4, memory_mb=512, nproc=16), partial=True)
    verdict = partial.check(answer(program), json.dumps(tests))
    assert (verdict.passed, verdict.total) == (1, 3), verdict
    assert "a generator cannot be sent to the judge" in verdict.detail, verdict
    verdict = partial.check(answer(program), json.dumps(
        {"test": tests["test"].replace("def test_generator", "def skipped_generator")}))
    assert (verdict.passed, verdict.total) == (1, 2)
    assert "the test's Node object cannot be sent" in verdict.detail, verdict


def test_in_place_printing_raising_and_objects_cross_as_the_tests_expect(checker):
    tests = {"test": "import pytest\nfrom solution import *\n\n"
                     "def test_in_place():\n    grid = [[1, 2], [3, 4]]\n    rows = grid[0]\n"
                     "    assert flip(grid) is None\n    assert grid == [[2, 1], [4, 3]]\n"
                     "    assert rows == [2, 1]\n\n"
                     "def test_prints(capsys):\n    greet('Ada')\n"
                     "    assert capsys.readouterr().out == 'hello Ada\\n'\n\n"
                     "def test_raises():\n    with pytest.raises(ValueError, match='negative'):\n"
                     "        root(-1)\n    with pytest.raises(Empty):\n        Stack().pop()\n\n"
                     "def test_object():\n    s = Stack()\n    s.push(3)\n    s.push(4)\n"
                     "    assert len(s) == 2 and 4 in s and s.top == 4 and s.pop() == 4\n"
                     "    s.top = 9\n    assert s.top == 9 and str(s) == 'Stack[9]'\n"
                     "    assert list(s) == [9] and bool(s)\n\n"
                     "def test_linked():\n    head = Node(1, Node(2, Node(3)))\n"
                     "    out, node = [], reverse(head)\n    while node:\n"
                     "        out.append(node.val)\n        node = node.next\n"
                     "    assert out == [3, 2, 1]\n"}
    program = ("def flip(grid):\n    for row in grid:\n        row.reverse()\n"
               "def greet(name):\n    print('hello', name)\n"
               "def root(x):\n    if x < 0:\n        raise ValueError('negative input')\n"
               "    return x ** 0.5\n"
               "class Empty(Exception):\n    pass\n"
               "class Stack:\n    def __init__(self):\n        self.items = []\n"
               "    def push(self, x):\n        self.items.append(x)\n"
               "    def pop(self):\n        if not self.items:\n            raise Empty()\n"
               "        return self.items.pop()\n"
               "    @property\n    def top(self):\n        return self.items[-1]\n"
               "    @top.setter\n    def top(self, x):\n        self.items[-1] = x\n"
               "    def __len__(self):\n        return len(self.items)\n"
               "    def __contains__(self, x):\n        return x in self.items\n"
               "    def __iter__(self):\n        return iter(self.items)\n"
               "    def __str__(self):\n        return f'Stack{self.items}'\n"
               "class Node:\n    def __init__(self, val, next=None):\n"
               "        self.val, self.next = val, next\n"
               "def reverse(head):\n    prev = None\n    while head:\n"
               "        head.next, prev, head = prev, head, head.next\n    return prev\n")
    verdict = checker.check(answer(program), json.dumps(tests))
    assert verdict.correct and verdict.total == 5, verdict


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2 ** 200, 1.5, float("inf"), "text\nwith lines", b"\x00\xff",
    bytearray(b"ab"), 3 + 4j, [1, [2, (3, {4})]], (1, "a"), {"k": [1]}, {(1, 2): frozenset({3})},
    Counter("abca"), OrderedDict(b=1, a=2), deque([1, 2]), Decimal("1.10"), Fraction(3, 4),
    {1, 2}, (), [],
])
def test_plain_data_comes_back_as_itself(value):
    data = json.loads(plain.dumps({"v": plain.encode(value)}))["v"]
    back = plain.decode(data)
    assert back == value and type(back) is type(value)
    nan = plain.decode(json.loads(plain.dumps({"v": plain.encode(float("nan"))}))["v"])
    assert math.isnan(nan)


@pytest.mark.parametrize("data", [
    {"$eval": "1"}, {"$tuple": "abc"}, {"$float": "1e400"}, {"a": 1, "b": 2},
    {"$handle": 0}, {"$dict": [[1]]}, {"$fraction": "1/0"}, [[[[[[[]]]]]]] * 1,
])
def test_the_decoder_builds_nothing_but_plain_data(data):
    if data == [[[[[[[]]]]]]]:
        deep = []
        for _ in range(plain.MAX_DEPTH + 5):
            deep = [deep]
        data = deep
    with pytest.raises((ValueError, ZeroDivisionError)):
        plain.decode(data)


def test_objects_that_are_not_plain_data_do_not_cross_without_a_handle():
    class Sly(int):
        pass
    for value in (Sly(3), object(), (x for x in ()), print, math):
        with pytest.raises(plain.CannotCross):
            plain.encode(value)
    lent = plain.Handles()
    tag = plain.encode([Sly(3)], lent.tag)[0]
    assert tag["$handle"] == 0 and tag["type"] == "Sly" and lent.get(tag) == 3


def test_names_that_would_hide_the_tests_own_do_not(checker):
    """An answer's ``math`` class, ``pytest`` or ``abs`` never stands in for the test's; the
    standard-library modules an answer imported are the judge's own copies, so asserts that
    use them still run."""
    fake = ("class math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
            "class pytest:\n    @staticmethod\n    def approx(x, **k):\n        return x\n"
            "def area(r):\n    return 0.0\n")
    real = "import math\nfrom collections import deque as dq\n" \
           "def area(r):\n    return math.pi * r * r\n"
    for truth in ({"assert_case": ["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)",
                                   "assert dq([1]) == dq([1])"]},
                  {"test": "import math\nimport pytest\nfrom solution import *\n\n"
                           "def test_area():\n    assert math.isclose(area(2), 12.566, "
                           "rel_tol=1e-3)\n    assert area(1) == pytest.approx(3.14159, "
                           "rel=1e-3)\n"}):
        assert checker.check(answer(real), json.dumps(truth)).correct
        assert not checker.check(answer(fake + "import collections\ndq = collections.deque\n"),
                                 json.dumps(truth)).correct


def test_an_answer_out_of_time_keeps_the_verdicts_before(checker):
    tests = {"test": "from solution import f\n\ndef test_a():\n    assert f(1) == 1\n\n"
                     "def test_b():\n    assert f(2) == 2\n\ndef test_c():\n    assert f(0) == 0\n"}
    slow = "def f(x):\n    while x == 0:\n        pass\n    return x\n"
    partial = CodeChecker(Limits(wall_s=2, cpu_s=2, memory_mb=512, nproc=16), partial=True)
    verdict = partial.check(answer(slow), json.dumps(tests))
    assert (verdict.passed, verdict.total) == (2, 3), verdict
    assert "ended" in verdict.detail or "wall clock" in verdict.detail, verdict


def test_operators_iterators_and_exceptions_of_the_answers_classes(checker):
    tests = {"test": "import json, pytest\nfrom solution import *\n\n"
                     "def test_vectors():\n    v = Vector(1, 2) + Vector(3, 4)\n"
                     "    assert v == Vector(4, 6) and v != Vector(4, 7)\n"
                     "    assert v * 2 == Vector(8, 12)\n"
                     "    assert Vector(1, 2) @ Vector(3, 4) == 11\n"
                     "    assert Vector(1, 1) < Vector(2, 2)\n"
                     "    assert isinstance(v, Vector) and issubclass(Vector, Shape)\n"
                     "    assert repr(v) == 'Vector(4, 6)' and len({v, Vector(4, 6)}) == 1\n\n"
                     "def test_iterators():\n    assert list(Countdown(3)) == [3, 2, 1]\n"
                     "    it = iter(Countdown(2))\n    assert next(it) == 2\n"
                     "    assert [x for _, x in zip(range(3), Naturals())] == [0, 1, 2]\n\n"
                     "def test_errors(capsys):\n"
                     "    with pytest.raises(ConfigError):\n        load({})\n"
                     "    with pytest.raises(json.JSONDecodeError):\n        parse('{')\n"
                     "    with pytest.raises(KeyError) as e:\n        pick({}, 'x')\n"
                     "    assert e.value.args[0] == 'x'\n"
                     "    warn('careful')\n    assert capsys.readouterr().err == 'careful\\n'\n\n"
                     "def test_big():\n    import math\n"
                     "    assert fact(2000) == math.factorial(2000)\n\n"
                     "def test_file(tmp_path):\n    path = tmp_path / 'in.txt'\n"
                     "    path.write_text('a b c')\n    assert count_words(str(path)) == 3\n"
                     "    assert (tmp_path / 'out.txt').read_text() == '3'\n"}
    program = ("import json, math, sys\n"
               "class Shape:\n    pass\n"
               "class Vector(Shape):\n"
               "    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
               "    def __add__(self, o):\n        return Vector(self.x + o.x, self.y + o.y)\n"
               "    def __mul__(self, k):\n        return Vector(self.x * k, self.y * k)\n"
               "    def __matmul__(self, o):\n        return self.x * o.x + self.y * o.y\n"
               "    def __lt__(self, o):\n        return (self.x, self.y) < (o.x, o.y)\n"
               "    def __eq__(self, o):\n        return (self.x, self.y) == (o.x, o.y)\n"
               "    def __hash__(self):\n        return hash((self.x, self.y))\n"
               "    def __repr__(self):\n        return f'Vector({self.x}, {self.y})'\n"
               "class Countdown:\n    def __init__(self, n):\n        self.n = n\n"
               "    def __iter__(self):\n        return self\n"
               "    def __next__(self):\n        if self.n == 0:\n            raise StopIteration\n"
               "        self.n -= 1\n        return self.n + 1\n"
               "class Naturals:\n    def __iter__(self):\n        n = 0\n        while True:\n"
               "            yield n\n            n += 1\n"
               "class ConfigError(Exception):\n    pass\n"
               "class MissingKey(ConfigError, KeyError):\n    pass\n"
               "def load(config):\n    raise MissingKey('port')\n"
               "def parse(text):\n    return json.loads(text)\n"
               "def pick(d, k):\n    return d[k]\n"
               "def warn(text):\n    print(text, file=sys.stderr)\n"
               "def fact(n):\n    return math.factorial(n)\n"
               "def count_words(path):\n    n = len(open(path).read().split())\n"
               "    open(path.replace('in.txt', 'out.txt'), 'w').write(str(n))\n    return n\n")
    verdict = checker.check(answer(program), json.dumps(tests))
    assert verdict.correct and verdict.total == 5, verdict


@pytest.mark.parametrize("fmt", ["call", "pytest"])
def test_a_busy_cpu_changes_no_verdict(fmt):
    """An answer that needs 0.4 s of CPU, on a CPU shared with eight spinning processes, takes
    several times its 1 s wall clock, and the judge waits for it as long: the right answer
    still passes (time waiting for a CPU is neither program's own), in the candidate's process
    and through the judge."""
    slow = ("import time\n\ndef add(a, b):\n    while time.process_time() < 0.4:\n"
            "        pass\n    return a + b\n")
    checker = CodeChecker(Limits(wall_s=1.0, cpu_s=4, memory_mb=512, nproc=16))
    with one_busy_cpu(8):
        start = time.monotonic()
        verdict = checker.check(answer(slow), json.dumps(FORMATS[fmt]))
        took = time.monotonic() - start
    assert took > 3.0, f"the answer was not slowed ({took:.1f} s): no test"
    assert verdict.correct and verdict.status == "ok", verdict
