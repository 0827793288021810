"""The Hydra config tree: every group option and preset composes; bad keys are one sentence."""

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from speed import scaled

from megatron_rlep.config import (CONF_DIR, ConfigError, at_least, between, check_overrides,
                                  compose, load_config, one_of)

GROUPS = ["model", "data", "algorithm", "rollout", "parallel", "logging", "verifier"]
NEEDS = {"verifier=custom": ["verifier.function=megatron_rlep.tasks.logic:compute_score"]}


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    assert options
    for option in options:
        compose([f"{group}={option}", *NEEDS.get(f"{group}={option}", [])])


def test_every_experiment_preset_composes():
    presets = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    assert "quickstart" in presets
    for preset in presets:
        compose([f"experiment={preset}"])


def test_algorithm_groups_differ_as_documented():
    grpo, dapo, rlep = (compose([f"algorithm={a}"]).algorithm for a in ("grpo", "dapo", "rlep"))
    assert (grpo.clip_high, dapo.clip_high) == (0.2, 0.28)
    assert (grpo.loss_agg, dapo.loss_agg) == ("seq-mean-token-mean", "token-mean")
    assert (dapo.replay_per_prompt, rlep.replay_per_prompt) == (0, 2)
    assert rlep.clip_high == dapo.clip_high and rlep.overlong_buffer == 512


@pytest.mark.parametrize("override, message", [
    ("algorithm.clip_lo=0.3", "config key algorithm.clip_lo is unknown; the keys of algorithm are"),
    ("+algorithm.clip_lo=0.3", "config key algorithm.clip_lo is unknown"),
    ("sed=3", "config key sed is unknown; the keys of the top level are"),
    ("algorithm.clip_low=abc", "config key algorithm.clip_low has a wrong value"),
    ("algorithm.clip_low=1.5", "config key algorithm.clip_low=1.5 is out of range"),
    ("verifier.mode=fuzzy", "config key verifier.mode='fuzzy' is not allowed; use one of dapo, math"),
    ("algorithm=ppo", "algorithm=ppo names no preset in conf/algorithm/; the presets are dapo"),
    ("algorithm.prompts_per_update=7", "algorithm.prompts_per_update=7 does not divide"),
    ("parallel.share_prompts=true parallel.pack_sequences=true", "two ways to pack a micro-batch"),
    ("algorithm.kl_coef=0.001", "config key algorithm.kl_coef=0.001 asks for a KL term against a "
                                "reference policy, which this trainer does not build"),
    ("algorithm.old_logp=engine", "config key algorithm.old_logp='engine' is not allowed; use "
                                  "one of actor, rollout"),
    ("algorithm.old_logp=rollout algorithm.correction.is_level=token",
     "algorithm.correction has no mismatch left to correct"),
    ("algorithm.old_logp=rollout rollout.top_p=0.9", "algorithm.old_logp=rollout needs "
                                                     "rollout.top_p=1: with rollout.top_p=0.9"),
    ("verifier=custom", "config key verifier.function names the reward function of "
                        "verifier.mode=custom and only of it"),
    ("verifier.function=r.py:f", "give verifier=custom verifier.function=FILE.py:NAME together"),
])
def test_bad_keys_and_values_are_one_sentence(override, message):
    with pytest.raises(ConfigError) as info:
        check_overrides(override.split())
    text = str(info.value)
    assert message in text
    assert "\n" not in text and text.endswith(".")


@dataclass
class Beams:
    width: int = at_least(1, default=4)
    order: str = one_of("best", "first", default="best")

    def check(self):
        if self.order == "first" and self.width > 1:
            raise ConfigError("config key beams.order=first keeps one beam; set beams.width=1.")


@dataclass
class Decoding:
    beams: Beams = field(default_factory=Beams)
    share: float = between(0.0, 1.0, default=0.5)


@pytest.mark.parametrize("raw, message", [
    ({"beams": {"width": 0}}, "config key beams.width=0 is out of range; it must be >= 1."),
    ({"share": 1.5}, "config key share=1.5 is out of range; it must be between 0.0 and 1.0."),
    ({"beams": {"order": "last"}}, "config key beams.order='last' is not allowed; use one of "
                                   "best, first."),
    ({"beams": {"order": "first"}}, "config key beams.order=first keeps one beam; set "
                                    "beams.width=1.")])
def test_a_key_with_its_range_is_one_line_in_its_dataclass(raw, message):
    """Adding a checked key is one edit: its line, range or choices included, in its group's
    dataclass (as ``Decoding`` here); a rule between keys is its group's ``check``."""
    assert load_config({}, Decoding) == Decoding()
    assert load_config({"beams": {"width": 1, "order": "first"}}, Decoding).beams.width == 1
    with pytest.raises(ConfigError) as info:
        load_config(raw, Decoding)
    assert str(info.value) == message


def test_sweeps_are_checked_job_by_job():
    check_overrides(["algorithm.replay_per_prompt=0,2", "seed=1,2", "-m"])
    with pytest.raises(ConfigError, match="config key seed has a wrong value"):
        check_overrides(["algorithm.replay_per_prompt=0,2", "seed=1,x"])


def test_entry_point_prints_one_line_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "megatron_rlep.quickstart", "samples=0"],
                            capture_output=True, text=True, timeout=scaled(120))
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: config key samples=0 is out of range; it must be "
                                     ">= 1.")


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_preset_composes_and_validates(preset):
    cfg = compose([f"experiment={preset}"])
    assert cfg.algorithm.prompts_per_rollout % cfg.algorithm.prompts_per_update == 0


# The reference's verl keys (tests/reference/recipes.yaml) -> how our resolved config says it.
def _ours(dotted):
    def get(cfg):
        value = cfg
        for part in dotted.split("."):
            value = getattr(value, part)
        return value
    return get


def _validation(key):
    return lambda cfg: (getattr(cfg.validation, key) if getattr(cfg.validation, key) is not None
                        else getattr(cfg.rollout, key))


REFERENCE_KEYS = {
    "algorithm.norm_adv_by_std_in_grpo": _ours("algorithm.normalize_std"),
    "data.train_batch_size": _ours("algorithm.prompts_per_rollout"),
    "data.max_prompt_length": _ours("data.max_prompt_length"),
    "data.max_response_length": _ours("rollout.max_response_length"),
    "data.experience_replay_num": _ours("algorithm.replay_per_prompt"),
    "actor_rollout_ref.actor.clip_ratio_low": _ours("algorithm.clip_low"),
    "actor_rollout_ref.actor.clip_ratio_high": _ours("algorithm.clip_high"),
    "actor_rollout_ref.actor.clip_ratio_c": _ours("algorithm.dual_clip"),
    "algorithm.filter_groups.enable": _ours("algorithm.dynamic_sampling"),
    "algorithm.filter_groups.metric": _ours("algorithm.filter_metric"),
    "algorithm.filter_groups.max_num_gen_batches": _ours("algorithm.max_gen_batches"),
    "algorithm.kl_ctrl.kl_coef": _ours("algorithm.kl_coef"),
    "actor_rollout_ref.actor.use_kl_loss": lambda cfg: cfg.algorithm.kl_coef > 0,
    "actor_rollout_ref.actor.optim.lr": _ours("algorithm.lr"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": _ours("algorithm.warmup_steps"),
    "actor_rollout_ref.actor.optim.weight_decay": _ours("algorithm.weight_decay"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": _ours("algorithm.prompts_per_update"),
    "actor_rollout_ref.actor.ppo_epochs": _ours("algorithm.epochs"),
    "actor_rollout_ref.actor.entropy_coeff": _ours("algorithm.entropy_coef"),
    "actor_rollout_ref.actor.grad_clip": _ours("algorithm.grad_clip"),
    "actor_rollout_ref.actor.loss_agg_mode": _ours("algorithm.loss_agg"),
    "actor_rollout_ref.rollout.n": _ours("algorithm.rollouts_per_prompt"),
    "actor_rollout_ref.rollout.temperature": _ours("rollout.temperature"),
    "actor_rollout_ref.rollout.top_p": _ours("rollout.top_p"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": _ours("rollout.tensor_parallel"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": _validation("temperature"),
    "actor_rollout_ref.rollout.val_kwargs.top_p": _validation("top_p"),
    "actor_rollout_ref.rollout.val_kwargs.n": _ours("validation.n"),
    "reward_model.overlong_buffer.enable": lambda cfg: cfg.algorithm.overlong_buffer > 0,
    "reward_model.overlong_buffer.len": _ours("algorithm.overlong_buffer"),
    "reward_model.overlong_buffer.penalty_factor": _ours("algorithm.overlong_factor"),
    "reward_model.reward_manager": _ours("verifier.mode"),
    "trainer.test_freq": _ours("logging.eval_every"),
    "trainer.save_freq": _ours("logging.save_every"),
}
# What the trainer always does, with no key to set (docs/reference_differences.md)
REFERENCE_FIXED = {"algorithm.adv_estimator": "grpo", "data.truncation": "left",
                   "actor_rollout_ref.rollout.top_k": -1,
                   "actor_rollout_ref.actor.optim.warmup_style": "constant"}
PAPER_PRESETS = {"dapo_nodyn_bs_64.sh": "dapo_nodyn_bs64", "official_dapo.sh": "dapo_official",
                 "rlep_training.sh": "rlep_qwen25_math_7b"}


@pytest.mark.parametrize("script", PAPER_PRESETS)
def test_paper_presets_train_as_the_reference_scripts(script):
    import yaml

    reference = yaml.safe_load((Path(__file__).parent / "reference" / "recipes.yaml").read_text())
    values = reference[script]
    assert values.keys() == REFERENCE_KEYS.keys() | REFERENCE_FIXED.keys(), \
        "map every key of tests/reference/recipes.yaml to the config, or list it as fixed"
    cfg = compose([f"experiment={PAPER_PRESETS[script]}"])
    differ = {key: (want, REFERENCE_KEYS[key](cfg)) for key, want in values.items()
              if key in REFERENCE_KEYS and REFERENCE_KEYS[key](cfg) != want}
    assert not differ, f"{PAPER_PRESETS[script]} differs from {script}: {differ}"
    assert all(values[key] == fixed for key, fixed in REFERENCE_FIXED.items())
    assert cfg.algorithm.warmup_from_zero, "verl steps its scheduler after the update: LR 0 first"


def test_hydra_flags_print_the_resolved_config():
    result = subprocess.run([sys.executable, "-m", "megatron_rlep.quickstart",
                             "experiment=dapo_official", "--cfg", "job", "--resolve"],
                            capture_output=True, text=True, timeout=scaled(120))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "prompts_per_update: 32" in result.stdout and "warmup_from_zero: true" in result.stdout
    assert "${" not in result.stdout  # resolved


@pytest.mark.parametrize("config_name, override", [
    ("config", "experiment=rlep_qwen25_7b"), ("config", "model=qwen3"),
    ("build_pool", "model=qwen2.5-math-7"), ("evaluate", "rollout=vlm"),
    ("demo", "experiment=cpu_dem")])
def test_a_mistyped_preset_stops_listing_the_presets(config_name, override):
    group, name = override.split("=")
    with pytest.raises(ConfigError) as info:
        check_overrides([override], config_name)
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    assert str(info.value) == (f"{group}={name} names no preset in conf/{group}/; the presets "
                               f"are {', '.join(options)}.")


@pytest.mark.parametrize("argv", [
    ["-m", "megatron_rlep.train", "--cfg", "job", "experiment=rlep_qwen25_7b"],
    ["tools/memory_plan.py", "experiment=dapo_nodyn_bs46", "--nodes", "8"],
    ["-m", "megatron_rlep.sweep", "--count", "experiment=cpu_rlep,cpu_rlepp"]])
def test_entry_points_refuse_a_mistyped_preset_in_one_line(argv):
    repo = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=scaled(120),
                            cwd=repo)
    assert result.returncode == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert line.startswith("error: experiment=") and "names no preset in conf/experiment/" in line
    assert "rlep_qwen25_math_7b" in line and "\n" not in line


@pytest.mark.parametrize("override", ["algorithm.clip_lo=0.3", "algorithm.clip_low=5",
                                      "experiment=rlep_qwen25_7b"])
def test_the_trainer_says_a_config_mistake_before_it_imports_torch(override):
    """A wrong key, value or preset is checked before torch, Megatron-Core or vLLM load: no
    torch import at all, and the line in well under 5 s (before: 6 s on a quiet machine,
    13-34 s on a loaded one)."""
    import time

    start = time.monotonic()
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "megatron_rlep.train",
                             override], capture_output=True, text=True, timeout=scaled(120))
    took = time.monotonic() - start
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert [x for x in lines if x.startswith("error: ")] == [lines[-1]]
    imported = [x.rsplit("|", 1)[-1].strip() for x in lines if x.startswith("import time:")]
    assert imported and not {"torch", "megatron", "vllm"} & set(imported), imported[-5:]
    assert took < scaled(5), took


def test_a_path_given_as_a_group_option_says_where_paths_go():
    with pytest.raises(ConfigError, match=r"^model=/models/Qwen2.5-Math-7B names no preset in "
                                          r"conf/model/ \(a path goes in "
                                          r"model.path=/models/Qwen2.5-Math-7B\); the presets are"):
        compose(["model=/models/Qwen2.5-Math-7B"])


def test_the_demo_takes_its_experiment_key_and_lists_take_brackets():
    assert compose(["experiment=cpu_rlep", "seed=2"], "demo").experiment == "cpu_rlep"
    assert compose([], "demo").experiment == "cpu_demo"
    with pytest.raises(ConfigError, match=r"takes a list; write it in brackets, e\.g\. "
                                          r"datasets=\[aime24,amc23\]"):
        compose(["datasets=aime24"], "evaluate")


def test_a_gpu_model_on_a_machine_without_one_stops_at_once():
    result = subprocess.run([sys.executable, "-m", "megatron_rlep.train",
                             "experiment=dapo_nodyn_bs64"], capture_output=True, text=True,
                            timeout=scaled(120), cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: the model /checkpoints/Qwen2.5-Math-7B needs a GPU (model.needs_gpu=true) but "
        "torch sees none here; run it on GPU nodes (sbatch --gpus-per-node=8 ...), or set "
        "model.needs_gpu=false to run it on the CPU anyway")


def test_a_mistyped_pool_path_stops_before_the_model_loads(tmp_path):
    result = subprocess.run([sys.executable, "-m", "megatron_rlep.train", "experiment=cpu_rlep",
                             f"algorithm.pool={tmp_path / 'pol'}", f"run_dir={tmp_path / 'run'}",
                             "logging.wandb=disabled"], capture_output=True, text=True,
                            timeout=scaled(120), cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: experience pool {tmp_path / 'pol'} does not exist; give the output directory "
        "of tools/build_pool.py or the RLEP release parquet (algorithm.pool)")
    assert "Megatron-Core" not in result.stdout + result.stderr  # no model was built


def test_a_configs_check_methods_change_nothing():
    """Issue 76, item 6: the rules between keys live in the groups' ``check`` methods, which
    only refuse; what a value such as ``auto`` means is made by ``resolve``, before them (on
    4eafd73 ``AlgorithmConfig.check`` set ``correction.is_level``)."""
    import copy
    import dataclasses

    from megatron_rlep.config import _walk

    for overrides in ([], ["algorithm.max_staleness=2"], ["experiment=cpu_demo"]):
        cfg = compose(overrides)
        for path in ("", "algorithm", "rollout", "parallel", "sandbox", "verifier"):
            group = cfg if not path else getattr(cfg, path)
            group_copy = copy.deepcopy(group)
            if callable(check := getattr(type(group), "check", None)):
                check(group)
            assert dataclasses.asdict(group) == dataclasses.asdict(group_copy), path
        raw = dataclasses.replace(cfg.algorithm, correction=dataclasses.replace(
            cfg.algorithm.correction, is_level="auto"))
        raw.check()
        assert raw.correction.is_level == "auto"  # check leaves it; resolve makes it
        _walk(raw, "resolve")
        assert raw.correction.is_level == cfg.algorithm.correction.is_level
    with pytest.raises(ConfigError, match=r"rollout.ranks=3 is not a multiple of "
                                          r"rollout.tensor_parallel=2: each engine takes"):
        compose(["rollout.placement=disaggregated", "rollout.ranks=3",
                 "rollout.tensor_parallel=2"])

