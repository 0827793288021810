"""Mathematical equivalence of two final answers, decided by math-verify in a child process.

sympy can run for minutes or exhaust memory on answers such as ``9^{9^{9}}`` or ``10^8!``, and
a thread cannot be interrupted, so math-verify never runs in the caller's process: requests
go to a child process over pipes and a reply that misses its deadline kills the child (a new
one starts on the next request). The deadline is the child's CPU time on the request (where
/proc gives it; wall-clock time elsewhere), with ``WALL_FACTOR`` times as much wall-clock time
as a last bound: on a busy machine a slow reply is the same verdict as on a quiet one. The
child warms sympy's algebra before it says it is ready. Nothing here uses signals, so it is safe
in any thread and in worker processes. Answers that are plainly explosive (huge exponents or
factorials, towers of powers, deep nesting, long strings) are judged not equivalent without
asking.

Run as ``python -m megatron_rlep.reward.equivalence`` it is the child: one JSON request per line in,
one JSON reply per line out.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

MAX_ANSWER_CHARS = 256
WALL_FACTOR = 10  # a check's wall-clock bound, in its CPU deadlines
POLL_S = 0.02
MAX_BRACE_DEPTH = 10
_EXPLOSIVE = re.compile(
    r"\^\s*\{?\s*[(\[]?\s*-?\d{4,}"  # exponent of 1000 or more
    r"|\d{4,}\s*!"  # factorial of 1000 or more
    r"|\d{200,}"  # absurdly long literal
)


def stacked_power(answer: str) -> bool:
    """A power whose exponent holds a power (``9^{9^{9}}``, ``2^3^4``): sympy may evaluate a
    tower. Powers side by side (``x^2+y^2``) are not stacked."""
    for i, ch in enumerate(answer):
        if ch != "^":
            continue
        rest = answer[i + 1:].lstrip()
        if rest.startswith("{"):
            depth = 0
            for end, c in enumerate(rest):
                depth += {"{": 1, "}": -1}.get(c, 0)
                if depth == 0:
                    break
            exponent, after = rest[:end + 1], rest[end + 1:]
        else:
            token = re.match(r"\\[a-zA-Z]+|[\w.]*", rest).group()
            exponent, after = token, rest[len(token):]
        if "^" in exponent or after.lstrip().startswith("^"):
            return True
    return False


def worth_asking(answer: str) -> bool:
    """False for answers that could make sympy run away; those are judged not equivalent."""
    if len(answer) > MAX_ANSWER_CHARS or "\x00" in answer or _EXPLOSIVE.search(answer) or \
            stacked_power(answer):
        return False
    depth = 0
    for ch in answer:
        depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(ch, 0)
        if depth > MAX_BRACE_DEPTH:
            return False
    return True


class EquivalenceChecker:
    """Asks a math-verify child process whether ``answer`` equals ``gold``, within a deadline."""

    def __init__(self, timeout_s: float = 0.9, start_timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        self.timeouts = 0
        with self._lock:
            self._start()

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_rlep.reward.equivalence"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        self._owner = os.getpid()
        if self._read_line(self.start_timeout_s) != "ready":
            self._kill()
            raise RuntimeError("the math-verify worker did not start; is math-verify installed?")

    def _read_line(self, timeout_s: float) -> str | None:
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        if not ready:
            return None
        return self._proc.stdout.readline().decode().strip() or None

    def _kill(self) -> None:
        if self._proc is not None and self._owner == os.getpid():
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def equivalent(self, answer: str, gold: str) -> bool:
        if not (worth_asking(answer) and worth_asking(gold)):
            return False
        with self._lock:
            if self._proc is None or self._owner != os.getpid() or self._proc.poll() is not None:
                self._start()  # first use in a forked child, or after a kill
            # the deadline counts from a ready worker: a restart (about 0.6 s) is not the answer's
            reply = self._ask(answer, gold)
            if reply is None:
                self.timeouts += 1
                self._kill()
                return False
            return reply == "true"

    def _ask(self, answer: str, gold: str) -> str | None:
        """The child's reply, or None once it has spent ``timeout_s`` of CPU time on it (or
        ``WALL_FACTOR`` times that of wall-clock time)."""
        start = _cpu_seconds(self._proc.pid)
        wall = time.monotonic() + (WALL_FACTOR if start is not None else 1) * self.timeout_s
        self._proc.stdin.write((json.dumps([answer, gold]) + "\n").encode())
        self._proc.stdin.flush()
        while True:
            left = wall - time.monotonic()
            reply = self._read_line(min(left, POLL_S))
            if reply is not None:
                return reply
            if left <= 0:
                return None
            if start is not None:
                spent = _cpu_seconds(self._proc.pid)
                if spent is None or spent - start > self.timeout_s:
                    return None

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _cpu_seconds(pid: int) -> float | None:
    """The process's user and system CPU seconds so far (Linux's /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _serve() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from math_verify import parse, verify

    def check(answer: str, gold: str) -> bool:
        target = parse(f"${answer}$", parsing_timeout=None)
        reference = parse(f"${gold}$", parsing_timeout=None)
        return bool(target and reference and verify(reference, target, timeout_seconds=None))

    check("x^2+2x+1", "(x+1)^2")  # sympy's first algebra loads and caches much (0.5 s of CPU)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            answer, gold = json.loads(line)
            result = check(answer, gold)
        except Exception:
            result = False
        out.write("true\n" if result else "false\n")
        out.flush()


if __name__ == "__main__":
    _serve()
