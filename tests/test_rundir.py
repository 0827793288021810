"""A run directory's housekeeping (megatron_rlep/rundir.py): settings pinned on resume, the
newest checkpoints and the best step kept."""

import json
from dataclasses import asdict

import pytest

from megatron_rlep import rundir
from megatron_rlep.config import RunError, compose


def test_a_run_resumes_only_with_the_settings_it_started_with(tmp_path):
    started = asdict(compose(["algorithm.lr=1e-5"]))
    rundir.pin_settings(tmp_path, started, resuming=True, writer=True)  # a new run: written
    assert json.loads((tmp_path / "config.json").read_text()) == started
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000002\n")
    # what may change on resume: steps, logging, layout, engine
    later = asdict(compose(["algorithm.lr=1e-5", "algorithm.total_steps=800", "logging.eval_every=3",
                            "parallel.tensor_parallel=2", "rollout.engine=transformers"]))
    rundir.pin_settings(tmp_path, later, resuming=True, writer=False)
    with pytest.raises(RunError, match=rf"^{tmp_path} holds a run started with other settings "
                                       r"\(algorithm.lr: 1e-05 there, 2e-05 now\); resume it"):
        rundir.pin_settings(tmp_path, asdict(compose(["algorithm.lr=2e-5"])), True, False)
    # a run from before a key existed resumes while the key keeps its default
    old = json.loads((tmp_path / "config.json").read_text())
    del old["algorithm"]["weight_decay_all"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    rundir.pin_settings(tmp_path, later, resuming=True, writer=False)
    with pytest.raises(RunError, match=r"\(algorithm.weight_decay_all: False there, True now\)"):
        rundir.pin_settings(tmp_path, asdict(compose(["algorithm.lr=1e-5",
                                                      "algorithm.weight_decay_all=true"])),
                            True, False)
    # resume=false starts over: nothing is compared
    rundir.pin_settings(tmp_path, asdict(compose(["algorithm.lr=2e-5"])), False, True)


def test_pruning_keeps_the_newest_and_the_best(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step-000010", "step-000020", "step-000030", "pool-000030", "pool-000020", "best"):
        (root / name).mkdir(parents=True)
        (root / name / "actor_checkpoint.json").write_text("{}")  # complete, from before manifests
    rundir.prune(tmp_path, 2)
    assert sorted(p.name for p in root.iterdir()) == ["best", "pool-000020", "pool-000030",
                                                      "step-000020", "step-000030"]
    rundir.prune(tmp_path, 0)  # 0 keeps all
    assert len(list(root.iterdir())) == 5


def test_a_damaged_checkpoint_never_costs_an_intact_one_its_place(tmp_path):
    """keep 2 with step 30 damaged (a file cut short): steps 10 and 20 are the two kept, and
    30 stays until the run writes that step again."""
    from megatron_rlep.files import file_entry

    root = tmp_path / "checkpoints"
    for name in ("step-000010", "step-000020", "step-000030"):
        (root / name).mkdir(parents=True)
        (root / name / "shard.bin").write_bytes(b"x" * 100)
        manifest = {"files": {"shard.bin": file_entry(root / name / "shard.bin")}}
        (root / name / "actor_checkpoint.json").write_text(json.dumps(manifest))
    (root / "step-000005").mkdir()  # older than the kept ones: removed, whatever it holds
    (root / "step-000030" / "shard.bin").write_bytes(b"x" * 10)
    rundir.prune(tmp_path, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step-000010", "step-000020", "step-000030"]


def test_distributed_optimizer_state_resumes_only_on_its_tp_pp_ep_and_optimizer():
    from megatron_rlep.actor.checkpoint import resume_problem, same_layout

    # the RNG states load on the same layout; a checkpoint from before EP was recorded has EP 1
    now = {"world": 2, "tp": 2, "pp": 1, "ep": 1}
    assert same_layout({"world": 2, "tp": 2, "pp": 1}, now) and same_layout(dict(now), now)
    assert not same_layout({"world": 2, "tp": 1, "pp": 1, "ep": 2}, {**now, "tp": 1})

    saved = {"layout": {"world": 64, "tp": 2, "pp": 1}, "distributed_optimizer": True}  # no ep: 1
    assert resume_problem(saved, {"world": 32, "tp": 2, "pp": 1, "ep": 1}, True) is None  # DP may change
    problem = resume_problem(saved, {"world": 64, "tp": 4, "pp": 1, "ep": 1}, True)
    assert problem.startswith("the checkpoint was saved at tp=2 pp=1 ep=1 and its distributed "
                              "optimizer state loads only there, not at tp=4 pp=1 ep=1")
    # a MoE's expert optimizer holds this rank's experts: EP 2 -> 1 failed deep in Megatron-Core
    # ("Global shape mismatch ... chained_1.optimizer ..."); EP 2 at another DP resumes
    moe = {"layout": {"world": 2, "tp": 1, "pp": 1, "ep": 2}, "distributed_optimizer": True}
    assert resume_problem(moe, {"world": 4, "tp": 1, "pp": 1, "ep": 2}, True) is None
    assert "resume with parallel.tensor_parallel=1 parallel.pipeline_parallel=1 " \
        "parallel.expert_parallel=2" in resume_problem(moe, {"world": 1, "tp": 1, "pp": 1, "ep": 1}, True)
    # the plain optimizer (the CPU, or one data-parallel rank) reshards on any layout
    plain = {"layout": {"world": 2, "tp": 2, "pp": 1}, "distributed_optimizer": False}
    assert resume_problem(plain, {"world": 1, "tp": 1, "pp": 1}, False) is None
    # one optimizer's state does not load into the other (a KeyError deep in Megatron-Core)
    assert resume_problem(saved, {"world": 8, "tp": 2, "pp": 1}, False).startswith(
        "its optimizer state was saved by the distributed optimizer, which this run does not "
        "use: resume with parallel.distributed_optimizer=true")
    assert "resume with parallel.distributed_optimizer=false" in \
        resume_problem(plain, {"world": 2, "tp": 2, "pp": 1}, True)
    # saved before any applied update: no optimizer state, so any layout and optimizer
    assert resume_problem({**saved, "optimizer_state": False}, {"world": 1, "tp": 1, "pp": 1},
                          False) is None


def test_room_for_the_run_and_for_each_save_is_said_with_the_numbers(tmp_path):
    plan = {"checkpoint": 10**18, "best": 0, "hf": 0, "saves": 3, "held": 3, "run": 3 * 10**18}
    problem = rundir.room_problem(tmp_path / "run", plan, 0)
    assert problem.startswith(f"{tmp_path}/run has ") and "free but the run's checkpoints need " \
        "2.6e+09 GiB more" not in problem and "3 of " in problem and \
        problem.endswith("free space there, or give a run_dir on a file system with room")
    assert rundir.room_problem(tmp_path / "run", {**plan, "checkpoint": 1, "run": 3}, 0) is None
    # before a save: the directory, its free space, what the save needs, and what is kept
    save = rundir.save_room_problem(tmp_path, "checkpoints/step-000004", 10**18, "step-000003")
    assert save.startswith(f"cannot save checkpoints/step-000004: {tmp_path} has ")
    assert save.endswith("the last intact checkpoint, checkpoints/step-000003, is still there: "
                         "free space (or lower logging.keep_checkpoints) and the same command "
                         "resumes from it")
    assert rundir.save_room_problem(tmp_path, "checkpoints/step-000004", 1, None) is None
    first = rundir.save_room_problem(tmp_path, "checkpoints/step-000001", 10**18, None)
    assert first.endswith("the run has no checkpoint yet; free space (or lower "
                          "logging.keep_checkpoints) and start it again")


def test_manifest_entries_read_side_by_side_equal_one_file_at_a_time(tmp_path):
    """files.file_entries (threads) gives each file's size and CRC-32 as file_entry does one by
    one; damage's checksums read only the files of its share, in threads too."""
    import random

    from megatron_rlep.files import damage, file_entries, file_entry

    rng = random.Random(0)
    sizes = {"a.bin": 0, "c/d.bin": 3 << 20, "e.bin": 12345}
    (tmp_path / "c").mkdir()
    for name, n in sizes.items():
        (tmp_path / name).write_bytes(rng.randbytes(n))
    (tmp_path / "b.bin").write_bytes(b"hello")
    names = ["a.bin", "b.bin", "c/d.bin", "e.bin"]
    entries = file_entries(tmp_path, names)
    assert entries == {n: file_entry(tmp_path / n) for n in names}
    assert entries["a.bin"] == {"size": 0, "crc32": "00000000"}
    assert entries["b.bin"] == {"size": 5, "crc32": "3610a686"}  # CRC-32 of b"hello"
    assert file_entries(tmp_path, []) == {}
    data = bytearray((tmp_path / "c/d.bin").read_bytes())
    data[1 << 20] ^= 1
    (tmp_path / "c/d.bin").write_bytes(data)
    said = "c/d.bin does not match its manifest's checksum (its bytes changed)"
    assert damage(tmp_path, entries) is None  # sizes only
    assert damage(tmp_path, entries, checksums=True) == said
    assert damage(tmp_path, entries, checksums=True, share=(0, 2)) == said  # files 0 and 2
    assert damage(tmp_path, entries, checksums=True, share=(1, 2)) is None  # another rank's


def test_a_checkpoint_resumes_only_with_the_layer_specs_it_was_saved_with():
    """Transformer Engine's specs and the local ones name parameters otherwise (TE's fused layer
    norms, its _extra_state): a local-spec checkpoint resumed where TE is installed failed deep in
    Megatron-Core. Now one sentence names the key to set; weights-only ones too."""
    from megatron_rlep.actor.checkpoint import resume_problem

    layout = {"world": 1, "tp": 1, "pp": 1}
    local = {"layout": layout, "transformer_engine": False}
    problem = resume_problem(local, layout, False, transformer_engine=True)
    assert problem.startswith("it was saved with Megatron-Core's local layer specs and this run "
                              "builds Transformer Engine's ones")
    assert "resume with model.transformer_impl=local" in problem
    assert "model.transformer_impl=transformer_engine" in resume_problem(
        {**local, "transformer_engine": True, "optimizer_state": False}, layout, False,
        transformer_engine=False)
    assert resume_problem(local, layout, False, transformer_engine=False) is None
    assert resume_problem({"layout": layout}, layout, False, transformer_engine=True) is None
