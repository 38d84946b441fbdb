"""DDP's membership generations (mpca.algorithm.membership): the decision rule by hand, and the store protocol
with a real in-process TCPStore and one thread per agent (no process group, no other process)."""
import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from mpca.algorithm.ddp import optimizer_layout, optimizer_state
from mpca.algorithm.membership import Generation, Membership, decide, first_generation


def test_decide_ranks_by_agent_id_and_takes_the_replica_furthest_ahead():
    gen = decide(3, {4: 120, 0: 121, 2: 121}, joins=1)
    assert gen == Generation(3, (0, 2, 4), source=0, steps=121, joins=1)
    assert [gen.rank(a) for a in (0, 2, 4)] == [0, 1, 2] and gen.world == 3
    assert decide(1, {1: 0, 3: 50}, joins=2).source == 3  # a newcomer (0 steps) adopts the survivor's replica
    assert Generation.from_json(gen.to_json()) == gen
    assert first_generation(4) == Generation(0, (0, 1, 2, 3), 0, 0, 0)
    with pytest.raises(ValueError):
        decide(1, {}, 0)


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)

    def client(prefix="run/members"):
        c = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=datetime.timedelta(seconds=10))
        return dist.PrefixStore(prefix, c)

    yield client


def _in_threads(calls):
    out, errors = {}, []

    def run(key, fn):
        try:
            out[key] = fn()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=kv) for kv in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def _member(store, agent, agents=4, **kw):
    return Membership(store(), agent, agents, settle_s=kw.pop("settle_s", 0.3), poll_s=0.01, timeout_s=10, **kw)


def test_the_first_k_arrivals_are_generation_0_and_later_ones_are_newcomers(store):
    arrivals = [_member(store, a, agents=2).arrive() for a in (0, 1, 1)]
    assert arrivals == [True, True, False]


def test_survivors_of_a_loss_agree_on_one_generation_without_the_lost_agent(store):
    survivors = {a: _member(store, a) for a in (0, 2, 3)}
    steps = {0: 40, 2: 41, 3: 40}  # one survivor got one step further before the failure
    got = _in_threads({a: (lambda a=a, m=m: m.next(0, steps[a], expected=None)) for a, m in survivors.items()})
    assert len(set(got.values())) == 1
    gen = got[0]
    assert gen.members == (0, 2, 3) and gen.number == 1 and gen.source == 2 and gen.steps == 41
    assert survivors[0].latest() == 1


def test_a_newcomer_joins_the_members_next_generation_and_adopts_their_replica(store):
    members = {a: _member(store, a, agents=3) for a in (0, 1)}
    newcomer = _member(store, 2, agents=3)
    got = _in_threads({2: newcomer.join,
                       **{a: (lambda a=a, m=m: _after_joins(m, a)) for a, m in members.items()}})
    assert got[0] == got[1] == got[2]
    assert got[2].members == (0, 1, 2) and got[2].source == 0 and got[2].steps == 77 and got[2].joins == 1


def _after_joins(m, agent):
    """What a member does: sees the newcomer's request (the polled counter), then re-forms expecting it."""
    while m.joins() == 0:
        threading.Event().wait(0.01)
    return m.next(0, 77, expected=2 + m.joins() - 0)


def test_a_participant_left_out_of_a_decided_generation_asks_to_join_the_next(store):
    early = _member(store, 0)
    gen1 = early.next(0, 10, expected=1)  # decided alone: 1 expected, 1 ready
    assert gen1.members == (0,)
    late = _member(store, 1)
    got = _in_threads({1: lambda: late.next(0, 10, expected=None),
                       0: lambda: _rejoin(early, gen1)})
    assert got[1] == got[0] and got[1].members == (0, 1) and got[1].number == 2


def _rejoin(m, gen):
    while m.joins() <= gen.joins:  # the late participant's request
        threading.Event().wait(0.01)
    return m.next(gen.number, 10, expected=gen.world + m.joins() - gen.joins)


def test_waiting_for_a_generation_ends_when_the_driver_asks_to_stop(store):
    stop = threading.Event()
    m = _member(store, 0, stopping=stop.is_set, settle_s=60)
    threading.Timer(0.2, stop.set).start()
    assert m.next(0, 5, expected=3) is None


def test_an_optimizer_state_survives_its_json_layout_and_tensors():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    import json

    meta, tensors = optimizer_layout(opt)
    meta = json.loads(json.dumps(meta))  # as it travels
    fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters(), lr=0.5)
    fresh.load_state_dict(optimizer_state(meta, [t.clone() for t in tensors]))
    want, got = opt.state_dict(), fresh.state_dict()
    assert got["param_groups"][0]["lr"] == 0.01
    for i, entry in want["state"].items():
        for k, v in entry.items():
            assert torch.equal(torch.as_tensor(got["state"][i][k]), torch.as_tensor(v)), (i, k)
