"""A rollout rank of a disaggregated job (megatron_rlep/rollout/rollout_rank.py) before its loop:
the engine it builds, with the bridge and the engine stood in for; the bridge
(megatron_rlep/rollout/bridge.py) and the learners' loop."""

import threading

import pytest
from speed import scaled

from megatron_rlep.rollout import bridge as bridges
from megatron_rlep.rollout import messages, rollout_rank
from megatron_rlep.config import compose


class Built(Exception):
    """Raised by the stand-in engine maker: the rank stops once it has asked for its engine."""


class FakeBridge:
    """Stands in for the bridge to learner 0: records what the rank says, answers stop."""

    def __init__(self, rank, size, timeout_s, connect_s, sync_s):
        self.sent = []
        FakeBridge.last = self

    def send(self, peer, message):
        self.sent.append(message)

    def receive(self, peer, timeout_s=None):
        return messages.Stop()


def test_a_rollout_rank_sizes_its_engine_for_validation_and_has_its_gpu_to_itself(monkeypatch,
                                                                                  tmp_path):
    """Findings 6 and 8: the engine's length covers a validation answer longer than a training
    one (validation answers were cut short), and it is built as a dedicated engine (vLLM: its own
    memory share, no sleep mode, where it took the colocated 0.6 and slept)."""
    import megatron_rlep.builtin_model
    import megatron_rlep.rollout

    asked = {}

    def make_engine(rollout, path, dtype, seed, max_model_len, tensor_parallel=None,
                    dedicated=False, sandbox=None, routes=False):
        asked.update(max_model_len=max_model_len, dedicated=dedicated)
        raise Built

    monkeypatch.setattr(rollout_rank, "Bridge", FakeBridge)

    def quit_quietly():
        raise Built  # as the rank's process ends
    monkeypatch.setattr(rollout_rank, "quit_quietly", quit_quietly)
    monkeypatch.setattr(megatron_rlep.rollout, "make_engine", make_engine)
    monkeypatch.setattr(megatron_rlep.builtin_model, "resolve_model_path", lambda path: path)
    cfg = compose(["rollout.placement=disaggregated", "rollout.ranks=1", "data.max_prompt_length=64",
                   "rollout.max_response_length=32", "validation.max_response_length=96",
                   f"run_dir={tmp_path}"])
    with pytest.raises(Built):
        rollout_rank.rollout_rank_main(cfg, 0, 1)
    assert asked == {"max_model_len": 64 + 96, "dedicated": True}
    said = FakeBridge.last.sent[0]  # said before the rank exits, its traceback kept
    assert isinstance(said, messages.Failed) and said.why.startswith("Built:  (traceback: ")
    assert "raise Built" in (tmp_path / "rollout-rank-0.traceback").read_text()


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


def bridge_ends(size: int, timeout_s: float) -> dict:
    """A bridge of ``size`` ranks in this one process, each end met from its own thread."""
    ends = {}

    def start(rank):
        ends[rank] = bridges.Bridge(rank, size, timeout_s=timeout_s, connect_s=30)
    threads = [threading.Thread(target=start, args=(rank,)) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ends


def test_the_bridge_outlives_silence_longer_than_its_timeout_and_finds_a_silent_peer(job_store):
    """Finding 2: a learner with nothing to say for longer than rollout.timeout_s (a long
    checkpoint save) leaves the bridge up, its heartbeats saying it is alive; a peer that is
    not even heard from for rollout.timeout_s is found silent in one sentence."""
    import time

    ends = bridge_ends(2, 2.0)
    learner, rollout = ends[0], ends[1]
    time.sleep(5)  # 2.5 x the timeout without a message either way
    learner.send(1, messages.Work([messages.Prompt(3, [1, 2], 2)]))
    assert rollout.receive(0, None) == messages.Work([messages.Prompt(3, [1, 2], 2)])
    rollout.send(0, messages.Landed([]))
    assert isinstance(learner.receive(1, 10), messages.Landed)
    learner.close(wait_s=0)  # its heartbeats stop: as a learner whose node stalls
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out: bridge rank 0 not heard from in \d+ s "
                                           r"\(rollout.timeout_s=2\)"):
        rollout.receive(0, None)
    assert time.monotonic() - start < 2.0 + scaled(1.5)
    rollout.close(wait_s=0)  # both ends in this one process: neither closes its links


def test_a_rank_busy_past_the_wait_on_it_says_what_it_is_doing(job_store, monkeypatch):
    """Issue 76, item 2: a rollout rank answers the bridge during a batch: while a generate call
    runs, its heartbeats say what it is doing and for how long, so learner 0, whose wait on it
    ends first (rollout.timeout_s), names the rank, what it was doing and the two ways out (on
    f6a37d0 it said "the rollout ranks sent nothing ... one hung or died", and "stopped
    answering ... it hung" for a weight sync's Ready); a rank done with it says nothing more."""
    import re
    import time

    from megatron_rlep.rollout.remote_stream import RemoteStream, RolloutRankError

    monkeypatch.setenv("SLURMD_NODENAME", "node4")
    monkeypatch.setenv("RANK", "2")
    ends = bridge_ends(2, 2.0)
    learner, rollout = ends[0], ends[1]
    stream = RemoteStream(learner, [[1]], 1, 2.0, 1800.0)
    learner.inbox[1].put(messages.Landed([]))
    stream._message(1)  # its first word: waits on it now last rollout.timeout_s
    said = (r"^rollout rank 0 \(job rank 2 on node4\) has been generating the answers of 4 "
            r"prompts for \d+ s, past the wait on it, 2 s \(rollout.timeout_s\): raise that "
            r"above a batch's time \(docs/cluster.md, sizing\), or set rollout.partial=true")
    with rollout.busy("generating the answers of 4 prompts"):
        with pytest.raises(RolloutRankError, match=said):
            stream._landed()  # the stream's wait for finished answers
        with pytest.raises(TimeoutError) as waited:
            stream._reply(1)  # a weight sync's wait for Ready: said by its caller, so
        assert re.match(said, stream._fault(1, waited.value))
        assert int(learner.doing(1).rsplit(" for ", 1)[1].split()[0]) >= 4
    deadline = time.monotonic() + scaled(5)
    while learner.doing(1) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert learner.doing(1) is None  # its next heartbeat: busy no more
    for end in ends.values():
        end.close(wait_s=0)  # both ends in this one process: neither closes its links


def test_learner_0_logs_where_the_rollout_ranks_run_and_a_fault_names_the_dead_rank(
        job_store, capsys, monkeypatch):
    """Issue 76, items 4 and 5: the bridge's ranks say their node and job rank as they meet;
    learner 0 logs the rollout ranks' nodes as they are (torchrun's rendezvous, not the job,
    orders the nodes), and names a faulty rank by rollout rank, job rank and node (on 4eafd73:
    by its bridge rank, one higher, with no node). A rank whose process died is named before
    the engine peer that reports its broken collective first."""

    from megatron_rlep.rollout.remote_stream import RemoteStream, RolloutRankError

    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    monkeypatch.setenv("RANK", "5")
    ends = bridge_ends(3, 30.0)
    learner = ends[0]
    assert "learner 0: the bridge met: learner 0 (job rank 5) on node7; rollout ranks 0-1 " \
        "(job ranks 5,5) on node7" in capsys.readouterr().out
    learner.places = {0: ("n1", 0), 1: ("n2", 2), 2: ("n2", 3)}  # as a two-node job's are
    assert learner.layout() == "learner 0 (job rank 0) on n1; rollout ranks 0-1 (job ranks 2-3) on n2"
    learner.places[2] = ("n3", 7)
    assert learner.layout() == ("learner 0 (job rank 0) on n1; rollout rank 0 (job rank 2) on "
                                "n2; rollout rank 1 (job rank 7) on n3")
    assert learner.name(2) == "rollout rank 1 (job rank 7 on n3)"

    stream = RemoteStream(learner, [[1, 2]], 1, 30.0, 1800.0)
    # until the rollout ranks' first word (their engines start) a wait on them has the start-up's
    # deadline (a resumed run's first weight sync once waited rollout.timeout_s for it)
    assert stream._limit() == (1800.0, "rollout.connect_timeout_s, as their engines start")
    learner.inbox[1].put(messages.Landed([]))
    stream._message(1)
    assert stream._limit() == (30.0, "rollout.timeout_s")
    learner.inbox[1].put(messages.Failed("RuntimeError: Connection closed by peer"))
    learner.inbox[2].put(messages.Broken("RuntimeError: Connection reset by peer"))
    with pytest.raises(RolloutRankError) as said:
        stream._message(1)  # the engine's reader reports first; its peer's process died
    assert str(said.value) == ("rollout rank 1 (job rank 7 on n3) is gone: the bridge to it "
                               "broke (RuntimeError: Connection reset by peer); its log says why")
    learner.inbox[2].get()
    later = threading.Timer(0.3, learner.inbox[2].put, [messages.Broken("RuntimeError: reset")])
    later.start()  # a broadcast to them all broke first: which rank's link, its reader says
    assert stream._fault(0, RuntimeError("Connection reset by peer")).startswith(
        "rollout rank 1 (job rank 7 on n3) is gone: the bridge to it broke (RuntimeError: reset)")
    learner.inbox[2].get()
    learner.inbox[1].put(messages.Failed("ValueError: bad prompt"))
    with pytest.raises(RolloutRankError, match=r"^rollout rank 0 \(job rank 2 on n2\) failed: "
                                               r"ValueError: bad prompt$"):
        stream._message(1)
    for end in ends.values():
        end.close(wait_s=0)  # every end in this one process: none closes its links


def test_a_bridge_rank_that_never_comes_is_said_within_the_start_up_deadline(job_store, capsys):
    """Finding 5: the start-up deadline is rollout.connect_timeout_s, said in the log, and the
    ranks that did not come are named."""
    import time

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rollout rank 0: bridge ranks \[0\] .* did not start "
                                           r"within 1 s \(rollout.connect_timeout_s\)"):
        bridges.Bridge(1, 2, timeout_s=5.0, connect_s=1)
    assert time.monotonic() - start < scaled(10)
    assert "rollout rank 0: waiting up to 1 s (rollout.connect_timeout_s) for the bridge's 2 " \
        "ranks" in capsys.readouterr().out


def test_an_engines_ranks_hear_from_its_reader_every_heartbeat_and_time_out_by_the_run(
        monkeypatch):
    """Issue 76, item 3: the ranks of a TP engine wait for each other at most rollout.timeout_s
    in their own group (on 4eafd73 torch's 30 minutes), and the engine's reader passes its
    other ranks ``Idle`` after a heartbeat's time without a message from learner 0, so a long
    silence of learner 0's (a checkpoint save) outlasts that timeout (on 4eafd73 the reader
    waited on learner 0 as long as it took, the other ranks in their broadcast meanwhile)."""
    import datetime

    import torch.distributed as dist

    cfg = compose(["rollout.placement=disaggregated", "rollout.ranks=4",
                   "rollout.tensor_parallel=2", "rollout.timeout_s=45"])
    made = []
    for name in ("RANK", "WORLD_SIZE"):  # _engine_group sets them: restored after the test
        monkeypatch.setenv(name, "0")  # (delenv of an unset name would restore nothing)
    monkeypatch.setattr(rollout_rank, "job_store", lambda name, timeout: None)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: made.append(kw["timeout"]))
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: made.append(kw["timeout"]) or ranks)
    rank = rollout_rank.RolloutRank.__new__(rollout_rank.RolloutRank)
    start_up = datetime.timedelta(seconds=1800)  # the bridge's: rollout.connect_timeout_s
    rank.r, rank.index, rank.bridge = cfg.rollout, 3, type("B", (), {"timeout": start_up})()
    assert rank._engine_group() == ([2, 3], 2)
    assert made == [start_up] + [datetime.timedelta(seconds=45)] * 2  # the world, the engines

    class Silent:  # learner 0 saying nothing (its heartbeats keep it alive)
        beat_s = 0.2

        def ready(self, peer):
            return False

        def receive(self, peer, timeout_s=None):
            threading.Event().wait(timeout_s or 30)  # as long as learner 0 is silent

    passed = []
    monkeypatch.setattr(dist, "broadcast_object_list", lambda box, src, group: passed.append(box[0]))
    rank.bridge, rank.reader, rank.peers = Silent(), True, ("group", 2)
    said = []
    waiting = threading.Thread(target=lambda: said.append(rank.next_message(busy=False)),
                               daemon=True)
    waiting.start()
    waiting.join(scaled(5))
    assert said == [messages.Idle()] and passed == [messages.Idle()]


class Broadcast:
    """A broadcast's NCCL work as learner 0 sees it: done when ``done`` says so (a rank that never
    joins: never; NCCL's own wait has no deadline but its watchdog), the host's waits written to
    ``order``."""

    def __init__(self, order, index, done=True):
        self.order, self.index, self.done = order, index, done

    def is_completed(self):
        if self.done:
            self.order.append(("wait for", self.index))
        return self.done

    def wait(self):  # on a GPU: the stream's wait, not the host's
        pass


def fake_bridge(order, done=True, sync_s=300.0):
    """Learner 0's end of a bridge to one rollout rank, its weights group stood in for."""
    import queue

    class Group:
        def broadcast(self, tensors, options):
            order.append(("broadcast", len(tensors[0])))
            return Broadcast(order, sum(o[0] == "broadcast" for o in order) - 1, done)

    bridge = bridges.Bridge.__new__(bridges.Bridge)
    bridge.rank, bridge.size, bridge.weights, bridge.sync_s = 0, 2, Group(), sync_s
    bridge.inbox = {1: queue.Queue()}
    bridge.send = lambda peer, message: None
    return bridge


def test_learner_0_holds_at_most_two_flat_buckets_while_they_cross_the_wire(monkeypatch):
    """Finding 4: on a GPU a broadcast's wait holds the stream, not the host, so the host once ran
    ahead and made every bucket's flat copy before the first crossed; now it waits for the
    broadcast two buckets back before it copies the next (CUDA stood in for, in order)."""
    import torch

    order = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bridges, "flat_bucket", lambda bucket, device: order.append(
        ("copy", bucket[0][0])) or torch.zeros(4, dtype=torch.uint8))
    bridge = fake_bridge(order)
    buckets = [[(f"b{k}", torch.zeros(1))] for k in range(4)]
    assert bridge.broadcast_buckets(buckets) == 16
    copies = [i for i, o in enumerate(order) if o[0] == "copy"]
    assert order[copies[2] - 1] == ("wait for", 0) and order[copies[3] - 1] == ("wait for", 1)
    assert [o for o in order[copies[3]:] if o[0] == "wait for"] == [("wait for", 2),
                                                                   ("wait for", 3)]


def test_a_weight_sync_ends_within_its_budget_and_names_a_rank_that_died_in_it(monkeypatch):
    """Issue 76, item 2: learner 0 waits for a weight sync at most rollout.sync_timeout_s, and a
    rank whose process dies meanwhile is said at once, each in one sentence (on a49faf2 a
    broadcast's wait had no deadline but its NCCL group's timeout, then NCCL's watchdog abort);
    the NCCL group's own timeout lies a margin beyond the budget."""
    import datetime
    import time

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bridges, "flat_bucket", lambda bucket, device: torch.zeros(4))
    buckets = [[("w", torch.zeros(1))]]
    outcome = []

    def sync(bridge):
        start = time.monotonic()
        try:
            bridge.broadcast_buckets(buckets)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            outcome.append((err, time.monotonic() - start))

    stuck = fake_bridge([], done=False, sync_s=0.5)  # the rank never joins the broadcast
    waiting = threading.Thread(target=sync, args=(stuck,), daemon=True)
    waiting.start()
    waiting.join(scaled(10))
    assert outcome, "learner 0 still waits in the broadcast"
    err, took = outcome.pop()
    assert isinstance(err, bridges.SyncTimeout) and 0.5 <= took < scaled(5), (err, took)
    assert str(err).startswith("a weight sync did not finish within 0.5 s "
                               "(rollout.sync_timeout_s) after every rollout rank was ready")
    dead = fake_bridge([], done=False, sync_s=300.0)  # the rank dies in it
    dead.inbox[1].put(messages.Broken("RuntimeError: Connection reset by peer"))
    waiting = threading.Thread(target=sync, args=(dead,), daemon=True)
    waiting.start()
    waiting.join(scaled(10))
    err, took = outcome.pop()
    assert isinstance(err, bridges.PeerGone) and took < scaled(5)
    assert "bridge rank 1's link broke during a weight sync" in str(err)
    assert bridges.weights_timeout(300.0) == datetime.timedelta(seconds=360)


def test_the_placement_is_chosen_once_and_the_loop_never_asks_where_the_engines_run():
    """Issue 76, item 6: ``rollout.placement`` is read by one function, ``train.rollout_side``
    (on 4eafd73 ``Trainer.__init__`` read it three times, ``main`` once, the producer twice,
    and ``tool_seconds`` asked the rollout side for an engine by ``getattr``); the trainer and
    the producer reach the engines through the side it returns (rollout/service.py)."""
    import ast
    import inspect

    from megatron_rlep import producer, train

    lines, start = inspect.getsourcelines(train.rollout_side)
    chooser = range(start, start + len(lines))
    for module in (train, producer):
        for number, line in enumerate(inspect.getsource(module).splitlines(), 1):
            if "placement" in line:
                assert module is train and number in chooser, (module.__name__, number, line)
    for cls in (train.Trainer, producer.Producer):
        tree = ast.parse(inspect.getsource(cls))
        names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                 for n in ast.walk(tree)}
        assert not names & {"remote", "bridge", "RemoteStream", "RemoteRollout",
                            "LocalRollout"}, cls.__name__
    assert "getattr" not in inspect.getsource(train.Trainer)


def test_what_the_two_sides_say_is_read_by_name_only():
    """Issue 76, item 6: every message, and every item one carries, is a named type, built and
    read by its fields (on 4eafd73 ``Work`` and ``Landed`` carried tuples read by position)."""
    import dataclasses

    import torch

    from megatron_rlep.rollout.stream import Answer

    answer = Answer([5, 6], [-0.1, -0.2], [1, 1], finished=True, done=True)
    said = [messages.Work([messages.Prompt(3, [1, 2], 2)]),
            messages.Landed([messages.Finished(3, [answer])], 0.5, {}),
            messages.Bucket([messages.TensorSpec("w", (2, 2), torch.bfloat16)])]

    def named(value) -> bool:
        if isinstance(value, tuple):  # a record read by position; a shape is a value
            return all(isinstance(v, int) for v in value)
        if isinstance(value, list):
            return all(named(v) for v in value)
        if dataclasses.is_dataclass(value):
            return all(named(getattr(value, f.name)) for f in dataclasses.fields(value))
        return True
    for message in said:
        assert named(message), message
    for name, kind in vars(messages).items():
        if isinstance(kind, type) and kind.__module__ == messages.__name__:
            assert dataclasses.is_dataclass(kind), name
