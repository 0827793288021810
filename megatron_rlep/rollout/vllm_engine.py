"""vLLM rollout engine for GPU clusters: a thin adapter over vLLM's documented offline API.

NOT EXERCISED ON THE DEVELOPMENT MACHINES: vLLM does not install without CUDA, so this module
is only imported on a GPU node (``rollout.engine=vllm`` or ``auto`` with vLLM present). What
the CPU test suite does exercise is everything around it - the same ``generate`` contract, the
streamed weight export it is fed from, the distributed prompt sharding - through
``TransformersEngine``.

Layout (the TRL pattern for torchrun/srun jobs without Ray):

* every rank builds ``vllm.LLM(distributed_executor_backend="external_launcher")``; ranks
  ``[k * tp, (k + 1) * tp)`` form engine k with ``tensor_parallel_size = rollout.tensor_parallel``
  (independent of the actor's TP); the ranks of one engine are called with the same prompts;
* colocated with the actor: after generation the engine sleeps (``sleep(level=1)``: weights
  offloaded, KV cache freed) and wakes weights first, KV cache after, around a weight sync;
* weights arrive as full Hugging Face-named tensors from ``Actor.export_hf`` (PP broadcast +
  TP gather on the actor side); vLLM's ``model.load_weights`` re-shards them for its own TP.
"""

from __future__ import annotations

from megatron_rlep.rollout.base import Completion


class VllmEngine:
    collective = True  # every rank of an engine's TP group calls generate with the same prompts

    def __init__(self, model_path: str, tensor_parallel: int = 1, gpu_memory_utilization: float = 0.6,
                 max_model_len: int = 4096, dtype: str = "bfloat16", seed: int = 0):
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel,
                       distributed_executor_backend="external_launcher",
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       dtype=dtype, seed=seed, enable_sleep_mode=True, enable_prefix_caching=True)
        self.asleep = False

    def encode_prompt(self, messages) -> list[int]:
        return list(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, seed=0,
                 progress=False) -> list[list[Completion]]:
        from vllm import SamplingParams

        self.wake()
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        params = [SamplingParams(n=c, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                 seed=seed + i) for i, c in enumerate(counts)]
        requests = [{"prompt_token_ids": self.encode_prompt(p)} for p in prompts]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=progress)
        eos = self.tokenizer.eos_token_id
        results = []
        for out in outputs:
            group = []
            for o in out.outputs:
                finished = o.finish_reason == "stop"
                ids = tuple(o.token_ids)
                if finished and (not ids or ids[-1] != eos):
                    ids += (eos,)  # the trained sequence ends with its EOS
                group.append(Completion(o.text, ids, finished))
            results.append(group)
        self.sleep()
        return results

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self, tags=None) -> None:
        if self.asleep:
            self.llm.wake_up(tags=tags)
            self.asleep = tags is not None and "kv_cache" not in tags

    def load_weights(self, buckets) -> int:
        """Weights first, KV cache after: the engine's memory is back only once weights are in."""
        self.wake(tags=["weights"])
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        count = 0
        for bucket in buckets:
            model.load_weights(weights=bucket)
            count += len(bucket)
        self.llm.reset_prefix_cache()
        self.wake(tags=["kv_cache"])
        return count
