"""The Megatron-Core actor: a ``GPTModel`` from a Hugging Face checkpoint on any TP x PP x DP
layout, log-probs through Megatron's forward-backward schedule, the clipped GRPO update, export.

Every rank of the job builds one ``Actor`` and calls its methods with the same whole batch;
the actor takes this rank's data-parallel share, runs the micro-batches through
``get_forward_backward_func`` (so pipeline parallelism works), and returns results that are
the same on every rank. The loss is token-mean over the whole mini-batch: each micro-batch
returns (sum, token count) and Megatron's ``finalize_model_grads`` divides the gradients by
the token count summed over micro-batches and data-parallel ranks.

On a GPU the host queues work ahead of the device; reading a value the device computes makes it
wait. Within an update nothing is read per micro-batch: rows are picked by indices made on the
host, metrics stay on the device until the step's end, and log-probs come to the host there,
once (docs/gpu_runs.md, "The update at a real load", has the audit).

The actor knows nothing of rollouts, rewards or replay.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Optional

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint as checkpoint_function

from megatron_rlep import correction, platform
from megatron_rlep import loss as objective
from megatron_rlep.actor import attention, checkpoint, hf, optim, routing
from megatron_rlep.actor.batch import (SequenceBatch, collate, collate_packed, collate_shared,
                                       dp_slice, idle, loss_positions, micro_batches,
                                       packed_tokens, prompt_groups, shared_micro_batches,
                                       split_to, to_device)
from megatron_rlep.actor.logprobs import response_logprobs
from megatron_rlep.builtin_model import resolve_model_path
from megatron_rlep.errors import RunError


def sequence_parallel_problem(sequence_parallel: bool, transformer_engine: bool,
                              cuda: bool) -> str | None:
    """Why sequence parallelism cannot run on this layer kind and platform, or None. On a GPU
    it needs Transformer Engine's norms: Megatron-Core's torch norms (the local specs) refuse
    it, and the shim that lets them take it is installed only without CUDA."""
    if sequence_parallel and cuda and not transformer_engine:
        return ("parallel.sequence_parallel=true needs Transformer Engine's layers on a GPU "
                "(Megatron-Core's local norms refuse it) and they are not in use here: install "
                "the gpu extra's transformer-engine, or set parallel.sequence_parallel=false "
                "(tools/memory_plan.py shows what that costs)")
    return None


def routing_problem(routing_replay: str, hf_config, pipeline_parallel: int,
                    recompute: str) -> str | None:
    """Why ``actor.routing_replay`` cannot run with this model and layout, or None."""
    if routing_replay == "none":
        return None
    if not getattr(hf_config, "num_experts", None):
        return (f"actor.routing_replay={routing_replay} replays a mixture-of-experts model's "
                f"routes and this {hf_config.model_type} model has no router: set "
                "actor.routing_replay=none")
    if pipeline_parallel > 1 and recompute == "full":
        return ("actor.routing_replay with parallel.recompute=full under pipeline parallelism "
                "would recompute a layer after another micro-batch's routes were set: set "
                "parallel.recompute=selective or none, or parallel.pipeline_parallel=1")
    return None


def _use_transformer_engine(impl: str) -> bool:
    """``model.transformer_impl``: whether the layers use Transformer Engine; the reason it does
    not goes out once, in one line (Megatron-Core's own import warnings are silenced)."""
    reason = platform.transformer_engine_unavailable()
    if impl == "transformer_engine" and reason:
        raise RunError(f"model.transformer_impl=transformer_engine, but Transformer Engine is "
                       f"unusable here: {reason}; install the gpu extra (pip install .[gpu]) on "
                       "a CUDA machine or set model.transformer_impl=auto")
    use = impl != "local" and reason is None
    if not use and (not dist.is_initialized() or dist.get_rank() == 0):
        why = "model.transformer_impl=local" if impl == "local" else f"Transformer Engine: {reason}"
        print(f"Megatron-Core runs its local layer specs with torch kernels ({why}; Apex is not "
              "used)", flush=True)
    return use


def build_module(hf_config, tensor_parallel: int, pipeline_parallel: int, dtype: torch.dtype,
                 transformer_engine: bool, recompute: str = "none",
                 sequence_parallel: bool = False, expert_parallel: int = 1,
                 router_aux_loss: float = 0.0):
    """(TransformerConfig, this rank's GPTModel shard) for ``hf_config``, weights not loaded;
    the process group and Megatron's parallel state must be set up."""
    config = hf.transformer_config(hf_config, tensor_parallel, pipeline_parallel, dtype,
                                       cpu=not platform.has_cuda(), recompute=recompute,
                                       sequence_parallel=sequence_parallel,
                                       expert_parallel=expert_parallel,
                                       router_aux_loss=router_aux_loss,
                                       grouped_gemm=transformer_engine)
    spec = platform.layer_spec(transformer_engine=transformer_engine,
                               **hf.spec_options(hf_config))
    if not transformer_engine:
        spec = attention.with_sdpa(spec)
    model = hf.gpt_model(hf_config, config, spec).to(platform.device())
    # one dtype throughout, as TE's layers make it: the local specs' torch norms ignore
    # params_dtype, and Megatron-Core's optimizers cannot checkpoint fp32 ones beside bf16
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return config, model


_STATS = ("loss", "pg_loss", "clipped", "dual_clipped", "entropy", "kl", "tokens", "sequences")


class Actor:
    def __init__(self, model_path: str, algorithm, tensor_parallel: int = 1,
                 pipeline_parallel: int = 1, micro_batch_size: int = 4, dtype: str = "auto",
                 temperature: float = 1.0, seed: int = 1234, transformer_impl: str = "auto",
                 max_tokens_per_micro_batch: int = 0, recompute: str = "none",
                 bf16_grads: bool = False, logprob_chunk_tokens: int = 0,
                 sequence_parallel: bool = False, share_prompts: bool = False,
                 pack_sequences: bool = False, expert_parallel: int = 1,
                 router_aux_loss: float = 0.0, distributed_optimizer: bool | None = None,
                 routing_replay: str = "none"):
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed import finalize_model_grads
        from transformers import AutoConfig

        self.hf_path = resolve_model_path(model_path)  # a missing checkpoint: one sentence, first
        try:
            platform.init_distributed(tensor_parallel, pipeline_parallel, seed, expert_parallel)
        except ValueError as err:  # parallel sizes that do not fit the ranks started
            raise RunError(str(err)) from None
        self.hf_config = AutoConfig.from_pretrained(self.hf_path)
        self.algorithm = algorithm
        self.micro_batch_size = micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.temperature = temperature
        self.dtype = platform.compute_dtype(dtype)
        self.device = platform.device()
        use_te = self.transformer_engine = _use_transformer_engine(transformer_impl)
        problem = sequence_parallel_problem(sequence_parallel, use_te, platform.has_cuda())
        if problem:
            raise RunError(problem)
        if share_prompts and use_te:
            raise RunError("parallel.share_prompts needs an attention mask of any shape, which the "
                           "Transformer Engine layers do not take here: set "
                           "model.transformer_impl=local or parallel.share_prompts=false")
        try:
            config, model = build_module(self.hf_config, tensor_parallel, pipeline_parallel,
                                         self.dtype, use_te, recompute, sequence_parallel,
                                         expert_parallel, router_aux_loss)
        except hf.ModelError as err:
            raise RunError(f"model.path={model_path}: {err}") from None
        hf.load_hf_weights(model, self.hf_config, hf.SafetensorsReader(self.hf_path).get)
        problem = routing_problem(routing_replay, self.hf_config, pipeline_parallel, recompute)
        if problem:
            raise RunError(problem)
        # MoE routing replay: each router's hook (routing.py), by layer; the routes of this
        # rank's micro-batches kept by key (_routed); the last pass's agreement counts
        self.routes = routing.install(model) if routing_replay != "none" else {}
        self._kept: dict = {}
        # during a pass: (kept routes or None, records micro-batch by micro-batch, the batch's
        # given routes as a table of its rows or None)
        self._pass = None
        self._last_pass = None  # the last pass's records
        self.route_counts = None  # [layers, 2] of the last pass (routing.agreement)
        self._first_counts = None  # the step's first passes' (routes given by the batch)
        self._route_dtype = routing.route_dtype(getattr(self.hf_config, "num_experts", 0) or 0)
        self.share_prompts = share_prompts
        self.pack_sequences = pack_sequences
        self._positions = None  # a packed micro-batch's position ids, for the rotary embedding
        if share_prompts:  # through a weak reference: the model must not keep the actor alive
            rotary = weakref.WeakMethod(self._rotary_at_positions)
            model.rotary_pos_emb.register_forward_hook(lambda *args: rotary()(*args))
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        if distributed_optimizer is None:  # auto: where it shards anything
            distributed_optimizer = platform.has_cuda() and self.dp_size > 1
        distributed = self.distributed_optimizer = distributed_optimizer
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=not bf16_grads, overlap_grad_reduce=False,
            use_distributed_optimizer=distributed)
        self.model = DistributedDataParallel(config, ddp_config, model)
        self.optimizer, self.scheduler = optim.build(
            [self.model], algorithm.lr, algorithm.weight_decay, algorithm.grad_clip,
            algorithm.warmup_steps, algorithm.total_steps, self.dtype, distributed,
            algorithm.weight_decay_all, algorithm.adam_eps)
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = self.model.no_sync
        config.grad_scale_func = self.optimizer.scale_loss
        self.config = config
        # those two make reference cycles (DDP keeps config), and so do DDP's gradient hooks:
        # when the actor goes, they go, so a deleted actor's memory is freed at once
        weakref.finalize(self, _break_cycles, self.model, config)
        self.step = 0
        self.fused_old_logp = None  # train_step's own old log-probs, when it took them
        self.fused_adam = True  # CPU: torch's fused Adam kernel (platform.fused_cpu_adam)
        self.offloaded = False

    # ------------------------------------------------------------------ schedule

    @property
    def module(self):
        return self.model.module

    def _schedule(self, micros: list, loss_func, forward_only: bool) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            module = self.module
            last_stage = module.post_process
            module.post_process = False  # hidden states out: the loss applies the output
            # layer to the response positions only (see _scored); no mask: causal attention
            self._positions = mb.positions if mb.attention_mask is not None else None
            packed = None
            if mb.cu_seqlens is not None:
                from megatron.core.packed_seq_params import PackedSeqParams

                # the local specs read the bounds on the host, in every layer (SdpaAttention,
                # Megatron's unfused THD RoPE); Transformer Engine's kernels take a device copy
                bounds = mb.cu_seqlens.to(self.device, non_blocking=True) \
                    if self.transformer_engine else mb.cu_seqlens
                packed = PackedSeqParams(
                    qkv_format="thd", cu_seqlens_q=bounds, cu_seqlens_kv=bounds,
                    max_seqlen_q=mb.max_seqlen, max_seqlen_kv=mb.max_seqlen)
            rows = self._set_targets(mb)
            try:
                output = model(mb.tokens, mb.positions, mb.attention_mask, packed_seq_params=packed)
            finally:
                module.post_process = last_stage
                self._positions = None
            if rows is not None:  # the experts used (padding: none), 1 byte each
                padding = (rows < 0)[:, None]
                self._pass[1].append({layer: hook.used.to(self._route_dtype).masked_fill(padding, -1)
                                      for layer, hook in self.routes.items()})
            return output, partial(loss_func, mb)

        if not micros:
            return []
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micros), model=[self.model],
            num_microbatches=len(micros), seq_length=max(m.tokens.shape[1] for m in micros),
            micro_batch_size=max(m.tokens.shape[0] for m in micros), forward_only=forward_only,
        )

    def _set_targets(self, mb):
        """The routers' targets for ``mb``, the pass's next micro-batch (Megatron runs a stage's
        micro-batches in order; a recompute in backward, without pipelining, keeps them): the
        kept ones, else those the batch gives; its rows in the router's order (None outside a
        pass of ``_routed``)."""
        if self._pass is None:
            return None
        kept, records, given = self._pass
        rows = routing.router_rows(mb.token_ids, *self._sequence_part)
        for layer, hook in self.routes.items():
            hook.target = kept[len(records)][layer] if kept is not None else \
                routing.targets(given, rows, layer) if given is not None else None
        return rows

    def _routed(self, batch: SequenceBatch, key, run):
        """``run()``, a pass over ``batch``, with MoE routing replay under ``key``: the first
        pass under a key keeps the experts each token of this rank's micro-batches went to, a
        later one gives them to the routers again. The micro-batches are the same ones (the
        same batch, split the same way), so a rank holds only its own tokens' routes and
        nothing moves between ranks. The first pass takes the routes ``batch.routes`` gives
        (the rollout's), the routers' own choice for the tokens without. Without replay, or
        ``key`` None: ``run()``."""
        if not self.routes or key is None:
            return run()
        kept, given = self._kept.get(key), None
        if kept is None and batch.routes is not None:
            c, lengths, routes = self.hf_config, [len(t) for t in batch.tokens], batch.routes
            for i, (n, r) in enumerate(zip(lengths, routes)):
                if r is not None and len(r) != n:
                    raise ValueError(f"sequence {i} of the batch has {n} tokens and routes for "
                                     f"{len(r)}: the engine's routes must cover its prompt and "
                                     "response, a row a token")
            if self.share_prompts:
                routes = routing.shared_prompt_routes(routes, lengths, prompt_groups(batch),
                                                      batch.prompt_lengths)
            given = torch.cat([torch.full((n, c.num_hidden_layers, c.num_experts_per_tok), -1,
                                          dtype=self._route_dtype) if r is None else
                               r.to(self._route_dtype) for n, r in zip(lengths, routes)]
                              ).to(self.device, non_blocking=True)
        self._pass = (kept, [], given)
        for hook in self.routes.values():
            hook.counts = None
        try:
            result = run()
        finally:
            records, self._pass = self._pass[1], None
            for hook in self.routes.values():
                hook.target = None
        self._last_pass = records
        counts = torch.zeros(self.hf_config.num_hidden_layers, 2, dtype=torch.long,
                             device=self.device)
        for layer, hook in self.routes.items():
            if hook.counts is not None:
                counts[layer] = hook.counts
        dist.all_reduce(counts)
        self.route_counts = counts.cpu()
        if kept is None:
            self._kept[key] = records
            self._first_counts = self.route_counts if self._first_counts is None else \
                self._first_counts + self.route_counts
        return result

    @property
    def _sequence_part(self) -> tuple[int, int]:
        """(this rank's part, parts) of a micro-batch's sequence dimension in its layers."""
        from megatron.core import parallel_state as ps

        if not self.config.sequence_parallel:
            return 0, 1
        return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()

    def forget_routes(self):
        """Drop every key's routes (a step's end); the step's first passes' counts, [layers, 2]
        (routes given by the batches against the routers' own choice; routing.agreement), or
        None."""
        self._kept.clear()
        first, self._first_counts = self._first_counts, None
        return first

    def sequence_routes(self, batch: SequenceBatch, key=None) -> list[torch.Tensor]:
        """The routes kept under ``key`` (None: those the last pass used) for ``batch``, the
        pass's batch, as [tokens, layers, top-k] per sequence, the same on every rank (all
        ranks take part: each contributes its tokens and layers)."""
        c = self.hf_config
        lengths = [len(t) for t in batch.tokens]
        table = torch.full((sum(lengths), c.num_hidden_layers, c.num_experts_per_tok), -1,
                           dtype=self._route_dtype, device=self.device)
        kept = self._last_pass if key is None else self._kept[key]
        for mb, used in zip(self._micros(batch), kept, strict=True):
            routing.record(table, routing.router_rows(mb.token_ids, *self._sequence_part), used)
        # a slot two ranks hold (TP without sequence parallelism) has the same experts on both
        dist.all_reduce(table, op=dist.ReduceOp.MAX)
        routes = list(table.cpu().split(lengths))
        if self.share_prompts:
            routes = routing.shared_prompt_routes(routes, lengths, prompt_groups(batch),
                                                  batch.prompt_lengths)
        return routes

    def _router_grad_norm(self) -> float | None:
        """The routers' gradient norm (after the data-parallel reduction, all stages)."""
        from megatron.core import parallel_state as ps

        if not self.routes:
            return None
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for layer in self.module.decoder.layers:
            total += layer.mlp.router.weight.main_grad.double().pow(2).sum()
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
        return total.sqrt().item()

    def _micros(self, batch: SequenceBatch) -> list:
        """This rank's micro-batches. With expert parallelism every data-parallel rank runs as
        many (the experts' all-to-all pairs the ranks' forward passes up): micro-batches are
        split, and idle ones (no loss token) added, up to the most any rank has."""
        groups = self._micro_indices(batch, self.dp_rank)
        target = len(groups)
        if self.config.expert_model_parallel_size > 1 and self.dp_size > 1:
            target = max(len(self._micro_indices(batch, r)) for r in range(self.dp_size))
            groups = split_to(groups, target)
        collate_one = collate_shared if self.share_prompts else \
            collate_packed if self.pack_sequences else collate
        micros = [collate_one(batch, index, self.device, self._pad_multiple) for index in groups]
        return micros + [idle(micros[-1])] * (target - len(micros))

    def _micro_indices(self, batch: SequenceBatch, dp_rank: int) -> list[list[int]]:
        lengths = [len(t) for t in batch.tokens]
        if not self.share_prompts:
            mine = dp_slice(lengths, dp_rank, self.dp_size)
            return micro_batches(mine, lengths, self.micro_batch_size,
                                 self.max_tokens_per_micro_batch, self.pack_sequences)
        units = [(m, packed_tokens(batch, m)) for m in prompt_groups(batch)]
        mine = dp_slice(lengths, dp_rank, self.dp_size, units)
        return shared_micro_batches(batch, mine, self.micro_batch_size,
                                    self.max_tokens_per_micro_batch)

    def _rotary_at_positions(self, module, args, output):
        """Forward hook of the rotary embedding: for a packed micro-batch, the embedding [s, 1, 1,
        d] of positions 0..s-1 becomes each token's own [s, b, 1, d] (Megatron's unfused RoPE
        broadcasts over the batch dimension)."""
        if self._positions is None:
            return output
        return output[self._positions.T][:, :, 0]

    @property
    def _pad_multiple(self) -> int:
        """Sequence parallelism splits a micro-batch's length over TP: pad to a multiple."""
        return self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1

    def _rows(self, hidden: torch.Tensor, mb) -> torch.Tensor:
        """Hidden states [n, h] of the micro-batch's loss-mask positions, in the mask's order,
        from the decoder's output [s, b, h] (split over TP along s with sequence parallelism:
        gathered first; the rows' gradient comes back whole on every rank, so the gather's
        backward only splits it). Packed rows (shared prompts, packed sequences) are picked by
        ``hidden_index``; a shared prompt's last position feeds every response's first token,
        its gradients summed."""
        if self.config.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        if mb.hidden_index is not None:
            return hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])[mb.hidden_index]
        width = hidden.shape[0]  # loss_index counts row * width + column
        return hidden.transpose(0, 1)[mb.loss_index // width, mb.loss_index % width]

    def _row_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab/tp] of hidden-state ``rows`` [n, h]."""
        module = self.module
        weight = module.shared_embedding_or_output_weight() \
            if module.share_embeddings_and_output_weights else None
        if self.config.sequence_parallel:  # the output layer would gather the rows over TP
            from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

            weight = module.output_layer.weight if weight is None else weight
            return torch.nn.functional.linear(copy_to_tensor_model_parallel_region(rows), weight)
        logits, _ = module.output_layer(rows[:, None], weight=weight)
        return logits[:, 0]

    def _row_scores(self, rows: torch.Tensor, targets: torch.Tensor, entropy: str):
        """(log-probs, entropies or None) of ``targets`` after hidden-state ``rows`` [n, h]."""
        return response_logprobs(self._row_logits(rows), targets, self.temperature, entropy)

    def _scored(self, mb, hidden, entropy: str):
        """[b, s] log-probs and entropies of the response tokens (zero elsewhere). With
        ``logprob_chunk_tokens`` the response rows go through the output layer and the softmax
        that many at a time, each chunk recomputed in the backward pass, so the [tokens x
        vocab/tp] logits and their fp32 softmax never exist whole."""
        rows, targets = self._rows(hidden, mb), mb.labels.reshape(-1)[mb.loss_index]
        chunk = self.logprob_chunk_tokens or max(len(rows), 1)
        parts = []
        for start in range(0, max(len(rows), 1), chunk):
            args = (rows[start:start + chunk], targets[start:start + chunk], entropy)
            if chunk < len(rows) and torch.is_grad_enabled():
                parts.append(checkpoint_function(self._row_scores, *args, use_reentrant=False))
            else:
                parts.append(self._row_scores(*args))
        logp = torch.cat([p[0] for p in parts])
        ent = torch.cat([p[1] for p in parts]) if parts[0][1] is not None else None
        scatter = lambda v: v.new_zeros(mb.loss_mask.numel()).index_copy(  # noqa: E731
            0, mb.loss_index, v).view(mb.loss_mask.shape)
        return scatter(logp), (scatter(ent) if ent is not None else None)

    def _from_last_stage(self, obj):
        """Broadcast a Python object from the last pipeline stage to the whole PP group."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        box = [obj]
        group = ps.get_pipeline_model_parallel_group()
        src = dist.get_global_rank(group, ps.get_pipeline_model_parallel_world_size() - 1)
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    def _all_dp(self, obj) -> list:
        from megatron.core import parallel_state as ps

        if self.dp_size == 1:
            return [obj]
        out = [None] * self.dp_size
        dist.all_gather_object(out, obj, group=ps.get_data_parallel_group())
        return out

    # ------------------------------------------------------------------ log-probs

    @torch.no_grad()
    def logprobs(self, batch: SequenceBatch, with_entropy: bool = False, routes=None
                 ) -> tuple[list[torch.Tensor], Optional[list[torch.Tensor]]]:
        """Per-sequence log-probs (and entropies) of the response tokens, on every rank;
        ``routes``: a key of MoE routing replay (``_routed``)."""
        self.model.eval()

        def collect(mb, hidden):
            logp, ent = self._scored(mb, hidden, "detached" if with_entropy else "none")
            return torch.zeros((), device=hidden.device), torch.tensor(0, dtype=torch.int), \
                {"scored": (mb, logp, ent)}

        merged = self._gather_rows(self._routed(batch, routes, lambda: self._schedule(
            self._micros(batch), collect, forward_only=True)))
        logps = [merged[i][0] for i in range(len(batch))]
        ents = [merged[i][1] for i in range(len(batch))] if with_entropy else None
        return logps, ents

    def _gather_rows(self, outputs: list[dict]) -> dict:
        """The per-sequence rows the micro-batches scored, on the host (read after the last
        micro-batch is queued), from every pipeline stage and data-parallel rank: {index in the
        batch: (log-probs, entropies or None)}."""
        rows = self._from_last_stage(_per_sequence([out["scored"] for out in outputs]))
        merged = {}
        for part in self._all_dp(rows):
            merged.update(part)
        return merged

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [b, s, V] of right-aligned ``tokens`` (tests, sync checks)."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        self.model.eval()
        batch = SequenceBatch([t.tolist() for t in tokens], [1] * len(tokens))

        def collect(mb, hidden):
            logits = self._row_logits(self._rows(hidden, mb))
            full = gather_from_tensor_model_parallel_region(logits).float().cpu()
            return torch.zeros((), device=hidden.device), torch.tensor(0, dtype=torch.int), \
                {"rows": dict(zip(mb.index, full.reshape(len(mb.index), -1, full.shape[-1])))}

        micro = collate(batch, list(range(len(batch))), torch.device("cpu"), self._pad_multiple)
        micro.loss_mask[:, :tokens.shape[1]] = True  # every position but the padding
        micro.loss_index, micro.loss_counts = loss_positions(micro.loss_mask)
        micros = [to_device(micro, self.device)]
        rows = {}
        for out in self._schedule(micros, collect, forward_only=True):
            rows.update(out["rows"])
        rows = self._from_last_stage(rows)
        return torch.stack([rows[i] for i in range(len(batch))])

    # ------------------------------------------------------------------ update

    def _policy_loss(self, mb, hidden):
        a = self.algorithm
        logp, entropy = self._scored(mb, hidden, "grad" if a.entropy_coef else "detached")
        fused = mb.old_logp is None  # before the step's first update: old = this forward's
        old = logp.detach() if fused else mb.old_logp
        pg, clipped, dual = objective.policy_token_loss(
            logp, old, mb.advantages, a.clip_low, a.clip_high, a.dual_clip)
        if mb.weights is not None:  # off-policy correction's importance weights
            pg = pg * mb.weights
        per_token = pg
        kl = torch.zeros_like(pg)
        if a.kl_coef:
            if mb.ref_logp is None:
                raise ValueError("algorithm.kl_coef > 0 needs reference log-probs in the batch")
            kl = objective.kl_k3(logp, mb.ref_logp)
            per_token = per_token + a.kl_coef * kl
        if a.entropy_coef:
            per_token = per_token - a.entropy_coef * entropy
        total, count = objective.aggregate(per_token, mb.loss_mask, a.loss_agg)
        masked = lambda v: v.reshape(-1)[mb.loss_index]  # noqa: E731  (the mask's entries)
        with torch.no_grad():  # on the device: train_step reads the step's sums once
            stats = torch.stack([
                total.detach(), masked(pg).sum(), masked(clipped).sum(), masked(dual).sum(),
                masked(entropy).sum(), masked(kl).sum(), mb.loss_mask.sum(),
            ]).double()
            if mb.tags is not None:  # the same, by class of token (correction.token_tags)
                stats = torch.cat([stats, correction.class_sums(
                    masked(mb.tags), masked(clipped | dual), masked(
                        mb.advantages.abs() * (logp - old).exp() *
                        (mb.weights if mb.weights is not None else 1.0)))])
        out = {"stats": stats, "count": count.detach().double(), "sequences": len(mb.index)}
        if fused:
            out["scored"] = (mb, old, None)
        return total, count.int(), out

    def begin_step(self, step: int) -> None:
        """Set the learning rate of rollout step ``step`` (from 0) for all its updates."""
        optim.set_position(self.scheduler, optim.position(step, self.algorithm.warmup_from_zero))

    def train_step(self, batch: SequenceBatch, routes=None) -> dict:
        """One optimiser update on a mini-batch with advantages and old log-probs; metrics.
        Without old log-probs (``batch.old_logp`` None: valid only while the policy is the one
        that is to be updated, i.e. before the step's first update) this forward's own are
        used, and left per sequence in ``fused_old_logp``. ``routes``: a key of MoE routing
        replay (``_routed``)."""
        from megatron.core import parallel_state as ps

        if batch.advantages is None:
            raise ValueError("train_step needs a batch with advantages")
        self.restore()  # a no-op unless offloaded between updates
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        replayed = bool(self.routes) and routes in self._kept  # kept by an earlier pass
        outputs = self._routed(batch, routes, lambda: self._schedule(
            self._micros(batch), self._policy_loss, forward_only=False))
        router_grad_norm = self._router_grad_norm()
        # the micro-batches' sums added on the device and read once, here
        classes = 3 * correction.TAG_CLASSES if batch.tags is not None else 0
        stats = torch.zeros(len(_STATS) - 1 + classes, dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        for out in outputs:
            stats += out["stats"]
            count += out["count"]
        sequences = sum(out["sequences"] for out in outputs)  # a fill, not a copy from the host
        both = torch.cat([stats, torch.full((1,), float(sequences), dtype=torch.float64,
                                            device=self.device), count[None]])
        if self.dp_size > 1:
            dist.all_reduce(both, group=ps.get_data_parallel_group())
        both = both.cpu()
        stats, count = self._from_last_stage((both[:-1], both[-1]))
        if batch.old_logp is None:
            merged = self._gather_rows(outputs)
            self.fused_old_logp = [merged[i][0] for i in range(len(batch))]
        grad_norm, lr, applied = optim.step(self.optimizer, self.algorithm.grad_clip,
                                            self.fused_adam)
        self.step += 1
        # the sums of _STATS but sequences, the classes' sums (if any), then sequences
        head = len(_STATS) - 1
        s = dict(zip(_STATS, stats[:head].tolist() + [stats[-1].item()]))
        by_class = stats[head:-1] if batch.tags is not None else None
        tokens = max(s["tokens"], 1.0)
        return {"loss": s["loss"] / max(float(count), 1.0), "pg_loss": s["pg_loss"] / tokens,
                "clip_fraction": s["clipped"] / tokens, "dual_clip_fraction": s["dual_clipped"] / tokens,
                "entropy": s["entropy"] / tokens, "kl": s["kl"] / tokens,
                "grad_norm": grad_norm, "lr": lr, "tokens": s["tokens"], "sequences": s["sequences"],
                "skipped": not applied, "by_class": by_class,
                "route_counts": self.route_counts if replayed else None,
                "router_grad_norm": router_grad_norm}

    # ------------------------------------------------------------------ memory between updates

    def offload(self) -> None:
        """Free the gradient buffers (they are zeroed before every update anyway) and, with bf16
        weights, move the optimizer's fp32 master weights and Adam state to host memory, through
        Megatron-Core's own RL hooks; the weights stay. ``restore`` undoes it. In fp32 the
        optimizer's parameters are the weights themselves, so its state stays put."""
        if self.offloaded:
            return
        for buffer in self.model.buffers + getattr(self.model, "expert_parallel_buffers", []):
            buffer.offload_to_cpu(move_params=False, move_grads=True)
        if self.dtype != torch.float32:
            self.optimizer.offload_to_cpu()
        self.offloaded = True
        if platform.has_cuda():
            torch.cuda.empty_cache()

    def restore(self) -> None:
        if not self.offloaded:
            return
        if self.dtype != torch.float32:
            self.optimizer.restore_from_cpu()
        for buffer in self.model.buffers + getattr(self.model, "expert_parallel_buffers", []):
            buffer.reload_from_cpu(move_params=False, move_grads=True)
        self.offloaded = False

    # ------------------------------------------------------------------ weights out and in

    def export_hf(self, consume=None, bucket_bytes: int = 256 << 20):
        """``consume(buckets)``: the policy as full Hugging Face-named tensors, in bounded
        buckets, on every rank; the export completes on this rank whatever ``consume`` reads
        (``hf.export_hf``)."""
        return hf.export_hf(self.module, self.hf_config, consume, bucket_bytes)

    def save(self, path, extra: dict | None = None):
        offloaded = self.offloaded  # the optimizer's state is saved from where it trains
        self.restore()
        saved = checkpoint.save(path, self.module, self.optimizer, self.scheduler, self.step,
                                extra, self.transformer_engine, self.distributed_optimizer)
        if offloaded:
            self.offload()
        return saved

    def save_weights(self, path, step: int, extra: dict | None = None):
        return checkpoint.save_weights(path, self.module, step, extra, self.transformer_engine)

    def load(self, path) -> dict:
        self.restore()
        self.step, extra = checkpoint.load(path, self.module, self.optimizer, self.scheduler,
                                           self.distributed_optimizer, self.transformer_engine)
        return extra

    def save_hf(self, path):
        return self.export_hf(lambda buckets: checkpoint.save_hf(path, buckets, self.hf_path))


def _break_cycles(model, config) -> None:
    """A deleted actor's reference cycles, broken: the config's hooks into the DDP wrapper and
    the optimizer, and DDP's gradient-accumulator hooks (each holds the wrapper)."""
    config.no_sync_func = config.grad_scale_func = config.finalize_model_grads_func = None
    getattr(model, "grad_accs", []).clear()


def _per_sequence(scored: list) -> dict:
    """{index in the batch: (log-probs, entropies or None)} of the response tokens the
    micro-batches scored ((micro-batch, [b, s] log-probs, [b, s] entropies or None) each), on the
    CPU: one copy from the device for each kind, split by the host's counts."""
    index = [i for mb, _, _ in scored for i in mb.index]
    counts = [n for mb, _, _ in scored for n in mb.loss_counts]

    def host(kind: int):
        picked = [part[kind].detach().reshape(-1)[part[0].loss_index] for part in scored]
        return torch.cat(picked).float().cpu().split(counts) if picked else []

    logps = host(1)
    ents = host(2) if scored and scored[0][2] is not None else [None] * len(index)
    return dict(zip(index, zip(logps, ents)))
