"""Storage faults on real files: checkpoints that prove they are whole, a damaged one skipped for
the step before, none intact, one from before manifests, a full disk at start and a save the
file system refuses, and tools/checkpoint.py verify on each.

A trainer run on the tiny model saves steps 1-3; each case damages a copy of it. The full disk
is a real tmpfs where the tests run as root (they do on the project's machines and in CI);
elsewhere the start-up case is skipped. The save refused mid-write is a fault injected at the
checkpoint's file writes (``tests/helpers/full_disk/sitecustomize.py``: ENOSPC), and also, on a
tmpfs, a real ENOSPC from Megatron-Core's writer.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from speed import scaled

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import tiny  # noqa: E402
from launch import env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def train(assets, run_dir, *extra, steps=3, check=True, environ=None):
    model, pool = assets
    argv = [sys.executable, "-m", "megatron_rlep.train", f"model.path={model}",
            "data.train_size=8", "data.levels=[1,2]", "data.eval_size=4",
            "algorithm.prompts_per_rollout=2", "algorithm.prompts_per_update=2",
            "algorithm.rollouts_per_prompt=2", "algorithm.replay_per_prompt=1",
            f"algorithm.pool={pool}", "algorithm.warmup_steps=0", f"algorithm.total_steps={steps}",
            "rollout.engine=transformers", "rollout.max_response_length=8",
            "logging.wandb=disabled", "logging.eval_every=0", "logging.save_every=1",
            "logging.progress=false", f"run_dir={run_dir}", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(600),
                            env=environ or env())
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def verify(run_dir):
    return subprocess.run([sys.executable, str(REPO / "tools" / "checkpoint.py"), "verify",
                           str(run_dir)], capture_output=True, text=True, timeout=scaled(120))


def listed(report, status: str) -> int:
    """How many checkpoints the verify tool's report lists with ``status``."""
    return sum(line.split()[1:2] == [status] for line in report.stdout.splitlines()
               if line.startswith("  "))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(assets, a run directory with steps 1, 2 and 3 saved)."""
    root = tmp_path_factory.mktemp("storage")
    assets = tiny.make_model(root / "model"), tiny.make_pool(root / "pool.parquet", 8, [1, 2], 1)
    train(assets, root / "run")
    return assets, root / "run"


def copy_of(saved, tmp_path):
    shutil.copytree(saved[1], tmp_path / "run")
    return tmp_path / "run"


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(data)


def test_the_verify_tool_names_the_training_step_not_the_update_count(saved, tmp_path):
    """A step checkpoint's manifest counts optimizer updates in its own ``step`` (two a step
    with two mini-batches); the tool's line names the training step, ``extra.step``."""
    run = copy_of(saved, tmp_path)
    manifest = run / "checkpoints" / "step-000003" / "actor_checkpoint.json"
    meta = json.loads(manifest.read_text())
    assert meta["extra"]["step"] == 3
    manifest.write_text(json.dumps(dict(meta, step=6)))
    line = next(x for x in verify(run).stdout.splitlines() if x.startswith("  checkpoints/step-000003"))
    assert "intact" in line and "step 3," in line and "step 6" not in line, line


DAMAGE = {  # name: (what is done to step 3, what the one line says of it)
    "truncated": (lambda d: os.truncate(d / "__0_0.distcp", 1000),
                  "__0_0.distcp is 1,000 bytes, its manifest says "),
    "deleted": (lambda d: (d / "__0_1.distcp").unlink(), "__0_1.distcp is missing"),
    "flipped": (lambda d: flip_a_byte(d / "__0_1.distcp"),
                "__0_1.distcp does not match its manifest's checksum (its bytes changed)"),
    "no manifest": (lambda d: (d / "actor_checkpoint.json").unlink(),
                    "its manifest actor_checkpoint.json is missing"),
}


def test_every_save_ends_with_a_manifest_of_its_files(saved):
    run = saved[1]
    for name in ("step-000001", "step-000002", "step-000003"):
        meta = json.loads((run / "checkpoints" / name / "actor_checkpoint.json").read_text())
        on_disk = {str(p.relative_to(run / "checkpoints" / name))
                   for p in (run / "checkpoints" / name).rglob("*") if p.is_file()}
        assert set(meta["files"]) == on_disk - {"actor_checkpoint.json"}
        assert {"__0_0.distcp", ".metadata", "rng/rank-0.pt"} <= set(meta["files"])
    report = verify(run)
    assert report.returncode == 0, report.stdout + report.stderr
    assert listed(report, "intact") == 4  # three steps and the final export, hf


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_the_verify_tool_names_the_damaged_file(saved, tmp_path, kind):
    run = copy_of(saved, tmp_path)
    damage, said = DAMAGE[kind]
    damage(run / "checkpoints" / "step-000003")
    report = verify(run)
    assert report.returncode == 1, report.stdout + report.stderr
    line = next(x for x in report.stdout.splitlines() if "step-000003 " in x)
    assert "DAMAGED" in line and said in line, report.stdout
    assert listed(report, "intact") == 3
    assert report.stdout.strip().endswith("the newest checkpoint, step-000003, is damaged: a "
                                          "resume takes step-000002, the newest intact one")


@pytest.mark.parametrize("kind, extra", [("truncated", ()), ("flipped", ("resume_verify=true",))])
def test_a_damaged_newest_checkpoint_falls_back_to_the_step_before(saved, tmp_path, kind, extra):
    """One line says which checkpoint was skipped and why; the run goes on from step 2, writes
    step 3 again, and every checkpoint is intact after. A flipped byte keeps the file's size:
    resume_verify=true reads the checksums (docs/cluster.md: what that costs)."""
    run = copy_of(saved, tmp_path)
    damage, said = DAMAGE[kind]
    damage(run / "checkpoints" / "step-000003")
    result = train(saved[0], run, *extra, steps=4)
    warnings = [x for x in result.stdout.splitlines() if x.startswith("warning: skipping")]
    assert warnings == [f"warning: skipping checkpoints/step-000003, it is damaged: {said}"] or \
        (warnings and warnings[0].startswith(f"warning: skipping checkpoints/step-000003, it is "
                                             f"damaged: {said}")), result.stdout
    assert len(warnings) == 1
    assert f"resuming from {run}/checkpoints/step-000002 at step 2" in result.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000004"
    report = verify(run)
    assert report.returncode == 0 and "DAMAGED" not in report.stdout, report.stdout


def test_no_intact_checkpoint_stops_in_one_sentence_and_an_old_one_loads_with_a_note(saved,
                                                                                      tmp_path):
    run = copy_of(saved, tmp_path)
    for step in (1, 2, 3):
        (run / "checkpoints" / f"step-00000{step}" / "actor_checkpoint.json").unlink()
    result = train(saved[0], run, steps=4, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {run} holds no intact checkpoint to resume from (checkpoints/step-000003: its "
        "manifest actor_checkpoint.json is missing; checkpoints/step-000002: its manifest "
        "actor_checkpoint.json is missing; checkpoints/step-000001: its manifest "
        "actor_checkpoint.json is missing): resume from a copy of the run directory, or start "
        "afresh with resume=false or another run_dir")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        ["latest", "step-000001", "step-000002", "step-000003"]  # nothing removed
    # written before manifests: the metadata without its list of files loads, with a note
    old = copy_of(saved, tmp_path / "old")
    for step in (1, 2, 3):
        path = old / "checkpoints" / f"step-00000{step}" / "actor_checkpoint.json"
        meta = json.loads(path.read_text())
        del meta["files"]
        path.write_text(json.dumps(meta))
    result = train(saved[0], old, steps=4)
    assert ("note: checkpoints/step-000003 was written before checkpoints carried a manifest: "
            "its files could not be checked") in result.stdout
    assert f"resuming from {old}/checkpoints/step-000003 at step 3" in result.stdout
    assert listed(verify(old), "unchecked") == 3


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs of a given size in MiB, unmounted after the test; skipped where it cannot be
    mounted (not root)."""
    mounts = []

    def make(mib: int) -> Path:
        mount = tmp_path / f"tmpfs-{len(mounts)}"
        mount.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"no tmpfs here ({done.stderr.strip()}): the case needs root")
        mounts.append(mount)
        return mount

    yield make
    for mount in mounts:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_run_before_the_model_loads(saved, tmpfs):
    """40 MiB where three checkpoints of 36.9 MiB, the best step's weights and the final export
    are planned: one sentence, before the model is built."""
    small_disk = tmpfs(40)
    result = train(saved[0], small_disk / "run", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {small_disk}/run has ") and "\n" not in line, line
    assert "free but the run's checkpoints need" in line and "3 of 36.9 MiB on disk at once" \
        in line and "or give a run_dir on a file system with room" in line, line
    assert "Megatron-Core runs" not in result.stdout  # stopped before the model was built


def test_a_save_the_file_system_refuses_stops_in_one_sentence(saved, tmp_path):
    """ENOSPC at a file of step 2's checkpoint (a fault injected at that write): the run stops in one
    sentence with the directory, its free space and the checkpoint's size; the partial save is
    gone, ``latest`` still names step 1, which is intact, and the same command resumes."""
    run = tmp_path / "run"
    environ = env(PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "helpers" / "full_disk"),
                                              os.environ.get("PYTHONPATH", "")]),
                  FULL_DISK_AT="step-000002")
    result = train(saved[0], run, check=False, environ=environ)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: saving checkpoints/step-000002 failed (") and \
        "No space left on device" in line and "\n" not in line, line
    assert f"in {run}, which has " in line and "free for a checkpoint of 36.9 MiB" in line
    assert line.endswith("the partial save is removed and the last intact checkpoint, "
                         "checkpoints/step-000001, is still there: free space (or lower "
                         "logging.keep_checkpoints) and the same command resumes from it"), line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000001"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert verify(run).returncode == 0
    resumed = train(saved[0], run)
    assert f"resuming from {run}/checkpoints/step-000001 at step 1" in resumed.stdout


def test_a_real_enospc_from_megatron_cores_writer_leaves_nothing_behind(saved, tmpfs):
    """The checkpoint writer on a tmpfs too small for it (4 MiB for the untrained tiny
    model's 12 MiB of weights): SaveFailed marked as storage, no partial directory, nothing
    published."""
    small_disk = tmpfs(4)
    script = f"""
from megatron_rlep.actor import checkpoint
from megatron_rlep.actor.actor import Actor
from megatron_rlep.config import AlgorithmConfig
actor = Actor({str(saved[0][0])!r}, AlgorithmConfig())
try:
    actor.save({str(small_disk)!r} + "/ckpt", extra={{}})
except checkpoint.SaveFailed as err:
    print("FAILED", err.storage, err.reason[:200])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=scaled(300), env=env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILED True" in result.stdout, result.stdout
    assert list(small_disk.iterdir()) == []


def test_an_export_is_whole_or_absent(saved, tmp_path):
    """tools/export_hf.py refused a file write (ENOSPC injected) leaves neither hf-best nor its
    partial directory, in one sentence; an export damaged later (a shard cut short) is refused
    as a model.path in one sentence."""
    from megatron_rlep.builtin_model import resolve_model_path

    run = copy_of(saved, tmp_path)
    environ = env(PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "helpers" / "full_disk"),
                                              os.environ.get("PYTHONPATH", "")]),
                  FULL_DISK_AT="hf-step-000002")
    result = subprocess.run([sys.executable, str(REPO / "tools" / "export_hf.py"), str(run),
                             "--step", "2"], capture_output=True, text=True,
                            timeout=scaled(300), env=environ)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: writing {run}/hf-step-000002 failed (OSError: [Errno 28] No "
                           "space left on device") and line.endswith("run it again"), line
    assert not (run / "hf-step-000002").exists() and not (run / "hf-step-000002.partial").exists()
    shard = next((run / "hf").glob("*.safetensors"))
    os.truncate(shard, 4096)
    with pytest.raises(FileNotFoundError, match=rf"^model.path {run}/hf is damaged: {shard.name} "
                                                r"is 4,096 bytes, its manifest says [\d,]+; "
                                                "export it again"):
        resolve_model_path(str(run / "hf"))
