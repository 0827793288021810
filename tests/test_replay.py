"""The replay rule and group planning as pure functions."""

from collections import Counter

from megatron_rlep.data import dapo_prompt, Example
from megatron_rlep.groups import plan_group, replay_sample
from megatron_rlep.pool import ExperiencePool, question_key, sample_replays

ANSWERS = ("a", "b", "c", "d", "e")


def test_replays_are_deterministic_fresh_each_step_and_without_replacement():
    first = sample_replays(ANSWERS, 2, seed=1, step=3, key="q")
    assert first == sample_replays(ANSWERS, 2, seed=1, step=3, key="q")
    assert len(set(first)) == 2 and set(first) <= set(ANSWERS)
    draws = {tuple(sample_replays(ANSWERS, 2, seed=1, step=s, key="q")) for s in range(20)}
    assert len(draws) > 5, "the same answers every step"
    assert sample_replays(ANSWERS, 2, 2, 3, "q") != first or sample_replays(ANSWERS, 2, 1, 3, "r") != first
    assert sorted(sample_replays(("x",), 2, 1, 0, "q")) == ["x"]
    assert sample_replays(ANSWERS, 0, 1, 0, "q") == [] and sample_replays((), 2, 1, 0, "q") == []


def test_replays_are_uniform():
    counts = Counter(a for step in range(5000) for a in sample_replays(ANSWERS, 2, 7, step, "q"))
    # each answer is in 2/5 of the draws: 2000 expected, sd about 35
    assert all(abs(c - 2000) < 200 for c in counts.values()), counts


def example(text):
    return Example(id=text, prompt=dapo_prompt(text), ground_truth="1", data_source="t")


def test_plan_fills_short_and_absent_questions_with_fresh_rollouts():
    pool = ExperiencePool({question_key(example("full")): ANSWERS,
                           question_key(example("short")): ("only",)})
    assert plan_group(example("full"), pool, 16, 2, True, 1, 0)[1] == 16
    replays, fresh = plan_group(example("short"), pool, 16, 2, True, 1, 0)
    assert replays == ["only"] and fresh == 17
    assert plan_group(example("absent"), pool, 16, 2, True, 1, 0) == ([], 18)
    assert plan_group(example("absent"), pool, 16, 2, False, 1, 0) == ([], 16)
    assert plan_group(example("full"), None, 16, 0, True, 1, 0) == ([], 16)


class CharTokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != self.eos_token_id)


def test_replay_sequences_end_with_eos_or_are_cut_without_it():
    tok = CharTokenizer()
    s = replay_sample("Answer: 7", tok, 20)
    assert s.response_ids == tuple(map(ord, "Answer: 7")) + (0,) and s.finished and s.replay
    cut = replay_sample("long reasoning\nAnswer: 7", tok, 6)
    assert cut.response_ids == tuple(map(ord, "long r")) and not cut.finished
    assert cut.text == "long r"  # scored on what is trained, like a fresh truncated answer
    exact = replay_sample("abcde", tok, 6)  # 5 characters + EOS fit exactly
    assert exact.finished and exact.response_ids[-1] == 0


def test_dynamic_sampling_filters_on_accuracy_then_stops_or_trains_short():
    from types import SimpleNamespace

    import pytest

    from megatron_rlep.config import AlgorithmConfig, RunError
    from megatron_rlep.groups import Group, Sample
    from megatron_rlep.train import Trainer

    def group(*answers):  # (correct, reward) per answer
        g = Group(example("q"), (1,), [], len(answers))
        g.samples = [Sample((1,), "", False, True, reward=r, correct=c) for c, r in answers]
        return g

    wrong_cut = group((False, -1.0), (False, -1.25))  # equal accuracy, rewards differ (overlong)
    batches = [[wrong_cut, group((True, 1.0), (False, -1.0))],
               [group((True, 1.0), (True, 1.0)), group((False, -1.0), (False, -1.0))],
               [group((False, -1.0), (True, 1.0)), group((True, 1.0), (True, 1.0))]]

    def gather(**algorithm):
        a = AlgorithmConfig(prompts_per_rollout=2, dynamic_sampling=True, **algorithm)
        stub = SimpleNamespace(cfg=SimpleNamespace(algorithm=a),
                               prompts=SimpleNamespace(take=lambda n: [None] * n),
                               collect=lambda examples, step, batch: batches[batch])
        return Trainer.gather_groups(stub, step=0)

    groups, info = gather()  # the reference: accuracy, 10 batches
    assert groups == [batches[0][1], batches[2][0]]
    assert info == {"prompts_drawn": 6, "groups_dropped": 4, "gen_batches": 3, "groups_short": 0}
    groups, info = gather(filter_metric="reward")
    assert groups == batches[0] and info["gen_batches"] == 1
    with pytest.raises(RunError, match=r"kept 1 of 2 groups in 2 generation batches.*short_batch=train"):
        gather(max_gen_batches=2)
    groups, info = gather(max_gen_batches=2, short_batch="train")
    assert groups == [batches[0][1]] and info["groups_short"] == 1 and info["prompts_drawn"] == 4


def test_replays_repeat_stored_answers_unless_distinct():
    # the reference draws M stored answers: one stored three times is replayed more often,
    # and may fill both slots; distinct=True draws among the two texts
    stored = ("Answer: 5", "Answer: 5", "Answer: 5", "5\nAnswer: 5")
    draws = [sample_replays(stored, 2, 1, step, "q") for step in range(300)]
    assert sum(d == ["Answer: 5", "Answer: 5"] for d in draws) > 0
    assert all(len(d) == 2 for d in draws)
    repeated = sum(d.count("Answer: 5") for d in draws) / 600  # 3/4 of the stored answers
    assert abs(repeated - 0.75) < 0.06
    for step in range(50):
        assert sorted(sample_replays(stored, 2, 1, step, "q", distinct=True)) == sorted(set(stored))
    pool = ExperiencePool({question_key(example("q")): stored})
    assert plan_group(example("q"), pool, 4, 3, True, 1, 0)[1] == 4 + 3 - 3
    assert plan_group(example("q"), pool, 4, 3, True, 1, 0, distinct=True)[1] == 4 + 3 - 2
