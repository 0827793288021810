"""A rollout rank of the disaggregated placement (megatron_rlep/placement.py) before its loop:
the engine it builds, with the bridge and the engine stood in for."""

import pytest

from megatron_rlep import placement
from megatron_rlep.config import compose


class Built(Exception):
    """Raised by the stand-in engine maker: the rank stops once it has asked for its engine."""


class FakeBridge:
    """Stands in for the bridge to learner 0: records what the rank says, answers stop."""

    def __init__(self, rank, size, timeout_s):
        self.sent = []
        FakeBridge.last = self

    def send(self, peer, message):
        self.sent.append(message)

    def receive(self, peer, timeout_s=None):
        return ("stop",)


def test_a_rollout_rank_sizes_its_engine_for_validation_and_has_its_gpu_to_itself(monkeypatch):
    """Findings 6 and 8: the engine's length covers a validation answer longer than a training
    one (validation answers were cut short), and it is built as a dedicated engine (vLLM: its own
    memory share, no sleep mode, where it took the colocated 0.6 and slept)."""
    import megatron_rlep.builtin_model
    import megatron_rlep.rollout

    asked = {}

    def make_engine(rollout, path, dtype, seed, max_model_len, tensor_parallel=None,
                    dedicated=False):
        asked.update(max_model_len=max_model_len, dedicated=dedicated)
        raise Built

    monkeypatch.setattr(placement, "Bridge", FakeBridge)
    monkeypatch.setattr(megatron_rlep.rollout, "make_engine", make_engine)
    monkeypatch.setattr(megatron_rlep.builtin_model, "resolve_model_path", lambda path: path)
    cfg = compose(["rollout.placement=disaggregated", "rollout.ranks=1", "data.max_prompt_length=64",
                   "rollout.max_response_length=32", "validation.max_response_length=96"])
    with pytest.raises(Built):
        placement.rollout_rank_main(cfg, 0, 1)
    assert asked == {"max_model_len": 64 + 96, "dedicated": True}
    assert FakeBridge.last.sent[0][0] == "error"  # told to learner 0 before the rank exits


def test_a_rollout_rank_sees_only_its_own_gpu_before_anything_touches_cuda(monkeypatch):
    """Finding 1: each rollout rank keeps its node-local device visible, as device 0, before
    the bridge (whose weight group is NCCL's on GPUs) or the engine start."""
    cfg = compose(["rollout.placement=disaggregated", "rollout.ranks=1"])
    env = {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    placement.own_device(env)
    assert env == {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7"}
    env = {"SLURM_LOCALID": "2"}
    monkeypatch.setattr(placement.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    placement.own_device(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["LOCAL_RANK"] == "0"
    monkeypatch.setattr(placement.os.path, "exists", lambda path: False)  # a CPU node
    env = {"LOCAL_RANK": "1"}
    placement.own_device(env)
    assert env == {"LOCAL_RANK": "1"}

    seen = []  # the order: the device first, then the bridge
    monkeypatch.setattr(placement, "own_device", lambda: seen.append("device"))

    class Bridge(FakeBridge):
        def __init__(self, *args):
            seen.append("bridge")
            raise Built
    monkeypatch.setattr(placement, "Bridge", Bridge)
    with pytest.raises(Built):
        placement.rollout_rank_main(cfg, 0, 1)
    assert seen == ["device", "bridge"]
