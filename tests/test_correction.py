"""Off-policy correction on hand-computed ratios (megatron_rlep/correction.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from megatron_rlep.correction import batch_correction, engine_old_logp, sequence_correction

# pi_old / pi_behaviour per token: 0.5/0.25 = 2, 0.25/0.5 = 0.5, 0.9/0.3 = 3; product 3
OLD = torch.tensor([0.5, 0.25, 0.9]).log()
BEHAVIOUR = torch.tensor([0.25, 0.5, 0.3]).log()


def config(**kw):
    base = dict(is_level=None, is_threshold=2.5, rs_level=None, rs_threshold=None,
                rs_threshold_lower=None, replay="on_policy", replay_weight=0.5)
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
