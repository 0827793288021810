"""The replay rule and group planning as pure functions."""

from collections import Counter

from megatron_rlep.data import dapo_prompt, Example
from megatron_rlep.errors import RunError
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

    from megatron_rlep.config import AlgorithmConfig
    from megatron_rlep.groups import Group, Sample
    from megatron_rlep.producer import Producer

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
        drawn = iter(batches)  # a generation batch per collect, in order
        stub = SimpleNamespace(cfg=SimpleNamespace(algorithm=a), stream=None,
                               prompts=SimpleNamespace(take=lambda n: range(n)),
                               collect=lambda positions, step: next(drawn))
        return Producer.groups(stub, step=0)

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


def test_strategy_weights_and_coins_by_hand():
    from megatron_rlep.replay import coin, priority_weight, replays_before_generation

    assert priority_weight(0.5, 0.1) == 1.0 and priority_weight(0.25, 0.1) == 0.75
    assert priority_weight(0.0, 0.1) == priority_weight(1.0, 0.1) == 0.1
    assert priority_weight(None, 0.1) == 1.0  # unknown: replay
    assert coin(1, 2, "q") == coin(1, 2, "q") != coin(1, 3, "q")
    assert all(replays_before_generation("uniform", 1, s, "q") for s in range(20))
    assert not any(replays_before_generation("rescue", 1, s, "q") for s in range(20))
    assert not any(replays_before_generation("priority", 1, s, "q", 1.0, 0.0) for s in range(20))
    chosen = sum(replays_before_generation("priority", 1, s, "q", 0.25, 0.0) for s in range(4000))
    assert abs(chosen - 3000) < 150  # weight 0.75; sd about 27


def test_recent_takes_the_newest_versions_and_equals_uniform_on_a_frozen_pool():
    from megatron_rlep.replay import choose

    texts, versions = ("a", "b", "c", "d"), (0, 1, 1, 2)
    picks = {tuple(choose(texts, 2, 1, s, "q", versions=versions, recent=True)) for s in range(30)}
    assert {p[0] for p in picks} == {"d"} and {p[1] for p in picks} == {"b", "c"}
    assert choose(texts, 1, 1, 0, "q", versions=versions, recent=True) == ["d"]
    for s in range(10):
        assert choose(texts, 2, 1, s, "q", versions=(3,) * 4, recent=True) == \
            sample_replays(texts, 2, 1, s, "q")


def test_pass_rates_start_at_the_pool_rate_and_follow_fresh_answers():
    from megatron_rlep.replay import PassRates

    rates = PassRates()
    assert rates.rate("q") is None and rates.rate("q", prior=0.5) == 0.5
    rates.add("q", [True, False])
    assert rates.rate("q", prior=0.5) == (1 + 4 * 0.5) / (2 + 4) and rates.rate("q") == 0.5
    rates.add("q", [True, True])
    assert rates.rate("q") == 0.75 and rates.rate("q", prior=0.5) == 5 / 8
    assert PassRates.from_state(rates.state()).counts == rates.counts == {"q": [3, 4]}


def test_priority_and_rescue_plan_groups_of_g_and_rescue_replays_only_where_none_is_right():
    from megatron_rlep.groups import Group, Sample, rescue_replays

    pool = ExperiencePool({question_key(example("full")): ANSWERS})
    assert plan_group(example("full"), pool, 4, 2, True, 1, 0, strategy="rescue") == ([], 4)
    assert plan_group(example("full"), pool, 4, 2, True, 1, 0, strategy="priority", rate=0.0) == ([], 4)
    replays, fresh = plan_group(example("full"), pool, 4, 2, True, 1, 0, strategy="priority",
                                rate=0.5)
    assert len(replays) == 2 and fresh == 4
    group = Group(example("full"), (1,), [], 4, [Sample((2,), "x", False, True) for _ in range(4)])
    assert rescue_replays(group, pool, 2, 1, 0) == sample_replays(ANSWERS, 2, 1, 0,
                                                                   question_key(example("full")))
    group.samples[0].correct = True
    assert rescue_replays(group, pool, 2, 1, 0) == []
    assert rescue_replays(Group(example("absent"), (1,), [], 4), pool, 2, 1, 0) == []


def test_a_replay_keeps_the_token_ids_and_log_probs_it_was_sampled_with():
    tok = CharTokenizer()
    s = replay_sample("ab", tok, 5, sampled=([97, 98, 0], [-0.1, -0.2, -0.3]))
    assert s.response_ids == (97, 98, 0) and s.logprobs == (-0.1, -0.2, -0.3) and s.finished
    cut = replay_sample("ab", tok, 2, sampled=([97, 98, 0], [-0.1, -0.2, -0.3]))
    assert cut.response_ids == (97, 98) and cut.logprobs == (-0.1, -0.2) and not cut.finished


def test_live_pool_renews_answers_evicts_the_oldest_and_round_trips(tmp_path):
    from megatron_rlep.pool import Answer

    pool, q = ExperiencePool({}), example("q")
    pool.add(q, [Answer("a", 0, (5, 0), (-0.5, -0.25), '{"step": 0}'), Answer("b", 0)], cap=3)
    pool.add(q, [Answer("c", 1), Answer("a", 2, (6, 0), (-1.0, -2.0), '{"step": 2}')], cap=3)
    assert pool.answers(q) == ("b", "c", "a") and pool.versions(q) == (0, 1, 2)  # a renewed
    pool.add(q, [Answer("d", 3)], cap=3)  # b, the oldest, goes
    assert pool.answers(q) == ("c", "a", "d") and pool.version_of(q, "a") == 2
    assert pool.sampled_as(q, "a") == ([6, 0], [-1.0, -2.0]) and pool.sampled_as(q, "c") is None
    pool.write(tmp_path / "live", {"test": True})
    back = ExperiencePool.load(tmp_path / "live")
    assert back.entries == pool.entries and back.pass_rate(q) is None
    assert back.version_of(q, "zzz") == -1  # not in the pool: as a built pool's answers


def test_refresh_takes_verified_finished_fresh_answers_with_provenance():
    import json
    from types import SimpleNamespace

    from megatron_rlep.config import Config
    from megatron_rlep.groups import Group, Sample
    from megatron_rlep.producer import Producer

    cfg = Config(run_dir="runs/x")
    cfg.algorithm.replay.cap = 2
    producer = SimpleNamespace(cfg=cfg, pool=ExperiencePool({}))
    q = example("q")
    samples = [Sample((1, 0), "right", False, True, correct=True, logprobs=(-0.5, -0.5)),
               Sample((2,), "right but cut", False, False, correct=True),
               Sample((3, 0), "wrong", False, True, correct=False),
               Sample((4, 0), "replayed", True, True, correct=True)]
    Producer.refresh_pool(producer, [Group(q, (9,), ["replayed"], 3, samples)], step=7)
    (answer,) = producer.pool.entries[question_key(q)]
    assert (answer.text, answer.version, answer.token_ids, answer.logprobs) == \
        ("right", 7, (1, 0), (-0.5, -0.5))
    record = json.loads(answer.provenance)
    assert record["step"] == 7 and record["source"] == "runs/x" and record["verifier"] == "dapo"
    assert record["temperature"] == cfg.rollout.temperature
