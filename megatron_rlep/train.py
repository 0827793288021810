"""The trainer: DAPO/GRPO, and RLEP when ``algorithm.replay_per_prompt`` M > 0.

    python -m megatron_rlep.train experiment=<preset> [key=value ...]

One step reads like the paper's Figure 2: prompts -> G fresh rollouts each (the engine is asked
only for the fresh slots) -> M replays each from the experience pool -> rewards -> advantages
over each G' = G + M group -> updates in mini-batches of ``prompts_per_update`` prompts ->
weight sync into the engine -> validation now and then -> checkpoint now and then.

Run under torchrun/srun for TP/PP/DP; every rank runs this loop with the same data. The step's
prompt order and replays are pure functions of (seed, position, step), so a resumed run
continues the same streams.

A file named STOP in ``run_dir`` (what slurm/common.sh writes on the time-limit warning, or
``touch RUN_DIR/STOP`` by hand), or SIGTERM / SIGUSR1 to the ranks (a Slurm preemption,
``scontrol requeue``), makes every rank finish the current step, write a checkpoint and leave;
the stop file is then removed, and the next start with the same ``run_dir`` resumes from the
checkpoint. The file signals nobody, so a step may take as long as it needs; a signal sent to
torchrun gives its ranks only torchrun's 30-second grace before SIGKILL.
"""

from __future__ import annotations

if __name__ == "__main__":  # a mistyped key, value or preset: said before torch and Megatron load
    from megatron_rlep.cli import check_command_line, with_cpu_runtime

    check_command_line("config")
    with_cpu_runtime()  # may run this command again, so before the heavy imports

import contextlib  # noqa: E402
import json  # noqa: E402
from collections import Counter
import math
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import host_memory, metrics, placement, platform, rundir, tasks
from megatron_rlep.actor import checkpoint as actor_checkpoint
from megatron_rlep.actor.actor import Actor
from megatron_rlep.actor.batch import SequenceBatch
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.config import Config, ConfigError, RunError
from megatron_rlep.data import Example, load_examples
from megatron_rlep.files import write_text_atomic
from megatron_rlep.correction import active as correction_active, batch_correction, \
    engine_old_logp
from megatron_rlep.groups import (Group, Sample, assign_advantages, plan_group, replay_sample,
                                  rescue_replays, score_samples, without_unscored)
from megatron_rlep.loss import rollout_mismatch
from megatron_rlep.monitor import Monitor
from megatron_rlep.pool import Answer, ExperiencePool, question_key
from megatron_rlep.replay import PassRates
from megatron_rlep.rollout import (encode_prompt, generate_sharded, make_engine, model_stop_ids,
                                   training_engine)
from megatron_rlep.rollout.stream import Flight, RolloutStream
from megatron_rlep.reward.scorer import Item, Scorer


def is_rank0() -> bool:
    """Rank 0 of the job; before the process group starts, as torchrun or srun numbered it."""
    if dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


class StopRequest:
    """Records SIGTERM / SIGUSR1 and watches ``stop_file``; ``agreed()`` is True on every rank
    once any rank got a signal or saw the file."""

    def __init__(self, stop_file: Path):
        self.received = None
        self.stop_file = stop_file
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._record)

    def _record(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def agreed(self) -> bool:
        if self.received is None and self.stop_file.exists():
            self.received = f"the stop file {self.stop_file}"
        return _any_rank(self.received is not None)


class PromptStream:
    """Training prompts in a seeded order, reshuffled every epoch; ``cursor`` counts prompts
    handed out so far (saved in checkpoints)."""

    def __init__(self, examples: list[Example], seed: int, cursor: int = 0):
        if not examples:
            raise ValueError("the training set is empty; check data.train")
        self.examples, self.seed, self.cursor = examples, seed, cursor

    def take(self, n: int) -> list[Example]:
        out = [self.at(self.cursor + i) for i in range(n)]
        self.cursor += n
        return out

    def at(self, position: int) -> Example:
        """The example at ``position`` of the stream (a pure function of the seed)."""
        epoch, pos = divmod(position, len(self.examples))
        order = list(range(len(self.examples)))
        random.Random(self.seed * 100003 + epoch).shuffle(order)
        return self.examples[order[pos]]


class Trainer:
    def __init__(self, cfg: Config):
        from transformers import AutoTokenizer

        self.cfg = cfg
        a, r = cfg.algorithm, cfg.rollout
        self.run_dir = Path(cfg.run_dir)
        if a.replay_per_prompt and not a.pool and not a.replay.refresh:
            raise ConfigError("config key algorithm.pool is empty but algorithm.replay_per_prompt "
                              f"is {a.replay_per_prompt}; give a pool directory from "
                              "tools/build_pool.py or the RLEP release parquet, set "
                              "algorithm.replay.refresh=true to start from an empty live pool, "
                              "or set M to 0.")
        # settings, model path, data and pool first: a mistake there stops before minutes of
        # start-up
        resolve_model_path(cfg.model.path)
        self.train_set = load_examples(cfg.data.train, "train", cfg.data.data_dir,
                                       **tasks.loader_kwargs(cfg.data.train, cfg.data.levels,
                                                              cfg.data.train_size, cfg.seed))
        self.eval_sets = {name: load_examples(name, "test", cfg.data.data_dir,
                                              **tasks.loader_kwargs(name, cfg.data.levels,
                                                                     cfg.data.eval_size, cfg.seed))
                          for name in cfg.data.eval}
        # the reward's workers start here: a reward file that does not import stops the run now
        self.scorer = Scorer(cfg.verifier, max_length=r.max_response_length,
                             overlong_buffer=a.overlong_buffer, overlong_factor=a.overlong_factor)
        if is_rank0():
            for line in filter(None, (self.scorer.describe(), self.scorer.sandbox_line(),
                                      self.scorer.code_line(self.train_set))):
                print(line, flush=True)
        self.unscored = 0  # answers left out of their groups this step (the sandbox failed)
        self.pool = self._load_pool()
        self.disk = self.disk_plan()
        problem = rundir.room_problem(self.run_dir, self.disk, cfg.logging.keep_checkpoints)
        if problem:  # before the model loads: a full file system is said in seconds
            raise RunError(problem)
        rundir.pin_settings(self.run_dir, asdict(cfg), cfg.resume, is_rank0())
        # before the model: a wandb that cannot start stops the run here
        self.monitor = Monitor(self.run_dir, cfg.logging, asdict(cfg), is_rank0())
        self.actor = Actor(cfg.model.path, a, dtype=cfg.model.dtype, temperature=r.temperature,
                           seed=cfg.seed, transformer_impl=cfg.model.transformer_impl,
                           router_aux_loss=a.router_aux_loss,
                           **{k: v for k, v in asdict(cfg.parallel).items()
                              if k != "offload_during_rollout"})  # the trainer's to do
        self.tokenizer = AutoTokenizer.from_pretrained(self.actor.hf_path)
        self.stop_ids = model_stop_ids(self.actor.hf_path, self.tokenizer)
        self.offload = cfg.parallel.offload_during_rollout
        if self.offload:  # before the engine starts: its start-up wants the memory free
            self.actor.offload()
        r = replace(r, engine=training_engine(r.engine, self.actor.hf_path))
        self.remote = r.placement == "disaggregated"  # the engines on the rollout ranks
        self.engine = None if self.remote else make_engine(
            r, self.actor.hf_path, self.actor.dtype, cfg.seed,
            cfg.data.max_prompt_length + max(r.max_response_length,
                                             self._validation()["max_tokens"]))
        if self.remote:
            self.stream = placement.RemoteStream(
                placement.learner_bridge(cfg, dist.get_rank() if dist.is_initialized() else 0),
                placement.engines(cfg), a.max_staleness, r.timeout_s)
        else:
            self.stream = RolloutStream(self._segment, r.segment_tokens if r.partial else
                                        r.max_response_length, r.max_response_length,
                                        a.max_staleness) if streaming(cfg) else None
        in_flight = []  # a resumed run's prompts that were in flight: sampled again first
        self.step, cursor = 0, 0
        self.pass_rates = PassRates()  # the replay strategies' running pass rates
        self.best = None  # (val/acc, step) of the best validation so far
        self.skipped_in_a_row = 0  # updates skipped for non-finite gradients, the latest ones
        self.last_saved = None  # the newest intact checkpoint's name
        if cfg.resume and (self.run_dir / "checkpoints" / "latest").is_file():
            checkpoint, extra = self.resume()
            self.step, cursor = extra["step"], extra["cursor"]
            self.last_saved = checkpoint.name
            self.best = rundir.best_before(self.run_dir, self.step)
            if self.offload:
                self.actor.offload()
            self.pass_rates = PassRates.from_state(extra.get("pass_rates"))
            in_flight = extra.get("in_flight", [])
            if self.stream is not None:
                self.stream.calls = extra.get("stream_calls", 0)
            if is_rank0():
                print(f"resuming from {checkpoint} at step {self.step}", flush=True)
            self.sync_weights(self.step)
        self.prompts = PromptStream(self.train_set, cfg.seed, cursor)
        if in_flight and self.stream is not None:
            self.dispatch(in_flight, [self.prompts.at(p) for p in in_flight], self.step)
        if self.stream is not None and is_rank0():
            print(asynchrony_line(cfg), flush=True)

    def resume(self) -> tuple[Path, dict]:
        """(checkpoint, its extra state) of the newest intact checkpoint, loaded: the one
        ``latest`` names, else the step before it, and so on. A checkpoint is checked against
        its manifest first (every file's size; with ``resume_verify`` every checksum too); one
        whose load still fails is checked by checksum to tell damage from a bug. Each one
        skipped is said in one line; with none intact the run stops in one sentence."""
        skipped = []
        for checkpoint in rundir.resume_candidates(self.run_dir):
            problem, checked = actor_checkpoint.damage(checkpoint, self.cfg.resume_verify)
            if problem is None:
                failed = None
                try:
                    extra = self.actor.load(checkpoint)
                    if extra.get("live_pool"):  # answers verified when they joined
                        self.pool = ExperiencePool.load_live(checkpoint.parent /
                                                             extra["live_pool"])
                except Exception as err:  # noqa: BLE001 - told from damage below, every rank
                    failed = err
                if _any_rank(failed is not None):  # the check is collective: all ranks go in
                    problem = actor_checkpoint.damage(checkpoint, checksums=True)[0] if checked \
                        else None
                    if problem is None:
                        raise failed or RunError(f"loading {checkpoint} failed on another rank "
                                                 "(its log has the error)")
            if problem is not None:
                skipped.append(f"checkpoints/{checkpoint.name}: {problem}")
                if is_rank0():
                    print(f"warning: skipping checkpoints/{checkpoint.name}, it is damaged: "
                          f"{problem}", flush=True)
                continue
            if not checked and is_rank0():
                print(f"note: checkpoints/{checkpoint.name} was written before checkpoints "
                      "carried a manifest: its files could not be checked", flush=True)
            return checkpoint, extra
        raise RunError(f"{self.run_dir} holds no intact checkpoint to resume from "
                       f"({'; '.join(skipped)}): resume from a copy of the run directory, or "
                       "start afresh with resume=false or another run_dir")

    def too_many_skipped(self) -> bool:
        limit = self.cfg.algorithm.max_skipped_updates
        return bool(limit) and self.skipped_in_a_row >= limit

    def stop_on_skipped(self, step: int) -> None:
        """Too many updates in a row had non-finite gradients: checkpoint the weights before
        them (the skipped updates changed nothing) and stop in one sentence."""
        self.step = step + 1
        self.save(self.step)
        raise RunError(f"{self.skipped_in_a_row} updates in a row had non-finite gradients (the "
                       f"last at step {step}) and were skipped; checkpoints/step-{self.step:06d} "
                       "holds the weights before them: lower algorithm.lr or algorithm.grad_clip "
                       "or look at the step's batch (logging.dump_batches=true), then resume "
                       "(algorithm.max_skipped_updates sets how many in a row stop the run)")

    def keep_best(self, step: int, accuracy: float | None) -> bool:
        """After a validation: a new best ``val/acc`` replaces ``checkpoints/best`` (weights
        only). Every rank computed the same accuracy, so every rank takes part in the save."""
        if not self.cfg.logging.keep_best or accuracy is None or \
                (self.best is not None and accuracy <= self.best[0]):
            return False
        self.best = (accuracy, step)
        self._room_for("checkpoints/best", self.disk["best"])
        with self._stop_if_refused("checkpoints/best", self.disk["best"]):
            self.actor.save_weights(self.run_dir / "checkpoints" / "best", step,
                                    {"val/acc": accuracy})
        return True

    def disk_plan(self) -> dict:
        """What the run's checkpoints and export hold on disk (actor/checkpoint.py disk_plan),
        from the checkpoint's headers and the settings, before the model loads."""
        cfg, log = self.cfg, self.cfg.logging
        distributed = cfg.parallel.distributed_optimizer
        if distributed is None:  # the actor's default: on a GPU with data parallelism
            p = cfg.parallel
            world = int(os.environ.get("WORLD_SIZE", "1"))
            distributed = platform.has_cuda() and world // (p.tensor_parallel *
                                                            p.pipeline_parallel) > 1
        return actor_checkpoint.disk_plan(
            actor_checkpoint.hf_parameters(resolve_model_path(cfg.model.path)),
            platform.compute_dtype(cfg.model.dtype) == torch.bfloat16, cfg.algorithm.total_steps,
            log.save_every, log.keep_checkpoints, log.keep_best, distributed)

    def _load_pool(self) -> ExperiencePool | None:
        """The experience pool (None without replay; an empty live pool without a built one),
        checked, with its coverage of the training questions said and bounded."""
        a = self.cfg.algorithm
        if not a.replay_per_prompt:
            return None
        if not a.pool:
            return ExperiencePool({}, "live")
        pool = ExperiencePool.load(a.pool, self.scorer, a.pool_drop_rejected, a.pool_partial)
        if pool.rejected and is_rank0():
            fate = "dropped" if a.pool_drop_rejected else \
                "kept (algorithm.pool_drop_rejected=true drops them)"
            print(f"warning: experience pool {a.pool}: {pool.rejected} answers are rejected by "
                  f"the {self.cfg.verifier.mode} verifier and are {fate}", flush=True)
        coverage = pool.coverage(self.train_set)
        if is_rank0():
            print(f"experience pool {a.pool}: {len(pool)} questions, "
                  f"{sum(len(v) for v in pool.entries.values())} answers; it covers "
                  f"{coverage:.1%} of the {len(self.train_set)} training questions", flush=True)
        if coverage < a.pool_min_coverage:
            raise RunError(f"experience pool {a.pool} covers {coverage:.1%} of the training "
                           f"questions, below algorithm.pool_min_coverage="
                           f"{a.pool_min_coverage:g}; questions match by their prompt text, so "
                           "build the pool from this run's training data (data.train) or lower "
                           "algorithm.pool_min_coverage")
        return pool

    # ------------------------------------------------------------------ one step

    def collect(self, examples: list[Example], step: int, batch: int = 0) -> list[Group]:
        """G' groups for ``examples``: fresh rollouts and replays, scored. ``batch`` counts the
        step's generation batches (dynamic sampling draws more), so each has its own seeds."""
        r = self.cfg.rollout
        groups = self.plan(examples, step)
        completions = generate_sharded(
            self.engine, [g.prompt_ids for g in groups], [g.fresh_requested for g in groups],
            r.tensor_parallel, seed=(self.cfg.seed * 100003 + step) * 1009 + batch,
            temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_response_length)
        for group, fresh in zip(groups, completions):
            group.samples = [Sample(c.token_ids, c.text, replay=False, finished=c.finished,
                                    logprobs=c.logprobs) for c in fresh]
        return self.complete(groups, step)

    def plan(self, examples: list[Example], step: int) -> list[Group]:
        """A group per example: its replays (the replay strategy's) and how many fresh answers
        the engine must sample."""
        a = self.cfg.algorithm
        groups = []
        for ex in examples:
            rate = self.pass_rates.rate(question_key(ex), self.pool.pass_rate(ex)) \
                if self.pool is not None else None
            replays, fresh = plan_group(ex, self.pool, a.rollouts_per_prompt, a.replay_per_prompt,
                                        a.fill_absent, self.cfg.seed, step, a.replay_distinct,
                                        a.replay.strategy, rate, a.replay.priority_floor)
            groups.append(Group(ex, self._prompt_ids(ex), replays, fresh))
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
                                               self.cfg.seed, step, a.replay_distinct)
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
        return replay_sample(text, self.tokenizer, self.cfg.rollout.max_response_length,
                             self.pool.sampled_as(example, text) if stored else None,
                             self.stop_ids)

    def _prompt_ids(self, example: Example) -> tuple[int, ...]:
        return encode_prompt(self.tokenizer, example.prompt, self.cfg.data.max_prompt_length)

    def gather_groups(self, step: int) -> tuple[list[Group], dict]:
        """prompts_per_rollout groups. With dynamic sampling, uninformative groups (all answers
        right or all wrong: ``Group.informative``) are dropped and more prompts drawn, up to
        max_gen_batches generation batches in all; a batch still short then stops the run
        (short_batch=error, the reference's behaviour) or trains on the groups kept."""
        a = self.cfg.algorithm
        if self.stream is not None:
            return self.streamed_groups(step)
        if not a.dynamic_sampling:
            groups = self.collect(self.prompts.take(a.prompts_per_rollout), step)
            return groups, {"prompts_drawn": len(groups), "groups_dropped": 0,
                            "gen_batches": 1, "groups_short": 0}
        kept, drawn, batches = [], 0, 0
        while len(kept) < a.prompts_per_rollout and batches < (a.max_gen_batches or math.inf):
            more = self.collect(self.prompts.take(a.prompts_per_rollout), step, batches)
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

    # ------------------------------------------------------------------ asynchronous rollout

    def streamed_groups(self, step: int) -> tuple[list[Group], dict]:
        """prompts_per_rollout groups from the rollout stream (``rollout/stream.py``): what
        finished before this step first, the oldest first, then segments of generation until
        enough have finished; prompts are drawn to keep prompts_per_rollout +
        ``rollout.extra_prompts`` in flight. Dynamic sampling drops uninformative groups as
        they finish and draws more, up to max_gen_batches x prompts_per_rollout prompts a step."""
        a, r = self.cfg.algorithm, self.cfg.rollout
        need = a.prompts_per_rollout
        limit = need * (a.max_gen_batches or math.inf) + r.extra_prompts if \
            a.dynamic_sampling else math.inf  # prompts drawn this step at most
        kept, drawn, dropped, busy = [], 0, 0, 0.0
        while len(kept) < need:
            room = need - len(kept) + r.extra_prompts - len(self.stream.flights)
            if room > 0 and drawn < limit:
                count = int(min(room, limit - drawn))
                first = self.prompts.cursor
                self.dispatch(list(range(first, first + count)), self.prompts.take(count), step)
                drawn += count
            finished = self.stream.take(need - len(kept), self.step)
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
            self.stream.advance(self.step, (self.cfg.seed * 100003 + 99991) * 1009)
            busy += time.perf_counter() - start
        # the next step's prompts in flight now: disaggregated engines sample them while the
        # learners train (a colocated engine when the next step starts)
        room = need + r.extra_prompts - len(self.stream.flights)
        if room > 0:
            first = self.prompts.cursor
            self.dispatch(list(range(first, first + room)), self.prompts.take(room), step + 1)
        short = max(need - len(kept), 0)
        if short and a.short_batch == "error":
            raise RunError(f"step {step}: dynamic sampling kept {len(kept)} of {need} groups "
                           f"from {drawn} prompts (algorithm.max_gen_batches); the questions are "
                           "too easy or too hard for the policy: raise algorithm.max_gen_batches "
                           "(0: no limit) or set algorithm.short_batch=train")
        return kept, {"prompts_drawn": drawn, "groups_dropped": dropped,
                      "gen_batches": math.ceil(drawn / need), "groups_short": short,
                      "generating_s": busy}

    def dispatch(self, positions: list[int], examples: list[Example], step: int) -> None:
        """Prompts into the rollout stream, each planned as a group (its replays chosen now)."""
        flights = []
        for position, group in zip(positions, self.plan(examples, step)):
            group.position = position
            flights.append(Flight(position, group.prompt_ids, group.fresh_requested, group))
        self.stream.dispatch(flights, self.step)

    def _landed(self, flight: Flight) -> Group:
        """A finished flight as its group, the fresh answers as samples."""
        group = flight.payload
        group.samples = [Sample(tuple(a.token_ids),
                                self.tokenizer.decode(a.token_ids, skip_special_tokens=True),
                                replay=False, finished=a.finished, logprobs=tuple(a.logprobs),
                                versions=tuple(a.versions)) for a in flight.answers]
        return group

    def _segment(self, prompts: list, counts: list[int], seed: int, max_tokens: int) -> list:
        """The rollout stream's engine: one segment of every prompt's answers."""
        r = self.cfg.rollout
        return generate_sharded(self.engine, prompts, counts, r.tensor_parallel, seed=seed,
                                temperature=r.temperature, top_p=r.top_p, max_tokens=max_tokens)

    def staleness_metrics(self, groups: list[Group]) -> dict:
        """How many versions behind the trained fresh tokens were (each token against the
        weights it trains), and the rollout stream's restarts."""
        counts = Counter(self.step - v for g in groups for s in g.samples for v in s.versions)
        total = sum(counts.values())
        out = {"rollout/staleness_mean": sum(k * n for k, n in counts.items()) / total
               if total else None, "rollout/staleness_max": max(counts, default=None),
               "rollout/stale_regenerated": self.stream.regenerated,
               "rollout/in_flight": len(self.stream.flights)}
        for lag in range(self.cfg.algorithm.max_staleness + 1):
            out[f"rollout/tokens_lag_{lag}"] = counts[lag] / total if total else None
        self.stream.regenerated = 0
        return out

    def update(self, groups: list[Group]) -> tuple[list[dict], dict]:
        """Old log-probs from the current policy, then one optimiser update per mini-batch of
        ``prompts_per_update`` prompts (x epochs). Also returns how far the engine's behaviour
        log-probs are from the actor's.

        The first mini-batch takes its old log-probs from its own forward pass (the policy has
        not moved yet, so they are the same numbers) when nothing needs them before the update:
        one epoch, no off-policy correction, no KL term. Only the later mini-batches then need a
        forward pass of their own first."""
        a = self.cfg.algorithm
        if self.engine is not None:
            self.engine.sleep()  # a colocated engine frees its memory for the update
        assign_advantages(groups, a.normalize_std)
        self.actor.begin_step(self.step)
        batch = _sequences(groups)
        offsets = [0]
        for g in groups:
            offsets.append(offsets[-1] + len(g.samples))
        minis = [list(range(offsets[start], offsets[min(start + a.prompts_per_update, len(groups))]))
                 for start in range(0, len(groups), a.prompts_per_update)]
        fused = set(minis[0]) if a.epochs == 1 and not a.kl_coef and \
            not correction_active(a.correction) else set()
        samples = [s for g in groups for s in g.samples]
        old = [None] * len(batch)
        later = [i for i in range(len(batch)) if i not in fused]
        if a.old_logp == "rollout":
            old = engine_old_logp(samples, later)
            later = [i for i in later if old[i] is None]
        if later:
            for i, logp in zip(later, self.actor.logprobs(_subset(batch, later))[0]):
                old[i] = logp
        batch.old_logp = old
        batch.weights, batch.kept, corrected = batch_correction(
            batch.old_logp, [s.logprobs for s in samples], [s.replay for s in samples],
            a.correction)
        results = []
        for _ in range(a.epochs):
            for index in minis:
                sub = _subset(batch, index)
                if sub.old_logp[0] is None:  # fused: the actor's own forward gives them
                    sub.old_logp = None
                results.append(self.actor.train_step(sub))
                if sub.old_logp is None:
                    for i, logp in zip(index, self.actor.fused_old_logp):
                        batch.old_logp[i] = logp
                self.skipped_in_a_row = self.skipped_in_a_row + 1 if results[-1]["skipped"] else 0
                if self.too_many_skipped():
                    break
            if self.too_many_skipped():
                break
        mismatch = rollout_mismatch([() if s.replay else s.logprobs for s in samples], batch.old_logp)
        mismatch.update(corrected)
        if self.offload:  # the rollout's room: the update is done, train_step restores
            self.actor.offload()
        return results, mismatch

    def sync_weights(self, version: int) -> dict:
        """The actor's weights (policy ``version``: the updates applied) into the engines:
        streamed into the colocated engine, or broadcast to the rollout ranks in buckets (every
        rank takes part in the export)."""
        start = time.perf_counter()
        buckets = self.actor.export_hf()
        if self.remote:
            self.stream.weights(version, buckets)
        elif self.engine is not None:
            self.engine.load_weights(buckets, keep_cache=self.cfg.rollout.partial_kv == "keep")
        else:
            for _ in buckets:  # the collectives of the export still need this rank
                pass
        out = {"time/sync_s": time.perf_counter() - start}
        if self.cfg.rollout.check_sync:
            out["sync/max_logprob_diff"], out["sync/mean_logprob_diff"] = \
                self._sync_difference()
        return out

    def _sync_difference(self) -> tuple[float, float]:
        """Largest and mean |log p_engine - log p_actor| over a fixed sequence (temperature 1)."""
        probe = self._prompt_ids(self.train_set[0])
        ids = torch.tensor([probe])
        actor = torch.log_softmax(self.actor.logits(ids)[0, :-1].float(), -1)
        actor = actor.gather(-1, ids[0, 1:, None])[:, 0]
        diff = torch.zeros(2, device=platform.device())
        engine = self.stream.request(("probe", probe)) if self.remote else \
            self.engine.sequence_logprobs(probe) if self.engine is not None else None
        if engine is not None:
            gap = (engine - actor.cpu()).abs()
            diff += torch.tensor([gap.max().item(), gap.mean().item()], device=diff.device)
        if dist.is_initialized() and not self.remote:
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        return float(diff[0]), float(diff[1])

    def validate(self, step: int) -> dict:
        """mean@n, pass@n and maj@n (n = validation.n) per held-out set and data source
        (megatron_rlep/metrics.py); ``val/acc`` is the mean of the sets' mean@n. Every
        validation samples with the same seeds, so points of a run, and of two runs, are paired;
        every answer's verdict goes to ``run_dir/validation/step-XXXXXX.jsonl`` for paired
        statistics (megatron_rlep/paired.py)."""
        n, out, accs, errors, record = self.cfg.validation.n, {}, [], [], []
        for name, examples in self.eval_sets.items():
            prompts = [self._prompt_ids(e) for e in examples]
            if self.engine is not None and self.cfg.rollout.partial_kv == "keep":
                self.engine.clear_cache()  # validated by the current weights alone
            completions = self.stream.sample(prompts, [n] * len(examples), self.cfg.seed,
                                               **self._validation()) if self.remote else \
                generate_sharded(self.engine, prompts, [n] * len(examples),
                                 self.cfg.rollout.tensor_parallel, seed=self.cfg.seed,
                                 **self._validation())
            answers = [(i, j, e, c) for i, (e, group) in enumerate(zip(examples, completions))
                       for j, c in enumerate(group)]
            scores = self.scorer.score([Item(e.data_source, c.text, e.ground_truth, e.extra_info)
                                        for _, _, e, c in answers], collective=True)
            self.scorer.check(scores, f"the validation of {name} at step {step}")
            rows = [{"data_source": e.data_source, "id": f"{i}", "sample_index": j,
                     "pred": score.pred, "correct": score.correct}
                    for (i, j, e, _), score in zip(answers, scores)]
            result = metrics.compute(rows)
            record += [dict(row, id=f"{name}/{row['id']}") for row in rows]
            for source, m in result.items():
                if len(result) == 2 and source != "all":
                    continue  # one data source: its numbers are the set's
                prefix = f"val/{name}" if source == "all" else f"val/{name}/{source}"
                out[f"{prefix}/mean@{n}"] = m["mean@n"]
                if n > 1:
                    out[f"{prefix}/pass@{n}"] = m["pass@k"][str(n)]
                    out[f"{prefix}/maj@{n}"] = m["maj@k"][str(n)]
            accs.append(result["all"]["mean@n"])
            errors.append(result["all"]["stderr"]["mean@n"])
        out["val/acc"] = sum(accs) / len(accs) if accs else None
        # its standard error over held-out questions (the sets' errors combined as independent)
        out["val/acc_stderr"] = math.sqrt(sum(e * e for e in errors)) / len(errors) if errors else None
        if is_rank0():
            (self.run_dir / "validation").mkdir(parents=True, exist_ok=True)
            write_text_atomic("".join(json.dumps(r) + "\n" for r in record),
                              self.run_dir / "validation" / f"step-{step:06d}.jsonl")
        return out

    def _validation(self) -> dict:
        """Validation's sampling settings: ``validation.*``, the rollout's where unset."""
        v, r = self.cfg.validation, self.cfg.rollout
        return {"temperature": _unless_none(v.temperature, r.temperature),
                "top_p": _unless_none(v.top_p, r.top_p),
                "max_tokens": _unless_none(v.max_response_length, r.max_response_length)}

    def refresh_pool(self, groups: list[Group], step: int) -> None:
        """The live pool takes the step's verified fresh answers that ended with EOS."""
        r = self.cfg.rollout
        provenance = json.dumps({"source": str(self.run_dir), "step": step,
                                 "temperature": r.temperature, "top_p": r.top_p,
                                 "max_response_length": r.max_response_length,
                                 "verifier": self.cfg.verifier.mode,
                                 "function": self.cfg.verifier.function})
        for g in groups:
            good = [Answer(s.text, step, s.response_ids, s.logprobs, provenance)
                    for s in g.samples if not s.replay and s.correct and s.finished]
            if good:
                self.pool.add(g.example, good, self.cfg.algorithm.replay.cap)

    def replay_metrics(self, groups: list[Group], step: int) -> dict:
        """The pool's size and coverage, and how old the replayed answers are (steps since
        the policy that sampled them; a built pool's answers count from before step 0)."""
        ages = [step - self.pool.version_of(g.example, t) for g in groups for t in g.replays]
        return {"pool/questions": len(self.pool),
                "pool/answers": sum(len(v) for v in self.pool.entries.values()),
                "pool/questions_covered": _mean(bool(self.pool.answers(g.example)) for g in groups),
                "train/replay_age_mean": _mean(ages)}

    def save(self, step: int) -> None:
        """A checkpoint of ``step``, then ``latest`` names it. Too little room for it, or a
        write the file system refuses, stops the run in one sentence with the numbers; the
        partial directory goes, ``latest`` stays on the last intact checkpoint."""
        name = f"step-{step:06d}"
        self._room_for(f"checkpoints/{name}", self.disk["checkpoint"])
        extra = {"step": step, "cursor": self.prompts.cursor, "pass_rates": self.pass_rates.state()}
        if self.stream is not None:  # what was in flight is sampled again on resume
            extra["in_flight"] = [f.position for f in self.stream.flights]
            extra["stream_calls"] = self.stream.calls
        pool = None
        if self.cfg.algorithm.replay.refresh and self.pool is not None:
            extra["live_pool"] = f"pool-{step:06d}"
            pool = self.run_dir / "checkpoints" / extra["live_pool"]
            if is_rank0():
                shutil.rmtree(pool, ignore_errors=True)  # left by a save cut short
        with self._stop_if_refused(f"checkpoints/{name}", self.disk["checkpoint"], pool):
            if pool is not None and is_rank0():
                self.pool.write(pool, {"live_pool_of": str(self.run_dir), "step": step})
            self.actor.save(self.run_dir / "checkpoints" / name, extra=extra)
        if is_rank0():
            latest = self.run_dir / "checkpoints" / "latest"
            tmp = latest.with_suffix(".tmp")
            tmp.write_text(name + "\n")
            tmp.replace(latest)
            rundir.prune(self.run_dir, self.cfg.logging.keep_checkpoints)
        self.last_saved = name
        if dist.is_initialized():
            dist.barrier()

    def _room_for(self, what: str, need: int) -> None:
        """Stop before a save (``what``: its path under run_dir) the file system has no room
        for (every rank agrees)."""
        problem = rundir.save_room_problem(self.run_dir, what, need, self.last_saved) \
            if is_rank0() else None
        if _any_rank(problem is not None):
            raise RunError(problem or f"cannot save {what}: rank 0 found too little "
                           f"room; {rundir.kept_note(self.run_dir, self.last_saved)}")

    @contextlib.contextmanager
    def _stop_if_refused(self, what: str, need: int, also: Path | None = None):
        """A save the file system refuses (full, over quota, an I/O error) becomes one sentence;
        what it wrote (its partial directory, ``also``) is gone."""
        try:
            yield
        except (actor_checkpoint.SaveFailed, OSError) as err:
            if isinstance(err, actor_checkpoint.SaveFailed) and not err.storage or \
                    isinstance(err, OSError) and not actor_checkpoint.storage_error(err):
                raise
            if also is not None and is_rank0():
                shutil.rmtree(also, ignore_errors=True)
            reason = err.reason if isinstance(err, actor_checkpoint.SaveFailed) else \
                f"{type(err).__name__}: {err}"
            free = shutil.disk_usage(self.run_dir).free
            raise RunError(f"saving {what} failed ({reason}) in {self.run_dir}, which "
                           f"has {actor_checkpoint.human(free)} free for a checkpoint of "
                           f"{actor_checkpoint.human(need)}; the partial save is removed and "
                           f"{rundir.kept_note(self.run_dir, self.last_saved)}") from None

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        cfg, a = self.cfg, self.cfg.algorithm
        if is_rank0():
            rundir.say_disk(self.run_dir, self.disk, cfg.logging.keep_checkpoints)
        monitor = self.monitor
        monitor.start(a.total_steps, self.step)
        free_page_cap = host_memory.FreePageCap()
        if self.pool is not None:
            monitor.artifact(a.pool, "experience-pool", "pool", reference=True)
        every = cfg.logging.eval_every
        stop = StopRequest(self.run_dir / "STOP")
        try:
            while self.step < a.total_steps:
                step = self.step
                metrics = {}
                if every and step == 0:
                    first = self.validate(0)  # the untrained policy
                    self.keep_best(0, first["val/acc"])
                    monitor.log(0, first, advance=False)
                t0 = time.perf_counter()
                groups, info = self.gather_groups(step)
                stale = self.staleness_metrics(groups) if self.stream is not None else {}
                t1 = time.perf_counter()
                updates, mismatch = self.update(groups) if groups else ([], {})
                if self.too_many_skipped():
                    self.stop_on_skipped(step)
                t2 = time.perf_counter()
                metrics.update(mismatch)
                metrics.update(self.sync_weights(step + 1) if updates else {})
                if a.replay.refresh and self.pool is not None:
                    self.refresh_pool(groups, step)
                self.step += 1
                if every and (self.step % every == 0 or self.step == a.total_steps):
                    metrics.update(self.validate(self.step))
                    metrics["val/best_kept"] = float(self.keep_best(self.step, metrics["val/acc"]))
                metrics.update(_step_metrics(groups, updates, info, t1 - t0, t2 - t1))
                if self.remote:  # each side's waits on the other
                    metrics.update(stale)
                    metrics["time/learner_idle"], self.stream.idle = self.stream.idle, 0.0
                    metrics["time/rollout_idle"], self.stream.rollout_idle = \
                        self.stream.rollout_idle, 0.0
                    metrics.update(self.stream.memory())
                elif self.stream is not None:  # colocated: each idles while the other works
                    metrics.update(stale)
                    metrics["time/learner_idle"] = t1 - t0
                    metrics["time/rollout_idle"] = (t1 - t0 - info["generating_s"]) + \
                        (time.perf_counter() - t1)
                metrics.update(self.scorer.take_counts())  # rewards that raised, timed out, ...
                metrics["reward/unscored"], self.unscored = self.unscored, 0
                if self.pool is not None:
                    metrics.update(self.replay_metrics(groups, step))
                metrics["time/step_s"] = time.perf_counter() - t0
                metrics.update(free_page_cap())
                metrics.update(_memory_metrics())
                if cfg.logging.dump_batches:  # every rank's own: they must agree
                    rank = f"rank-{dist.get_rank()}/" if not is_rank0() else ""
                    _dump(self.run_dir / "batches" / f"{rank}step-{step:06d}.json", groups)
                saved = self.step == a.total_steps or (cfg.logging.save_every and
                                                       self.step % cfg.logging.save_every == 0)
                if saved:
                    self.save(self.step)
                if self.step == a.total_steps:
                    with self._stop_if_refused("hf", self.disk["hf"]):  # the policy for pools
                        self.actor.save_hf(self.run_dir / "hf")
                monitor.log(self.step, metrics)
                if self.step < a.total_steps and stop.agreed():
                    if not saved:
                        self.save(self.step)
                    if is_rank0():
                        stop.stop_file.unlink(missing_ok=True)
                        print(f"stopping on {stop.received or 'a signal to another rank'}: saved "
                              f"step-{self.step:06d}; the same command resumes from it", flush=True)
                    break
        finally:
            monitor.close()
            self.scorer.close()
        if self.remote:  # a failed run says nothing more to the rollout ranks: its exit ends them
            self.stream.stop()


def streaming(cfg: Config) -> bool:
    """Whether the trainer samples through the rollout stream (asynchronous rollout)."""
    r = cfg.rollout
    return cfg.algorithm.max_staleness > 0 or r.partial or bool(r.extra_prompts) or \
        r.placement == "disaggregated"


def asynchrony_line(cfg: Config) -> str:
    """The start-up line that gives the effective staleness bound: the stream's, plus what a
    step's later mini-batches and epochs add (each trains on answers sampled before the
    step's earlier updates)."""
    a, r = cfg.algorithm, cfg.rollout
    updates = a.epochs * (a.prompts_per_rollout // a.prompts_per_update)
    how = [f"{r.placement} engines"]
    if r.partial:
        how.append(f"partial rollouts in segments of {r.segment_tokens} tokens")
    if r.extra_prompts:
        how.append(f"{r.extra_prompts} prompts in flight beyond a step's")
    bound = f"a group trains at most {a.max_staleness} policy versions after its oldest token"
    if updates > 1:
        bound += (f"; the step's {updates} updates add up to {updates - 1} more, so a token is "
                  f"at most {a.max_staleness + updates - 1} updates behind the weights it trains")
    fix = "" if a.correction.is_level or a.correction.rs_level else \
        "; no importance weights between the sampling and the trained policy " \
        "(algorithm.correction.is_level=token adds them)"
    return f"asynchronous rollout: {', '.join(how)}; {bound}{fix}"


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank calls it)."""
    value = torch.tensor([float(flag)], device=platform.device())
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _memory_metrics() -> dict:
    """This rank's memory at the step's end: the host's (its process and the children it
    started: scorers, engines; vLLM's sleep mode parks weights there), its heap's live and
    free bytes (``host_memory.metrics``) and, on a GPU, the torch allocator's peak (the actor;
    vLLM's sleep-mode pool is outside it) and the device's use (everything, vLLM included)."""
    out = host_memory.metrics()
    if not torch.cuda.is_available():
        return out
    free, total = torch.cuda.mem_get_info()
    out.update({"perf/peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                "perf/device_memory_used_gib": (total - free) / 2**30})
    torch.cuda.reset_peak_memory_stats()
    return out


def _sequences(groups: list[Group]) -> SequenceBatch:
    tokens, prompts, adv = [], [], []
    for g in groups:
        for s in g.samples:
            tokens.append(list(g.prompt_ids) + list(s.response_ids))
            prompts.append(len(g.prompt_ids))
            adv.append(s.advantage)
    return SequenceBatch(tokens, prompts, advantages=torch.tensor(adv))


def _subset(batch: SequenceBatch, index: list[int]) -> SequenceBatch:
    def pick(values):
        return None if values is None else [values[i] for i in index]

    return SequenceBatch(pick(batch.tokens), pick(batch.prompt_lengths),
                         advantages=batch.advantages[index], old_logp=pick(batch.old_logp),
                         weights=pick(batch.weights), kept=pick(batch.kept))


def _unless_none(value, default):
    return default if value is None else value


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _step_metrics(groups, updates, info, rollout_s, update_s) -> dict:
    fresh = [s for g in groups for s in g.samples if not s.replay]
    replay = [s for g in groups for s in g.samples if s.replay]
    every = fresh + replay
    out = {
        "train/acc_fresh": _mean(s.correct for s in fresh),
        "train/acc_replay": _mean(s.correct for s in replay),
        "train/reward": _mean(s.reward for s in every),
        "train/reward_fresh": _mean(s.reward for s in fresh),
        "train/replay_fraction": len(replay) / max(len(every), 1),
        "train/replays_per_group": _mean(len(g.replays) for g in groups),  # the effective M
        "train/groups_with_replays": _mean(bool(g.replays) for g in groups),
        "train/distinct_replays_per_group": _mean(len(set(g.replays)) for g in groups),
        # the replays' share of the advantage mass sum |A|: how much of the update they steer
        "train/replay_advantage_share": sum(abs(s.advantage) for s in replay) /
        max(sum(abs(s.advantage) for s in every), 1e-12),
        "train/response_length": _mean(len(s.response_ids) for s in every),
        "train/response_length_fresh": _mean(len(s.response_ids) for s in fresh),
        "train/truncated_fraction": _mean(not s.finished for s in every),
        "train/groups": len(groups), "train/sequences": len(every),
        "train/prompts_drawn": info["prompts_drawn"], "train/groups_dropped": info["groups_dropped"],
        "train/gen_batches": info["gen_batches"], "train/groups_short": info["groups_short"],
        "time/rollout_s": rollout_s, "time/update_s": update_s,
    }
    applied = [u for u in updates if not u["skipped"]]
    for key in ("loss", "clip_fraction", "dual_clip_fraction", "entropy", "grad_norm", "lr"):
        out[f"actor/{key}"] = _mean(u[key] for u in applied)
    out["actor/skipped_updates"] = len(updates) - len(applied)  # non-finite gradients
    tokens = sum(u["tokens"] for u in updates)
    out["perf/update_tokens_per_s"] = tokens / update_s if update_s > 0 else None
    out["perf/rollout_tokens_per_s"] = sum(len(s.response_ids) for s in fresh) / rollout_s \
        if rollout_s > 0 else None
    return out


def _dump(path: Path, groups: list[Group]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{"id": g.example.id, **({} if g.position is None else {"position": g.position}),
             "prompt_ids": list(g.prompt_ids), "replays": g.replays,
             "fresh_requested": g.fresh_requested,
             "samples": [{"replay": s.replay, "response_ids": list(s.response_ids), "text": s.text,
                          "finished": s.finished, "reward": s.reward, "correct": s.correct,
                          "advantage": s.advantage, "logprobs": list(s.logprobs),
                          "status": s.status, **({"versions": list(s.versions)} if s.versions
                                                 else {})}
                         for s in g.samples]} for g in groups]
    path.write_text(json.dumps(data))


def name_and_place(cfg: Config) -> None:
    """Under Hydra: each job of a ``-m`` sweep gets its own run directory (the sweep's
    ``<run_dir>/multirun/<job number>``), and a run without ``logging.name`` is named after its
    command-line overrides."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        cfg.run_dir = hydra_cfg.runtime.output_dir
    if cfg.logging.name is None:
        shown = [o for o in hydra_cfg.overrides.task if not o.startswith(("run_dir=", "logging."))]
        cfg.logging.name = ",".join(shown) or Path(cfg.run_dir).name


def main(cfg: Config) -> None:
    import logging

    logging.getLogger("megatron").setLevel(logging.WARNING)  # per-bucket parameter listings
    name_and_place(cfg)
    if cfg.rollout.placement == "disaggregated":
        role, index, learners = placement.split(cfg)
        if role == "rollout":
            placement.rollout_rank_main(cfg, index, learners)
            return
    trainer = Trainer(cfg)
    trainer.run()
    if dist.is_initialized():
        dist.barrier()
    if trainer.engine is not None:
        trainer.engine.close()  # vLLM's teardown now, not at a later job's garbage collection
    platform.destroy_distributed()  # NCCL warns of a leak otherwise; a sweep's next job re-inits


if __name__ == "__main__":
    from megatron_rlep.cli import hydra_entry

    hydra_entry(main, "config")
