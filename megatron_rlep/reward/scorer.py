"""Rewards for a batch of answers, scored once and the same on every rank by construction.

``Scorer.score(items, collective=True)`` (the trainer: every rank passes the step's same
answers) gives rank r the answers r, r + world, ...; it scores them in its own worker processes
(``verifier.workers`` of them, ``worker.py``) and the results are gathered to every rank, so a
reward that is slow, random or fails on one rank cannot give two ranks different rewards (and
so different advantages, groups kept by dynamic sampling, or collectives). Without
``collective`` (the evaluation and pool tools, whose ranks score their own shares) it scores
here alone.

The DAPO rule, a pure function of the answer's last 300 characters, is scored in this process;
every other rule in the workers. Every answer there has ``verifier.timeout_s`` from when a ready
worker takes it; a worker that passes it is killed and replaced. An answer whose scoring raised or timed out scores 0 and is counted
(``reward/errors``, ``reward/timeouts``); one the sandbox could not run is an infrastructure
failure (``reward/infra``): no signal, left out of its group. ``check`` stops a run in one
sentence when more than ``verifier.max_failures`` of a batch failed, naming the rule and the
first error: nothing trains on zeroed rewards unnoticed. The shaped reward adds DAPO's
overlong penalty to the rule's score by the answer's token length.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, is_dataclass

from megatron_rlep.errors import ConfigError, RunError
from megatron_rlep.reward.math_rule import overlong_penalty
from megatron_rlep.reward.rules import Rules
from megatron_rlep.reward.sources import source_kind

START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Item:
    data_source: str
    response: str
    ground_truth: str
    extra_info: dict | None = None
    length: int | None = None  # response tokens, for the overlong penalty


@dataclass(frozen=True)
class Score:
    correct: bool  # verified: the rule's verdict, or the function's acc (else score > 0)
    pred: str | None
    reward: float  # the rule's score, shaped by the overlong penalty
    status: str = "ok"  # ok | error | timeout | infra
    error: str = ""


def settings(mode: str = "dapo", **keys) -> dict:
    """A ``verifier`` setting as a dict (the config's defaults, ``mode`` and ``keys``), for the
    tools that take a mode on their command line."""
    from megatron_rlep.config import VerifierConfig

    return asdict(VerifierConfig(mode=mode, **keys))


class _Worker:
    """One worker process and the item it is scoring (``busy``: (index, deadline))."""

    def __init__(self, settings_json: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "megatron_rlep.reward.worker",
                                      settings_json], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.busy = None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if line != "ready":
            self.kill()

            failed = json.loads(line).get("fail") if line.startswith("{") else None
            raise ConfigError(failed or f"the reward worker did not start within "
                                        f"{START_TIMEOUT_S:.0f} s; is the environment complete?")

    def send(self, index: int, item: Item, timeout_s: float) -> None:
        self.proc.stdin.write((json.dumps(asdict(item)) + "\n").encode())
        self.proc.stdin.flush()
        self.busy = (index, time.monotonic() + timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


class Scorer:
    def __init__(self, settings, max_length: int | None = None, overlong_buffer: int = 0,
                 overlong_factor: float = 1.0, sandbox=None):
        """``settings``: the ``verifier`` config (a dataclass or its dict); ``sandbox``: the
        ``sandbox`` config (None: its defaults). Starts one worker at once, so a reward file
        that does not import stops here, in one sentence."""
        from megatron_rlep.reward.sandbox import isolation

        self.settings = asdict(settings) if is_dataclass(settings) else dict(settings)
        self.settings["sandbox"] = isolation(sandbox)
        self._json = json.dumps(self.settings)
        self.max_length, self.buffer, self.factor = max_length, overlong_buffer, overlong_factor
        self.workers: list[_Worker | None] = [None] * max(1, self.settings["workers"])
        # the DAPO rule is a pure function of bounded text: scored here, not through a worker
        mode = self.settings["mode"]
        here = mode == "dapo" or mode == "custom" and self.settings["math_rule"] == "dapo"
        self._here = Rules({**self.settings, "mode": "dapo"}) if here else None
        if self.settings["mode"] != "dapo":
            self.workers[0] = _Worker(self._json)  # a reward file that does not load: now
        self.counts: Counter = Counter()  # of the batches since ``take_counts``
        self.first_error = ""

    # ------------------------------------------------------------------ what it is

    def describe(self) -> str:
        """One line: the rule (or the dispatch) and the workers."""
        s = self.settings
        math = f"the {s['math_rule'] if s['mode'] == 'custom' else s['mode']} rule"
        rule = {"dapo": math, "math": math, "code": "the code checker in the sandbox",
                "custom": f"verifier.function={s['function']} (math sources: {math}; code "
                          "sources: the code checker in the sandbox)"}[s["mode"]]
        return (f"rewards: {rule}; {len(self.workers)} scoring worker(s) per rank, "
                f"{s['timeout_s']:g} s an answer")

    def runs_code(self) -> bool:
        """Whether code answers may come to the sandbox."""
        return self.settings["mode"] in ("code", "custom")

    def code_line(self, examples) -> str | None:
        """How many of ``examples`` are code, by test format, and how many of their test files
        patch the answer's objects (``code.census``), where code can be scored."""
        if self.settings["mode"] not in ("code", "custom"):
            return None
        from megatron_rlep.reward.code import census

        line = census(examples)
        if line and self.settings["code"]["in_process_patching"]:
            line = line.split(": they fail")[0] + ": these run in the answer's own process " \
                "(verifier.code.in_process_patching=true), where a pass can be forged"
        return line

    # ------------------------------------------------------------------ scoring

    def score(self, items: list[Item], collective: bool = False) -> list[Score]:
        """A Score per item, in order; with ``collective`` every rank passes the same items
        and gets the same Scores, each rank scoring a share."""
        import torch.distributed as dist

        if collective and dist.is_initialized() and dist.get_world_size() > 1:
            rank, world = dist.get_rank(), dist.get_world_size()
            mine = list(range(rank, len(items), world))
            shares = [None] * world
            dist.all_gather_object(shares, (mine, self._local([items[i] for i in mine])))
            raw = [None] * len(items)
            for indices, results in shares:
                for i, result in zip(indices, results):
                    raw[i] = result
        else:
            raw = self._local(items)
        scores = [self._shape(item, result) for item, result in zip(items, raw)]
        for score in scores:
            self.counts[score.status] += 1
            if score.status in ("error", "timeout", "infra") and not self.first_error:
                self.first_error = score.error
        return scores

    def _shape(self, item: Item, result: dict) -> Score:
        status = result.get("status", "error" if "error" in result else "ok")
        if status != "ok":
            return Score(False, None, 0.0, status, result.get("error", ""))
        reward = result["score"]
        if self.max_length is not None and item.length is not None:
            reward += overlong_penalty(item.length, self.max_length, self.buffer, self.factor)
        return Score(bool(result["correct"]), result["pred"], reward)

    def _local(self, items: list[Item]) -> list[dict]:
        """Every item scored: by the DAPO rule here where that is its rule, else through the
        worker pool, each within its deadline."""
        results: list[dict | None] = [None] * len(items)
        todo = []
        for i, item in enumerate(items):
            if self._here is not None and self._routes_here(item):
                results[i] = self._here.score(asdict(item))
            else:
                todo.append(i)
        todo.reverse()
        timeout = self.settings["timeout_s"]
        while todo or any(w is not None and w.busy for w in self.workers):
            for n, worker in enumerate(self.workers):
                if todo and (worker is None or worker.busy is None):
                    if worker is None:
                        worker = self.workers[n] = _Worker(self._json)
                    index = todo.pop()
                    worker.send(index, items[index], timeout)
            busy = [w for w in self.workers if w is not None and w.busy]
            wait = max(0.0, min(w.busy[1] for w in busy) - time.monotonic())
            ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], wait)
            for n, worker in enumerate(self.workers):
                if worker is None or not worker.busy:
                    continue
                index, deadline = worker.busy
                if worker.proc.stdout in ready:
                    line = worker.proc.stdout.readline()
                    if line:
                        results[index] = json.loads(line)
                        worker.busy = None
                        continue
                    results[index] = {"error": "the scoring worker died (exit status "
                                               f"{worker.proc.wait()})", "status": "error"}
                elif time.monotonic() >= deadline:
                    results[index] = {"error": f"no score within verifier.timeout_s={timeout:g}",
                                      "status": "timeout"}
                else:
                    continue
                worker.kill()
                self.workers[n] = None
        return results

    def _routes_here(self, item: Item) -> bool:
        mode = self.settings["mode"]
        return mode == "dapo" or (mode == "custom" and source_kind(item.data_source) == "math")

    # ------------------------------------------------------------------ accounting

    def take_counts(self) -> dict:
        """``reward/errors``, ``reward/timeouts`` and ``reward/infra`` since the last call."""
        out = {f"reward/{k}": self.counts[s] for k, s in
               (("errors", "error"), ("timeouts", "timeout"), ("infra", "infra"))}
        self.counts = Counter()
        return out

    def check(self, scores: list[Score], what: str) -> None:
        """Stop (RunError, one sentence) when more than ``verifier.max_failures`` of ``scores``
        raised, timed out or could not be run."""
        limit = self.settings["max_failures"]
        failed = [s for s in scores if s.status in ("error", "timeout")]
        infra = [s for s in scores if s.status == "infra"]
        rule = self.settings["function"] if self.settings["mode"] == "custom" else \
            f"verifier.mode={self.settings['mode']}"
        if failed and len(failed) > limit * len(scores):
            kinds = Counter(s.status for s in failed)
            raise RunError(f"{len(failed)} of {len(scores)} rewards in {what} failed "
                           f"({kinds['error']} raised, {kinds['timeout']} passed "
                           f"verifier.timeout_s={self.settings['timeout_s']:g}) with {rule}; "
                           f"the first: {failed[0].error}: fix the reward, or raise "
                           "verifier.timeout_s or verifier.max_failures")
        if infra and len(infra) > limit * len(scores):
            raise RunError(f"the code sandbox could not run {len(infra)} of {len(scores)} "
                           f"answers in {what} ({infra[0].error}): run on a node whose kernel "
                           "allows every layer, or name the one it refuses in "
                           "sandbox.allow_missing (docs/sandbox_threat_model.md)")

    def close(self) -> None:
        for worker in self.workers:
            if worker is not None:
                worker.kill()
        self.workers = [None] * len(self.workers)
