"""The rollout stream (megatron_rlep/rollout/stream.py) with a scripted engine: tokens tagged with
the version that sampled them, answers continued across weight updates, whole groups taken the
oldest first, nothing trained past the staleness bound (restarted and counted instead), and
over-provisioned prompts carried into later steps."""

import random

import pytest

from megatron_rlep.config import ConfigError, compose
from megatron_rlep.rollout.base import Completion, answer_seed
from megatron_rlep.rollout.stream import Flight, RolloutStream, lags

EOS = 0


class Scripted:
    """An engine whose answers have fixed lengths: prompt p's j-th answer is ``lengths[p][j]``
    tokens long, the last an end of sequence; tokens are 1 + how many came before."""

    def __init__(self, lengths: dict):
        self.lengths, self.calls = lengths, []

    def __call__(self, prompts, counts, seeds, max_tokens):
        assert set(counts) == {1} and len(seeds) == len(prompts)  # a request, a seed per answer
        self.calls.append((len(prompts), max_tokens))
        out, firsts = [], {}
        for prompt in prompts:
            key, done = prompt[0], len(prompt) - 1
            if done:  # continuing: the answer's index is its token 1
                j = prompt[1] - 1000
            else:  # a first segment: a group's answers come in order
                j = firsts[key] = firsts.get(key, -1) + 1
            out.append([self._next(key, j, done, max_tokens)])
        return out

    def _next(self, key, j, done, max_tokens):
        total = self.lengths[key][j]
        first = 1000 + j if done == 0 else None
        take = min(max_tokens, total - done)
        ids = [(first if i == 0 and first is not None else done + i + 1) for i in range(take)]
        finished = done + take == total
        if finished:
            ids[-1] = EOS
        return Completion("", tuple(ids), finished, tuple(-0.1 for _ in ids))


def flight(position: int, count: int = 2) -> Flight:
    return Flight(position, (position,), count)


def test_a_long_answer_continues_under_the_next_versions_tagged_with_each():
    engine = Scripted({1: [3, 9], 2: [2, 2]})
    stream = RolloutStream(engine, segment=4, max_tokens=16, max_staleness=2)
    stream.dispatch([flight(1), flight(2)], version=0)
    stream.advance(version=0, seed=7)
    assert [f.position for f in stream.take(2, version=0)] == [2]  # 1's long answer goes on
    stream.advance(version=1, seed=7)
    stream.advance(version=2, seed=7)
    (done,) = stream.take(2, version=2)
    long = done.answers[1]
    assert long.versions == [0] * 4 + [1] * 4 + [2] and long.finished and long.token_ids[-1] == EOS
    assert done.oldest() == 0 and lags([done], 2) == {2: 7, 1: 4, 0: 1}  # 3 + 9 tokens
    # a segment asks for what is left at most, and only the unfinished answers are sent
    assert engine.calls == [(4, 4), (1, 4), (1, 4)]  # a request per answer


def test_no_token_trains_more_than_n_versions_behind_and_no_group_is_starved():
    """Random answer lengths, updates of random sizes: every group trains exactly once, whole,
    within the bound; the long ones are waited for at their last update, never dropped."""
    for seed in range(30):
        rng = random.Random(seed)
        n = rng.choice([1, 2, 3])
        segment = rng.choice([4, 8, 16, 40])
        lengths = {p: [rng.randint(1, 40) for _ in range(3)] for p in range(30)}
        stream = RolloutStream(Scripted(lengths), segment=segment, max_tokens=40, max_staleness=n)
        trained, version, waiting, next_position = [], 0, 0, 0
        while len(trained) < 30:
            want = rng.randint(1, 4)
            room = min(want + 3 - len(stream.flights), 30 - next_position)  # 3 extra in flight
            if room > 0:
                stream.dispatch([flight(p, 3) for p in range(next_position, next_position + room)],
                                version)
                next_position += room
            taken = []
            while len(taken) < want and (stream.pending() or any(f.done for f in stream.flights)):
                more = stream.take(want - len(taken), version)
                taken += more
                if not more:
                    stream.advance(version, seed)
                    waiting += 1
            for f in taken:
                assert all(a.done for a in f.answers) and len(f.answers) == 3  # whole groups
                assert max(lags([f], version)) <= n  # the bound, at the update that trains it
                trained.append(f.position)
            version += 1  # an update
        assert sorted(trained) == list(range(30))  # every prompt exactly once, restarts too


def test_a_long_answer_is_waited_for_at_its_last_update_not_dropped():
    """One long group among short ones, updates of 2 groups with 1 more in flight: the short
    ones train first; at the update that is the long one's last within N = 1, the stream waits
    for it; nothing is sampled twice."""
    lengths = {0: [30, 2]} | {p: [2, 2] for p in range(1, 8)}
    stream = RolloutStream(Scripted(lengths), segment=4, max_tokens=40, max_staleness=1)
    updates, version, position = [], 0, 0
    while position < 8 or stream.flights:
        room = min(3 - len(stream.flights), 8 - position)
        stream.dispatch([flight(p) for p in range(position, position + room)], version)
        position += room
        taken = []
        while len(taken) < 2 and stream.flights:
            more = stream.take(2 - len(taken), version)
            taken += more
            if not more:
                stream.advance(version, 1)
        assert all(max(lags([f], version)) <= 1 for f in taken)
        updates.append([f.position for f in taken])
        version += 1
    assert updates[:2] == [[1, 2], [0, 3]]  # at version 1 group 0 is due: waited for, first
    assert sorted(sum(updates, [])) == list(range(8)) and stream.regenerated == 0


def test_groups_are_taken_the_oldest_first_and_extra_prompts_carry_over():
    stream = RolloutStream(Scripted({p: [1, 1] for p in range(6)}), segment=8, max_tokens=8,
                           max_staleness=3)
    stream.dispatch([flight(p) for p in (4, 5)], version=0)
    stream.advance(0, 1)
    stream.dispatch([flight(p) for p in (0, 1, 2, 3)], version=1)  # over-provisioned: 6 for 2
    stream.advance(1, 1)
    assert [f.position for f in stream.take(2, 1)] == [4, 5]  # version 0 before version 1
    assert [f.position for f in stream.take(2, 2)] == [0, 1]
    assert [f.position for f in stream.flights] == [2, 3]  # carried, finished, still in bound


def test_a_finished_group_past_the_bound_is_sampled_again_not_trained():
    engine = Scripted({1: [2, 2]})
    stream = RolloutStream(engine, segment=8, max_tokens=8, max_staleness=1)
    stream.dispatch([flight(1)], version=0)
    stream.advance(0, 1)
    assert stream.take(1, version=2) == [] and stream.regenerated == 1
    stream.advance(2, 1)
    (again,) = stream.take(1, version=2)
    assert again.oldest() == 2


@pytest.mark.parametrize("overrides, message", [
    (["rollout.partial=true"], "set algorithm.max_staleness to 1 or more"),
    (["rollout.extra_prompts=2"], "carries finished groups into later steps"),
    (["rollout.placement=disaggregated", "algorithm.max_staleness=1"], "rollout.ranks"),
    (["algorithm.max_staleness=2", "algorithm.old_logp=rollout"], "add staleness twice"),
])
def test_settings_that_need_a_bound_or_add_staleness_twice_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        compose(["experiment=cpu_demo", *overrides])
    assert "\n" not in str(err.value)


def test_the_start_up_line_gives_the_effective_bound():
    from megatron_rlep.train import asynchrony_line, rollout_side

    cfg = compose(["experiment=cpu_demo", "algorithm.max_staleness=2",
                             "rollout.partial=true", "rollout.extra_prompts=2"])
    line = asynchrony_line(cfg, rollout_side(cfg).where)
    assert line.startswith("asynchronous rollout: colocated engines, ")
    apart = compose(["experiment=cpu_demo", "algorithm.max_staleness=1",
                     "rollout.placement=disaggregated", "rollout.ranks=1"])
    assert asynchrony_line(apart, rollout_side(apart).where).startswith(
        "asynchronous rollout: disaggregated engines (their weights broadcast within 300 s a "
        "sync, rollout.sync_timeout_s); ")  # the sync's budget, stated at start
    assert "at most 2 policy versions after its oldest token" in line
    assert "the step's 2 updates add up to 1 more, so a token is at most 3 updates behind" in line
    assert "partial rollouts in segments of 64 tokens" in line and "2 prompts in flight" in line


def test_an_answers_seed_is_its_place_not_the_engine_call_that_samples_it():
    """Each answer's request is seeded by the run's seed, its prompt's position, its index and
    the tokens it has: flights sent together or apart, advanced in one call or several, after
    a restart or not, draw with the same seeds."""
    def seeds_of(schedule):
        seen = {}

        def engine(prompts, counts, seeds, max_tokens):
            for prompt, seed in zip(prompts, seeds):
                seen.setdefault((prompt[0], len(prompt) - 1), set()).add(seed)
            return Scripted({3: [6, 2], 8: [2, 5]})(prompts, counts, seeds, max_tokens)
        stream = RolloutStream(engine, segment=3, max_tokens=16, max_staleness=5)
        schedule(stream)
        return seen

    def together(stream):
        stream.dispatch([flight(3), flight(8)], version=0)
        for v in range(3):
            stream.advance(version=v, seed=11)

    def apart(stream):
        stream.dispatch([flight(8)], version=0)
        stream.advance(version=0, seed=11)
        stream.dispatch([flight(3)], version=1)
        for v in range(1, 4):
            stream.advance(version=v, seed=11)
    one, other = seeds_of(together), seeds_of(apart)
    assert one == other
    assert one[(3, 0)] == {answer_seed(11, 3, 0), answer_seed(11, 3, 1)}
    assert one[(3, 3)] == {answer_seed(11, 3, 0, 3)}  # answer 0 goes on after its 3 tokens
    assert one[(8, 3)] == {answer_seed(11, 8, 1, 3)}
    assert len({s for seeds in one.values() for s in seeds}) == 6  # 4 answers, 2 go on
