"""Off-policy correction on hand-computed ratios (megatron_rlep/correction.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from megatron_rlep import correction
from megatron_rlep.correction import batch_correction, engine_old_logp, sequence_correction
from megatron_rlep.errors import RunError
from megatron_rlep.groups import Sample

# pi_old / pi_behaviour per token: 0.5/0.25 = 2, 0.25/0.5 = 0.5, 0.9/0.3 = 3; product 3
OLD = torch.tensor([0.5, 0.25, 0.9]).log()
BEHAVIOUR = torch.tensor([0.25, 0.5, 0.3]).log()


def config(**kw):
    base = dict(is_level=None, is_threshold=2.5, is_mode="truncate", rs_level=None,
                rs_threshold=None, rs_threshold_lower=None, replay="on_policy", replay_weight=0.5,
                baseline="plain")
    return SimpleNamespace(**{**base, **kw})


def test_token_and_sequence_weights_are_truncated_ratios():
    w, kept, raw = sequence_correction(OLD, BEHAVIOUR, "token", 2.5)
    assert w.tolist() == pytest.approx([2.0, 0.5, 2.5]) and raw.tolist() == pytest.approx([2, 0.5, 3])
    assert kept.all()
    w, _, raw = sequence_correction(OLD, BEHAVIOUR, "sequence", 2.5)
    assert w.tolist() == pytest.approx([2.5] * 3) and raw.tolist() == pytest.approx([3.0] * 3)
    assert sequence_correction(OLD, BEHAVIOUR, "sequence", 4.0)[0].tolist() == pytest.approx([3.0] * 3)
    w, _, _ = sequence_correction(OLD, BEHAVIOUR, None, 2.5)
    assert w.tolist() == [1.0, 1.0, 1.0]
    # the safety bound: a log-ratio of 50 counts as 20
    huge = sequence_correction(torch.tensor([0.0]), torch.tensor([-50.0]), "token", 1e12)[0]
    assert huge.item() == pytest.approx(math.exp(20), rel=1e-5)


def test_rejection_by_token_sequence_and_geometric_mean():
    kept = sequence_correction(OLD, BEHAVIOUR, None, 2.5, "token")[1]
    assert kept.tolist() == [True, True, False]  # [1/2.5, 2.5]: 3 is out
    assert sequence_correction(OLD, BEHAVIOUR, None, 2.5, "token", 4.0, 0.6)[1].tolist() == \
        [True, False, True]
    assert not sequence_correction(OLD, BEHAVIOUR, None, 2.5, "sequence")[1].any()  # 3 > 2.5
    assert sequence_correction(OLD, BEHAVIOUR, None, 2.5, "sequence", 4.0)[1].all()
    # geometric mean 3 ** (1/3) = 1.442
    assert sequence_correction(OLD, BEHAVIOUR, None, 2.5, "geometric", 1.5)[1].all()
    assert not sequence_correction(OLD, BEHAVIOUR, None, 2.5, "geometric", 1.4)[1].any()


def test_replays_on_policy_stored_or_down_weighted():
    old, beh = [OLD, OLD, OLD[:2]], [BEHAVIOUR.tolist(), [], BEHAVIOUR[:2].tolist()]
    replay = [False, True, True]
    assert batch_correction(old, beh, replay, config()) == (None, None, {})
    weights, kept, metrics = batch_correction(old, beh, replay, config(is_level="token"))
    assert weights[0].tolist() == pytest.approx([2.0, 0.5, 2.5])
    assert weights[1].tolist() == [1.0] * 3 and weights[2].tolist() == [1.0] * 2  # on_policy
    assert metrics["correction/fresh/truncated_fraction"] == pytest.approx(1 / 3)
    assert metrics["correction/fresh/is_ratio_max"] == pytest.approx(3.0)
    assert metrics["correction/fresh/is_weight_mean"] == pytest.approx(5 / 3)
    assert metrics["correction/replay/is_weight_mean"] == 1.0
    down = batch_correction(old, beh, replay, config(replay="down_weight"))[0]
    assert down[0].tolist() == [1.0] * 3 and down[1].tolist() == [0.5] * 3
    with pytest.raises(ValueError, match="needs the pool's log-probs"):
        batch_correction(old, beh, replay, config(replay="stored"))
    stored = batch_correction([OLD[:2]], [BEHAVIOUR[:2].tolist()], [True],
                              config(replay="stored", rs_level="token", rs_threshold=1.9,
                                     rs_threshold_lower=0.4))
    assert stored[0][0].tolist() == pytest.approx([2.0, 0.5])  # token IS when is_level is unset
    assert stored[1][0].tolist() == [False, True]  # 2 > 1.9, 0.5 >= 0.4
    assert stored[2]["correction/replay/rejected_fraction"] == 0.5


def test_weights_and_rejections_reach_the_loss_positions_of_their_tokens():
    from megatron_rlep.actor.batch import SequenceBatch, collate

    # prompts of 2 and 1 tokens; responses of 3 and 2 tokens; labels are shifted by one
    batch = SequenceBatch([[1, 2, 3, 4, 5], [1, 6, 7]], [2, 1], advantages=torch.tensor([1.0, -1.0]),
                          old_logp=[torch.zeros(3), torch.zeros(2)],
                          weights=[torch.tensor([2.0, 0.5, 2.5]), torch.tensor([1.0, 3.0])],
                          kept=[torch.tensor([True, True, False]), torch.tensor([True, True])])
    micro = collate(batch, [0, 1], torch.device("cpu"))
    assert micro.loss_mask.tolist() == [[False, True, True, False, False],
                                        [True, True, False, False, False]]
    assert micro.weights[0, 1:4].tolist() == [2.0, 0.5, 2.5] and micro.weights[1, :2].tolist() == [1.0, 3.0]
    plain = collate(SequenceBatch(batch.tokens, batch.prompt_lengths), [0, 1], torch.device("cpu"))
    assert plain.weights is None and plain.loss_mask.sum() == 5


def test_the_engines_log_probs_stand_in_for_the_old_policys_where_complete():
    """algorithm.old_logp=rollout: fresh answers of the later mini-batches take the engine's
    log-probs; replays, answers missing one, and the first mini-batch are left to the actor."""
    from megatron_rlep.groups import Sample

    samples = [Sample((5, 6), "a", False, True, logprobs=(-0.5, -1.25)),  # first mini-batch
               Sample((5, 6), "b", False, True, logprobs=(-0.25, -2.0)),
               Sample((7,), "c", True, True),  # a replay: on-policy, the actor's
               Sample((5, 6, 7), "d", False, False, logprobs=(-1.0,)),  # incomplete
               Sample((8,), "e", False, True, logprobs=(-3.0,))]
    old = engine_old_logp(samples, later=[1, 2, 3, 4])
    assert [o is None for o in old] == [True, False, True, True, False]
    assert old[1].tolist() == [-0.25, -2.0] and old[1].dtype == torch.float32
    assert old[4].tolist() == [-3.0]


def test_under_staleness_the_default_is_the_decoupled_loss_truncated_at_its_cap():
    """The default correction (``is_level=auto``): none synchronously; with max_staleness 2,
    each token's clipped surrogate against the proximal policy times w = min(pi_old /
    pi_behaviour, C). Three tokens by hand, the third above the cap; then AReaL's masking."""
    from megatron_rlep.config import compose
    from megatron_rlep.loss import aggregate, policy_token_loss

    assert compose([]).algorithm.correction.is_level is None
    c = compose(["algorithm.max_staleness=2"]).algorithm.correction
    assert (c.is_level, c.is_mode, c.is_threshold, c.baseline) == ("token", "truncate", 2.0,
                                                                   "plain")
    # proximal 0.5, 0.25, 0.9; behaviour 0.25, 0.5, 0.3 (rho 2, 0.5, 3); current 0.55, 0.2, 0.9
    # (r 1.1, 0.8, 1); A = 1: the surrogate's token losses -1.1, -0.8, -1
    current = torch.tensor([0.55, 0.2, 0.9]).log()

    def loss(cfg):
        weights, kept, _ = batch_correction([OLD], [BEHAVIOUR.tolist()], [False], cfg)
        pg, _, _ = policy_token_loss(current, OLD, torch.tensor(1.0))
        total, count = aggregate((pg * weights[0])[None], kept[0][None])
        return (total / count).item()
    assert loss(config(is_level="token", is_threshold=2.0)) == pytest.approx(
        -(2 * 1.1 + 0.5 * 0.8 + 2 * 1.0) / 3)  # the cap hit: 3 truncated to 2
    assert loss(config(is_level="token", is_threshold=4.0)) == pytest.approx(
        -(2 * 1.1 + 0.5 * 0.8 + 3 * 1.0) / 3)  # not hit
    assert loss(config(is_level="token", is_threshold=2.5, is_mode="mask")) == pytest.approx(
        -(2 * 1.1 + 0.5 * 0.8) / 2)  # AReaL: the token above the cap leaves the loss


def sample(n, replay=False, versions=(), logprobs=(), advantage=0.0):
    return Sample(tuple(range(n)), "", replay, True, advantage=advantage, versions=versions,
                  logprobs=logprobs)


def test_lags_in_versions_and_in_updates_and_the_gap_to_the_proximal_policy_by_hand():
    # at version 4: a fresh answer of versions 3, 3, 4 in the step's first update, one of
    # version 4 and a replay in its second
    samples = [sample(3, versions=(3, 3, 4), logprobs=(-1.0, -1.0, -2.0), advantage=1.0),
               sample(2, versions=(4, 4), logprobs=(-1.0, -1.0), advantage=-0.5),
               sample(2, replay=True, advantage=2.0)]
    old = [torch.tensor([-1.0 + math.log(2), -1.0, -2.0]), torch.tensor([-1.0, -1.0]),
           torch.tensor([-0.5, -0.5])]
    m = correction.lag_metrics(samples, old, 4, [[0], [1, 2]], 1.5)
    # versions behind: 1, 1, 0 and 0, 0; updates behind: 2 updates a version, plus the update's
    # place in the step: 2, 2, 0 and 1, 1
    assert m["stale/lag_versions_mean"] == pytest.approx(2 / 5) and m["stale/lag_versions_max"] == 1
    assert m["stale/tokens_versions_0"] == pytest.approx(3 / 5)
    assert m["stale/lag_updates_mean"] == pytest.approx(6 / 5) and m["stale/lag_updates_max"] == 2
    assert m["stale/tokens_updates_1"] == pytest.approx(2 / 5)
    # lag 1: rho 2 and 1 (k3: 2 - 1 - log 2 and 0); lag 0: rho 1 for all three tokens
    assert m["stale/lag_1/kl_behaviour_proximal"] == pytest.approx((1 - math.log(2)) / 2)
    assert m["stale/lag_1/is_ratio_mean"] == pytest.approx(1.5)
    assert m["stale/lag_1/above_threshold"] == pytest.approx(0.5)
    assert m["stale/lag_0/kl_behaviour_proximal"] == pytest.approx(0.0)
    assert m["stale/fresh/advantage_mean"] == pytest.approx(0.25)
    assert m["stale/replay/advantage_mean"] == pytest.approx(2.0)
    # two epochs: 4 updates a version, and each token trains twice, the second time 2 updates
    # later: the first answer's stale tokens 1 x 4 + 2 updates behind
    twice = correction.lag_metrics(samples, old, 4, [[0], [1, 2]] * 2, 1.5)
    assert twice["stale/lag_versions_mean"] == m["stale/lag_versions_mean"]
    assert twice["stale/lag_updates_max"] == 1 * 4 + 2


def test_token_classes_and_their_sums_by_hand():
    samples = [sample(3, versions=(3, 3, 4)), sample(2), sample(2, replay=True)]
    tags = correction.token_tags(samples, 4)
    assert [t.tolist() for t in tags] == [[1, 1, 0], [0, 0], [7, 7]]
    flat = torch.cat(tags)
    cut = torch.tensor([True, False, False, False, False, True, False])
    coefficient = torch.tensor([9.0, 1.0, 2.0, 2.0, 1.0, 9.0, 4.0])
    sums = correction.class_sums(flat, cut, coefficient)
    m = correction.class_metrics([sums, sums])
    assert m["stale/lag_1/clip_fraction"] == pytest.approx(0.5)
    assert m["stale/lag_0/clip_fraction"] == 0.0
    assert m["stale/replay/clip_fraction"] == pytest.approx(0.5)
    # uncut coefficients: fresh 1 + 2 + 2 + 1 = 6, replay 4
    assert m["stale/replay/gradient_share"] == pytest.approx(0.4)


def test_a_weighted_baseline_weighs_fresh_answers_by_their_clamped_sequence_ratio():
    samples = [sample(3, logprobs=tuple(BEHAVIOUR.tolist())), sample(2, logprobs=(-1.0, -1.0)),
               sample(1, replay=True), sample(1)]
    old = [OLD, torch.tensor([-1.5, -1.5]), torch.tensor([-3.0]), None]
    weights = correction.baseline_weights(samples, old, 2.5)
    # products 3 (above 2.5) and e^-1 (below 1 / 2.5); a replay and an answer without any: 1
    assert weights == pytest.approx([2.5, 0.4, 1.0, 1.0])


def test_stored_replays_from_a_pool_sampled_otherwise_are_refused_naming_both(tmp_path):
    from megatron_rlep.data import Example
    from megatron_rlep.pool import ExperiencePool, pool_row, write_pool
    from megatron_rlep.producer import check_stored_sampling

    ex = Example("q1", [{"role": "user", "content": "1 + 1?"}], "2", "arithmetic")
    row = pool_row(ex, ["Answer: 2"], [3], 1, 2, [[5, 6, 0]], [[-0.1, -0.2, -0.3]])
    for name, sampling in (("hot", {"temperature": 0.7, "top_p": 0.95}), ("same", {
            "temperature": 1.0, "top_p": 1.0}), ("unsaid", None)):
        write_pool([row], tmp_path / name, {"tool": "test", **({"sampling": sampling}
                                                               if sampling else {})})
    rollout = SimpleNamespace(temperature=1.0, top_p=1.0)
    check_stored_sampling(ExperiencePool.load(tmp_path / "same"), rollout)
    with pytest.raises(RunError, match=r"temperature 0.7 \(top-p 0.95\).*rollout.temperature=1.0"):
        check_stored_sampling(ExperiencePool.load(tmp_path / "hot"), rollout)
    with pytest.raises(RunError, match="does not say the temperature"):
        check_stored_sampling(ExperiencePool.load(tmp_path / "unsaid"), rollout)


def test_a_live_pool_answer_carries_the_version_that_sampled_it(tmp_path):
    from megatron_rlep.data import Example
    from megatron_rlep.groups import Group
    from megatron_rlep.pool import ExperiencePool
    from megatron_rlep.producer import Producer

    ex = Example("q1", [{"role": "user", "content": "1 + 1?"}], "2", "arithmetic")
    stale = Sample((5, 0), "Answer: 2", False, True, correct=True, versions=(3, 4))
    now = Sample((6, 0), "2\nAnswer: 2", False, True, correct=True)
    producer = SimpleNamespace(pool=ExperiencePool({}, "live"), cfg=SimpleNamespace(
        run_dir=tmp_path, rollout=SimpleNamespace(temperature=1.0, top_p=1.0,
                                                  max_response_length=8),
        verifier=SimpleNamespace(mode="dapo", function=None),
        algorithm=SimpleNamespace(replay=SimpleNamespace(cap=4))))
    Producer.refresh_pool(producer, [Group(ex, (1,), [], 2, [stale, now])], step=5)
    assert producer.pool.versions(ex) == (3, 5)  # sampled at version 3; the step's own


def test_m2po_leaves_out_the_largest_squared_log_ratios_until_the_rest_is_within_tau():
    from megatron_rlep.correction import m2_mask

    # squares 0.25, 0.01, 0, 0.09 (mean 0.0875) and 0.0004: leave out 0.25 and the mean of the
    # rest is (0.01 + 0 + 0.09 + 0.0004) / 4 = 0.0251
    ratios = [torch.tensor([0.5, -0.1, 0.0, 0.3]), torch.tensor([0.02])]
    kept, before = m2_mask(ratios, 0.04)
    assert before == pytest.approx(0.3504 / 5)
    assert [k.tolist() for k in kept] == [[False, True, True, True], [True]]
    # tau 0.02: 0.0251 is still above it; 0.09 leaves too: (0.01 + 0 + 0.0004) / 3 = 0.0035
    kept, _ = m2_mask(ratios, 0.02)
    assert [k.tolist() for k in kept] == [[False, True, True, False], [True]]
    kept, _ = m2_mask(ratios, 0.1)  # within tau already: every token stays
    assert all(k.all() for k in kept)


def test_m2po_masks_the_fresh_tokens_of_a_batch_and_never_a_replays():
    from megatron_rlep.config import CorrectionConfig

    old = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])]
    behaviour = [[-1.5, -1.0], [], [-3.0]]  # a fresh answer, a replay, a fresh one far off
    cfg = CorrectionConfig(is_level=None, m2_threshold=0.04)
    _, kept, metrics = correction.batch_correction(old, behaviour, [False, True, False], cfg)
    # squares 0.25, 0, 4 over the fresh tokens: 4 leaves (0.125), then 0.25 (0.0)
    assert [k.tolist() for k in kept] == [[False, True], [True, True], [False]]
    assert metrics["correction/fresh/m2"] == pytest.approx(4.25 / 3)
    assert metrics["correction/fresh/m2_masked_fraction"] == pytest.approx(2 / 3)


WEIGHTED = """
import sys
sys.path.insert(0, "tests/helpers")
import torch
from tiny import make_model
from megatron_rlep.actor.actor import Actor
from megatron_rlep.actor.batch import SequenceBatch
from megatron_rlep.config import AlgorithmConfig

actor = Actor(str(make_model(sys.argv[1], "qwen2")), AlgorithmConfig(lr=0.0))
tokens, prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 6, 7, 8]], [3, 3]
old = actor.logprobs(SequenceBatch(tokens, prompts))[0]
for scale in (1.0, 2.0, 0.0):
    out = actor.train_step(SequenceBatch(tokens, prompts, advantages=torch.tensor([1.0, -0.5]),
                                         old_logp=old, weights=[torch.full_like(o, scale)
                                                                for o in old]))
    print("W", scale, out["loss"], out["grad_norm"])
"""


def test_the_importance_weights_reach_the_actors_loss_and_its_gradient(tmp_path):
    """The decoupled loss inside the actor, not only by hand: one Megatron-Core update of a tiny
    model (learning rate 0: the same weights each time) on one batch whose importance weights
    are all 1, all 2 and all 0: the loss and the gradient's norm double, then vanish. On a
    trainer that dropped the weights from ``Actor._policy_loss`` all three would be equal."""
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "helpers"))
    from launch import env
    from speed import scaled

    done = subprocess.run([sys.executable, "-c", WEIGHTED, str(tmp_path / "m")], env=env(),
                          capture_output=True, text=True, timeout=scaled(300),
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {float(w): (float(loss), float(norm)) for _, w, loss, norm in
            (line.split() for line in done.stdout.splitlines() if line.startswith("W "))}
    (loss, norm), (loss2, norm2), (loss0, norm0) = runs[1.0], runs[2.0], runs[0.0]
    assert abs(loss) > 1e-4 and norm > 1e-6, runs
    assert loss2 == pytest.approx(2 * loss, rel=1e-5) and norm2 == pytest.approx(2 * norm, rel=1e-4)
    assert loss0 == 0.0 and norm0 == 0.0, runs


def test_a_correction_under_nucleus_sampling_is_refused_in_one_sentence():
    """The behaviour log-probs under rollout.top_p < 1 are the nucleus-renormalised
    distribution's, which the actor's softmax never is: a correction that compares the two
    (the default under staleness included) is refused, naming both ways out; without one, or
    synchronously, nucleus sampling runs."""
    from megatron_rlep.config import ConfigError, compose

    with pytest.raises(ConfigError, match=r"^config key algorithm.correction.is_level=token "
                                          r"compares .* with rollout.top_p=0.9 the engine's are "
                                          r"of the nucleus-renormalised distribution"):
        compose(["algorithm.max_staleness=2", "rollout.top_p=0.9"])
    with pytest.raises(ConfigError, match=r"^config key algorithm.correction.rs_level=sequence"):
        compose(["rollout.top_p=0.95", "algorithm.correction.rs_level=sequence",
                 "algorithm.correction.rs_threshold=2"])
    assert compose(["algorithm.max_staleness=2", "rollout.top_p=0.9",
                    "algorithm.correction.is_level=null"]).rollout.top_p == 0.9
    assert compose(["rollout.top_p=0.9"]).algorithm.correction.is_level is None
