"""One answer grown in the asynchronous rollout stream, for the tool tests."""

from megatron_rlep.rollout.stream import Flight, RolloutStream


def grown(engine, prompt: tuple, turns, max_tokens: int):
    """(the answer, the last version): ``prompt``'s one answer sampled by ``engine`` 4 tokens a
    segment, a new policy version each segment, with ``turns``' tools."""
    stream = RolloutStream(engine, segment=4, max_tokens=max_tokens, max_staleness=100,
                           turns=turns)
    stream.dispatch([Flight(0, prompt, 1)], version=0)
    version = 0
    while not stream.flights[0].done:
        stream.advance(version, seed=1)
        version += 1
    return stream.flights[0].answers[0], version - 1
