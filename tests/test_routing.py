"""MoE routing replay's pieces on hand-made numbers (megatron_rlep/actor/routing.py); the actor
with it on every layout: tests/test_actor.py, through the trainer: tests/test_train.py."""

import math

import pytest
import torch

from megatron_rlep.actor import routing
from megatron_rlep.actor.batch import SequenceBatch, collate, collate_packed, collate_shared, idle


def topk(scores, k, num_groups=None, group_topk=None):
    return torch.topk(scores, k=k, dim=1)


def test_a_given_route_is_used_its_scores_gathered_and_the_own_choice_counted():
    hook = routing.LayerRoutes()
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0],
                           [1.0, 2.0, 3.0, 4.0],
                           [0.0, 5.0, 1.0, 6.0]], requires_grad=True)
    hook.target = torch.tensor([[1, 0], [0, 1], [-1, -1]], dtype=torch.int8)
    values, index = hook.get_replay_topk(scores, 2, default_compute_topk=topk)
    # row 0: the router's own {0, 1} in another order counts as the same; row 1: forced to
    # {0, 1} against its own {3, 2}; row 2: none given, its own {3, 1}
    assert index.tolist() == [[1, 0], [0, 1], [3, 1]]
    assert values.tolist() == [[3.0, 4.0], [1.0, 2.0], [6.0, 5.0]]
    assert hook.counts.tolist() == [2, 1] and torch.equal(hook.used, index)
    values.sum().backward()  # the router's scores get a gradient where the tokens were sent
    assert scores.grad.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 0, 1]]
    hook.target = None
    _, index = hook.get_replay_topk(scores, 2, default_compute_topk=topk)
    assert index.tolist() == [[0, 1], [3, 2], [3, 1]] and hook.counts.tolist() == [2, 1]


def test_rows_follow_megatrons_sequence_major_order_and_sequence_parallel_slices():
    ids = torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1]])  # [b=2, s=4]
    assert routing.router_rows(ids).tolist() == [0, 4, 1, 5, 2, -1, 3, -1]
    assert routing.router_rows(ids, 0, 2).tolist() == [0, 4, 1, 5]
    assert routing.router_rows(ids, 1, 2).tolist() == [2, -1, 3, -1]
    used = torch.full((6, 2, 2), -1, dtype=torch.int8)
    routing.record(used, torch.tensor([5, -1, 0]), {1: torch.tensor([[1, 2], [3, 0], [0, 2]])})
    assert used[5, 1].tolist() == [1, 2] and used[0, 1].tolist() == [0, 2]
    assert (used[:, 0] == -1).all() and (used[1:5] == -1).all()


def test_given_routes_become_targets_and_reach_a_shared_prompts_row():
    table = torch.arange(6 * 2 * 2, dtype=torch.int8).view(6, 2, 2)
    rows = torch.tensor([5, -1, 0])
    assert routing.targets(table, rows, 1).tolist() == [[22, 23], [-1, -1], [2, 3]]
    # a group of three over a 2-token prompt: the first has no routes (a replay), the second's
    # prompt routes go to all; a group without any stays without
    second = torch.full((4, 1, 2), 7, dtype=torch.int8)
    out = routing.shared_prompt_routes([None, second, None, None], [3, 4, 5, 3],
                                       [[0, 1, 2], [3]], [2, 2, 2, 1])
    assert out[0][:, 0, 0].tolist() == [7, 7, -1] and out[2][:, 0, 0].tolist() == [7, 7, -1, -1, -1]
    assert torch.equal(out[1], second) and out[3] is None


def test_an_answers_routes_grow_by_the_rows_each_completion_fed_last():
    """A 2-token prompt, a first completion of 2 tokens (rows 0-2 fed, the last never: -1); a
    second one continues after a 3-token observation: the first's fed rows stay, the rest are
    the second's (its prefill fed the first's last token and the observation); rows of tokens
    cut off the answer are dropped, and a finished answer's unfed rows are -1."""
    from megatron_rlep.rollout.base import joined_routes, padded_routes

    def rows(values):
        return torch.tensor(values, dtype=torch.int8).view(-1, 1, 1)
    first = joined_routes(None, rows([1, 1, 1, -1]))
    assert first[:, 0, 0].tolist() == [1, 1, 1, -1]
    second = rows([2, 2, 2, 2, 2, 2, 2, 2, 2, -1])  # prompt 2 + answer 4 + observation 3 + 1
    grown = joined_routes(first, second)
    assert grown[:, 0, 0].tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2, -1]
    assert joined_routes(first, second, dropped=2)[:, 0, 0].tolist() == [1, 1, 1, 2, 2, 2, 2, 2]
    assert joined_routes(first, None) is None and padded_routes(None, 4) is None
    assert padded_routes(rows([3, 3]), 4)[:, 0, 0].tolist() == [3, 3, -1, -1]
    assert padded_routes(grown, 10) is grown


def batch():
    # two sequences of one prompt (3 tokens), one of another (2 tokens)
    return SequenceBatch([[7, 8, 9, 1, 2], [7, 8, 9, 3], [5, 6, 4, 4, 4]], [3, 3, 2])


def test_each_collate_names_every_slot_by_its_row_in_the_pass_table():
    b, cpu = batch(), torch.device("cpu")  # rows: 0-4, 5-8, 9-13
    assert collate(b, [2, 1], cpu, 2).token_ids.tolist() == [
        [9, 10, 11, 12, 13, -1], [5, 6, 7, 8, -1, -1]]
    assert collate_packed(b, [0, 2], cpu, 4).token_ids.tolist() == [
        [0, 1, 2, 3, 4, 9, 10, 11, 12, 13, -1, -1]]
    shared = collate_shared(b, [0, 1, 2], cpu)
    # the prompt once, as the first sequence's rows, then each response at its own positions
    assert shared.token_ids.tolist() == [[0, 1, 2, 3, 4, 8], [9, 10, 11, 12, 13, -1]]
    assert (idle(shared).token_ids == -1).all()


def test_a_shared_prompts_routes_reach_every_sequence_of_its_group():
    routes = [torch.full((n, 1, 2), -1, dtype=torch.int8) for n in (5, 4, 5)]
    routes[0][:] = 1
    routes[1][3:] = 2  # its response; its prompt was the first sequence's
    routes = routing.shared_prompt_routes(routes, [5, 4, 5], [[0, 1], [2]], [3, 3, 2])
    assert routes[1][:, 0, 0].tolist() == [1, 1, 1, 2] and (routes[2] == -1).all()


def test_agreement_by_layer_leaves_out_layers_with_nothing_given():
    counts = torch.tensor([[4, 3], [0, 0], [4, 1]])
    assert routing.agreement(counts) == pytest.approx({
        "moe/route_agreement": 0.5, "moe/route_agreement_l0": 0.75, "moe/route_agreement_l2": 0.25})
    assert routing.agreement(torch.zeros(2, 2, dtype=torch.long)) == {}


def test_routes_take_one_byte_up_to_128_experts():
    assert routing.route_dtype(128) == torch.int8 and routing.route_dtype(129) == torch.int16


def test_a_dense_model_or_a_recompute_under_pipeline_parallelism_is_refused_in_one_sentence():
    from types import SimpleNamespace

    from megatron_rlep.actor.actor import routing_problem

    dense, moe = SimpleNamespace(model_type="qwen3"), SimpleNamespace(model_type="qwen3_moe",
                                                                      num_experts=4)
    assert routing_problem("none", dense, 2, "full") is None
    assert routing_problem("actor", dense, 1, "none").startswith(
        "actor.routing_replay=actor replays a mixture-of-experts model's routes and this qwen3")
    assert "set parallel.recompute=selective" in routing_problem("actor", moe, 2, "full")
    assert routing_problem("actor", moe, 1, "full") is None
    assert routing_problem("actor", moe, 2, "selective") is None


def test_the_router_is_never_fused_as_the_fused_one_skips_the_hook():
    from types import SimpleNamespace

    from megatron_rlep.actor.hf import _moe_settings

    moe = SimpleNamespace(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=8, norm_topk_prob=True)
    assert _moe_settings(moe, 1, 0.0, True)["moe_router_fusion"] is False


def test_the_transformers_engine_returns_the_routes_a_plain_forward_takes(tmp_path):
    """Batched, left-padded and decoded token by token with a KV cache, each completion's routes
    are the experts a forward pass over its prompt and response alone picks, token for token;
    the response's last token, never fed, has none."""
    import sys
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent / "helpers"))
    import tiny

    from megatron_rlep.rollout.transformers_engine import TransformersEngine

    model = tiny.make_model(tmp_path / "m", "qwen3_moe")
    engine = TransformersEngine(str(model), batch_size=3, routes=True)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    out = engine.generate(prompts, n=2, max_tokens=6, seed=3)
    reference = AutoModelForCausalLM.from_pretrained(model).eval()
    for prompt, completions in zip(prompts, out):
        for c in completions:
            ids = list(prompt) + list(c.token_ids)
            assert c.routes.shape == (len(ids), 2, 2) and c.routes.dtype == torch.int8
            assert torch.equal(c.routes[:-1].long().sort(-1).values, forward_routes(reference, ids))
            assert (c.routes[-1] == -1).all()
    assert len({tuple(c.token_ids) for cs in out for c in cs}) > 1  # the rows differ


def forward_routes(model, ids) -> torch.Tensor:
    """[tokens - 1, layers, top-k] experts (sorted) of a plain transformers forward over ``ids``
    less the last token."""
    picked = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, args, o: picked.append(o[2]))
             for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([list(ids)[:-1]]))
    for hook in hooks:
        hook.remove()
    return torch.stack(picked, 1).sort(-1).values


def test_a_partial_rollouts_routes_are_each_segments_across_a_weight_update(tmp_path):
    """The rollout stream in segments of 3 tokens on the transformers engine, its routers'
    weights negated after the first segment (a weight update): each answer's rows up to the
    one that fed its third token are the first weights' forward's, the rest the new weights'
    (the second segment fed the third token again), token for token."""
    import sys
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent / "helpers"))
    import tiny

    from megatron_rlep.rollout.stream import Flight, RolloutStream
    from megatron_rlep.rollout.transformers_engine import TransformersEngine

    model = tiny.make_model(tmp_path / "m", "qwen3_moe")
    before = AutoModelForCausalLM.from_pretrained(model).eval()
    after = AutoModelForCausalLM.from_pretrained(model).eval()
    with torch.no_grad():
        for layer in after.model.layers:
            layer.mlp.gate.weight.neg_()
    after.save_pretrained(tmp_path / "after")
    engine = TransformersEngine(str(model), batch_size=4, routes=True)
    stream = RolloutStream(lambda prompts, counts, seeds, max_tokens: engine.generate(
        prompts, counts, max_tokens=max_tokens, seed=seeds), 3, 8, max_staleness=5)
    prompt = (5, 6, 7, 8, 9)
    stream.dispatch([Flight(0, prompt, 2)], version=0)
    stream.advance(0, seed=1)
    engine.load_weights([list(load_file(tmp_path / "after" / "model.safetensors").items())])
    while stream.pending():
        stream.advance(1, seed=1)
    for answer in stream.flights[0].answers:
        ids = prompt + tuple(answer.token_ids)
        assert answer.versions == [0, 0, 0, 1, 1, 1, 1, 1]
        first, second = forward_routes(before, ids), forward_routes(after, ids)
        cut = len(prompt) + 2  # the row that fed the third token, the second segment's
        assert torch.equal(answer.routes[:-1].long().sort(-1).values,
                           torch.cat([first[:cut], second[cut:]]))
        assert (answer.routes[-1] == -1).all()
        assert not torch.equal(first[cut:], second[cut:])  # the two weights route apart


def test_the_start_up_line_says_where_each_kind_of_tokens_experts_come_from():
    from megatron_rlep.config import compose
    from megatron_rlep.train import routes_line

    r3 = ["actor.routing_replay=rollout", "rollout.engine=transformers"]
    plain = routes_line(compose([*r3, "algorithm.replay_per_prompt=0"]))
    assert "(R3)" in plain and "pool replay" not in plain and "segment" not in plain
    mixed = routes_line(compose([*r3, "algorithm.replay_per_prompt=2", "rollout.partial=true",
                                 "algorithm.max_staleness=1", "rollout.tools=[python]"]))
    for kind in ("each segment's own", "a tool's observation to those of the next turn's "
                 "prefill", "a pool replay's, stored without routes"):
        assert kind in mixed
    assert "(R2)" in routes_line(compose(["actor.routing_replay=actor"]))
    with pytest.raises(Exception, match="rollout.engine=vllm does not return"):
        compose(["actor.routing_replay=rollout", "rollout.engine=vllm"]).check()


def test_the_precision_study_counts_a_token_flipped_by_the_position_that_predicts_it():
    """studies/routing_precision.py's pieces: a response token is flipped where some layer's
    experts at the row before it differ (as sets) from the engine's; a ratio outside the clip
    band counts."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "studies"))
    from routing_precision import arm, flipped

    engine = torch.tensor([[[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]], [[-1, -1]]])  # 2 + 3 tokens
    own = torch.tensor([[[3, 3]], [[3, 2]], [[2, 1]], [[1, 3]], [[0, 0]]])
    # rows 1-3 predict the 3 response tokens: row 1 the same set, row 2 not, row 3 the same
    assert flipped([engine], [own], prompt=2).tolist() == [False, True, False]
    out = arm([[-1.0, -2.0]], [torch.tensor([-1.0, -2.0 + math.log(1.3)])], 0.2, 0.28)
    assert out["outside_clip"] == 0.5 and out["beyond_1pct"] == 0.5
    assert out["logp_diff_max"] == pytest.approx(math.log(1.3))
