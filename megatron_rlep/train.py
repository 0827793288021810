"""The trainer: DAPO/GRPO, and RLEP when ``algorithm.replay_per_prompt`` M > 0.

    python -m megatron_rlep.train experiment=<preset> [key=value ...]

One step reads like the paper's Figure 2: prompts -> G fresh rollouts each (the engine is asked
only for the fresh slots) -> M replays each from the experience pool -> rewards -> advantages
over each G' = G + M group -> updates in mini-batches of ``prompts_per_update`` prompts ->
weight sync into the engine -> validation now and then -> checkpoint now and then.

Three parts, each readable alone: the producer of scored groups (``producer.py``: prompts,
fresh answers sampled at once or through the asynchronous rollout stream, replays, rewards), the
learner and the loop here (advantages, updates, weight sync, validation, metrics), and the
checkpoints beside them (``checkpoints.py``).

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
    from megatron_rlep.cli import check_command_line, user_errors_in_one_line, with_cpu_runtime
    from megatron_rlep.roles import take_role

    JOBS = check_command_line("config")
    with_cpu_runtime()  # may run this command again, so before the heavy imports
    with user_errors_in_one_line():  # this rank's side and GPU, before anything starts CUDA
        ROLE = take_role(JOBS)

import json  # noqa: E402
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import correction, host_memory, metrics, platform, rundir, tasks
from megatron_rlep.actor import routing
from megatron_rlep.actor.actor import Actor
from megatron_rlep.actor.batch import SequenceBatch
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.checkpoints import Checkpoints, disk_plan
from megatron_rlep.config import Config, ConfigError, RunError
from megatron_rlep.data import load_examples
from megatron_rlep.files import write_text_atomic
from megatron_rlep.groups import Group, assign_advantages
from megatron_rlep.loss import rollout_mismatch
from megatron_rlep.metrics import mean_or_none
from megatron_rlep.monitor import Monitor
from megatron_rlep.platform import any_rank, is_rank0
from megatron_rlep.producer import Producer, load_pool
from megatron_rlep.rollout import model_stop_ids, validation_sampling
from megatron_rlep.rollout.rollout_rank import rollout_rank_main
from megatron_rlep.rollout.service import LocalRollout, RemoteRollout
from megatron_rlep.reward.sandbox import Sandbox, isolation
from megatron_rlep.reward.scorer import Item, Scorer


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
        return any_rank(self.received is not None)


class Trainer:
    """The learner and the loop: each step takes scored groups from the producer
    (``producer.py``), updates the actor on them, sends its weights to the engines, validates
    now and then, and saves beside it (``checkpoints.py``)."""

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
        # the rollout side, wherever it runs: the loop below never asks where
        self.rollout = rollout_side(cfg)
        self.rollout.connect()
        self.train_set = load_examples(cfg.data.train, "train", cfg.data.data_dir,
                                       **tasks.loader_kwargs(cfg.data.train, cfg.data.levels,
                                                              cfg.data.train_size, cfg.seed,
                                                              cfg.rollout.tool_format))
        self.eval_sets = {name: load_examples(name, "test", cfg.data.data_dir,
                                              **tasks.loader_kwargs(name, cfg.data.levels,
                                                                     cfg.data.eval_size, cfg.seed,
                                                                     cfg.rollout.tool_format))
                          for name in cfg.data.eval}
        # the reward's workers start here: a reward file that does not import stops the run now
        self.scorer = Scorer(cfg.verifier, max_length=r.max_response_length,
                             overlong_buffer=a.overlong_buffer, overlong_factor=a.overlong_factor,
                             sandbox=cfg.sandbox)
        if is_rank0():
            # a node whose kernel refuses a layer of the sandbox stops the run here
            sandbox = Sandbox(**isolation(cfg.sandbox)).probe() \
                if self.scorer.runs_code() or "python" in r.tools else None
            for line in filter(None, (self.scorer.describe(), sandbox,
                                      self.scorer.code_line(self.train_set))):
                print(line, flush=True)
        pool = load_pool(cfg, self.scorer, self.train_set)
        self.checkpoints = Checkpoints(cfg, disk_plan(cfg))
        problem = rundir.room_problem(self.run_dir, self.checkpoints.disk,
                                      cfg.logging.keep_checkpoints)
        if problem:  # before the model loads: a full file system is said in seconds
            raise RunError(problem)
        rundir.pin_settings(self.run_dir, asdict(cfg), cfg.resume, is_rank0())
        # before the model: a wandb that cannot start stops the run here
        self.monitor = Monitor(self.run_dir, cfg.logging, asdict(cfg), is_rank0())
        self.actor = Actor(cfg.model.path, a, dtype=cfg.model.dtype, temperature=r.temperature,
                           seed=cfg.seed, transformer_impl=cfg.model.transformer_impl,
                           router_aux_loss=a.router_aux_loss,
                           routing_replay=cfg.actor.routing_replay,
                           **{k: v for k, v in asdict(cfg.parallel).items()
                              if k != "offload_during_rollout"})  # the trainer's to do
        if self.actor.routes and is_rank0():
            print(routes_line(cfg), flush=True)
        self.tokenizer = AutoTokenizer.from_pretrained(self.actor.hf_path)
        self.offload = cfg.parallel.offload_during_rollout
        if self.offload:  # before the engine starts: its start-up wants the memory free
            self.actor.offload()
        engine = self.rollout.start(r, self.actor.hf_path, self.actor.dtype)
        self.producer = Producer(cfg, self.tokenizer,
                                 model_stop_ids(self.actor.hf_path, self.tokenizer), self.scorer,
                                 pool, engine, self.train_set, self.rollout)
        self.stream = self.producer.stream
        self.step, in_flight = 0, []
        self.skipped_in_a_row = 0  # updates skipped for non-finite gradients, the latest ones
        if cfg.resume and (self.run_dir / "checkpoints" / "latest").is_file():
            checkpoint, extra, live_pool = self.checkpoints.resume(self.actor)
            self.step = extra["step"]
            if live_pool is not None:
                live_pool.calls, self.producer.pool = self.producer.pool.calls, live_pool
            if self.offload:
                self.actor.offload()
            in_flight = self.producer.restore(extra)
            if is_rank0():
                print(f"resuming from {checkpoint} at step {self.step}", flush=True)
            self.sync_weights(self.step)
        self.producer.dispatch_again(in_flight, self.step)
        if self.stream is not None and is_rank0():
            print(asynchrony_line(cfg, self.rollout.where), flush=True)

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

    def save(self, step: int) -> None:
        """A checkpoint of ``step`` with the producer's state (and its live pool)."""
        live = self.cfg.algorithm.replay.refresh and self.producer.pool is not None
        self.checkpoints.save(self.actor, step, self.producer.state(),
                              self.producer.pool if live else None)

    def save_if_due(self) -> bool:
        """A checkpoint at the last step and every ``logging.save_every`` steps, and the final
        policy in Hugging Face form for pools; whether a checkpoint was written."""
        last = self.step == self.cfg.algorithm.total_steps
        every = self.cfg.logging.save_every
        saved = last or bool(every and self.step % every == 0)
        if saved:
            self.save(self.step)
        if last:
            with self.checkpoints.stop_if_refused("hf", self.checkpoints.disk["hf"]):
                self.actor.save_hf(self.run_dir / "hf")
        return saved

    # ------------------------------------------------------------------ the learner

    def update(self, groups: list[Group]) -> tuple[list[dict], dict]:
        """Old log-probs from the current policy, then one optimiser update per mini-batch of
        ``prompts_per_update`` prompts (x epochs). Also returns how far the engine's behaviour
        log-probs are from the actor's.

        The first mini-batch takes its old log-probs from its own forward pass (the policy has
        not moved yet, so they are the same numbers) when nothing needs them before the update:
        one epoch, no off-policy correction, no KL term. Only the later mini-batches then need a
        forward pass of their own first."""
        a = self.cfg.algorithm
        self.rollout.before_update()
        assign_advantages(groups, a.normalize_std,
                          fresh_baseline=a.correction.baseline == "fresh")
        self.actor.begin_step(self.step)
        batch = _sequences(groups)
        offsets = [0]
        for g in groups:
            offsets.append(offsets[-1] + len(g.samples))
        minis = [list(range(offsets[start], offsets[min(start + a.prompts_per_update, len(groups))]))
                 for start in range(0, len(groups), a.prompts_per_update)]
        samples = [s for g in groups for s in g.samples]
        # (the fused pass gives the loss's tokens only: a tool's observations would be missing)
        fused = set(minis[0]) if a.epochs == 1 and not a.kl_coef and \
            not correction.active(a.correction) and not any(s.mask for s in samples) else set()
        old = [None] * len(batch)
        later = [i for i in range(len(batch)) if i not in fused]
        if a.old_logp == "rollout":
            old = correction.engine_old_logp(samples, later)
            later = [i for i in later if old[i] is None]
        # MoE routing replay (R2): a mini-batch's passes after its first route as that one did;
        # the actor keeps the routes of its own micro-batches, so each mini-batch's old log-probs
        # come from a pass over those same micro-batches
        replay, waiting = bool(self.actor.routes), set(later)
        passes = [[i for i in index if i in waiting] for index in minis] if replay else [later]
        for n, index in enumerate(passes):
            if index:
                key = n if replay and index == minis[n] else None
                for i, logp in zip(index, self.actor.logprobs(_subset(batch, index),
                                                              routes=key)[0]):
                    old[i] = logp
        batch.old_logp = old
        seen = correction.model_tokens(samples, old)  # what the corrections compare
        c = a.correction
        if c.baseline == "weighted":  # the groups' baselines: the proximal policy's
            assign_advantages(groups, a.normalize_std,
                              correction.baseline_weights(seen, old, c.is_threshold))
            batch.advantages = torch.tensor([s.advantage for s in samples])
        batch.weights, batch.kept, corrected = correction.batch_correction(
            batch.old_logp, [s.logprobs for s in seen], [s.replay for s in samples], c)
        batch.kept = correction.without_observations(batch.kept, samples)
        batch.tags = correction.token_tags(samples, self.step)
        results = []
        for _ in range(a.epochs):
            for n, index in enumerate(minis):
                sub = _subset(batch, index)
                if sub.old_logp[0] is None:  # fused: the actor's own forward gives them
                    sub.old_logp = None
                results.append(self.actor.train_step(sub, routes=n if replay else None))
                if sub.old_logp is None:
                    for i, logp in zip(index, self.actor.fused_old_logp):
                        batch.old_logp[i] = logp
                self.skipped_in_a_row = self.skipped_in_a_row + 1 if results[-1]["skipped"] else 0
                if self.too_many_skipped():
                    break
            if self.too_many_skipped():
                break
        first = self.actor.forget_routes()
        mismatch = rollout_mismatch(*correction.model_parts(samples, batch.old_logp))
        if first is not None and self.cfg.actor.routing_replay == "rollout":
            # the engine's experts against the actor's own choice, before the step's updates
            mismatch.update(routing.agreement(first, "moe/rollout_route_agreement"))
        mismatch.update(corrected)
        mismatch.update(correction.lag_metrics(seen, batch.old_logp, self.step,
                                               minis * a.epochs, c.is_threshold))
        mismatch.update(correction.class_metrics([r["by_class"] for r in results]))
        if self.offload:  # the rollout's room: the update is done, train_step restores
            self.actor.offload()
        return results, mismatch

    def tool_seconds(self) -> float | None:
        """Seconds this rank's engine has spent running tool calls; None where it runs none
        (no tools, or rollout ranks of their own run them)."""
        turns = self.stream.turns if self.stream is not None else None
        toolbox = turns.toolbox if turns is not None else self.rollout.toolbox
        return toolbox.seconds if toolbox is not None else None

    def sync_weights(self, version: int) -> dict:
        """The actor's weights (policy ``version``: the updates applied) into the engines:
        streamed into the colocated engine, or broadcast to the rollout ranks in buckets (every
        rank takes part in the export)."""
        start = time.perf_counter()
        self.rollout.load_weights(version, self.actor.export_hf)
        out = {"time/sync_s": time.perf_counter() - start}
        if self.cfg.rollout.check_sync:
            out["sync/max_logprob_diff"], out["sync/mean_logprob_diff"] = \
                self._sync_difference()
        return out

    def _sync_difference(self) -> tuple[float, float]:
        """Largest and mean |log p_engine - log p_actor| over a fixed sequence (temperature 1)."""
        probe = self.producer.prompt_ids(self.train_set[0])
        ids = torch.tensor([probe])
        actor = torch.log_softmax(self.actor.logits(ids)[0, :-1].float(), -1)
        actor = actor.gather(-1, ids[0, 1:, None])[:, 0]
        diff = torch.zeros(2, device=platform.device())
        probed = self.rollout.probe(probe)  # None on a rank without an engine
        if probed is not None:
            gap = (probed - actor.cpu()).abs()
            diff += torch.tensor([gap.max().item(), gap.mean().item()], device=diff.device)
        if dist.is_initialized():  # from the ranks that have an engine
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
            prompts = [self.producer.prompt_ids(e) for e in examples]
            completions = self.rollout.sample(prompts, [n] * len(examples), self.cfg.seed,
                                              **validation_sampling(self.cfg))
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

    def validate_and_keep(self, step: int) -> dict:
        """``validate``, and the policy kept as the best so far if it is (``val/best_kept``)."""
        out = self.validate(step)
        out["val/best_kept"] = float(self.checkpoints.keep_best(self.actor, step, out["val/acc"]))
        return out

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        cfg, a = self.cfg, self.cfg.algorithm
        if is_rank0():
            rundir.say_disk(self.run_dir, self.checkpoints.disk, cfg.logging.keep_checkpoints)
            rundir.note_code(self.run_dir, self.step)
        monitor, producer = self.monitor, self.producer
        monitor.start(a.total_steps, self.step)
        settle_pages = host_memory.FreePageSettle()
        if producer.pool is not None:
            monitor.artifact(a.pool, "experience-pool", "pool", reference=True)
        every = cfg.logging.eval_every
        stop = StopRequest(self.run_dir / "STOP")
        try:
            while self.step < a.total_steps:
                step = self.step
                if every and step == 0:
                    first = self.validate(0)  # the untrained policy
                    self.checkpoints.keep_best(self.actor, 0, first["val/acc"])
                    monitor.log(0, first, advance=False)
                record = StepRecord(self, settle_pages)
                groups, info = producer.groups(step)  # prompts, G fresh + M replays, rewards
                record.rolled_out(groups, info)
                updates, mismatch = self.update(groups) if groups else ([], {})
                if self.too_many_skipped():
                    self.stop_on_skipped(step)
                record.updated(updates, mismatch)
                if updates:
                    record.add(self.sync_weights(step + 1))
                if a.replay.refresh and producer.pool is not None:
                    producer.refresh_pool(groups, step)
                self.step += 1
                if every and (self.step % every == 0 or self.step == a.total_steps):
                    record.add(self.validate_and_keep(self.step))
                metrics = record.finish()
                if cfg.logging.dump_batches:
                    _dump(self.run_dir, step, groups)
                saved = self.save_if_due()
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


class StepRecord:
    """One step's metrics, gathered beside the loop's verbs so that the loop reads as the step
    runs: each phase's time by ``clock``, what a verb returns (``updated``, ``add``), then in
    ``finish`` what the step's groups, updates, tools, stream, scorer, producer and memory
    say."""

    def __init__(self, trainer: Trainer, settle_pages, clock=time.perf_counter):
        self.trainer, self.settle_pages, self.clock = trainer, settle_pages, clock
        self.step, self.metrics = trainer.step, {}
        self.start, self.tools_start = clock(), trainer.tool_seconds()

    def rolled_out(self, groups: list[Group], info: dict) -> None:
        t = self.trainer
        self.groups, self.info = groups, info
        self.stale = t.producer.staleness_metrics(groups, self.step) if t.stream is not None \
            else {}
        self.rollout_end = self.clock()
        self.tools_s = None if self.tools_start is None else t.tool_seconds() - self.tools_start

    def updated(self, updates: list[dict], mismatch: dict) -> None:
        self.updates, self.update_end = updates, self.clock()
        self.metrics.update(mismatch)

    def add(self, metrics: dict) -> None:
        self.metrics.update(metrics)

    def finish(self) -> dict:
        t, out = self.trainer, self.metrics
        rollout_s = self.rollout_end - self.start
        out.update(_step_metrics(self.groups, self.updates, self.info, rollout_s,
                                 self.update_end - self.rollout_end))
        out.update(_tool_metrics(self.groups, self.tools_s, rollout_s))
        if t.stream is not None:  # asynchronous: each side's waits on the other
            out.update(self.stale)
            out.update(t.rollout.waits(rollout_s, self.info["generating_s"],
                                       self.clock() - self.rollout_end))
        out.update(t.scorer.take_counts())  # rewards that raised, timed out, ...
        out["reward/unscored"], t.producer.unscored = t.producer.unscored, 0
        if t.producer.pool is not None:
            out.update(t.producer.replay_metrics(self.groups, self.step))
        out["time/step_s"] = self.clock() - self.start
        out.update(self.settle_pages())
        out.update(_memory_metrics())
        return out


def rollout_side(cfg: Config) -> LocalRollout | RemoteRollout:
    """Where the engines run, chosen here once (rollout.placement): the learners' own processes,
    or rollout ranks of their own (megatron_rlep/roles.py made them)."""
    if cfg.rollout.placement == "disaggregated":
        return RemoteRollout(cfg)
    return LocalRollout(cfg)


def asynchrony_line(cfg: Config, where: str) -> str:
    """The start-up line that gives the effective staleness bound: the stream's, plus what a
    step's later mini-batches and epochs add (each trains on answers sampled before the
    step's earlier updates); ``where``: the engines' (``LocalRollout.where``)."""
    a, r = cfg.algorithm, cfg.rollout
    updates = a.epochs * (a.prompts_per_rollout // a.prompts_per_update)
    how = [where]
    if r.partial:
        how.append(f"partial rollouts in segments of {r.segment_tokens} tokens")
    if r.extra_prompts:
        how.append(f"{r.extra_prompts} prompts in flight beyond a step's")
    bound = f"a group trains at most {a.max_staleness} policy versions after its oldest token"
    if updates > 1:
        bound += (f"; the step's {updates} updates add up to {updates - 1} more, so a token is "
                  f"at most {a.max_staleness + updates - 1} updates behind the weights it trains")
    return f"asynchronous rollout: {', '.join(how)}; {bound}; {correction_line(a.correction)}"


def correction_line(c) -> str:
    """What corrects the stale tokens, in words (``algorithm.correction``)."""
    if c.is_level:
        cap = (f"tokens above {c.is_threshold:g} left out" if c.is_mode == "mask" else
               f"truncated at {c.is_threshold:g}")
        what = (f"stale tokens weighted by pi_old / pi_behaviour ({c.is_level}-level, {cap}: "
                "the decoupled loss, algorithm.correction.is_level)")
    else:
        what = ("no importance weights between the sampling and the trained policy "
                "(algorithm.correction.is_level=token adds them)")
    if c.rs_level:
        what += f", {c.rs_level}-level rejection"
    if c.m2_threshold is not None:
        what += (f", the tokens of largest squared log-ratio left out until the rest's mean is "
                 f"at most {c.m2_threshold:g} (M2PO, algorithm.correction.m2_threshold)")
    if c.baseline == "weighted":
        what += ", group baselines weighted to the trained policy (algorithm.correction.baseline)"
    if c.baseline == "fresh":
        what += (", replays' advantages against their group's fresh answers alone "
                 "(algorithm.correction.baseline=fresh)")
    return what


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


def routes_line(cfg: Config) -> str:
    """The start-up line of MoE routing replay: where each kind of token's experts come from."""
    if cfg.actor.routing_replay == "actor":
        return ("MoE routing replay: actor.routing_replay=actor (R2), each update's pass sends a "
                "token to the experts of the step's first pass over it (the old log-probs' or the "
                "first update's); the routers still train")
    r = cfg.rollout
    kinds = ["a fresh answer's tokens to the experts of the engine's forward that fed them"
             + (" (a partial rollout's, each segment's own)" if r.partial else "")]
    if r.tools:
        kinds.append("a tool's observation to those of the next turn's prefill")
    if cfg.algorithm.replay_per_prompt:
        kinds.append("a pool replay's, stored without routes, to those of the step's first pass "
                     "over it")
    return ("MoE routing replay: actor.routing_replay=rollout (R3), each update's pass sends "
            + "; ".join(kinds) + "; later passes replay the first's; the routers still train")


def _sequences(groups: list[Group]) -> SequenceBatch:
    tokens, prompts, adv, routes = [], [], [], []
    for g in groups:
        for s in g.samples:
            tokens.append(list(g.prompt_ids) + list(s.response_ids))
            prompts.append(len(g.prompt_ids))
            adv.append(s.advantage)
            routes.append(s.routes)
    return SequenceBatch(tokens, prompts, advantages=torch.tensor(adv),
                         routes=routes if any(r is not None for r in routes) else None)


def _subset(batch: SequenceBatch, index: list[int]) -> SequenceBatch:
    def pick(values):
        return None if values is None else [values[i] for i in index]

    return SequenceBatch(pick(batch.tokens), pick(batch.prompt_lengths),
                         advantages=batch.advantages[index], old_logp=pick(batch.old_logp),
                         weights=pick(batch.weights), kept=pick(batch.kept), tags=pick(batch.tags),
                         routes=pick(batch.routes))


def _step_metrics(groups, updates, info, rollout_s, update_s) -> dict:
    fresh = [s for g in groups for s in g.samples if not s.replay]
    replay = [s for g in groups for s in g.samples if s.replay]
    every = fresh + replay
    out = {
        "train/acc_fresh": mean_or_none(s.correct for s in fresh),
        "train/acc_replay": mean_or_none(s.correct for s in replay),
        "train/reward": mean_or_none(s.reward for s in every),
        "train/reward_fresh": mean_or_none(s.reward for s in fresh),
        "train/replay_fraction": len(replay) / max(len(every), 1),
        "train/replays_per_group": mean_or_none(len(g.replays) for g in groups),  # the effective M
        "train/groups_with_replays": mean_or_none(bool(g.replays) for g in groups),
        "train/distinct_replays_per_group": mean_or_none(len(set(g.replays)) for g in groups),
        # the replays' share of the advantage mass sum |A|: how much of the update they steer
        "train/replay_advantage_share": sum(abs(s.advantage) for s in replay) /
        max(sum(abs(s.advantage) for s in every), 1e-12),
        "train/response_length": mean_or_none(len(s.response_ids) for s in every),
        "train/response_length_fresh": mean_or_none(len(s.response_ids) for s in fresh),
        "train/truncated_fraction": mean_or_none(not s.finished for s in every),
        "train/groups": len(groups), "train/sequences": len(every),
        "train/prompts_drawn": info["prompts_drawn"], "train/groups_dropped": info["groups_dropped"],
        "train/gen_batches": info["gen_batches"], "train/groups_short": info["groups_short"],
        "time/rollout_s": rollout_s, "time/update_s": update_s,
    }
    applied = [u for u in updates if not u["skipped"]]
    for key in ("loss", "clip_fraction", "dual_clip_fraction", "entropy", "grad_norm", "lr"):
        out[f"actor/{key}"] = mean_or_none(u[key] for u in applied)
    out["actor/skipped_updates"] = len(updates) - len(applied)  # non-finite gradients
    counts = [u["route_counts"] for u in updates if u["route_counts"] is not None]
    if counts:  # MoE routing replay: the routers' own choices against the routes given
        out.update(routing.agreement(sum(counts)))
        out["moe/router_grad_norm"] = mean_or_none(u["router_grad_norm"] for u in applied)
    tokens = sum(u["tokens"] for u in updates)
    out["perf/update_tokens_per_s"] = tokens / update_s if update_s > 0 else None
    out["perf/rollout_tokens_per_s"] = sum(len(s.response_ids) for s in fresh) / rollout_s \
        if rollout_s > 0 else None
    return out


def turns(mask) -> int:
    """The model's turns in an answer: its runs of trained tokens between observations."""
    return sum(1 for i, kept in enumerate(mask) if kept and (i == 0 or not mask[i - 1]))


def _tool_metrics(groups: list[Group], tools_s: float | None, rollout_s: float) -> dict:
    """With tools: calls and model turns per fresh answer, the share of answers that call one,
    the share of calls that ran without error, the share of answers with a failed call that end
    right all the same (recovered), observation tokens per answer, and the share of the step's
    rollout spent running calls (this rank's engine's; None on learners whose rollout ranks
    run them)."""
    fresh = [s for g in groups for s in g.samples if not s.replay]
    if not any(s.mask for s in fresh):
        return {}
    calls = [c for s in fresh for c in s.calls]
    failed = [s for s in fresh if any(c != "ok" for c in s.calls)]
    return {"tools/calls_per_answer": len(calls) / len(fresh),
            "tools/turns_per_answer": mean_or_none(turns(s.mask) for s in fresh),
            "tools/answers_calling": mean_or_none(bool(s.calls) for s in fresh),
            "tools/ok_share": mean_or_none(c == "ok" for c in calls),
            "tools/recovered": mean_or_none(s.correct for s in failed),
            "tools/observation_tokens": mean_or_none(len(s.mask) - sum(s.mask) for s in fresh),
            "time/tools_s": tools_s,
            "tools/time_share": tools_s / rollout_s if rollout_s and tools_s is not None else None}


def _dump(run_dir: Path, step: int, groups: list[Group]) -> None:
    """The step's groups as this rank saw them (``logging.dump_batches``): every rank's own, as
    they must agree."""
    rank = f"rank-{dist.get_rank()}/" if not is_rank0() else ""
    path = run_dir / "batches" / f"{rank}step-{step:06d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{"id": g.example.id, **({} if g.position is None else {"position": g.position}),
             "prompt_ids": list(g.prompt_ids), "replays": g.replays,
             "fresh_requested": g.fresh_requested,
             "samples": [{"replay": s.replay, "response_ids": list(s.response_ids), "text": s.text,
                          "finished": s.finished, "reward": s.reward, "correct": s.correct,
                          "advantage": s.advantage, "logprobs": list(s.logprobs),
                          "status": s.status, **({"versions": list(s.versions)} if s.versions
                                                 else {}),
                          **({"mask": [int(m) for m in s.mask], "calls": list(s.calls)}
                             if s.mask else {})}
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


def main(cfg: Config, role: tuple[str, int, int] | None) -> None:
    """One job of ``cfg``; ``role``: this rank's side of a disaggregated job, as
    ``roles.take_role`` chose it when the process started (None: colocated)."""
    import logging

    logging.getLogger("megatron").setLevel(logging.WARNING)  # per-bucket parameter listings
    name_and_place(cfg)
    if role is not None and role[0] == "rollout":
        rollout_rank_main(cfg, role[1], role[2])
        # its work is done and said (the engine closed, learner 0 told): the bridge's links
        # go with the process, not through gloo's destructors at the interpreter's exit,
        # which call std::terminate when a peer's last heartbeats are still arriving
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    trainer = Trainer(cfg)
    trainer.run()
    if dist.is_initialized():
        dist.barrier()
    # the rollout side's end: vLLM's teardown now, not at a later job's garbage collection, and
    # the rollout ranks told to stop (a failed run never gets here: its exit ends them)
    trainer.rollout.close()
    platform.destroy_distributed()  # NCCL warns of a leak otherwise; a sweep's next job re-inits


if __name__ == "__main__":
    from megatron_rlep.cli import hydra_entry

    hydra_entry(lambda cfg: main(cfg, ROLE), "config")
