"""Actor checkpoints: Megatron-Core distributed checkpoints and Hugging Face exports.

``save``/``load`` write and read model, optimiser, scheduler, step and caller state (any
JSON-able ``extra``, such as the trainer's data position) as a Megatron-Core distributed
checkpoint, which loads onto a different TP/PP layout. ``save_weights`` writes the model alone
(the trainer's best validation step), and ``load_weights`` reads the model out of either kind
(tools/export_hf.py). The metadata records the layout, the weights' dtype and whether
Transformer Engine layers were used (their parameter names differ from the local specs'). Every rank's RNG state goes beside it
(``rng/rank-<r>.pt``) and is restored when the layout is the same; on another layout the
ranks keep their seeded generators.

Both writers are atomic: all ranks write ``<dir>.partial``, rank 0 renames it to ``<dir>``
only after every rank has finished, so a killed job never leaves a directory that loads. The
last file written, ``actor_checkpoint.json``, holds the metadata and the manifest: every other
file's size and CRC-32 (``damage`` checks a checkpoint against it: the sizes cheaply, the
checksums when asked).

Saves are synchronous. Megatron-Core's writer hands its write results back through a queue
that it creates, once per process, from a *spawned* ``multiprocessing.Manager`` - a server
process that costs about 3 s to start and outlives a trainer killed with SIGKILL. A save that
finishes in the calling process needs no server: ``save`` gives the writer a thread queue.
"""

from __future__ import annotations

import errno
import json
import queue
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rlep import files, platform
from megatron_rlep.errors import RunError

COMPLETE = files.CHECKPOINT_MANIFEST  # the metadata and the manifest, written last


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if platform.has_cuda():
        state["cuda"] = torch.cuda.get_rng_state()
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state["tracker"] = get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and platform.has_cuda():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _layout() -> dict:
    from megatron.core import parallel_state as ps

    return {"world": dist.get_world_size() if dist.is_initialized() else 1,
            "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(),
            "ep": ps.get_expert_model_parallel_world_size()}


def _model_info(model, transformer_engine: bool) -> dict:
    dtype = next(model.parameters()).dtype
    return {"dtype": str(dtype).replace("torch.", ""), "transformer_engine": transformer_engine}


# The distributed optimizer's state format: Megatron-Core's dp_reshardable (every rank writes its
# own shard, in parallel; it reshards over DP only). Its default, fully_sharded_model_space, is
# deprecated; fully_reshardable gathers on DP rank 0 (a 7B model's 91 GiB of Adam state through
# one rank). Checkpoints before this was set name no format: they are the default's.
OPTIMIZER_FORMAT = "dp_reshardable"
OLD_OPTIMIZER_FORMAT = "fully_sharded_model_space"


def _inner_optimizers(optimizer):
    """(Megatron-Core optimizer, the torch optimizer it steps) of each part (dense, experts)."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(part, "optimizer", None) is not None:
            yield part, part.optimizer


def has_optimizer_state(optimizer) -> bool:
    """Whether Adam has any state yet: it makes it at its first applied update."""
    return any(len(inner.state) for _, inner in _inner_optimizers(optimizer))


def _empty_adam_state(optimizer) -> None:
    """Zero Adam moments at step 0, the state torch's Adam (no Apex, no Transformer Engine) makes
    at its first update, for every parameter of a distributed optimizer that has none: its state
    dict reads the step from there, also when it is being loaded into (the load overwrites
    all)."""
    for part, inner in _inner_optimizers(optimizer):
        if type(part).__name__ != "DistributedOptimizer" or \
                not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                if not inner.state[param]:
                    inner.state[param].update(step=torch.tensor(0.0),
                                              exp_avg=torch.zeros_like(param),
                                              exp_avg_sq=torch.zeros_like(param))


def _adam_steps_from_groups(optimizer) -> None:
    """After a load: the distributed optimizer keeps torch Adam's step in its parameter groups
    and sets it into each parameter's state, then overwrites that with the per-parameter step of
    the state being loaded into (``_empty_adam_state``'s 0); the group's step is the saved one."""
    for _, inner in _inner_optimizers(optimizer):
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            if "step" in group:
                for param in group["params"]:
                    inner.state[param]["step"] = torch.tensor(float(group["step"]))


def _sharded(model, optimizer, scheduler, loading: bool, fmt: str = OPTIMIZER_FORMAT) -> dict:
    """Model, scheduler and (``optimizer`` not None) optimizer state, as Megatron-Core shards them."""
    model_sd = model.sharded_state_dict()
    state = {"model": model_sd, "scheduler": scheduler.state_dict()}
    if optimizer is not None:
        if loading:
            _empty_adam_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=loading, metadata={"distrib_optim_sharding_type": fmt})
    return state


def same_layout(saved: dict, now: dict) -> bool:
    """Whether a checkpoint's layout is this run's (its RNG states then load): one saved before
    layouts named EP has EP 1."""
    return {"ep": 1, **saved} == now


def resume_problem(meta: dict, layout: dict, distributed_optimizer: bool,
                   transformer_engine: bool | None = None) -> str | None:
    """Why a full checkpoint cannot resume on ``layout``, or None: Transformer Engine's layer
    specs and Megatron-Core's local ones name their parameters differently (TE fuses the layer
    norms into the linear layers and keeps ``_extra_state``), so a checkpoint resumes only with
    the kind it was saved with; the distributed optimizer's state (dp_reshardable) loads only on
    the TP x PP x EP it was saved on (checkpoints before EP was recorded: EP 1), and only into
    the distributed optimizer (the plain one's only into the plain one); the weights load on any
    layout."""
    saved, sharded = {"ep": 1, **meta.get("layout", {})}, bool(meta.get("distributed_optimizer"))
    layout = {"ep": 1, **layout}
    te = meta.get("transformer_engine")
    if transformer_engine is not None and te is not None and bool(te) != transformer_engine:
        kinds = {True: "Transformer Engine's", False: "Megatron-Core's local"}
        return (f"it was saved with {kinds[bool(te)]} layer specs and this run builds "
                f"{kinds[transformer_engine]} ones, whose parameters are named otherwise: resume "
                f"with model.transformer_impl={'transformer_engine' if te else 'local'}, or start "
                "from its weights (tools/export_hf.py, then model.path=) with a fresh optimizer")
    if not meta.get("optimizer_state", True):  # saved before any update: weights only
        return None
    if sharded != distributed_optimizer:
        return (f"its optimizer state was saved {'by' if sharded else 'without'} the distributed "
                f"optimizer, which this run {'does not use' if sharded else 'uses'}: resume with "
                f"parallel.distributed_optimizer={str(sharded).lower()}, or start from its weights "
                "(tools/export_hf.py, then model.path=) with a fresh optimizer")
    if not sharded or all(saved.get(k) == layout[k] for k in ("tp", "pp", "ep")):
        return None
    return (f"the checkpoint was saved at tp={saved.get('tp')} pp={saved.get('pp')} "
            f"ep={saved['ep']} and its distributed optimizer state loads only there, not at "
            f"tp={layout['tp']} pp={layout['pp']} ep={layout['ep']}: resume with "
            f"parallel.tensor_parallel={saved.get('tp')} parallel.pipeline_parallel="
            f"{saved.get('pp')} parallel.expert_parallel={saved['ep']}, or start the new layout "
            "from its weights (tools/export_hf.py, then model.path=) with a fresh optimizer")


def _rank_and_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _from_rank0(obj):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _everyones(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _publish(partial: Path, final: Path, metadata: dict) -> None:
    """Once every rank is done: the manifest of every file (size and CRC-32, the ranks reading a
    share each) goes into ``COMPLETE``, written last, and rank 0 renames ``partial`` into
    place."""
    _barrier()
    rank, world = _rank_and_world()
    names = _from_rank0(files.listed_files(partial, (COMPLETE,)) if rank == 0 else None)
    mine = files.file_entries(partial, [n for i, n in enumerate(names) if i % world == rank])
    manifest = {k: v for part in _everyones(mine) for k, v in part.items()}
    if rank == 0:
        (partial / COMPLETE).write_text(json.dumps({**metadata, "files": manifest}, indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
    _barrier()


def damage(path: str | Path, checksums: bool = False) -> tuple[str | None, bool]:
    """(what is wrong with checkpoint ``path`` or None, whether its files could be checked),
    ``files.checkpoint_damage`` with the checksums read a share per rank; every rank gets the
    same answer."""
    found, checked = files.checkpoint_damage(Path(path), checksums, _rank_and_world())
    return next((p for p in _everyones(found) if p), None), checked


class SaveFailed(RuntimeError):
    """A checkpoint's write failed on some rank; its partial directory is gone and nothing was
    published. ``storage``: the file system refused it (full, over quota, an I/O error)."""

    def __init__(self, path: Path, reason: str, storage: bool):
        super().__init__(f"writing {path} failed: {reason}")
        self.path, self.reason, self.storage = path, reason, storage


STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}
# what PyTorch's and Megatron-Core's writers say of the same, where the errno is lost on the way
STORAGE_WORDS = ("No space left", "Disk quota", "Input/output error", "Read-only file system",
                 "unexpected pos")


def storage_error(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is the file system refusing a write."""
    seen, todo = set(), [err]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS or \
                any(word in str(err) for word in STORAGE_WORDS):
            return True
        inner = [f[0] if isinstance(f, tuple) else f for f in (getattr(err, "failures", None)
                                                               or {}).values()]
        todo += [err.__cause__, err.__context__, *inner]
    return False


def _first_line(err: BaseException) -> str:
    """``Type: message`` of the error underneath (torch's CheckpointException wraps each rank's
    own in ``failures``), its first line."""
    failures = getattr(err, "failures", None)
    if failures:
        inner = next(iter(failures.values()))
        err = inner[0] if isinstance(inner, tuple) else inner
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:300]


def _write_or_clean(partial: Path, final: Path, write) -> None:
    """This rank's part of a save; when it failed on any rank, rank 0 removes ``partial`` and
    every rank raises ``SaveFailed`` (so no rank waits at a barrier the others never reach)."""
    try:
        write()
        mine = None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - torch's CheckpointException is one
        mine = (_first_line(err), storage_error(err))
    failed = next((f for f in _everyones(mine) if f), None)
    if failed is None:
        return
    if _rank_and_world()[0] == 0:
        shutil.rmtree(partial, ignore_errors=True)
    _barrier()
    raise SaveFailed(final, *failed)


def _prepare(final: Path) -> Path:
    partial = final.with_name(final.name + ".partial")
    if not dist.is_initialized() or dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    return partial


def _synchronous_writer() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:  # synchronous saves: see the module docstring
        filesystem_async._results_queue = queue.Queue()


def save(path: str | Path, model, optimizer, scheduler, step: int, extra: dict | None = None,
         transformer_engine: bool = False, distributed_optimizer: bool = False) -> Path:
    from megatron.core import dist_checkpointing

    _synchronous_writer()
    final = Path(path)
    partial = _prepare(final)
    # before the first applied update (every one skipped) Adam has no state to save: the resumed
    # run starts from a fresh optimizer, which is the same
    optimizer_state = has_optimizer_state(optimizer)
    rank = dist.get_rank() if dist.is_initialized() else 0

    def write():
        dist_checkpointing.save(_sharded(model, optimizer if optimizer_state else None, scheduler,
                                         loading=False), str(partial))
        (partial / "rng").mkdir(exist_ok=True)
        torch.save(_rng_state(), partial / "rng" / f"rank-{rank}.pt")

    _write_or_clean(partial, final, write)
    _publish(partial, final, {"step": step, "extra": extra or {}, "layout": _layout(),
                              "optimizer_format": OPTIMIZER_FORMAT,
                              "optimizer_state": optimizer_state,
                              "distributed_optimizer": distributed_optimizer,
                              **_model_info(model, transformer_engine)})
    return final


def save_weights(path: str | Path, model, step: int, extra: dict | None = None,
                 transformer_engine: bool = False) -> Path:
    """The model's weights alone (no optimiser or scheduler state: about a seventh of a full
    checkpoint in bf16), atomically replacing ``path``; ``load_weights`` and tools/export_hf.py
    read it."""
    from megatron.core import dist_checkpointing

    _synchronous_writer()
    final = Path(path)
    partial = _prepare(final)
    _write_or_clean(partial, final, lambda: dist_checkpointing.save(
        {"model": model.sharded_state_dict()}, str(partial)))
    _publish(partial, final, {"step": step, "extra": extra or {}, "layout": _layout(),
                              "weights_only": True, **_model_info(model, transformer_engine)})
    return final


def metadata(path: str | Path) -> dict:
    """A complete checkpoint's metadata (step, extra, layout, dtype, layer kind)."""
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete actor checkpoint (no {COMPLETE}); "
                                "point to a checkpoint directory written by a finished save")
    return json.loads((path / COMPLETE).read_text())


def load_weights(path: str | Path, model) -> dict:
    """The model's weights from a full or weights-only checkpoint, on any layout (Megatron-Core
    reshards on load); returns the checkpoint's metadata."""
    from megatron.core import dist_checkpointing

    meta = metadata(path)
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(path))
    model.load_state_dict(state["model"])
    return meta


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def load(path: str | Path, model, optimizer, scheduler, distributed_optimizer: bool = False,
         transformer_engine: bool | None = None) -> tuple[int, dict]:
    """Restore into the live objects; returns (step, extra)."""
    from megatron.core import dist_checkpointing

    path = Path(path)
    meta = metadata(path)
    if meta.get("weights_only"):
        raise FileNotFoundError(f"{path} holds weights only (the best validation step); resume "
                                "from a step-* checkpoint, or export it with tools/export_hf.py")
    problem = resume_problem(meta, _layout(), distributed_optimizer, transformer_engine)
    if problem:
        raise RunError(f"{path}: {problem}")
    fmt = meta.get("optimizer_format", OLD_OPTIMIZER_FORMAT)
    with_optimizer = meta.get("optimizer_state", True)  # False: saved before any update
    state = dist_checkpointing.load(_sharded(model, optimizer if with_optimizer else None,
                                             scheduler, loading=True, fmt=fmt), str(path))
    model.load_state_dict(state["model"])
    if with_optimizer:
        with torch.no_grad():  # fp32 parameters are their own main copy: views of the weights
            optimizer.load_state_dict(state["optimizer"])
        _adam_steps_from_groups(optimizer)
    scheduler.load_state_dict(state["scheduler"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = path / "rng" / f"rank-{rank}.pt"
    if same_layout(meta["layout"], _layout()) and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    return int(meta["step"]), meta["extra"]


def hf_parameters(hf_path: str | Path) -> int:
    """The parameters of a Hugging Face checkpoint, from its safetensors headers alone."""
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(hf_path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                n = 1
                for size in f.get_slice(key).get_shape():
                    n *= size
                total += n
    return total


def disk_plan(parameters: int, bf16: bool, total_steps: int, save_every: int, keep: int,
              keep_best: bool, distributed_optimizer: bool = False) -> dict:
    """Bytes on disk: a full checkpoint (weights in the compute dtype; with bf16 weights, or the
    distributed optimizer, which keeps one of fp32 weights too, Adam's fp32 master copy; Adam's
    two fp32 moments), the best step's weights-only checkpoint, the
    final Hugging Face export, and what a whole run holds at most: the newest ``keep`` full
    checkpoints and the one being written before the oldest goes (0: every one), plus those
    two."""
    weights = parameters * (2 if bf16 else 4)
    full = weights + parameters * ((4 if bf16 or distributed_optimizer else 0) + 8)
    saves = total_steps // save_every + (total_steps % save_every > 0) if save_every else 1
    held = min(keep + 1, saves) if keep else saves
    best = weights if keep_best else 0
    return {"checkpoint": full, "best": best, "hf": weights, "saves": saves, "held": held,
            "run": held * full + best + weights}


def human(size: float) -> str:
    """Bytes as MiB below a GiB, else GiB, one decimal."""
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.1f} GiB"


def save_hf(path: str | Path, buckets, hf_path: str | Path) -> Path:
    """Write the exported ``buckets`` (a consumer of ``hf.export_hf``) as a Hugging Face
    checkpoint (safetensors shards plus the source's config, tokenizer and chat template; the
    config's dtype is the weights', so a bf16 run from an fp32 checkpoint loads as bf16); rank 0
    writes."""
    from safetensors.torch import save_file

    final = Path(path)
    partial = _prepare(final)
    writer = not dist.is_initialized() or dist.get_rank() == 0

    def write():  # rank 0 writes; a failed write leaves the rest of the export to export_hf
        weight_map, dtype = {}, None
        for n, bucket in enumerate(buckets):
            dtype = dtype or next((str(v.dtype).removeprefix("torch.") for _, v in bucket), None)
            if writer:
                name = f"model-{n + 1:05d}.safetensors"
                save_file({k: v.contiguous().cpu() for k, v in bucket}, str(partial / name),
                          metadata={"format": "pt"})
                weight_map.update({k: name for k, _ in bucket})
        if writer:
            (partial / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n")
            for item in Path(hf_path).iterdir():
                if item.is_file() and not item.name.endswith(".safetensors") \
                        and not item.name.endswith(".safetensors.index.json"):
                    shutil.copy2(item, partial / item.name)
            config = partial / "config.json"
            if dtype and config.is_file():
                settings = json.loads(config.read_text())
                for key in [k for k in ("dtype", "torch_dtype") if k in settings] or ["torch_dtype"]:
                    settings[key] = dtype
                config.write_text(json.dumps(settings, indent=2) + "\n")

    _write_or_clean(partial, final, write)
    _publish(partial, final, {"exported_from": str(hf_path)})
    return final
