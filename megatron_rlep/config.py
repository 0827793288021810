"""The typed configuration: one dataclass per Hydra group, checked on load.

``conf/`` holds the YAML tree (groups model, data, algorithm, rollout, parallel, logging,
verifier, and ``experiment/`` presets); the dataclasses here are its schema. ``load_config``
turns a composed Hydra config into a ``Config``; any unknown key, wrong type or out-of-range
value raises ``ConfigError`` with one sentence that names the key. ``check_overrides`` does the
same for a command line before Hydra starts, so a typo never reaches a traceback.

This module holds no training logic.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megatron_rlep.errors import ConfigError, RunError  # noqa: F401 - also imported from here

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


@dataclass
class ModelConfig:
    path: str = "smollm2-135m"  # a built-in name or a Hugging Face checkpoint directory
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU
    # layer specs: auto = Transformer Engine when it imports (else local, said once);
    # transformer_engine = stop when TE does not import; local = Megatron-Core's local specs
    transformer_impl: str = "auto"
    # true: stop at start when no CUDA GPU is visible (a model too large for a CPU; the 7B
    # preset sets it), and the Slurm preflight fails on a node without the GPUs for its ranks
    needs_gpu: bool = False


@dataclass
class DataConfig:
    train: str = "arithmetic"  # built-in task, .parquet/.jsonl path, name under data_dir, hub id
    eval: list[str] = field(default_factory=lambda: ["arithmetic"])
    data_dir: Optional[str] = None
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])  # built-in task only
    train_size: int = 256  # built-in task only
    eval_size: int = 64  # built-in task only
    max_prompt_length: int = 1024


@dataclass
class ReplayConfig:
    """Which pool answers go into which group (megatron_rlep/replay.py)."""
    strategy: str = "uniform"  # uniform (the paper) | rescue | priority | recent
    priority_floor: float = 0.1  # priority: the least chance a prompt gets its replays
    refresh: bool = False  # live pool: this run's verified, finished fresh answers join the pool
    cap: int = 8  # live pool: answers kept per question, the oldest versions evicted first


@dataclass
class CorrectionConfig:
    """Off-policy correction (megatron_rlep/correction.py; verl's rollout_correction names)."""
    # auto | null | token | sequence [rollout_is]; auto: token under asynchronous rollout
    # (algorithm.max_staleness > 0: AReaL's decoupled loss), null otherwise
    is_level: Optional[str] = "auto"
    is_threshold: float = 2.0  # truncation C of the weights [rollout_is_threshold]
    is_mode: str = "truncate"  # above C: truncate the weight to C | mask: drop the token (AReaL)
    # the groups' mean and spread: plain | weighted (fresh answers weighted by their sequence
    # ratio pi_old / pi_behaviour within [1/C, C]: the baseline of the policy being trained)
    baseline: str = "plain"
    rs_level: Optional[str] = None  # null | token | sequence | geometric [rollout_rs]
    rs_threshold: Optional[float] = None  # upper bound; null: is_threshold [rollout_rs_threshold]
    rs_threshold_lower: Optional[float] = None  # null: 1 / upper [rollout_rs_threshold_lower]
    replay: str = "on_policy"  # replayed answers: on_policy (the paper) | stored | down_weight
    replay_weight: float = 0.5  # down_weight: the factor on a replayed answer's token losses


@dataclass
class AlgorithmConfig:
    name: str = "rlep"  # grpo | dapo | rlep
    rollouts_per_prompt: int = 16  # G
    replay_per_prompt: int = 2  # M (0 = no replay)
    pool: Optional[str] = None  # experience pool: pool directory or RLEP release parquet
    fill_absent: bool = True  # a question absent from the pool gets G + M fresh rollouts (else G)
    replay_distinct: bool = False  # M distinct texts (else M stored answers, repeats too: the reference)
    pool_drop_rejected: bool = False  # drop pool answers the verifier rejects (else keep, counted)
    pool_partial: bool = False  # read a pool directory whose build has not finished (no manifest)
    # stop when fewer of the training questions have pool answers (questions match by their
    # prompt text: a pool of other data covers none, and RLEP would silently be DAPO)
    pool_min_coverage: float = 0.1
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    prompts_per_rollout: int = 512
    prompts_per_update: int = 64
    epochs: int = 1
    # the old policy's log-probs of the fresh answers in the step's later mini-batches: actor (a
    # forward pass of the actor before the first update) | rollout (the engine's, recorded as it
    # sampled; no forward pass, docs/training.md). The first mini-batch takes its own forward's.
    old_logp: str = "actor"
    # asynchronous rollout: a group trains at most this many policy versions after its oldest
    # token was sampled (0: today's synchronous trainer; docs/training.md, "Asynchronous rollout")
    max_staleness: int = 0
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 10.0
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum (verl's)
    normalize_std: bool = True
    kl_coef: float = 0.0  # must stay 0: no reference policy is built (refused when checked)
    entropy_coef: float = 0.0
    overlong_buffer: int = 512
    overlong_factor: float = 1.0
    dynamic_sampling: bool = False  # drop groups whose answers are all right or all wrong
    filter_metric: str = "acc"  # acc (the reference) | reward (the shaped reward)
    max_gen_batches: int = 10  # generation batches per step in all, the first included (0: no limit)
    short_batch: str = "error"  # still short after them: error (the reference) | train on those kept
    lr: float = 1e-6
    warmup_steps: int = 10  # rollout steps of linear warm-up (every update of a step: one LR)
    warmup_from_zero: bool = False  # step k at lr * k / warmup, the first at 0 (the reference)
    weight_decay: float = 0.1
    # false: Megatron's groups, biases and norms undecayed; true: every parameter decayed, as the
    # reference's AdamW over all parameters (the paper presets)
    weight_decay_all: bool = False
    adam_eps: float = 1e-8  # Adam's epsilon (a gradient element far below it barely moves)
    grad_clip: float = 1.0
    # an update whose gradient norm is not finite is skipped (actor/skipped_updates); this many
    # in a row stop the run with a checkpoint of the weights before them (0: never stop)
    max_skipped_updates: int = 3
    # a mixture-of-experts model's router load-balancing loss coefficient (0: off, as RL
    # trainers run it; the checkpoint's router_aux_loss_coef is for pre-training)
    router_aux_loss: float = 0.0
    total_steps: int = 400


@dataclass
class RolloutConfig:
    engine: str = "auto"  # auto | vllm | transformers
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_length: int = 3072
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.6  # vLLM on GPU, beside the actor (colocated)
    # vLLM on a GPU of its own (rollout.placement=disaggregated): no actor beside it, no sleep
    dedicated_gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gib: float = 1.0  # vLLM on CPU: KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    # vLLM on CPU: torch.compile the model (faster rollouts; the engine's start compiles,
    # docs/training.md has the costs) instead of running it eagerly
    cpu_compile: bool = False
    batch_size: int = 64  # sequences per generate call (transformers engine)
    check_sync: bool = False  # after each weight sync, compare engine and actor log-probs
    # asynchronous rollout (algorithm.max_staleness > 0; docs/training.md): where the engines run:
    # colocated (the training ranks, time-sliced) | disaggregated (the job's last `ranks` ranks
    # generate while the others train; weights go to them by broadcast after each update)
    placement: str = "colocated"
    ranks: int = 0
    # partial rollouts: answers grow segment_tokens at a time and unfinished ones go on under
    # the weights of later updates, their tokens tagged with the version that sampled them
    partial: bool = False
    segment_tokens: int = 64
    # an answer continued after new weights: recompute its KV cache with them (the engine gets
    # prompt and tokens so far again) | keep the KV its tokens had (vLLM's prefix cache is not
    # reset after a weight load; computed by the older weights, as PipelineRL keeps it)
    partial_kv: str = "recompute"
    extra_prompts: int = 0  # over-provisioning: prompts in flight beyond an update's
    timeout_s: float = 600.0  # disaggregated: the longest a learner waits on the rollout ranks
    # disaggregated: the longest any rank waits at start-up for the others to reach the bridge
    connect_timeout_s: float = 1800.0


@dataclass
class ValidationConfig:
    """Sampling of the held-out answers at validation (verl's val_kwargs); unset keys take the
    rollout's value."""
    n: int = 1  # answers per held-out question
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_response_length: Optional[int] = None


@dataclass
class ParallelConfig:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batch_size: int = 4  # sequences per micro-batch at most
    # and tokens per micro-batch at most, padding included (0: no budget; verl's dynamic batch
    # size): long answers go in small micro-batches, short ones in large
    max_tokens_per_micro_batch: int = 0
    # memory (tools/memory_plan.py shows each one's effect): activation recompute none |
    # selective (core attention) | full (each layer from its input); bf16 gradient buffers
    # instead of fp32 (bf16 models only); log-probs through the output layer this many response
    # tokens at a time, each chunk recomputed in backward (0: all at once)
    recompute: str = "none"
    bf16_grads: bool = False
    logprob_chunk_tokens: int = 0
    sequence_parallel: bool = False  # with TP > 1: norms' and residuals' activations split too
    # a mixture-of-experts model's experts spread over this many ranks (whole experts: expert
    # TP 1); at TP > 1 a MoE model needs sequence_parallel (Megatron-Core's MoE layer)
    expert_parallel: int = 1
    # each prompt once per micro-batch row, followed by its sequences' responses (local layer
    # specs only; megatron_rlep/actor/batch.py): the same numbers, the prompt computed once
    share_prompts: bool = False
    # a micro-batch's sequences end to end in one row, without padding (Megatron's THD layout
    # with PackedSeqParams; Transformer Engine's attention, or the local specs' per-sequence
    # attention): the same numbers; max_tokens_per_micro_batch then counts the packed tokens
    pack_sequences: bool = False
    # between updates (rollout, validation, weight sync) the gradient buffers are freed and, in
    # bf16, the optimizer's master weights and Adam state wait in host memory (verl's offload):
    # room for vLLM's KV cache; tools/memory_plan.py counts it
    offload_during_rollout: bool = False
    # Megatron's distributed optimizer: Adam's state and the fp32 master weights sharded over
    # the data-parallel ranks (ZeRO-1); null: on a GPU with data parallelism, else off
    distributed_optimizer: Optional[bool] = None


@dataclass
class LoggingConfig:
    wandb: str = "offline"  # online | offline | disabled
    project: str = "megatron_rlep"
    name: Optional[str] = None
    group: Optional[str] = None  # wandb group; default: $WANDB_RUN_GROUP, else the run's name
    log_every: int = 1
    eval_every: int = 10  # validation every N steps (0: never), and at the first and last step
    save_every: int = 50  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 0  # the newest N checkpoints stay on disk, older ones go (0: all)
    # the best validation step's weights stay too (checkpoints/best, weights only; its export:
    # tools/export_hf.py RUN_DIR --best)
    keep_best: bool = True
    dump_batches: bool = False  # write each step's groups to run_dir/batches/ (debugging, tests)
    progress: bool = True  # a live progress bar on rank 0


@dataclass
class CodeSandboxConfig:
    """What a code answer's program may use, per test run (megatron_rlep/reward/sandbox.py)."""
    wall_s: float = 10.0  # time running or asleep (not waiting for a CPU); 10x wall clock at most
    cpu_s: int = 10
    memory_mb: int = 1024
    nproc: int = 32  # processes (a fork bomb stops there)
    fsize_mb: int = 16  # the largest file it may write
    tmpfs_mb: int = 64  # its whole work directory
    output_kb: int = 1024  # stdout, and stderr; more kills it
    partial_credit: bool = False  # score 2 x the share of tests passed - 1 (else all or none)
    # true: where the kernel refuses the namespaces or Landlock, code answers are infrastructure
    # failures (the run stops past verifier.max_failures); false: run them with what is left
    require_isolation: bool = True
    # true: test files that patch the answer's objects (mock, monkeypatch) run in the answer's
    # own process, where a program written to defeat the harness can forge a pass; false (the
    # default): every test runs in the judge's process and such files fail there
    in_process_patching: bool = False


@dataclass
class VerifierConfig:
    # dapo | math: the math rule for every answer; code: the code checker for every answer;
    # custom: by data_source as verl does (math -> math_rule, code -> the code checker, the
    # rest -> function)
    mode: str = "dapo"
    function: Optional[str] = None  # custom: FILE.py:NAME or module:NAME, verl's signature
    math_rule: str = "dapo"  # custom: the rule for math data sources (dapo | math)
    workers: int = 1  # scoring processes per rank
    timeout_s: float = 30.0  # an answer's scoring deadline (a code answer: all its tests)
    max_failures: float = 0.1  # a larger share of a step's rewards raising or timing out stops it
    code: CodeSandboxConfig = field(default_factory=CodeSandboxConfig)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    seed: int = 1
    run_dir: str = "runs/default"
    resume: bool = True  # continue from run_dir/checkpoints/latest when it exists
    # on resume, check every file's checksum against the checkpoint's manifest, not only its
    # size (docs/cluster.md: what it costs against a load)
    resume_verify: bool = False
    samples: int = 4  # quickstart: answers per question
    questions: int = 8  # quickstart: questions shown


@dataclass
class BuildPoolConfig:
    """tools/build_pool.py: sample, verify and keep answers per training question."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    seed: int = 1
    split: str = "train"
    samples: int = 64  # answers sampled per question (paper: 64)
    temperature: float = 0.7
    top_p: float = 0.95
    min_correct: int = 2  # keep a question only with at least this many verified answers
    finished_only: bool = True  # keep answers that ended with EOS (not cut at max_response_length)
    dedupe: bool = True  # drop exact duplicate answers (counted once toward min_correct)
    max_keep: Optional[int] = None  # at most this many answers per question
    keep: str = "random"  # which answers max_keep keeps: random | shortest | diverse
    out: str = "runs/pool"
    shard_size: int = 32  # questions per shard file
    progress: bool = True


@dataclass
class EvaluateConfig:
    """tools/evaluate.py: n answers per held-out question, scored, with mean@n, pass@k, maj@k."""
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # wandb, project, name only
    datasets: list[str] = field(default_factory=lambda: ["aime24", "aime25", "amc23"])
    data_dir: Optional[str] = None  # where dataset names resolve (<data_dir>/<name>.jsonl)
    limit: Optional[int] = None  # only the first N questions of each dataset (quick checks)
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])  # built-in arithmetic only
    samples: int = 32  # answers per question (paper: 32)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: Optional[int] = None  # response limit; None = rollout.max_response_length
    seed: int = 1
    out: str = "runs/eval"
    chunk_size: int = 8  # questions per work unit (the unit of resuming and of rank sharing)
    progress: bool = True


@dataclass
class DemoConfig:
    """python -m megatron_rlep.demo: baseline, pool, RLEP, evaluation and report in one run."""
    experiment: str = "cpu_demo"  # the training preset both runs share (conf/experiment/)
    # the built-in task: arithmetic (the preset as named), code or logic (<experiment>_<task>)
    task: str = "arithmetic"
    replay_per_prompt: int = 2  # M of the RLEP run; the baseline has 0
    seed: int = 1  # both runs, the pool and the evaluation
    out: str = "runs/demo"
    # a finished pool directory for RLEP to replay instead of the one built from this demo's
    # baseline (no pool stage): arms of a study that share one pool (docs/demo_runs.md)
    pool: Optional[str] = None
    pool_samples: int = 6  # answers sampled per training question for the pool
    pool_temperature: float = 0.7
    pool_top_p: float = 0.95
    min_correct: int = 2
    pool_dedupe: bool = False  # short arithmetic answers repeat word for word: keep them all
    eval_samples: int = 4  # answers per held-out question in the final evaluation
    # the report's fixed accuracy for steps-to-threshold: about twice the built-in model's
    # accuracy on the demo's held-out questions (0.11 on levels 3, 4 and 6)
    threshold: float = 0.2
    wandb: str = "disabled"  # online | offline | disabled, for both runs and the evaluations
    # matched: a third run, DAPO with G + M fresh rollouts per prompt (RLEP's group size and
    # sequences per step), evaluated and compared with RLEP: is the gain the replays or the
    # larger groups?
    compare: str = "none"
    progress: bool = True


SCHEMAS = {"config": Config, "build_pool": BuildPoolConfig, "evaluate": EvaluateConfig,
           "demo": DemoConfig}


def _register_schema() -> None:
    """Make ``base_config`` / ``build_pool_schema`` / ``evaluate_schema`` / ``demo_schema``
    (each schema with its defaults) the first entry of conf/config.yaml / build_pool.yaml /
    evaluate.yaml / demo.yaml."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=Config)
    ConfigStore.instance().store(name="build_pool_schema", node=BuildPoolConfig)
    ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
    ConfigStore.instance().store(name="demo_schema", node=DemoConfig)


_register_schema()

_SECTIONS = {cls.__name__: cls for cls in (ModelConfig, DataConfig, AlgorithmConfig,
                                           ReplayConfig, CorrectionConfig,
                                           RolloutConfig, ValidationConfig, ParallelConfig,
                                           LoggingConfig, VerifierConfig, CodeSandboxConfig)}

VERIFIER_MODES = ("dapo", "math", "code", "custom")  # also the tools' --mode / --verify

_CHOICES = {
    "algorithm.name": ("grpo", "dapo", "rlep"),
    "algorithm.loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
    "algorithm.replay.strategy": ("uniform", "rescue", "priority", "recent"),
    "algorithm.correction.is_level": ("auto", "token", "sequence"),
    "algorithm.correction.is_mode": ("truncate", "mask"),
    "algorithm.correction.baseline": ("plain", "weighted"),
    "algorithm.correction.rs_level": ("token", "sequence", "geometric"),
    "algorithm.correction.replay": ("on_policy", "stored", "down_weight"),
    "algorithm.filter_metric": ("acc", "reward"), "algorithm.short_batch": ("error", "train"),
    "algorithm.old_logp": ("actor", "rollout"),
    "rollout.engine": ("auto", "vllm", "transformers"),
    "logging.wandb": ("online", "offline", "disabled"),
    "verifier.mode": VERIFIER_MODES, "verifier.math_rule": ("dapo", "math"),
    "model.dtype": ("auto", "float32", "bfloat16"),
    "model.transformer_impl": ("auto", "transformer_engine", "local"),
    "parallel.recompute": ("none", "selective", "full"),
    "keep": ("random", "shortest", "diverse"), "split": ("train", "test"),
    "wandb": ("online", "offline", "disabled"), "compare": ("none", "matched"),
    "task": ("arithmetic", "code", "logic"), "rollout.placement": ("colocated", "disaggregated"),
    "rollout.partial_kv": ("recompute", "keep"),
}
_RANGES = {  # key: (low, high), inclusive; None = unbounded
    "algorithm.rollouts_per_prompt": (1, None), "algorithm.replay_per_prompt": (0, None),
    "algorithm.prompts_per_rollout": (1, None), "algorithm.prompts_per_update": (1, None),
    "algorithm.epochs": (1, None), "algorithm.clip_low": (0.0, 1.0),
    "algorithm.clip_high": (0.0, None), "algorithm.dual_clip": (1.0, None),
    "algorithm.overlong_buffer": (0, None), "algorithm.lr": (0.0, None), "algorithm.adam_eps": (0.0, None),
    "algorithm.warmup_steps": (0, None), "algorithm.max_skipped_updates": (0, None), "algorithm.max_gen_batches": (0, None), "algorithm.grad_clip": (0.0, None),
    "algorithm.total_steps": (0, None), "algorithm.replay.priority_floor": (0.0, 1.0),
    "algorithm.replay.cap": (1, None), "algorithm.pool_min_coverage": (0.0, 1.0),
    "algorithm.correction.is_threshold": (1.0, None), "algorithm.correction.rs_threshold": (1.0, None),
    "algorithm.correction.rs_threshold_lower": (0.0, 1.0),
    "algorithm.correction.replay_weight": (0.0, None), "rollout.temperature": (0.0, None),
    "rollout.top_p": (0.0, 1.0), "rollout.max_response_length": (1, None),
    "rollout.tensor_parallel": (1, None), "rollout.batch_size": (1, None),
    "rollout.gpu_memory_utilization": (0.0, 1.0),
    "rollout.dedicated_gpu_memory_utilization": (0.0, 1.0),
    "algorithm.max_staleness": (0, None), "rollout.ranks": (0, None),
    "rollout.segment_tokens": (1, None), "rollout.extra_prompts": (0, None),
    "rollout.timeout_s": (1.0, None), "rollout.connect_timeout_s": (1.0, None),
    "parallel.tensor_parallel": (1, None), "parallel.pipeline_parallel": (1, None),
    "parallel.expert_parallel": (1, None), "algorithm.router_aux_loss": (0.0, None),
    "parallel.micro_batch_size": (1, None), "parallel.max_tokens_per_micro_batch": (0, None),
    "parallel.logprob_chunk_tokens": (0, None), "data.train_size": (1, None),
    "data.eval_size": (1, None), "samples": (1, None), "questions": (1, None),
    "data.max_prompt_length": (1, None), "min_correct": (1, None), "shard_size": (1, None),
    "temperature": (0.0, None), "top_p": (0.0, 1.0), "max_keep": (1, None), "validation.n": (1, None),
    "validation.temperature": (0.0, None), "validation.top_p": (0.0, 1.0),
    "validation.max_response_length": (1, None),
    "logging.eval_every": (0, None), "logging.save_every": (0, None), "logging.keep_checkpoints": (0, None), "limit": (1, None),
    "max_tokens": (1, None), "chunk_size": (1, None), "replay_per_prompt": (1, None),
    "pool_samples": (1, None), "pool_temperature": (0.0, None), "pool_top_p": (0.0, 1.0),
    "eval_samples": (1, None), "verifier.workers": (1, None), "verifier.timeout_s": (0.1, None),
    "verifier.max_failures": (0.0, 1.0), "verifier.code.wall_s": (0.1, None),
    "verifier.code.cpu_s": (1, None), "verifier.code.memory_mb": (16, None),
    "verifier.code.nproc": (1, None), "verifier.code.fsize_mb": (1, None),
    "verifier.code.tmpfs_mb": (1, None), "verifier.code.output_kb": (1, None),
}


def _get(cfg: Config, dotted: str) -> Any:
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _check_values(cfg) -> None:
    """Check every listed key the schema of ``cfg`` has (unset optional keys are skipped), and
    resolve ``algorithm.correction.is_level=auto``."""
    if isinstance(cfg, Config) and cfg.algorithm.correction.is_level == "auto":
        # under asynchronous rollout AReaL's decoupled loss (megatron_rlep/correction.py)
        a = cfg.algorithm  # (old_logp=rollout under staleness is refused below)
        a.correction.is_level = "token" if a.max_staleness and a.old_logp == "actor" else None
    def value_of(key):
        try:
            return _get(cfg, key)
        except AttributeError:
            return None

    for key, allowed in _CHOICES.items():
        if value_of(key) is not None and value_of(key) not in allowed:
            raise ConfigError(f"config key {key}={_get(cfg, key)!r} is not allowed; use one of "
                              f"{', '.join(allowed)}.")
    for key, (low, high) in _RANGES.items():
        value = value_of(key)
        if value is None:
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise ConfigError(f"config key {key}={value} is out of range; it must be {bound}.")
    if isinstance(cfg, Config) and cfg.algorithm.prompts_per_rollout % cfg.algorithm.prompts_per_update:
        raise ConfigError(
            f"config key algorithm.prompts_per_update={cfg.algorithm.prompts_per_update} does "
            f"not divide algorithm.prompts_per_rollout={cfg.algorithm.prompts_per_rollout}; "
            f"pick a divisor so every update sees whole groups.")
    if isinstance(cfg, Config) and cfg.algorithm.old_logp == "rollout":
        c, top_p = cfg.algorithm.correction, cfg.rollout.top_p
        if c.is_level is not None or c.rs_level is not None:
            raise ConfigError("config key algorithm.old_logp=rollout makes the engine's log-probs "
                              "the old policy's, so algorithm.correction has no mismatch left to "
                              "correct; unset algorithm.correction.is_level and rs_level, or use "
                              "algorithm.old_logp=actor.")
        if top_p < 1:
            raise ConfigError(f"config key algorithm.old_logp=rollout needs rollout.top_p=1: with "
                              f"rollout.top_p={top_p} the engine's log-probs are of the truncated "
                              "distribution, not the policy's; set rollout.top_p=1 or use "
                              "algorithm.old_logp=actor.")
    if isinstance(cfg, Config):
        _check_asynchrony(cfg)
    if isinstance(cfg, Config) and cfg.algorithm.kl_coef != 0:
        raise ConfigError(f"config key algorithm.kl_coef={cfg.algorithm.kl_coef} asks for a KL "
                          "term against a reference policy, which this trainer does not build "
                          "(RLEP and DAPO train without one); set algorithm.kl_coef=0.")
    verifier = getattr(cfg, "verifier", None)
    if verifier is not None and (verifier.mode == "custom") != bool(verifier.function):
        raise ConfigError("config key verifier.function names the reward function of "
                          "verifier.mode=custom and only of it; give verifier=custom "
                          "verifier.function=FILE.py:NAME together (or neither).")
    if isinstance(cfg, Config) and cfg.parallel.share_prompts and cfg.parallel.pack_sequences:
        raise ConfigError("config keys parallel.share_prompts and parallel.pack_sequences are two "
                          "ways to pack a micro-batch; set one of them to false.")


def _check_asynchrony(cfg: Config) -> None:
    """Asynchronous settings that need a staleness bound, or would add staleness twice."""
    a, r = cfg.algorithm, cfg.rollout
    if (r.partial or r.extra_prompts) and a.max_staleness < 1:
        what = "rollout.partial=true continues answers under newer weights" if r.partial else \
            f"rollout.extra_prompts={r.extra_prompts} carries finished groups into later steps"
        raise ConfigError(f"config key {what}, so their tokens come from older policies; set "
                          "algorithm.max_staleness to 1 or more (how many versions behind a "
                          "trained token may be).")
    if r.placement == "disaggregated" and r.ranks < 1:
        raise ConfigError("config key rollout.placement=disaggregated needs rollout.ranks: how "
                          "many of the job's ranks run the engines (e.g. rollout.ranks=1).")
    if a.max_staleness and a.old_logp == "rollout":
        raise ConfigError(f"config key algorithm.old_logp=rollout takes the engine's log-probs as "
                          f"the old policy's, but with algorithm.max_staleness={a.max_staleness} "
                          "they are of a policy up to that many versions older: the two would "
                          "add staleness twice; use algorithm.old_logp=actor (the policy before "
                          "this update) and algorithm.correction for the rest.")


def _known_keys(node: Any) -> list[str]:
    if dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    return []


def _unknown_key(key: str, schema: type = Config) -> ConfigError:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    try:
        node = _get(schema(), parent) if parent else schema()
    except AttributeError:
        node = None
    known = ", ".join(_known_keys(node)) or "listed in megatron_rlep/config.py"
    return ConfigError(f"config key {key} is unknown; the keys of {parent or 'the top level'} "
                       f"are {known}.")


def _one_sentence(err: OmegaConfBaseException, schema: type = Config) -> ConfigError:
    key = getattr(err, "full_key", None) or "?"
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "not in" in text or "not found" in text or "Missing key" in text:
        return _unknown_key(key, schema)
    if "is not a ListConfig" in text:
        return ConfigError(f"config key {key} takes a list; write it in brackets, e.g. "
                           f"{key}=[aime24,amc23] (a bare a,b is a sweep of two runs).")
    return ConfigError(f"config key {key} has a wrong value ({text}); fix it to match the "
                       f"type in megatron_rlep/config.py.")


def _reject_unknown_keys(node: DictConfig, schema: type, prefix: str = "", root: type = None) -> None:
    """Hydra's ``+key=value`` can add keys to the schema; refuse any key it does not define."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise _unknown_key(prefix + str(key), root or schema)
        child_type = fields[key].type
        child_type = _SECTIONS.get(child_type, child_type)  # annotations are strings here
        if dataclasses.is_dataclass(child_type) and isinstance(node[key], DictConfig):
            _reject_unknown_keys(node[key], child_type, f"{prefix}{key}.", root or schema)


def load_config(raw: DictConfig | dict, schema: type = Config):
    """Check a composed config against ``schema`` and return it as that dataclass."""
    raw = raw if isinstance(raw, (DictConfig, ListConfig)) else OmegaConf.create(raw)
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    _reject_unknown_keys(raw, schema)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), raw)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _one_sentence(err, schema) from None
    _check_values(cfg)
    return cfg


def presets(group: str) -> list[str]:
    """The options of a config group: the YAML files under ``conf/<group>/``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_preset(group: str, name: str) -> None:
    """Stop in one sentence when ``conf/<group>/<name>.yaml`` does not exist (Hydra silently
    skips an optional group, such as ``experiment``, whose option is missing)."""
    if name not in presets(group):
        key = {"model": "model.path", "data": "data.train"}.get(group)
        hint = f" (a path goes in {key}={name})" if key and "/" in name else ""
        raise ConfigError(f"{group}={name} names no preset in conf/{group}/{hint}; the presets "
                          f"are {', '.join(presets(group))}.")


# keys of a schema's own that share a name with a config group: set after Hydra composes
_OWN_KEYS = {"demo": ("experiment",)}


def compose(overrides: list[str] = (), config_name: str = "config"):
    """Compose ``conf/<config_name>.yaml`` with command-line style overrides and check it
    against its schema (``SCHEMAS``). Every group option named (``experiment=...``,
    ``model=...``) must be a file under ``conf/<group>/``."""
    schema = SCHEMAS[config_name]
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException

    own, overrides = {}, list(overrides)
    for override in list(overrides):
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in _OWN_KEYS.get(config_name, ()):
            own[key] = value.strip("'\"")
            overrides.remove(override)
        if (CONF_DIR / key).is_dir() and value not in ("", "null"):
            check_preset(key, value.strip("'\""))
    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            raw = hydra_compose(config_name, overrides=overrides)
    except OmegaConfBaseException as err:
        raise _one_sentence(err, schema) from None
    except HydraException as err:
        if isinstance(err.__cause__, OmegaConfBaseException):
            raise _one_sentence(err.__cause__, schema) from None
        text = str(err).strip()
        unknown = re.search(r"Could not override '([\w.]+)'", text)
        if unknown:
            raise _unknown_key(unknown.group(1), schema) from None
        first = text.splitlines()[0].strip()
        raise ConfigError(f"config override failed: {first} (check the group option's name "
                          f"under conf/ and the key's spelling).") from None
    cfg = load_config(raw, schema)
    for key, value in own.items():
        setattr(cfg, key, value)
    return cfg


# Hydra's own flags that take a value (``--cfg job``), and the values ``--info`` may take
_HYDRA_VALUED = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                 "--config-dir", "-cd", "--experimental-rerun"}
_INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _without_hydra_flags(argv: list[str]) -> list[str]:
    """The overrides of a command line: Hydra's flags (``-m``, ``--cfg job --resolve``,
    ``--info``, ``--help``) and their values left out."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in _HYDRA_VALUED or (arg in ("--info", "-i") and i + 1 < len(argv)
                                      and argv[i + 1] in _INFO_VALUES):
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The jobs of a Hydra command line: sweeps (``key=a,b``) expanded as ``-m`` would, in
    Hydra's order (the last key varies fastest)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    plain = [o for o in _without_hydra_flags(overrides) if not o.startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except OverrideParseException as err:
        raise ConfigError(f"a command-line override cannot be parsed ({str(err).splitlines()[0]}); "
                          "write key=value, quoting values with spaces or '='.") from None
    jobs: list[list[str]] = [[]]
    for override in parsed:
        values = (list(override.sweep_string_iterator()) if override.is_sweep_override()
                  else [override.get_value_element_as_str()])
        key = override.get_key_element()
        jobs = [job + [f"{key}={value}"] for job in jobs for value in values]
    return jobs


def check_overrides(overrides: list[str], config_name: str = "config") -> None:
    """Compose and check every job of a command line (sweeps expanded) before Hydra runs it."""
    for job in expand_sweep(overrides):
        compose(job, config_name)
