"""The producer of scored groups: the trainer's half that turns prompts into what an update
trains on, readable without the learner (``train.py``) or the checkpoints (``checkpoints.py``).

A step asks ``Producer.groups(step)`` for ``prompts_per_rollout`` groups. Each group is planned
first (``plan``: its M replays from the experience pool, by the replay strategy, and how many
fresh answers the engine samples), then its fresh answers are sampled, and the fresh and the
replayed answers are scored (``complete``). Synchronously (``collect``) the engine samples a
whole batch at once; asynchronously the prompts go into the rollout stream
(``rollout/stream.py``, or ``remote_stream.RemoteStream`` on rollout ranks of their own) and the
groups are taken as they finish, oldest first (``streamed``). Dynamic sampling drops the
uninformative groups either way and draws more prompts.

Prompts come from ``PromptStream``, a seeded order that is a pure function of the position, so a
resumed run goes on with the same prompts; ``state`` and ``restore`` are what a checkpoint keeps
of this half (the stream's position, the replay strategies' pass rates, the prompts in flight).
It never touches the actor: the weights its engines sample with come from the learner
(``Trainer.sync_weights``).
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from collections import Counter
from pathlib import Path


from megatron_rlep.config import Config, RunError
from megatron_rlep.data import Example
from megatron_rlep.metrics import mean_or_none
from megatron_rlep.platform import is_rank0
from megatron_rlep.groups import (Group, Sample, plan_group, replay_sample, rescue_replays,
                                  score_samples, without_unscored)
from megatron_rlep.pool import Answer, ExperiencePool, question_key
from megatron_rlep.replay import PassRates
from megatron_rlep.rollout import answer_seed, encode_prompt, generate_sharded
from megatron_rlep.rollout.base import padded_routes
from megatron_rlep.rollout.stream import Flight


class PromptStream:
    """Training prompts in a seeded order, reshuffled every epoch; ``cursor`` counts prompts
    handed out so far (saved in checkpoints)."""

    def __init__(self, examples: list[Example], seed: int, cursor: int = 0):
        if not examples:
            raise ValueError("the training set is empty; check data.train")
        self.examples, self.seed, self.cursor = examples, seed, cursor

    def take(self, n: int) -> range:
        """The next ``n`` positions, handed out."""
        self.cursor += n
        return range(self.cursor - n, self.cursor)

    def at(self, position: int) -> Example:
        """The example at ``position`` of the stream (a pure function of the seed)."""
        epoch, pos = divmod(position, len(self.examples))
        order = list(range(len(self.examples)))
        random.Random(self.seed * 100003 + epoch).shuffle(order)
        return self.examples[order[pos]]


def load_pool(cfg: Config, scorer, train_set: list[Example]) -> ExperiencePool | None:
    """The experience pool (None without replay; an empty live pool without a built one),
    checked, with its coverage of the training questions said and bounded."""
    a = cfg.algorithm
    if not a.replay_per_prompt:
        return None
    if not a.pool:
        pool = ExperiencePool({}, "live")
        pool.calls = cfg.rollout.tool_format if cfg.rollout.tools else None
        return pool
    pool = ExperiencePool.load(a.pool, scorer, a.pool_drop_rejected, a.pool_partial)
    calls = pool.tool_format()
    if cfg.rollout.tools and calls not in (None, cfg.rollout.tool_format):
        raise RunError(f"experience pool {a.pool} holds tool calls in the {calls} format and "
                       f"this run's are in the {cfg.rollout.tool_format} format "
                       f"(rollout.tool_format), so its replays would teach the other one; "
                       f"rebuild the pool with tools/build_pool.py "
                       f"rollout.tool_format={cfg.rollout.tool_format} or set "
                       f"rollout.tool_format={calls}")
    if pool.rejected and is_rank0():
        fate = "dropped" if a.pool_drop_rejected else \
            "kept (algorithm.pool_drop_rejected=true drops them)"
        print(f"warning: experience pool {a.pool}: {pool.rejected} answers are rejected by "
              f"the {cfg.verifier.mode} verifier and are {fate}", flush=True)
    if a.correction.replay == "stored":
        check_stored_sampling(pool, cfg.rollout)
    coverage = pool.coverage(train_set)
    if is_rank0():
        print(f"experience pool {a.pool}: {len(pool)} questions, "
              f"{sum(len(v) for v in pool.entries.values())} answers; it covers "
              f"{coverage:.1%} of the {len(train_set)} training questions", flush=True)
    if coverage < a.pool_min_coverage:
        raise RunError(f"experience pool {a.pool} covers {coverage:.1%} of the training "
                       f"questions, below algorithm.pool_min_coverage="
                       f"{a.pool_min_coverage:g}; questions match by their prompt text, so "
                       "build the pool from this run's training data (data.train) or lower "
                       "algorithm.pool_min_coverage")
    return pool


def check_stored_sampling(pool: ExperiencePool, rollout) -> None:
    """``correction.replay=stored`` compares a replay's recorded log-probs with the actor's at
    the run's sampling settings: a pool sampled under others is refused in one sentence."""
    others = sorted(pool.sampling() - {(rollout.temperature, rollout.top_p)}, key=str)
    if not others:
        return
    temperature, top_p = others[0]
    sampled = ("does not say the temperature and top-p it sampled at (its manifest has no "
               "sampling): rebuild it with tools/build_pool.py at" if temperature is None else
               f"was sampled at temperature {temperature} (top-p {top_p}) and this run samples "
               f"at rollout.temperature={rollout.temperature} (rollout.top_p={rollout.top_p}): "
               "the two are of different distributions; rebuild the pool with")
    raise RunError(f"algorithm.correction.replay=stored compares the pool's recorded log-probs "
                   f"with this run's, but pool {pool.source} {sampled} temperature="
                   f"{rollout.temperature} top_p={rollout.top_p}, or use "
                   "algorithm.correction.replay=on_policy")


class Producer:
    """Scored groups for the learner. ``engine`` samples synchronously (None on a rank whose
    engines run on rollout ranks of their own); ``stream`` samples asynchronously (None when
    the trainer is synchronous), as ``side`` (rollout/service.py) makes it."""

    def __init__(self, cfg: Config, tokenizer, stop_ids, scorer, pool: ExperiencePool | None,
                 engine, train_set: list[Example], side):
        self.cfg, self.tokenizer, self.stop_ids, self.scorer = cfg, tokenizer, stop_ids, scorer
        self.pool, self.engine = pool, engine
        self.stream = side.stream(self.segment, self._turns)  # rollout/service.py
        self.prompts = PromptStream(train_set, cfg.seed)
        self.pass_rates = PassRates()  # the replay strategies' running pass rates
        self.unscored = 0  # answers left out of their groups this step (the sandbox failed)

    def _turns(self):
        """The stream's tools (``rollout/tools.py`` ``Turns``), None without: the engine's
        toolbox, or one of this rank's where it has no engine."""
        r = self.cfg.rollout
        if not r.tools:
            return None
        from megatron_rlep.rollout import tool_format
        from megatron_rlep.rollout.tools import Toolbox, Turns

        toolbox = getattr(self.engine, "toolbox", None) or Toolbox(
            list(r.tools), r.tool_timeout_s, r.tool_output_chars, r.tool_workers, self.cfg.sandbox)
        fmt = getattr(self.engine, "format", None) or tool_format(r, self.tokenizer, toolbox)
        return Turns(toolbox, fmt, r.max_turns)

    @functools.cached_property
    def chat_tools(self):
        """The chat format of tool calls (``rollout/chat_tools.py``), whose prompts declare the
        tools; None in any other run. A rank without an engine reads the tools' declarations
        from a toolbox of its own, closed at once."""
        r = self.cfg.rollout
        if not r.tools or r.tool_format != "chat":
            return None
        if getattr(self.engine, "format", None) is not None:
            return self.engine.format
        from megatron_rlep.rollout import tool_format
        from megatron_rlep.rollout.tools import Toolbox

        with Toolbox(list(r.tools), r.tool_timeout_s, r.tool_output_chars, 1) as toolbox:
            return tool_format(r, self.tokenizer, toolbox)

    def state(self) -> dict:
        """What a checkpoint keeps of the producer (the live pool is saved beside it)."""
        out = {"cursor": self.prompts.cursor, "pass_rates": self.pass_rates.state()}
        if self.stream is not None:  # what was in flight is sampled again on resume
            out["in_flight"] = [f.position for f in self.stream.flights]
        return out

    def restore(self, extra: dict) -> list[int]:
        """A checkpoint's ``state()`` back; returns the prompts that were in flight, for
        ``dispatch_again`` once the engines hold the checkpoint's weights."""
        self.prompts.cursor = extra["cursor"]
        self.pass_rates = PassRates.from_state(extra.get("pass_rates"))
        return extra.get("in_flight", []) if self.stream is not None else []

    def dispatch_again(self, positions: list[int], step: int) -> None:
        """A resumed run's prompts that were in flight, sampled again first."""
        if positions:
            self.dispatch(positions, step)

    def prompt_ids(self, example: Example) -> tuple[int, ...]:
        if self.chat_tools is not None:
            return self.chat_tools.prompt(example.prompt, self.cfg.data.max_prompt_length)
        return encode_prompt(self.tokenizer, example.prompt, self.cfg.data.max_prompt_length)

    # ------------------------------------------------------------------ a group's parts

    def plan(self, positions) -> list[Group]:
        """A group per position of the prompt stream: its replays (the replay strategy's, drawn
        as a pure function of the seed, the position and the question, so that runs of one seed
        replay the same answers whenever they sample the prompt) and how many fresh answers the
        engine must sample."""
        a = self.cfg.algorithm
        groups = []
        for position in positions:
            ex = self.prompts.at(position)
            rate = self.pass_rates.rate(question_key(ex), self.pool.pass_rate(ex)) \
                if self.pool is not None else None
            replays, fresh = plan_group(ex, self.pool, a.rollouts_per_prompt, a.replay_per_prompt,
                                        a.fill_absent, self.cfg.seed, position, a.replay_distinct,
                                        a.replay.strategy, rate, a.replay.priority_floor)
            groups.append(Group(ex, self.prompt_ids(ex), replays, fresh, position=position))
        return groups

    def complete(self, groups: list[Group], step: int) -> list[Group]:
        """Groups whose fresh answers are sampled, scored, with their replays added and scored;
        the pass rates take the fresh verdicts."""
        a = self.cfg.algorithm
        self._score([(s, g.example) for g in groups for s in g.samples], f"step {step}")
        self.unscored += without_unscored(groups)  # not in the pass rates either
        for group in groups:
            self.pass_rates.add(question_key(group.example), [s.correct for s in group.samples])
            if a.replay.strategy == "rescue":
                group.replays = rescue_replays(group, self.pool, a.replay_per_prompt,
                                               self.cfg.seed, group.position, a.replay_distinct)
        replayed = [(self._replay_sample(g.example, t), g) for g in groups for t in g.replays]
        self._score([(s, g.example) for s, g in replayed], f"step {step}'s replays")
        for sample, group in replayed:
            group.samples.append(sample)
        self.unscored += without_unscored(groups)
        return groups

    def _score(self, pairs: list, what: str) -> None:
        """Rewards of (sample, example) pairs, once for all ranks; too many failed: a stop."""
        if pairs:
            self.scorer.check(score_samples(pairs, self.scorer, collective=True), what)

    def _replay_sample(self, example: Example, text: str) -> Sample:
        stored = self.cfg.algorithm.correction.replay == "stored"
        limit = self.cfg.rollout.max_response_length
        tools = self.pool.trajectory(example, text)
        if tools is not None:  # its tokens as recorded, observations included
            return replay_sample(text, self.tokenizer, limit, (
                list(tools.token_ids), list(tools.logprobs) if stored else []), self.stop_ids,
                tools.mask)
        return replay_sample(text, self.tokenizer, limit,
                             self.pool.sampled_as(example, text) if stored else None,
                             self.stop_ids)

    # ------------------------------------------------------------------ a step's groups

    def groups(self, step: int) -> tuple[list[Group], dict]:
        """prompts_per_rollout groups. With dynamic sampling, uninformative groups (all answers
        right or all wrong: ``Group.informative``) are dropped and more prompts drawn, up to
        max_gen_batches generation batches in all; a batch still short then stops the run
        (short_batch=error, the reference's behaviour) or trains on the groups kept."""
        a = self.cfg.algorithm
        if self.stream is not None:
            return self.streamed(step)
        if not a.dynamic_sampling:
            groups = self.collect(self.prompts.take(a.prompts_per_rollout), step)
            return groups, {"prompts_drawn": len(groups), "groups_dropped": 0,
                            "gen_batches": 1, "groups_short": 0}
        kept, drawn, batches = [], 0, 0
        while len(kept) < a.prompts_per_rollout and batches < (a.max_gen_batches or math.inf):
            more = self.collect(self.prompts.take(a.prompts_per_rollout), step)
            batches, drawn = batches + 1, drawn + len(more)
            kept += [g for g in more if g.informative(a.filter_metric)]
        short = max(a.prompts_per_rollout - len(kept), 0)
        if short:
            what = (f"step {step}: dynamic sampling kept {len(kept)} of {a.prompts_per_rollout} "
                    f"groups in {batches} generation batches (algorithm.max_gen_batches)")
            if a.short_batch == "error":
                raise RunError(f"{what}; the questions are too easy or too hard for the policy: "
                               "raise algorithm.max_gen_batches (0: no limit) or set "
                               "algorithm.short_batch=train to train on the groups kept")
            if is_rank0():
                print(f"warning: {what}; training on them (algorithm.short_batch=train)", flush=True)
        return kept[:a.prompts_per_rollout], {"prompts_drawn": drawn, "groups_dropped": drawn - len(kept),
                                              "gen_batches": batches, "groups_short": short}

    def collect(self, positions: range, step: int) -> list[Group]:
        """G' groups for the prompts at ``positions`` of the prompt stream: fresh rollouts and
        replays, scored. Each fresh answer is a request of its own, seeded by ``answer_seed``
        (the run's seed, the prompt's position, the answer's index), as the rollout stream
        seeds it: a synchronous and an asynchronous run of one seed draw the same numbers."""
        r = self.cfg.rollout
        groups = self.plan(positions)
        requests = [(g, p, j) for g, p in zip(groups, positions) for j in range(g.fresh_requested)]
        completions = generate_sharded(
            self.engine, [g.prompt_ids for g, _, _ in requests], [1] * len(requests),
            r.tensor_parallel, seed=[answer_seed(self.cfg.seed, p, j) for _, p, j in requests],
            temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_response_length)
        for group in groups:
            group.samples = []
        for (group, _, _), (c,) in zip(requests, completions):
            group.samples.append(Sample(c.token_ids, c.text, replay=False, finished=c.finished,
                                        logprobs=c.logprobs, mask=c.mask, calls=c.calls,
                                        routes=c.routes))
        return self.complete(groups, step)


    # ------------------------------------------------------------------ asynchronous rollout

    def streamed(self, step: int) -> tuple[list[Group], dict]:
        """prompts_per_rollout groups from the rollout stream (``rollout/stream.py``): what
        finished before this step first, the oldest first, then segments of generation until
        enough have finished; prompts are drawn to keep prompts_per_rollout +
        ``rollout.extra_prompts`` in flight. Dynamic sampling drops uninformative groups as
        they finish and draws more, up to max_gen_batches x prompts_per_rollout prompts a step.
        The policy's version is ``step``: the updates applied so far."""
        a, r = self.cfg.algorithm, self.cfg.rollout
        need = a.prompts_per_rollout
        limit = need * (a.max_gen_batches or math.inf) + r.extra_prompts if \
            a.dynamic_sampling else math.inf  # prompts drawn this step at most
        kept, drawn, dropped, busy = [], 0, 0, 0.0
        while len(kept) < need:
            room = need - len(kept) + r.extra_prompts - len(self.stream.flights)
            if room > 0 and drawn < limit:
                count = int(min(room, limit - drawn))
                self.dispatch(self.prompts.take(count), step)
                drawn += count
            finished = self.stream.take(need - len(kept), step)
            if finished:
                groups = self.complete([self._landed(f) for f in finished], step)
                for group in groups:
                    if not a.dynamic_sampling or group.informative(a.filter_metric):
                        kept.append(group)
                    else:
                        dropped += 1
                continue
            if not self.stream.pending():
                break  # nothing left to sample this step: short (dynamic sampling's limit)
            start = time.perf_counter()
            self.stream.advance(step, self.cfg.seed)
            busy += time.perf_counter() - start
        # the next step's prompts in flight now: disaggregated engines sample them while the
        # learners train (a colocated engine when the next step starts)
        room = max(need + r.extra_prompts - len(self.stream.flights), 0)
        self.dispatch(self.prompts.take(room), step)
        short = max(need - len(kept), 0)
        if short and a.short_batch == "error":
            raise RunError(f"step {step}: dynamic sampling kept {len(kept)} of {need} groups "
                           f"from {drawn} prompts (algorithm.max_gen_batches); the questions are "
                           "too easy or too hard for the policy: raise algorithm.max_gen_batches "
                           "(0: no limit) or set algorithm.short_batch=train")
        return kept, {"prompts_drawn": drawn + room, "groups_dropped": dropped,
                      "gen_batches": math.ceil(drawn / need), "groups_short": short,
                      "generating_s": busy}

    def dispatch(self, positions, version: int) -> None:
        """The prompts at ``positions`` into the rollout stream, each planned as a group (its
        replays chosen now), sampled from policy ``version`` on."""
        self.stream.dispatch([Flight(p, g.prompt_ids, g.fresh_requested, g)
                              for p, g in zip(positions, self.plan(positions))], version)

    def _landed(self, flight: Flight) -> Group:
        """A finished flight as its group, the fresh answers as samples."""
        group = flight.payload
        tools = bool(self.cfg.rollout.tools)
        group.samples = [Sample(tuple(a.token_ids), self.tokenizer.decode(  # the model's text
            [t for t, m in zip(a.token_ids, a.mask) if m], skip_special_tokens=True),
            replay=False, finished=a.finished, logprobs=tuple(a.logprobs),
            versions=tuple(a.versions), mask=tuple(a.mask) if tools else (),
            calls=tuple(a.calls), routes=padded_routes(
                a.routes, len(flight.prompt_ids) + len(a.token_ids))) for a in flight.answers]
        return group

    def segment(self, prompts: list, counts: list[int], seed: int, max_tokens: int) -> list:
        """The colocated rollout stream's engine: one segment of every prompt's answers."""
        r = self.cfg.rollout
        stop = {"stop": self.stream.turns.stop} if self.stream.turns is not None else {}
        return generate_sharded(self.engine, prompts, counts, r.tensor_parallel, seed=seed,
                                temperature=r.temperature, top_p=r.top_p, max_tokens=max_tokens,
                                **stop)

    def staleness_metrics(self, groups: list[Group], version: int) -> dict:
        """How many versions behind the trained fresh tokens were (each token against the
        weights it trains, policy ``version``), and the rollout stream's restarts."""
        counts = Counter(version - v for g in groups for s in g.samples for v in s.versions)
        total = sum(counts.values())
        out = {"rollout/staleness_mean": sum(k * n for k, n in counts.items()) / total
               if total else None, "rollout/staleness_max": max(counts, default=None),
               "rollout/stale_regenerated": self.stream.regenerated,
               "rollout/in_flight": len(self.stream.flights)}
        for lag in range(self.cfg.algorithm.max_staleness + 1):
            out[f"rollout/tokens_lag_{lag}"] = counts[lag] / total if total else None
        self.stream.regenerated = 0
        return out

    # ------------------------------------------------------------------ the pool

    def refresh_pool(self, groups: list[Group], step: int) -> None:
        """The live pool takes the step's verified fresh answers that ended with EOS, each
        stamped with the version of the policy that sampled its first token (the step's own
        when synchronous)."""
        r = self.cfg.rollout
        provenance = json.dumps({"source": str(Path(self.cfg.run_dir)), "step": step,
                                 "temperature": r.temperature, "top_p": r.top_p,
                                 "max_response_length": r.max_response_length,
                                 "verifier": self.cfg.verifier.mode,
                                 "function": self.cfg.verifier.function})
        for g in groups:
            good = [Answer(s.text, min(s.versions, default=step), s.response_ids, s.logprobs,
                           provenance, s.mask)
                    for s in g.samples if not s.replay and s.correct and s.finished]
            if good:
                self.pool.add(g.example, good, self.cfg.algorithm.replay.cap)

    def replay_metrics(self, groups: list[Group], step: int) -> dict:
        """The pool's size and coverage, and how old the replayed answers are (steps since
        the policy that sampled them; a built pool's answers count from before step 0)."""
        ages = [step - self.pool.version_of(g.example, t) for g in groups for t in g.replays]
        return {"pool/questions": len(self.pool),
                "pool/answers": sum(len(v) for v in self.pool.entries.values()),
                "pool/questions_covered": mean_or_none(bool(self.pool.answers(g.example))
                                                       for g in groups),
                "train/replay_age_mean": mean_or_none(ages)}
