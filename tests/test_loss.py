"""Advantages, the clipped surrogate and token-mean aggregation on hand-computed numbers."""

import math

import pytest
import torch

from megatron_rlep.loss import LOSS_AGG_MODES, aggregate, group_advantages, kl_k3, policy_token_loss


def test_all_equal_rewards_give_zero_advantage():
    for value in (1.0, -1.0, 0.3):
        adv = group_advantages(torch.full((18,), value), torch.zeros(18, dtype=torch.long))
        assert torch.equal(adv, torch.zeros(18))


def test_advantages_are_normalised_per_mixed_group():
    # group 7: G = 3 fresh + M = 2 replayed, rewards 1, -1, -1 | 1, 1
    # mean 0.2, deviations .8 -1.2 -1.2 .8 .8, unbiased var (3*.64 + 2*1.44)/4 = 1.2
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 0.5])
    groups = torch.tensor([7, 7, 7, 7, 7, 3, 3, 9])
    adv = group_advantages(rewards, groups, eps=0.0)
    s = math.sqrt(1.2)
    expected = [0.8 / s, -1.2 / s, -1.2 / s, 0.8 / s, 0.8 / s,
                -1 / math.sqrt(2), 1 / math.sqrt(2),  # group 3: mean 0, std sqrt(2)
                0.0]  # a group of one has nothing to compare with
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    centred = group_advantages(rewards, groups, normalize_std=False)
    assert centred.tolist() == pytest.approx([0.8, -1.2, -1.2, 0.8, 0.8, -1, 1, 0], abs=1e-6)


def test_a_fresh_baseline_centres_replays_on_their_groups_fresh_answers():
    """algorithm.correction.baseline=fresh, by hand. Group 7 as above (fresh 1, -1, -1;
    replays 1, 1): the fresh mean is -1/3, so each replay gets (1 + 1/3) / sqrt(1.2) where the
    plain baseline gives 0.8 / sqrt(1.2); the fresh answers keep theirs. Group 5: every fresh
    answer wrong (-1, -1) and a replay right: plain mean -1/3, unbiased variance 4/3; the
    replay gets 2 / sqrt(4/3) = sqrt(3), not 1.333 / sqrt(4/3). A group of replays alone
    falls back to its own mean."""
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    groups = torch.tensor([7, 7, 7, 7, 7, 5, 5, 5, 2, 2])
    replays = torch.tensor([False, False, False, True, True, False, False, True, True, True])
    adv = group_advantages(rewards, groups, eps=0.0, replays=replays)
    s7, s5 = math.sqrt(1.2), math.sqrt(4 / 3)
    expected = [0.8 / s7, -1.2 / s7, -1.2 / s7, (4 / 3) / s7, (4 / 3) / s7,
                (-2 / 3) / s5, (-2 / 3) / s5, 2 / s5, 1 / math.sqrt(2), -1 / math.sqrt(2)]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    centred = group_advantages(rewards, groups, normalize_std=False, replays=replays)
    assert centred[[3, 4, 7]].tolist() == pytest.approx([4 / 3, 4 / 3, 2.0])


def test_ratio_one_is_never_clipped():
    logp = torch.tensor([[-0.5, -2.0, -0.1]])
    for a in (-3.0, -0.2, 0.0, 0.7, 5.0):
        loss, clipped, dual = policy_token_loss(logp, logp.clone(), torch.tensor([[a]]),
                                                0.2, 0.28, 3.0)
        assert torch.allclose(loss, torch.full_like(logp, -a))
        assert not clipped.any() and not dual.any()


def test_clip_higher_and_dual_clip_by_hand():
    ratio = torch.tensor([1.5, 0.5, 1.1, 5.0, 0.5])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    loss, clipped, dual = policy_token_loss(ratio.log(), torch.zeros(5), adv, 0.2, 0.28, 3.0)
    # 1.5, A=+1: -min(1.5, 1.28) = -1.28 (clipped high at 1 + 0.28)
    # 0.5, A=-1: -min(-0.5, -0.8) = 0.8 (clipped low at 1 - 0.2)
    # 1.1, A=+1: inside the range: -1.1
    # 5.0, A=-1: -min(-5, -1.28) = 5, bounded by the dual clip c * |A| = 3
    # 0.5, A=+1: -min(0.5, 0.8) = -0.5, the pessimistic unclipped term wins: not clipped
    assert loss.tolist() == pytest.approx([-1.28, 0.8, -1.1, 3.0, -0.5], abs=1e-6)
    assert clipped.tolist() == [True, True, False, False, False]
    assert dual.tolist() == [False, False, False, True, False]
    no_dual, _, _ = policy_token_loss(ratio.log(), torch.zeros(5), adv, 0.2, 0.28, 1.0)
    assert no_dual[3].item() == pytest.approx(5.0)


def test_token_mean_over_micro_batches_equals_single_batch():
    # sequences of 3 and 1 response tokens: token-mean (1+2+3+4)/4 = 2.5,
    # while the mean of the two micro-batch means would be (2 + 4)/2 = 3
    whole = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    total, count = aggregate(whole, mask)
    assert (total / count).item() == pytest.approx(2.5)
    parts = [aggregate(whole[:1], mask[:1]), aggregate(whole[1:, :1], mask[1:, :1])]
    assert (sum(t for t, _ in parts) / sum(c for _, c in parts)).item() == pytest.approx(2.5)
    # padding values never leak in, even when not finite
    poisoned = whole.clone()
    poisoned[1, 1:] = float("inf")
    assert aggregate(poisoned, mask)[0].item() == pytest.approx(10.0)

    # verl's seq-mean modes over the same two micro-batches: (2 + 4) / 2 and (6 + 4) / 2
    for mode, expected in (("seq-mean-token-mean", 3.0), ("seq-mean-token-sum", 5.0)):
        total, count = aggregate(whole, mask, mode)
        assert (total / count).item() == pytest.approx(expected)
        parts = [aggregate(whole[:1], mask[:1], mode), aggregate(whole[1:], mask[1:], mode)]
        assert (sum(t for t, _ in parts) / sum(c for _, c in parts)).item() == pytest.approx(expected)
    # a sequence without response tokens counts in no mode
    empty = torch.zeros(1, 3, dtype=torch.bool)
    assert [aggregate(whole[:1], empty, m)[1].item() for m in LOSS_AGG_MODES] == [0, 0, 0]
    with pytest.raises(ValueError, match="seq-mean-token-sum"):
        aggregate(whole, mask, "sum")


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(kl_k3(logp, logp), torch.zeros(3))
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # delta = ref - logp = (-0.5, 1, 0): e^d - d - 1
    assert kl_k3(logp, ref).tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.e - 2, 0.0])


def test_micro_batches_by_count_or_by_a_token_budget():
    from megatron_rlep.actor.batch import micro_batches

    lengths = [100, 90, 30, 30, 20, 10, 10, 5]
    assert micro_batches(list(range(8)), lengths, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # budget 120 padded tokens: 100 and 90 alone, then 4 x 30 = 120, then the count limit of 4
    assert micro_batches(list(range(8)), lengths, 4, 120) == [[0], [1], [2, 3, 4, 5], [6, 7]]
    assert micro_batches([0, 1], [200, 10], 4, 50) == [[0], [1]]  # longer than the budget: alone
    assert micro_batches([7, 2, 5], lengths, 2, 1000) == [[2, 5], [7]]  # only this rank's share


def test_expert_parallel_ranks_get_as_many_micro_batches_by_splitting_then_idling():
    from megatron_rlep.actor.batch import SequenceBatch, collate, idle, split_to

    # the largest is halved first (its first half keeps the longer sequences), ties to the first
    assert split_to([[0, 1, 2], [3]], 3) == [[0, 1], [2], [3]]
    assert split_to([[0, 1], [2, 3]], 4) == [[0], [1], [2], [3]]
    assert split_to([[0], [1]], 5) == [[0], [1]]  # single sequences: idle ones make up the rest
    assert split_to([[0, 1, 2, 3]], 1) == [[0, 1, 2, 3]]
    mb = collate(SequenceBatch([[1, 2, 3, 4], [5, 6, 7]], [2, 1]), [0, 1], torch.device("cpu"), 1)
    empty = idle(mb)
    assert empty.index == [] and not empty.loss_mask.any() and mb.loss_mask.sum() == 4
    assert torch.equal(empty.tokens, mb.tokens)  # the same forward pass, no loss token


def _grouped():
    from megatron_rlep.actor.batch import SequenceBatch

    a, b, c = [1, 2, 3], [4, 5], [6, 7, 8, 9]
    tokens = [a + [10, 11], a + [12, 13, 14, 15], a + [16], b + [17, 18, 19], b + [20, 21, 22],
              c + [23]]
    return SequenceBatch(tokens, [3, 3, 3, 2, 2, 4])


def test_shared_prompts_group_sequences_by_prompt_into_micro_batches():
    from megatron_rlep.actor.batch import dp_slice, packed_tokens, prompt_groups, shared_micro_batches

    batch = _grouped()
    assert prompt_groups(batch) == [[0, 1, 2], [3, 4], [5]]
    assert [packed_tokens(batch, g) for g in prompt_groups(batch)] == [3 + 7, 2 + 6, 4 + 1]
    # groups longest response first; the 3- and 1-sequence groups fit 4 sequences together
    assert shared_micro_batches(batch, list(range(6)), 4) == [[1, 0, 2], [3, 4, 5]]
    # at most 2 sequences: the first group is cut, and pieces of one prompt never share
    assert shared_micro_batches(batch, list(range(6)), 2) == [[1, 0], [3, 4], [5, 2]]
    # a budget of 9 packed tokens: 3 + 4 + 2 fits, the third answer goes on alone; two rows
    # padded to the wider would pass 9, so every piece is its own micro-batch, widest first
    assert shared_micro_batches(batch, list(range(6)), 8, 9) == [[1, 0], [3, 4], [5], [2]]
    units = [(g, packed_tokens(batch, g)) for g in prompt_groups(batch)]
    assert dp_slice([5, 7, 4, 5, 5, 5], 0, 2, units) == [0, 1, 2]  # 10 tokens
    assert dp_slice([5, 7, 4, 5, 5, 5], 1, 2, units) == [3, 4, 5]  # 8 + 5
    assert dp_slice([5, 7, 4, 5, 5, 5], 1, 4, units) == [0, 5]  # fewer units than ranks: sequences


def test_shared_prompts_pack_each_prompt_once_with_the_loss_side_unchanged():
    from megatron_rlep.actor.batch import SequenceBatch, collate, collate_shared

    batch = SequenceBatch([[5, 6, 7, 8, 9], [5, 6, 7, 10]], [3, 3])
    batch.advantages = torch.tensor([1.0, -1.0])
    micro = collate_shared(batch, [0, 1], torch.device("cpu"))
    assert micro.tokens.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert micro.positions.tolist() == [[0, 1, 2, 3, 4, 3]]  # the second answer restarts at 3
    allowed = (~micro.attention_mask[0, 0]).int().tolist()
    assert allowed[5] == [1, 1, 1, 0, 0, 1]  # token 10 sees the prompt and itself, not 8, 9
    assert allowed[4] == [1, 1, 1, 1, 1, 0]
    # log-probs of 8, 9 (sequence 0) and 10 (sequence 1) come from packed columns 2, 3 and 2
    assert micro.hidden_index.tolist() == [2, 3, 2]
    plain = collate(batch, [0, 1], torch.device("cpu"))
    assert torch.equal(micro.loss_mask, plain.loss_mask) and torch.equal(micro.labels, plain.labels)
    assert micro.labels[micro.loss_mask].tolist() == [8, 9, 10]
    assert micro.advantages.tolist() == [[1.0], [-1.0]]
    wide = collate_shared(batch, [0, 1], torch.device("cpu"), multiple=4)  # padded to 8
    assert wide.tokens.shape == (1, 8) and (~wide.attention_mask[0, 0, 7]).int().tolist()[7] == 1


def test_packed_sequences_stand_end_to_end_with_their_bounds():
    from megatron_rlep.actor.batch import SequenceBatch, collate, collate_packed, micro_batches

    batch = SequenceBatch([[5, 6, 7, 8, 9], [5, 6, 7, 10]], [3, 3])
    micro = collate_packed(batch, [0, 1], torch.device("cpu"))
    assert micro.tokens.tolist() == [[5, 6, 7, 8, 9, 5, 6, 7, 10]]
    assert micro.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert micro.cu_seqlens.tolist() == [0, 5, 9] and micro.max_seqlen == 5
    # labels 8, 9 from columns 2, 3 of sequence 0; 10 from column 5 + 2 of sequence 1
    assert micro.hidden_index.tolist() == [2, 3, 7]
    plain = collate(batch, [0, 1], torch.device("cpu"))
    assert torch.equal(micro.loss_mask, plain.loss_mask) and torch.equal(micro.labels, plain.labels)
    wide = collate_packed(batch, [0, 1], torch.device("cpu"), multiple=4)  # 9 -> 12: a padding
    assert wide.cu_seqlens.tolist() == [0, 5, 9, 12] and wide.tokens.shape == (1, 12)
    assert wide.positions[0, 9:].tolist() == [0, 1, 2]
    # a budget counts packed tokens, not rows padded to the longest: 100 + 30 + 30 + 20 = 180
    lengths = [100, 90, 30, 30, 20, 10, 10, 5]
    assert micro_batches(list(range(8)), lengths, 8, 180, packed=True) == \
        [[0], [1, 2, 3, 4, 5], [6, 7]]
