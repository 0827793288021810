"""The README's walk of the paper's run, rehearsed on a real one-node Slurm cluster.

The walk's lines are read from the README and run as a user runs them, with one override set,
conf/rehearsal.yaml (the built-in model instead of Qwen2.5-Math-7B, small sizes, one CPU node).
Model and data come as a user gets them: DAPO-Math-17k through tools/get_data.py (from a hub
cache filled with a DAPO-format parquet of built-in questions: no network here), the evaluation
sets from data/eval/. Checked: every stage's outputs; each training run's resolved settings
equal its preset's but for the override set's keys (the difference is printed); the offline
wandb runs hold the metrics; the best validation steps were exported and evaluated; the
walk's monitoring commands run on the results.
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled
import yaml

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import hub_cache  # noqa: E402
import slurm_cluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WHY_NOT = slurm_cluster.available()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    WHY_NOT is not None and not os.environ.get("CI"), reason=f"no Slurm here: {WHY_NOT}")]
SCRIPTS = {"train.sbatch": "train", "build_pool.sbatch": "build_pool",
           "evaluate.sbatch": "evaluate"}


def walk_lines() -> list[str]:
    """The shell lines of the README's walk (the bash block after its marker)."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- the walk:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def rehearse(line: str, overrides: dict, rlep: Path) -> str:
    """One walk line with the override set applied (conf/rehearsal.yaml says how)."""
    if line.startswith("export RLEP="):
        return f"export RLEP={rlep}"
    if "tools/get_data.py" in line:
        return " ".join(w for w in shlex.split(line, posix=False)
                        if w not in overrides["get_data_skip"])
    if "sbatch " not in line:
        return line
    head, _, rest = line.partition("sbatch ")
    closing = ")" if rest.endswith(")") else ""
    words = shlex.split(rest[:len(rest) - len(closing)], posix=False)
    at = next(i for i, w in enumerate(words) if w == "--wrap" or w.startswith("slurm/"))
    script = words[at].rsplit("/", 1)[-1]
    extra = overrides[SCRIPTS[script]] if script in SCRIPTS else []
    words = words[:at] + overrides["sbatch"] + [f"--output={rlep}/slurm-%x-%j.out"] + \
        words[at:] + extra
    return head + "sbatch " + " ".join(words) + closing


def flat(settings: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def overridden(keys: list[str]) -> set[str]:
    """The setting keys an override list may change: a key, or a whole group for group=option."""
    out = set()
    for item in keys:
        key = item.split("=", 1)[0]
        out.add(key if "." in key else key + ".")
    return out


def covered(key: str, allowed: set[str]) -> bool:
    return key in allowed or any(a.endswith(".") and key.startswith(a) for a in allowed)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from slurm_cluster.for_tests(tmp_path_factory, WHY_NOT)


# its own waits (300 s for the walk's submissions, 1,500 s for the seven jobs; 451-595 s here in
# all) inside pytest's limit, all three scaled by the machine's speed (tests/helpers/speed.py)
@pytest.mark.timeout(2100)
def test_the_readme_walk_runs_on_one_cpu_node(cluster, tmp_path):
    from megatron_rlep.tasks import arithmetic
    from megatron_rlep.config import compose

    overrides = yaml.safe_load((REPO / "conf" / "rehearsal.yaml").read_text())
    rlep = tmp_path / "rlep"
    # DAPO-Math-17k as the hub serves it (each question repeated), here 16 built-in questions
    parquet = hub_cache.dapo_parquet(tmp_path / "dapo.parquet", arithmetic.examples("train", [1, 2],
                                                                                   16, 1))
    hub_cache.add_snapshot(rlep / "assets" / ".hf-cache", "BytedTsinghua-SIA/DAPO-Math-17k",
                           "dataset", {"data/dapo-math-17k.parquet": parquet})
    script = "\n".join(rehearse(line, overrides, rlep) for line in walk_lines())
    print("the walk as rehearsed:\n" + script)
    env = dict(cluster.env(), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               MEGATRON_RLEP_VENV=sys.prefix, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore",
               PREFLIGHT="0")  # each job's preflight: tests/test_slurm.py's
    started = time.time()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stdout + done.stderr
    deadline = time.time() + scaled(1500)
    while cluster.queued() and time.time() < deadline:
        time.sleep(2)
    logs = {p.name: p.read_text() for p in sorted(rlep.glob("slurm-*.out"))}
    states = {name: cluster.job_field(name.rsplit("-", 1)[1][:-4], "JobState") for name in logs}
    assert set(states.values()) == {"COMPLETED"} and len(states) == 7, \
        "\n".join(f"== {n} {states[n]}\n{t[-3000:]}" for n, t in logs.items())
    print(f"the walk's 7 jobs took {time.time() - started:.0f} s")
    runs = rlep / "runs"

    # each stage's outputs
    base, rl = runs / "paper-baseline", runs / "paper-rlep"
    for run in (base, rl):
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [0, 1, 2]
        assert "val/acc" in lines[0] and "val/acc" in lines[-1]
        assert (run / "hf" / "config.json").is_file() and (run / "checkpoints" / "best").is_dir()
        record = next((run / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
        assert b"val/acc" in record and b"train/acc_fresh" in record  # the metrics, offline
        assert (run / "hf-best").is_dir()  # the export job's output
    rlep_lines = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()][1:]
    assert max(x["train/replay_fraction"] for x in rlep_lines) > 0  # it replayed from the pool
    manifest = json.loads((runs / "paper-pool" / "manifest.json").read_text())
    assert manifest["model"].endswith("paper-baseline/hf") and manifest["counts"]["questions_kept"] > 0
    assert manifest["counts"]["questions_seen"] == 16  # the parquet's repeats dropped on load
    for run in ("baseline", "rlep"):
        metrics = json.loads((runs / f"paper-eval-{run}" / "metrics.json").read_text())
        assert sorted(metrics) == ["aime24", "aime25", "all", "amc23"]
        assert metrics["all"]["questions"] == 12 and metrics["all"]["n"] == 2
        assert "exported step " in logs[next(n for n in logs if f"paper-export-{run}" in n)]

    # the resolved settings: the preset's, but for the override set's keys
    walk = "\n".join(walk_lines())
    for run, preset in ((base, "dapo_nodyn_bs64"), (rl, "rlep_qwen25_math_7b")):
        command = next(line for line in walk.splitlines() if f"experiment={preset}" in line)
        own = [w.replace("$RUNS_ROOT", str(runs)) for w in shlex.split(command.rstrip(")"))
               if "=" in w and not w.startswith(("-", "base=", "rlep=", "pool="))]
        with pytest.MonkeyPatch.context() as patch:
            for name, value in (("DAPO_MATH_17K", rlep / "assets" / "dapo-math-17k.parquet"),
                                ("QWEN_MATH_7B", rlep / "assets" / "qwen2.5-math-7b")):
                patch.setenv(name, str(value))
            reference = flat(dataclasses.asdict(compose([*own, f"run_dir={run}"])))
        resolved = flat(json.loads((run / "config.json").read_text()))
        diff = {k: (reference.get(k), resolved.get(k)) for k in reference.keys() | resolved.keys()
                if reference.get(k) != resolved.get(k)}
        print(f"{preset}: the resolved settings differ from the preset's in",
              json.dumps(diff, indent=1, default=str))
        allowed = overridden(overrides["train"])
        assert diff and all(covered(k, allowed) for k in diff), diff

    # the walk's monitoring commands, on the results
    py = sys.executable
    stats = subprocess.run([py, "tools/pool.py", "stats", str(runs / "paper-pool"), "--plot",
                            str(tmp_path / "pool.png")], cwd=REPO, capture_output=True, text=True)
    assert stats.returncode == 0 and "questions" in stats.stdout, stats.stderr
    plot = subprocess.run([py, "tools/plot.py", str(base), str(rl), "--paired", "-o",
                           str(tmp_path / "curves.png")], cwd=REPO, capture_output=True, text=True)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
