"""The typed configuration: one dataclass per Hydra group, checked on load.

``conf/`` holds the YAML tree (groups model, data, algorithm, rollout, parallel, logging,
verifier, and ``experiment/`` presets); the dataclasses here are its schema. ``load_config``
turns a composed Hydra config into a ``Config``; any unknown key, wrong type or out-of-range
value raises ``ConfigError`` with one sentence that names the key. ``check_overrides`` does the
same for a command line before Hydra starts, so a typo never reaches a traceback.

A key is one line in its group's dataclass: its type, its default and, where it has them, its
allowed values (``one_of``) or range (``at_least``, ``between``). A rule between keys is the
``check`` method of the group that holds them (``Config.check`` for rules across groups).

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

VERIFIER_MODES = ("dapo", "math", "code", "custom")  # also the tools' --mode / --verify


# A key's field with its allowed values or range, which ``load_config`` checks (an unset optional
# key is not checked): the key, its default and its check in one line of its dataclass.
def one_of(*allowed: str, default: Optional[str]):
    """The field of a key whose value must be one of ``allowed`` (or null, where Optional)."""
    return field(default=default, metadata={"one_of": allowed})


def at_least(low: float, *, default: Optional[float]):
    """The field of a key whose value must be ``>= low`` (or null, where Optional)."""
    return field(default=default, metadata={"range": (low, None)})


def between(low: float, high: float, *, default: Optional[float]):
    """The field of a key whose value must lie in ``[low, high]`` (or null, where Optional)."""
    return field(default=default, metadata={"range": (low, high)})


@dataclass
class ModelConfig:
    path: str = "smollm2-135m"  # a built-in name or a Hugging Face checkpoint directory
    # auto = bf16 on GPU, fp32 on CPU
    dtype: str = one_of("auto", "float32", "bfloat16", default="auto")
    # layer specs: auto = Transformer Engine when it imports (else local, said once);
    # transformer_engine = stop when TE does not import; local = Megatron-Core's local specs
    transformer_impl: str = one_of("auto", "transformer_engine", "local", default="auto")
    # true: stop at start when no CUDA GPU is visible (a model too large for a CPU; the 7B
    # preset sets it), and the Slurm preflight fails on a node without the GPUs for its ranks
    needs_gpu: bool = False


@dataclass
class DataConfig:
    train: str = "arithmetic"  # built-in task, .parquet/.jsonl path, name under data_dir, hub id
    eval: list[str] = field(default_factory=lambda: ["arithmetic"])
    data_dir: Optional[str] = None
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])  # built-in task only
    train_size: int = at_least(1, default=256)  # built-in task only
    eval_size: int = at_least(1, default=64)  # built-in task only
    max_prompt_length: int = at_least(1, default=1024)


@dataclass
class ReplayConfig:
    """Which pool answers go into which group (megatron_rlep/replay.py)."""
    # uniform (the paper) | rescue | priority | recent
    strategy: str = one_of("uniform", "rescue", "priority", "recent", default="uniform")
    # priority: the least chance a prompt gets its replays
    priority_floor: float = between(0.0, 1.0, default=0.1)
    refresh: bool = False  # live pool: this run's verified, finished fresh answers join the pool
    # live pool: answers kept per question, the oldest versions evicted first
    cap: int = at_least(1, default=8)


@dataclass
class CorrectionConfig:
    """Off-policy correction (megatron_rlep/correction.py; verl's rollout_correction names)."""
    # auto | null | token | sequence [rollout_is]; auto: token under asynchronous rollout
    # (algorithm.max_staleness > 0: the decoupled loss, truncated as verl does), null otherwise
    is_level: Optional[str] = one_of("auto", "token", "sequence", default="auto")
    # truncation C of the weights [rollout_is_threshold]
    is_threshold: float = at_least(1.0, default=2.0)
    # above C: truncate the weight to C | mask: drop the token (AReaL)
    is_mode: str = one_of("truncate", "mask", default="truncate")
    # the groups' mean and spread: plain | weighted (fresh answers weighted by their sequence
    # ratio pi_old / pi_behaviour within [1/C, C]: the baseline of the policy being trained) |
    # fresh (a replay's reward centred on its group's fresh answers alone, the answers of the
    # policies being trained, not on a mean its fellow replays lift; fresh answers' as plain)
    baseline: str = one_of("plain", "weighted", "fresh", default="plain")
    # M2PO (arXiv 2510.01161): the fresh tokens with the largest squared log-ratio
    # log(pi_old / pi_behaviour)^2 leave the loss until the rest's mean is at most this (the
    # paper's tau = 0.04); null: off
    m2_threshold: Optional[float] = at_least(0.0, default=None)
    # null | token | sequence | geometric [rollout_rs]
    rs_level: Optional[str] = one_of("token", "sequence", "geometric", default=None)
    # upper bound; null: is_threshold [rollout_rs_threshold]
    rs_threshold: Optional[float] = at_least(1.0, default=None)
    # null: 1 / upper [rollout_rs_threshold_lower]
    rs_threshold_lower: Optional[float] = between(0.0, 1.0, default=None)
    # replayed answers: on_policy (the paper) | stored | down_weight
    replay: str = one_of("on_policy", "stored", "down_weight", default="on_policy")
    # down_weight: the factor on a replayed answer's token losses
    replay_weight: float = at_least(0.0, default=0.5)


@dataclass
class AlgorithmConfig:
    name: str = one_of("grpo", "dapo", "rlep", default="rlep")
    rollouts_per_prompt: int = at_least(1, default=16)  # G
    replay_per_prompt: int = at_least(0, default=2)  # M (0 = no replay)
    pool: Optional[str] = None  # experience pool: pool directory or RLEP release parquet
    fill_absent: bool = True  # a question absent from the pool gets G + M fresh rollouts (else G)
    replay_distinct: bool = False  # M distinct texts (else M stored answers, repeats too: the reference)
    pool_drop_rejected: bool = False  # drop pool answers the verifier rejects (else keep, counted)
    pool_partial: bool = False  # read a pool directory whose build has not finished (no manifest)
    # stop when fewer of the training questions have pool answers (questions match by their
    # prompt text: a pool of other data covers none, and RLEP would silently be DAPO)
    pool_min_coverage: float = between(0.0, 1.0, default=0.1)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    prompts_per_rollout: int = at_least(1, default=512)
    prompts_per_update: int = at_least(1, default=64)
    epochs: int = at_least(1, default=1)
    # the old policy's log-probs of the fresh answers in the step's later mini-batches: actor (a
    # forward pass of the actor before the first update) | rollout (the engine's, recorded as it
    # sampled; no forward pass, docs/training.md). The first mini-batch takes its own forward's.
    old_logp: str = one_of("actor", "rollout", default="actor")
    # asynchronous rollout: a group trains at most this many policy versions after its oldest
    # token was sampled (0: today's synchronous trainer; docs/training.md, "Asynchronous rollout")
    max_staleness: int = at_least(0, default=0)
    clip_low: float = between(0.0, 1.0, default=0.2)
    clip_high: float = at_least(0.0, default=0.28)
    dual_clip: float = at_least(1.0, default=10.0)
    # verl's token-mean | seq-mean-token-mean | seq-mean-token-sum
    loss_agg: str = one_of("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                           default="token-mean")
    normalize_std: bool = True
    kl_coef: float = 0.0  # must stay 0: no reference policy is built (refused when checked)
    entropy_coef: float = 0.0
    overlong_buffer: int = at_least(0, default=512)
    overlong_factor: float = 1.0
    dynamic_sampling: bool = False  # drop groups whose answers are all right or all wrong
    # acc (the reference) | reward (the shaped reward)
    filter_metric: str = one_of("acc", "reward", default="acc")
    # generation batches per step in all, the first included (0: no limit)
    max_gen_batches: int = at_least(0, default=10)
    # still short after them: error (the reference) | train on those kept
    short_batch: str = one_of("error", "train", default="error")
    lr: float = at_least(0.0, default=1e-6)
    # rollout steps of linear warm-up (every update of a step: one LR)
    warmup_steps: int = at_least(0, default=10)
    warmup_from_zero: bool = False  # step k at lr * k / warmup, the first at 0 (the reference)
    weight_decay: float = 0.1
    # false: Megatron's groups, biases and norms undecayed; true: every parameter decayed, as the
    # reference's AdamW over all parameters (the paper presets)
    weight_decay_all: bool = False
    # Adam's epsilon (a gradient element far below it barely moves)
    adam_eps: float = at_least(0.0, default=1e-8)
    grad_clip: float = at_least(0.0, default=1.0)
    # an update whose gradient norm is not finite is skipped (actor/skipped_updates); this many
    # in a row stop the run with a checkpoint of the weights before them (0: never stop)
    max_skipped_updates: int = at_least(0, default=3)
    # a mixture-of-experts model's router load-balancing loss coefficient (0: off, as RL
    # trainers run it; the checkpoint's router_aux_loss_coef is for pre-training)
    router_aux_loss: float = at_least(0.0, default=0.0)
    total_steps: int = at_least(0, default=400)

    def resolve(self) -> None:
        """``correction.is_level=auto`` made what it means: token under asynchronous rollout
        (the decoupled loss, megatron_rlep/correction.py), null otherwise (old_logp=rollout
        under staleness is refused by ``check``)."""
        c = self.correction
        if c.is_level == "auto":
            c.is_level = "token" if self.max_staleness and self.old_logp == "actor" else None

    def check(self) -> None:
        """The rules between the algorithm's keys (``auto`` resolved first)."""
        c = self.correction
        if self.prompts_per_rollout % self.prompts_per_update:
            raise ConfigError(
                f"config key algorithm.prompts_per_update={self.prompts_per_update} does "
                f"not divide algorithm.prompts_per_rollout={self.prompts_per_rollout}; "
                f"pick a divisor so every update sees whole groups.")
        if self.old_logp == "rollout" and (c.is_level is not None or c.rs_level is not None or
                                           c.m2_threshold is not None):
            raise ConfigError("config key algorithm.old_logp=rollout makes the engine's log-probs "
                              "the old policy's, so algorithm.correction has no mismatch left to "
                              "correct; unset algorithm.correction.is_level and rs_level, or use "
                              "algorithm.old_logp=actor.")
        if self.max_staleness and self.old_logp == "rollout":
            raise ConfigError(f"config key algorithm.old_logp=rollout takes the engine's log-probs "
                              f"as the old policy's, but with algorithm.max_staleness="
                              f"{self.max_staleness} they are of a policy up to that many versions "
                              "older: the two would add staleness twice; use algorithm.old_logp="
                              "actor (the policy before this update) and algorithm.correction for "
                              "the rest.")
        if self.kl_coef != 0:
            raise ConfigError(f"config key algorithm.kl_coef={self.kl_coef} asks for a KL "
                              "term against a reference policy, which this trainer does not build "
                              "(RLEP and DAPO train without one); set algorithm.kl_coef=0.")


@dataclass
class RolloutConfig:
    engine: str = one_of("auto", "vllm", "transformers", default="auto")
    temperature: float = at_least(0.0, default=1.0)
    top_p: float = between(0.0, 1.0, default=1.0)
    max_response_length: int = at_least(1, default=3072)
    tensor_parallel: int = at_least(1, default=1)
    # vLLM on GPU, beside the actor (colocated)
    gpu_memory_utilization: float = between(0.0, 1.0, default=0.6)
    # vLLM on a GPU of its own (rollout.placement=disaggregated): no actor beside it, no sleep
    dedicated_gpu_memory_utilization: float = between(0.0, 1.0, default=0.9)
    cpu_kv_cache_gib: float = 1.0  # vLLM on CPU: KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    # vLLM on CPU: torch.compile the model (faster rollouts; the engine's start compiles,
    # docs/training.md has the costs) instead of running it eagerly
    cpu_compile: bool = False
    batch_size: int = at_least(1, default=64)  # sequences per generate call (transformers engine)
    check_sync: bool = False  # after each weight sync, compare engine and actor log-probs
    # asynchronous rollout (algorithm.max_staleness > 0; docs/training.md): where the engines run:
    # colocated (the training ranks, time-sliced) | disaggregated (the job's last `ranks` ranks
    # generate while the others train; weights go to them by broadcast after each update)
    placement: str = one_of("colocated", "disaggregated", default="colocated")
    ranks: int = at_least(0, default=0)
    # partial rollouts: answers grow segment_tokens at a time and unfinished ones go on under
    # the weights of later updates, their tokens tagged with the version that sampled them
    partial: bool = False
    segment_tokens: int = at_least(1, default=64)
    # an answer continued after new weights: recompute its KV cache with them (the engine gets
    # prompt and tokens so far again) | keep the KV its tokens had (vLLM's prefix cache is not
    # reset after a weight load; computed by the older weights, as PipelineRL keeps it)
    partial_kv: str = one_of("recompute", "keep", default="recompute")
    # over-provisioning: prompts in flight beyond an update's
    extra_prompts: int = at_least(0, default=0)
    # disaggregated: the longest a learner waits on the rollout ranks
    timeout_s: float = at_least(1.0, default=600.0)
    # disaggregated: the longest any rank waits at start-up for the others to reach the bridge
    connect_timeout_s: float = at_least(1.0, default=1800.0)
    # disaggregated: the longest one weight sync may take once every rollout rank is ready for
    # it (the bucket broadcasts; NCCL's own timeout is set a minute beyond it)
    sync_timeout_s: float = at_least(1.0, default=300.0)
    # tools in the loop (rollout/tools.py; docs/tools.md): their names (python, or a
    # function of your own as module:function), the most calls an answer makes, each call's
    # wall-clock limit, the characters of its output the model reads, the calls run at once
    tools: list[str] = field(default_factory=list)
    max_turns: int = at_least(1, default=4)
    tool_timeout_s: float = at_least(0.1, default=5.0)
    tool_output_chars: int = at_least(16, default=512)
    tool_workers: int = at_least(1, default=8)
    # how the model calls them: fence (a ```python block, its output in an ```output block) |
    # chat (the chat template's <tool_call> and tool messages; rollout/chat_tools.py), with the
    # template the prompts are rendered with in that format: null (the tokenizer's) | hermes
    # (the project's, the format of Qwen2.5 and Qwen3) | the path of a Jinja file
    tool_format: str = one_of("fence", "chat", default="fence")
    chat_template: Optional[str] = None

    def check(self) -> None:
        if self.chat_template is not None and self.tool_format != "chat":
            raise ConfigError(f"config key rollout.chat_template={self.chat_template!r} is for "
                              "tools in the chat format; set rollout.tool_format=chat or drop it.")
        if self.tools and self.engine != "transformers" and self.tensor_parallel > 1:
            raise ConfigError(f"config key rollout.tools runs each tool call once per engine, "
                              f"but rollout.tensor_parallel={self.tensor_parallel} would run it "
                              "on every rank of the engine; set rollout.tensor_parallel=1.")


@dataclass
class ValidationConfig:
    """Sampling of the held-out answers at validation (verl's val_kwargs); unset keys take the
    rollout's value."""
    n: int = at_least(1, default=1)  # answers per held-out question
    temperature: Optional[float] = at_least(0.0, default=None)
    top_p: Optional[float] = between(0.0, 1.0, default=None)
    max_response_length: Optional[int] = at_least(1, default=None)


@dataclass
class ParallelConfig:
    tensor_parallel: int = at_least(1, default=1)
    pipeline_parallel: int = at_least(1, default=1)
    micro_batch_size: int = at_least(1, default=4)  # sequences per micro-batch at most
    # and tokens per micro-batch at most, padding included (0: no budget; verl's dynamic batch
    # size): long answers go in small micro-batches, short ones in large
    max_tokens_per_micro_batch: int = at_least(0, default=0)
    # memory (tools/memory_plan.py shows each one's effect): activation recompute none |
    # selective (core attention) | full (each layer from its input); bf16 gradient buffers
    # instead of fp32 (bf16 models only); log-probs through the output layer this many response
    # tokens at a time, each chunk recomputed in backward (0: all at once)
    recompute: str = one_of("none", "selective", "full", default="none")
    bf16_grads: bool = False
    logprob_chunk_tokens: int = at_least(0, default=0)
    sequence_parallel: bool = False  # with TP > 1: norms' and residuals' activations split too
    # a mixture-of-experts model's experts spread over this many ranks (whole experts: expert
    # TP 1); at TP > 1 a MoE model needs sequence_parallel (Megatron-Core's MoE layer)
    expert_parallel: int = at_least(1, default=1)
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

    def check(self) -> None:
        if self.share_prompts and self.pack_sequences:
            raise ConfigError("config keys parallel.share_prompts and parallel.pack_sequences are "
                              "two ways to pack a micro-batch; set one of them to false.")


@dataclass
class ActorConfig:
    # a mixture-of-experts model's routes (megatron_rlep/actor/routing.py): none | actor (R2:
    # the update's passes send each token to the experts the old-log-prob pass chose) |
    # rollout (R3: the fresh answers' tokens to the experts the engine chose, the rest as R2)
    routing_replay: str = one_of("none", "actor", "rollout", default="none")


@dataclass
class LoggingConfig:
    wandb: str = one_of("online", "offline", "disabled", default="offline")
    project: str = "megatron_rlep"
    name: Optional[str] = None
    group: Optional[str] = None  # wandb group; default: $WANDB_RUN_GROUP, else the run's name
    log_every: int = 1
    # validation every N steps (0: never), and at the first and last step
    eval_every: int = at_least(0, default=10)
    save_every: int = at_least(0, default=50)  # checkpoint every N steps (0: only at the end)
    # the newest N checkpoints stay on disk, older ones go (0: all)
    keep_checkpoints: int = at_least(0, default=0)
    # the best validation step's weights stay too (checkpoints/best, weights only; its export:
    # tools/export_hf.py RUN_DIR --best)
    keep_best: bool = True
    dump_batches: bool = False  # write each step's groups to run_dir/batches/ (debugging, tests)
    progress: bool = True  # a live progress bar on rank 0


@dataclass
class CodeSandboxConfig:
    """What a code answer's program may use, per test run (megatron_rlep/reward/sandbox/)."""
    # time running or asleep (not waiting for a CPU); 10x wall clock at most
    wall_s: float = at_least(0.1, default=10.0)
    cpu_s: int = at_least(1, default=10)
    memory_mb: int = at_least(16, default=1024)
    nproc: int = at_least(1, default=32)  # processes (a fork bomb stops there)
    fsize_mb: int = at_least(1, default=16)  # the largest file it may write
    tmpfs_mb: int = at_least(1, default=64)  # its whole work directory
    output_kb: int = at_least(1, default=1024)  # stdout, and stderr; more kills it
    partial_credit: bool = False  # score 2 x the share of tests passed - 1 (else all or none)
    # true: test files that patch the answer's objects (mock, monkeypatch) run in the answer's
    # own process, where a program written to defeat the harness can forge a pass; false (the
    # default): every test runs in the judge's process and such files fail there
    in_process_patching: bool = False


@dataclass
class SandboxConfig:
    """What every sandboxed program gets, a code answer's and a tool call's alike
    (megatron_rlep/reward/sandbox/; docs/sandbox_threat_model.md)."""
    # installed distributions a program may import, read-only, with those they require; those
    # not installed are left out, and the start-up line names what is in
    packages: list[str] = field(default_factory=lambda: ["numpy", "sympy"])
    # layers a program may run without where the kernel or the container refuses them
    # (namespaces, landlock, seccomp), each then named in the start-up line; empty: a node that
    # refuses one stops the run at start
    allow_missing: list[str] = field(default_factory=list)

    def check(self) -> None:
        from megatron_rlep.reward.sandbox import LAYERS

        unknown = [layer for layer in self.allow_missing if layer not in LAYERS]
        if unknown:
            raise ConfigError(f"config key sandbox.allow_missing names {unknown}, which is no "
                              f"layer of the sandbox; the layers are {', '.join(LAYERS)}.")


@dataclass
class VerifierConfig:
    # dapo | math: the math rule for every answer; code: the code checker for every answer;
    # custom: by data_source as verl does (math -> math_rule, code -> the code checker, the
    # rest -> function)
    mode: str = one_of(*VERIFIER_MODES, default="dapo")
    function: Optional[str] = None  # custom: FILE.py:NAME or module:NAME, verl's signature
    math_rule: str = one_of("dapo", "math", default="dapo")  # custom: math data sources' rule
    workers: int = at_least(1, default=1)  # scoring processes per rank
    # an answer's scoring deadline (a code answer: all its tests)
    timeout_s: float = at_least(0.1, default=30.0)
    # a larger share of a step's rewards raising or timing out stops it
    max_failures: float = between(0.0, 1.0, default=0.1)
    code: CodeSandboxConfig = field(default_factory=CodeSandboxConfig)

    def check(self) -> None:
        if (self.mode == "custom") != bool(self.function):
            raise ConfigError("config key verifier.function names the reward function of "
                              "verifier.mode=custom and only of it; give verifier=custom "
                              "verifier.function=FILE.py:NAME together (or neither).")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    seed: int = 1
    run_dir: str = "runs/default"
    resume: bool = True  # continue from run_dir/checkpoints/latest when it exists
    # on resume, check every file's checksum against the checkpoint's manifest, not only its
    # size (docs/cluster.md: what it costs against a load)
    resume_verify: bool = False
    samples: int = at_least(1, default=4)  # quickstart: answers per question
    questions: int = at_least(1, default=8)  # quickstart: questions shown

    def check(self) -> None:
        """The rules between groups: the rollout's settings the algorithm's need (the tools'
        schemas take the rollout group too, but neither its placement nor asynchrony)."""
        a, r = self.algorithm, self.rollout
        if a.old_logp == "rollout" and r.top_p < 1:
            raise ConfigError(f"config key algorithm.old_logp=rollout needs rollout.top_p=1: with "
                              f"rollout.top_p={r.top_p} the engine's log-probs are of the "
                              "truncated distribution, not the policy's; set rollout.top_p=1 or "
                              "use algorithm.old_logp=actor.")
        c = a.correction
        weighed = [f"algorithm.correction.{key}={value}" for key, value in (
            ("is_level", c.is_level), ("rs_level", c.rs_level), ("m2_threshold", c.m2_threshold),
            ("baseline", "weighted" if c.baseline == "weighted" else None)) if value is not None]
        if weighed and r.top_p < 1:
            raise ConfigError(
                f"config key {weighed[0]} compares the actor's log-probs with the engine's "
                "(is_level=token is the default when algorithm.max_staleness > 0), and with "
                f"rollout.top_p={r.top_p} the engine's are of the nucleus-renormalised "
                "distribution, not the softmax the actor computes; set rollout.top_p=1, or "
                "algorithm.correction.is_level=null to train stale tokens without the weights.")
        if (r.partial or r.extra_prompts) and a.max_staleness < 1:
            what = "rollout.partial=true continues answers under newer weights" if r.partial else \
                f"rollout.extra_prompts={r.extra_prompts} carries finished groups into later steps"
            raise ConfigError(f"config key {what}, so their tokens come from older policies; set "
                              "algorithm.max_staleness to 1 or more (how many versions behind a "
                              "trained token may be).")
        problem = rollout_routes_problem(self)
        if problem:
            raise ConfigError(problem)
        if r.placement == "disaggregated" and r.ranks < 1:
            raise ConfigError("config key rollout.placement=disaggregated needs rollout.ranks: how "
                              "many of the job's ranks run the engines (e.g. rollout.ranks=1).")
        if r.placement == "disaggregated" and r.ranks % r.tensor_parallel:
            raise ConfigError(f"config key rollout.ranks={r.ranks} is not a multiple of "
                              f"rollout.tensor_parallel={r.tensor_parallel}: each engine takes "
                              "that many ranks")


def rollout_routes_problem(cfg: "Config") -> str | None:
    """Why ``actor.routing_replay=rollout`` (R3) cannot run with these settings, or None: the
    routes come from the transformers engine."""
    r = cfg.rollout
    if cfg.actor.routing_replay != "rollout" or r.engine == "transformers":
        return None
    return (f"config key actor.routing_replay=rollout takes the engine's routes, which "
            f"rollout.engine={r.engine} does not return to the trainer yet (vLLM returns them "
            "only from its V2 model runner, which needs Triton); set rollout.engine=transformers "
            "or actor.routing_replay=actor.")


@dataclass
class BuildPoolConfig:
    """tools/build_pool.py: sample, verify and keep answers per training question."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    seed: int = 1
    split: str = one_of("train", "test", default="train")
    samples: int = at_least(1, default=64)  # answers sampled per question (paper: 64)
    temperature: float = at_least(0.0, default=0.7)
    top_p: float = between(0.0, 1.0, default=0.95)
    # keep a question only with at least this many verified answers
    min_correct: int = at_least(1, default=2)
    finished_only: bool = True  # keep answers that ended with EOS (not cut at max_response_length)
    dedupe: bool = True  # drop exact duplicate answers (counted once toward min_correct)
    max_keep: Optional[int] = at_least(1, default=None)  # at most this many answers per question
    # which answers max_keep keeps
    keep: str = one_of("random", "shortest", "diverse", default="random")
    out: str = "runs/pool"
    shard_size: int = at_least(1, default=32)  # questions per shard file
    progress: bool = True


@dataclass
class EvaluateConfig:
    """tools/evaluate.py: n answers per held-out question, scored, with mean@n, pass@k, maj@k."""
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # wandb, project, name only
    datasets: list[str] = field(default_factory=lambda: ["aime24", "aime25", "amc23"])
    data_dir: Optional[str] = None  # where dataset names resolve (<data_dir>/<name>.jsonl)
    # only the first N questions of each dataset (quick checks)
    limit: Optional[int] = at_least(1, default=None)
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])  # built-in arithmetic only
    samples: int = at_least(1, default=32)  # answers per question (paper: 32)
    temperature: float = at_least(0.0, default=1.0)
    top_p: float = between(0.0, 1.0, default=1.0)
    # response limit; None = rollout.max_response_length
    max_tokens: Optional[int] = at_least(1, default=None)
    seed: int = 1
    out: str = "runs/eval"
    # questions per work unit (the unit of resuming and of rank sharing)
    chunk_size: int = at_least(1, default=8)
    progress: bool = True


@dataclass
class DemoConfig:
    """python -m megatron_rlep.demo: baseline, pool, RLEP, evaluation and report in one run."""
    experiment: str = "cpu_demo"  # the training preset both runs share (conf/experiment/)
    # the built-in task: arithmetic (the preset as named), calculator or chain (with a Python
    # tool), code or logic (<experiment>_<task>)
    task: str = one_of("arithmetic", "calculator", "chain", "code", "logic",
                       default="arithmetic")
    replay_per_prompt: int = at_least(1, default=2)  # M of the RLEP run; the baseline has 0
    seed: int = 1  # both runs, the pool and the evaluation
    out: str = "runs/demo"
    # a finished pool directory for RLEP to replay instead of the one built from this demo's
    # baseline (no pool stage): arms of a study that share one pool (docs/staleness.md)
    pool: Optional[str] = None
    pool_samples: int = at_least(1, default=6)  # answers sampled per training question for the pool
    pool_temperature: float = at_least(0.0, default=0.7)
    pool_top_p: float = between(0.0, 1.0, default=0.95)
    min_correct: int = at_least(1, default=2)
    pool_dedupe: bool = False  # short arithmetic answers repeat word for word: keep them all
    # answers per held-out question in the final evaluation
    eval_samples: int = at_least(1, default=4)
    # the report's fixed accuracy for steps-to-threshold: about twice the built-in model's
    # accuracy on the demo's held-out questions (0.11 on levels 3, 4 and 6)
    threshold: float = 0.2
    # for both runs and the evaluations
    wandb: str = one_of("online", "offline", "disabled", default="disabled")
    # matched: a third run, DAPO with G + M fresh rollouts per prompt (RLEP's group size and
    # sequences per step), evaluated and compared with RLEP: is the gain the replays or the
    # larger groups?
    compare: str = one_of("none", "matched", default="none")
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
                                           ActorConfig, LoggingConfig, VerifierConfig, CodeSandboxConfig,
                                           SandboxConfig)}


def _get(cfg: Config, dotted: str) -> Any:
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _check_values(node, prefix: str = "") -> None:
    """Check every key of ``node``, its groups' too, declared with ``one_of``, ``at_least`` or
    ``between`` (an unset optional key is not checked)."""
    for f in dataclasses.fields(node):
        key, value = prefix + f.name, getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            _check_values(value, f"{key}.")
        elif value is None:
            continue
        elif "one_of" in f.metadata and value not in f.metadata["one_of"]:
            raise ConfigError(f"config key {key}={value!r} is not allowed; use one of "
                              f"{', '.join(f.metadata['one_of'])}.")
        elif "range" in f.metadata:
            low, high = f.metadata["range"]
            if (low is not None and value < low) or (high is not None and value > high):
                bound = f">= {low}" if high is None else f"between {low} and {high}"
                raise ConfigError(f"config key {key}={value} is out of range; it must be {bound}.")


def _walk(node, method: str) -> None:
    """Call ``method`` of every group of ``node``, then its own: ``resolve`` makes a value such
    as ``auto`` what it means, ``check`` (which changes nothing) the rules between keys."""
    for f in dataclasses.fields(node):
        if dataclasses.is_dataclass(value := getattr(node, f.name)):
            _walk(value, method)
    if callable(call := getattr(type(node), method, None)):
        call(node)


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
    _walk(cfg, "resolve")
    _walk(cfg, "check")
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


def check_overrides(overrides: list[str], config_name: str = "config") -> list:
    """Compose and check every job of a command line (sweeps expanded) before Hydra runs it:
    their configs."""
    return [compose(job, config_name) for job in expand_sweep(overrides)]
