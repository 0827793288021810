"""A rollout rank of the disaggregated placement (megatron_rlep/rollout/placement.py) before its loop:
the engine it builds, with the bridge and the engine stood in for."""

import pytest
from speed import scaled

from megatron_rlep.rollout import placement
from megatron_rlep.rollout import messages
from megatron_rlep.config import compose


class Built(Exception):
    """Raised by the stand-in engine maker: the rank stops once it has asked for its engine."""


class FakeBridge:
    """Stands in for the bridge to learner 0: records what the rank says, answers stop."""

    def __init__(self, rank, size, timeout_s, connect_s):
        self.sent = []
        FakeBridge.last = self

    def send(self, peer, message):
        self.sent.append(message)

    def receive(self, peer, timeout_s=None):
        return messages.Stop()


def test_a_rollout_rank_sizes_its_engine_for_validation_and_has_its_gpu_to_itself(monkeypatch):
    """Findings 6 and 8: the engine's length covers a validation answer longer than a training
    one (validation answers were cut short), and it is built as a dedicated engine (vLLM: its own
    memory share, no sleep mode, where it took the colocated 0.6 and slept)."""
    import megatron_rlep.builtin_model
    import megatron_rlep.rollout

    asked = {}

    def make_engine(rollout, path, dtype, seed, max_model_len, tensor_parallel=None,
                    dedicated=False, sandbox=None):
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
    assert isinstance(FakeBridge.last.sent[0], messages.Failed)  # said before the rank exits


@pytest.fixture
def job_store(monkeypatch):
    """The job's store, as torchrun's agent keeps it: every bridge rank is its client."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "true")
    yield server


def test_the_bridge_outlives_silence_longer_than_its_timeout_and_finds_a_silent_peer(job_store):
    """Finding 2: a learner with nothing to say for longer than rollout.timeout_s (a long
    checkpoint save) leaves the bridge up, its heartbeats saying it is alive; a peer that is
    not even heard from for rollout.timeout_s is found silent in one sentence."""
    import threading
    import time

    ends = {}

    def start(rank):
        ends[rank] = placement.Bridge(rank, 2, timeout_s=2.0, connect_s=30)
    threads = [threading.Thread(target=start, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    learner, rollout = ends[0], ends[1]
    time.sleep(5)  # 2.5 x the timeout without a message either way
    learner.send(1, messages.Work([(3, (1, 2), 2)]))
    assert rollout.receive(0, None) == messages.Work([(3, (1, 2), 2)])
    rollout.send(0, messages.Landed([]))
    assert isinstance(learner.receive(1, 10), messages.Landed)
    learner.close(wait_s=0)  # its heartbeats stop: as a learner whose node stalls
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out: bridge rank 0 not heard from in \d+ s "
                                           r"\(rollout.timeout_s=2\)"):
        rollout.receive(0, None)
    assert time.monotonic() - start < 2.0 + scaled(1.5)
    rollout.close(wait_s=0)  # both ends in this one process: neither closes its links


def test_a_bridge_rank_that_never_comes_is_said_within_the_start_up_deadline(job_store, capsys):
    """Finding 5: the start-up deadline is rollout.connect_timeout_s, said in the log, and the
    ranks that did not come are named."""
    import time

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rollout rank 0: bridge ranks \[0\] .* did not start "
                                           r"within 1 s \(rollout.connect_timeout_s\)"):
        placement.Bridge(1, 2, timeout_s=5.0, connect_s=1)
    assert time.monotonic() - start < scaled(10)
    assert "rollout rank 0: waiting up to 1 s (rollout.connect_timeout_s) for the bridge's 2 " \
        "ranks" in capsys.readouterr().out


def test_learner_0_holds_at_most_two_flat_buckets_while_they_cross_the_wire(monkeypatch):
    """Finding 4: on a GPU a broadcast's wait holds the stream, not the host, so the host once ran
    ahead and made every bucket's flat copy before the first crossed; now it waits for the
    broadcast two buckets back before it copies the next (CUDA stood in for, in order)."""
    import torch

    order = []

    class Event:
        def __init__(self):
            self.index = sum(1 for o in order if o[0] == "broadcast") - 1

        def record(self):
            order.append(("record", self.index))

        def synchronize(self):
            order.append(("wait for", self.index))

    class Group:
        def broadcast(self, tensors, options):
            order.append(("broadcast", len(tensors[0])))
            return type("Work", (), {"wait": lambda self: None})()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(placement, "flat_bucket", lambda bucket, device: order.append(
        ("copy", bucket[0][0])) or torch.zeros(4, dtype=torch.uint8))
    bridge = placement.Bridge.__new__(placement.Bridge)
    bridge.size, bridge.weights = 2, Group()
    bridge.send = lambda peer, message: None
    buckets = [[(f"b{k}", torch.zeros(1))] for k in range(4)]
    assert bridge.broadcast_buckets(buckets) == 16
    copies = [i for i, o in enumerate(order) if o[0] == "copy"]
    assert order[copies[2] - 1] == ("wait for", 0) and order[copies[3] - 1] == ("wait for", 1)
    assert sum(o[0] == "wait for" for o in order) == 2


def test_the_learners_loop_never_asks_where_the_engines_run():
    """Item 1 of the rollout ranks' work: the loop (Trainer's methods but its construction)
    reaches the engines only through the rollout side (rollout/service.py), never by placement."""
    import ast
    import inspect

    from megatron_rlep import train

    tree = ast.parse(inspect.getsource(train.Trainer))
    for method in tree.body[0].body:
        if isinstance(method, ast.FunctionDef) and method.name not in ("__init__", "_bridge"):
            names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                     for n in ast.walk(method)}
            assert not names & {"placement", "remote", "engine", "RemoteStream"}, method.name
