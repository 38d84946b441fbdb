"""lab.campaign's rules, without Spark: the seeded schedule, when a fault counts as recovered, the summary; and
lab.bad_frames' broken messages against a real channel server (a thread, no process)."""
import collections
import json
import math
import os
import random
import threading

import pytest

from lab import bad_frames
from lab.campaign_driver import appended
from lab.campaign import (DRIVER, Fault, parse_kinds, read_cycles, recovered_after, redone, resource_table,
                          schedule, summary)


def test_the_schedule_is_the_seeds_gaps_kinds_agents_and_holds():
    faults = schedule(7, 60.0, ["kill", "stop"], agents=3, gap_s=(5.0, 9.0), stop_s=(6.0, 8.0), start_s=10.0)
    rng = random.Random(7)  # the draws, in the order the schedule takes them
    t, expected = 10.0, []
    while True:
        t += rng.uniform(5.0, 9.0)
        if t >= 60.0:
            break
        kind, agent = rng.choices(["kill", "stop"], [1.0, 1.0])[0], rng.randrange(3)
        expected.append((round(t, 3), kind, agent, round(rng.uniform(6.0, 8.0), 3) if kind == "stop" else 0.0))
    assert [(f.t, f.kind, f.agent, f.hold_s) for f in faults] == expected
    assert 5 <= len(faults) <= 10  # 50 s of gaps of 5–9 s
    assert all(5.0 - 1e-3 <= b.t - a.t <= 9.0 + 1e-3 for a, b in zip(faults, faults[1:]))
    assert faults == schedule(7, 60.0, ["kill", "stop"], 3, (5.0, 9.0), (6.0, 8.0))  # the same seed, the same faults
    assert faults != schedule(8, 60.0, ["kill", "stop"], 3, (5.0, 9.0), (6.0, 8.0))
    with pytest.raises(ValueError, match="unknown fault"):
        schedule(0, 60.0, ["unplug"], 2, (5.0, 9.0), (6.0, 8.0))
    with pytest.raises(ValueError, match="ordered"):
        schedule(0, 60.0, ["kill"], 2, (9.0, 5.0), (6.0, 8.0))
    with pytest.raises(ValueError, match="weight"):
        schedule(0, 60.0, {"kill": 0.0}, 2, (5.0, 9.0), (6.0, 8.0))


def test_weights_make_a_kind_likelier_driver_faults_name_no_agent_and_corrupt_ones_a_variant():
    assert parse_kinds("kill:4,stop, driver:0.5") == {"kill": 4.0, "stop": 1.0, "driver": 0.5}
    faults = schedule(3, 4000.0, {"kill": 8.0, "driver": 1.0, "corrupt": 2.0, "cut": 1.0}, 4, (1.0, 1.0),
                      (0.0, 0.0), cut_s=(5.0, 60.0))
    count = {k: sum(f.kind == k for f in faults) for k in ("kill", "driver", "corrupt", "cut")}
    assert sum(count.values()) == len(faults) == 3989  # one a second from 11 s to 3,999 s
    assert 0.62 < count["kill"] / len(faults) < 0.72 and 0.05 < count["driver"] / len(faults) < 0.12
    holds = [f.hold_s for f in faults if f.kind == "cut"]
    assert 5.0 <= min(holds) < 10.0 and 55.0 < max(holds) <= 60.0  # a cut lasts 5-60 s
    assert all(f.hold_s == 0.0 for f in faults if f.kind not in ("cut", "stop"))
    assert all(f.agent == DRIVER for f in faults if f.kind == "driver")
    assert all(0 <= f.agent < 4 for f in faults if f.kind != "driver")
    assert {f.variant for f in faults if f.kind == "corrupt"} == set(bad_frames.VARIANTS)
    assert all(f.variant == "" for f in faults if f.kind != "corrupt")


def test_a_fault_is_recovered_at_the_end_of_the_first_cycle_submitted_after_it_that_counts_the_agent():
    cycles = [{"t_submit": 100.0, "t_end": 101.0, "weight": {0: 3.0, 1: 3.0}},  # before the fault
              {"t_submit": 101.5, "t_end": 104.0, "weight": {0: 3.0}},  # agent 1 missing
              {"t_submit": 104.5, "t_end": 105.0, "weight": {0: 2.0, 1: 0.0}},  # it joined: nothing of its own yet
              {"t_submit": 105.5, "t_end": 106.5, "weight": {0: 2.0, 1: 4.0}}]  # counted again
    fault = Fault(t=0.0, kind="kill", agent=1, injected_at=101.2)
    assert recovered_after(fault, cycles) == pytest.approx(106.5 - 101.2)
    assert recovered_after(Fault(0.0, "kill", 0, injected_at=101.2), cycles) == pytest.approx(104.0 - 101.2)
    assert recovered_after(Fault(0.0, "kill", 1), cycles) is None  # never injected
    assert recovered_after(Fault(0.0, "kill", 1, injected_at=106.0), cycles) is None  # no cycle after it
    # the driver: the resumed driver's first cycle that counted any agent (the joining cycle counted none)
    resumed = [{"t_submit": 130.0, "t_end": 131.0, "weight": {0: 0.0, 1: 0.0}},
               {"t_submit": 131.5, "t_end": 132.5, "weight": {0: 0.0, 1: 2.0}}]
    assert recovered_after(Fault(0.0, "driver", DRIVER, injected_at=110.0), cycles + resumed) == pytest.approx(22.5)



def test_a_parameter_service_agent_is_recovered_at_its_first_call_to_the_service_after_the_fault():
    """Its cycles carry no weight (it contributes by calling the service): the first call after the fault — after
    it ended, for a stop or a cut — or, for a driver fault, any agent's first call to the resumed driver."""
    cycles = [{"t_submit": 100.0, "t_end": 100.2, "weight": {0: None, 1: None}, "calls": {0: 99.9, 1: 100.1}},
              {"t_submit": 100.5, "t_end": 100.7, "weight": {0: None, 1: None}, "calls": {0: 100.6, 1: 100.4}},
              {"t_submit": 101.0, "t_end": 101.2, "weight": {0: None, 1: None}, "calls": {0: 101.1, 1: 100.4}},
              {"t_submit": 109.0, "t_end": 109.2, "weight": {0: None, 1: None}, "calls": {0: 109.1, 1: 108.8}}]
    assert recovered_after(Fault(0.0, "kill", 1, injected_at=100.3), cycles) == pytest.approx(100.4 - 100.3)
    assert recovered_after(Fault(0.0, "nan", 0, injected_at=100.3), cycles) == pytest.approx(100.6 - 100.3)
    # stopped at 100.3 for 8 s: its request of 100.4 was on its way; it called again at 108.8
    assert recovered_after(Fault(0.0, "stop", 1, injected_at=100.3, hold_s=8.0), cycles) == pytest.approx(8.5)
    assert recovered_after(Fault(0.0, "stop", 1, injected_at=100.3, hold_s=9.0), cycles) is None
    resumed = [{"t_submit": 130.0, "t_end": 130.2, "weight": {}, "calls": {}},
               {"t_submit": 130.5, "t_end": 130.7, "weight": {0: None}, "calls": {0: 130.6}}]
    assert recovered_after(Fault(0.0, "driver", DRIVER, injected_at=110.0), cycles + resumed) == pytest.approx(20.6)


def test_decommissions_come_in_the_last_quarter_at_most_k_minus_1_on_distinct_agents_and_recover_when_they_left():
    from lab.campaign import DECOMMISSION_FROM, schedule

    for seed in range(5):
        faults = schedule(seed, 600.0, {"decommission": 5.0, "nan": 1.0}, 3, (1.0, 3.0), (6.0, 15.0))
        gone = [f for f in faults if f.kind == "decommission"]
        assert len(gone) == 2 and len({f.agent for f in gone}) == 2, gone  # K - 1 = 2, never the same agent
        assert all(f.t >= DECOMMISSION_FROM * 600.0 for f in gone)
    # before the last quarter the same seed draws the same schedule with the kind as without it
    args = (600.0, 3, (1.0, 3.0), (6.0, 15.0))
    early = [(f.t, f.kind, f.agent) for f in schedule(0, args[0], {"kill": 1.0, "nan": 1.0}, *args[1:])
             if f.t < DECOMMISSION_FROM * 600.0]
    assert early == [(f.t, f.kind, f.agent) for f in schedule(0, args[0], {"kill": 1.0, "nan": 1.0,
                                                                          "decommission": 3.0}, *args[1:])][:len(early)]
    cycles = [{"t_submit": 100.0, "t_end": 101.0, "weight": {0: 1.0, 1: 1.0}, "left": []},
              {"t_submit": 101.5, "t_end": 104.0, "weight": {0: 1.0}, "left": [1]},  # it left after this cycle
              {"t_submit": 104.5, "t_end": 105.0, "weight": {0: 1.0}, "left": []}]
    assert recovered_after(Fault(0.0, "decommission", 1, injected_at=100.5), cycles) == pytest.approx(3.5)
    assert recovered_after(Fault(0.0, "decommission", 0, injected_at=100.5), cycles) is None


def test_a_killed_agent_is_timed_from_its_replacement_executors_start_in_cycles():
    """after_replacement: the first process of the agent announced after the kill is its replacement; from its
    executor's start and from its own (its model built), the cycles that ended up to the recovery, the recovering
    cycle included."""
    from lab.campaign import after_replacement

    cycles = [{"t_submit": t - 0.5, "t_end": t, "weight": {0: 1.0}} for t in (101.0, 110.0, 112.0, 113.0, 114.0)]
    arrivals = [{"agent": 1, "pid": 10, "announced": 91.0, "executor_started": 90.0},  # the killed one
                {"agent": 0, "pid": 11, "announced": 105.0, "executor_started": 104.0},  # another agent's
                {"agent": 1, "pid": 13, "announced": 111.0, "executor_started": 99.6},  # the replacement: its JVM
                # started within /proc's precision of the kill, its model 11 s later
                {"agent": 1, "pid": 14, "announced": 130.0, "executor_started": 129.0}]  # a later one
    kill = Fault(0.0, "kill", 1, injected_at=100.0, recovered_s=13.0)  # counted again in the cycle ending at 113
    got = after_replacement(kill, arrivals, cycles)
    assert got == pytest.approx({"replacement_up_s": -0.4, "cycles_after_up": 4, "agent_up_s": 11.0,
                                 "cycles_after_agent_up": 2})  # cycles ending 101, 110, 112, 113 | 112, 113
    unrecovered = after_replacement(Fault(0.0, "kill", 1, injected_at=100.0), arrivals, cycles)
    assert unrecovered["agent_up_s"] == 11.0 and unrecovered["cycles_after_up"] is None
    none = {"replacement_up_s": None, "cycles_after_up": None, "agent_up_s": None, "cycles_after_agent_up": None}
    assert after_replacement(Fault(0.0, "kill", 0, injected_at=106.0, recovered_s=4.0), arrivals, cycles) == none
    assert after_replacement(Fault(0.0, "stop", 1, injected_at=100.0, recovered_s=13.0), arrivals, cycles) == none
    import os
    import time

    from lab.campaign import started_at

    assert time.time() - 3600 < started_at(os.getpid()) <= time.time()  # this test's process: minutes ago
    assert started_at(1) <= started_at(os.getpid()) and started_at(2 ** 22 + 7) is None


def test_the_agents_announced_in_every_incarnation_come_back_in_time_order_with_their_executors_start(tmp_path):
    from lab.campaign import announced_agents

    for inc, rows in ((0, [(0, 10, 5.0), (1, 11, 6.0)]), (1, [(1, 21, 40.0), (0, 20, 39.0)])):
        agents = tmp_path / f"inc-{inc}" / "agents"
        agents.mkdir(parents=True)
        text = "".join(json.dumps({"agent": a, "pid": p, "t": t}) + "\n" for a, p, t in rows)
        (agents / "announced.jsonl").write_text(text + ('{"agent": 1, "pi' if inc == 1 else ""))  # a cut line
    got = announced_agents(str(tmp_path), [{"agent": 0, "pid": 20, "executor_started": 37.5}])
    assert [(a["agent"], a["pid"], a["announced"], a["executor_started"]) for a in got] == \
        [(0, 10, 5.0, None), (1, 11, 6.0, None), (0, 20, 39.0, 37.5), (1, 21, 40.0, None)]

def test_cycles_are_read_back_without_a_killed_drivers_cut_line_and_the_cycles_run_again_counted(tmp_path):
    rows = [{"inc": 0, "cycle": c, "t_submit": 10.0 + c, "t_end": 10.5 + c, "weight": {"0": 1.0}} for c in range(7)]
    rows += [{"inc": 1, "cycle": c, "t_submit": 40.0 + c, "t_end": 40.5 + c, "weight": {"1": 2.0}} for c in (5, 6, 7)]
    (tmp_path / "cycles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:7]) + '{"inc": 0, "cyc')
    with appended(str(tmp_path / "cycles.jsonl")) as f:  # the next incarnation, after the kill cut its line
        f.write("".join(json.dumps(r) + "\n" for r in rows[7:]))
    cycles = read_cycles(str(tmp_path))
    assert [(c["inc"], c["cycle"]) for c in cycles] == [(0, c) for c in range(7)] + [(1, 5), (1, 6), (1, 7)]
    assert cycles[0]["weight"] == {0: 1.0} and cycles[-1]["weight"] == {1: 2.0}  # agents keyed by int again
    # killed after cycle 6 ended; the newest checkpoint held 5 cycles: cycles 5 and 6 ran again
    assert redone(Fault(0.0, "driver", DRIVER, injected_at=17.0, incarnation=0), cycles) == 2
    # a driver killed while it started (no cycle of its own): counted from the last cycle any driver ended
    assert redone(Fault(0.0, "driver", DRIVER, injected_at=30.0, incarnation=7), cycles) == 2
    assert redone(Fault(0.0, "driver", DRIVER, injected_at=48.0, incarnation=1), cycles) is None  # none followed
    # DDP's run 9: no checkpoint yet, so each resumed driver started again at cycle 0; a driver that ran cycles
    # 0-2 (after one that ran 0-17) and was killed redid 3 of them, not 18
    again = [{"inc": 0, "cycle": c, "t_submit": c, "t_end": c + 0.5} for c in range(18)]
    again += [{"inc": 1, "cycle": c, "t_submit": 50 + c, "t_end": 50.5 + c} for c in range(3)]
    again += [{"inc": 2, "cycle": c, "t_submit": 90 + c, "t_end": 90.5 + c} for c in range(2)]
    assert redone(Fault(0.0, "driver", DRIVER, injected_at=60.0, incarnation=1), again) == 3
    assert read_cycles(str(tmp_path / "nothing")) == []


def test_the_summary_counts_per_kind_and_the_resources_give_first_last_and_peak():
    faults = [Fault(1.0, "kill", 0, injected_at=1.0, recovered_s=4.0, cycles_after_up=1, cycles_after_agent_up=1),
              Fault(2.0, "kill", 1, injected_at=2.0, recovered_s=10.0, cycles_after_up=4, cycles_after_agent_up=2),
              Fault(3.0, "kill", 1, injected_at=3.0), Fault(4.0, "nan", 0), Fault(5.0, "nan", 1, injected_at=5.0,
                                                                                   recovered_s=1.0)]
    rows = {r["kind"]: r for r in summary(faults)}
    assert rows["kill"] == {"kind": "kill", "scheduled": 3, "injected": 3, "recovered": 2, "median_s": 7.0,
                            "max_s": 10.0, "median_after_s": 7.0, "median_cycles_after_up": 2.5,
                            "median_cycles_after_agent_up": 1.5}
    cuts = [Fault(1.0, "cut", 0, hold_s=20.0, injected_at=1.0, recovered_s=26.0),
            Fault(2.0, "cut", 1, hold_s=5.0, injected_at=2.0, recovered_s=9.0)]
    assert summary(cuts)[0]["median_s"] == 17.5 and summary(cuts)[0]["median_after_s"] == 5.0  # (6 + 4) / 2
    assert rows["nan"]["injected"] == 1 and rows["nan"]["median_s"] == 1.0
    assert math.isnan(summary([Fault(1.0, "stop", 0)])[0]["median_s"])
    samples = [{"t": 0, "driver": {"rss_mb": 100.0, "fds": 10, "threads": 5}, "agent0": None, "checkpoint_entries": 0},
               {"t": 2, "driver": {"rss_mb": 130.0, "fds": 12, "threads": 5}, "agent0": {"rss_mb": 50.0, "fds": 3,
                                                                                         "threads": 2},
                "checkpoint_entries": 2},
               {"t": 4, "driver": {"rss_mb": 120.0, "fds": 11, "threads": 6}, "agent0": None, "checkpoint_entries": 1}]
    table = {(r["process"], r["figure"]): (r["first"], r["last"], r["peak"]) for r in resource_table(samples)}
    assert table[("driver", "rss_mb")] == (100.0, 120.0, 130.0)
    assert table[("driver", "threads")] == (5, 6, 6)
    assert table[("agent0", "fds")] == (3, 3, 3)  # only the samples where its process was there
    assert table[("checkpoint dir", "entries")] == (0, 1, 2)
    spark = [{"t": t, "incarnation": 0, "driver": None, "checkpoint_entries": 0, "executor_jvms": n,
              "pyspark_workers": 2 * n} for t, n in ((0, 2), (2, 4), (4, 2))]
    table = {(r["process"], r["figure"]): (r["first"], r["last"], r["peak"]) for r in resource_table(spark)}
    assert table[("machine", "executor_jvms")] == (2, 2, 4) and table[("machine", "pyspark_workers")] == (4, 4, 8)
    assert not any(p == "incarnation" for p, _ in table)
    # the quarters: the run's samples at 0..8 s; the second quarter is 2 <= t < 4, the last t >= 6
    quarters = [{"t": t, "incarnation": 0, "driver": {"rss_mb": mb, "fds": 10, "threads": 5}}
                for t, mb in enumerate([100.0, 300.0, 110.0, 130.0, 999.0, 999.0, 120.0, 140.0, 150.0])]
    drv = {r["figure"]: r for r in resource_table(quarters) if r["process"] == "driver"}
    assert (drv["rss_mb"]["q2"], drv["rss_mb"]["q4"]) == (120.0, 140.0) and drv["fds"]["q4"] == 10
    from lab.campaign import attach_storage

    cycles = [{"t_end": 101.5, "storage_mb": 3.0}, {"t_end": 103.0, "storage_mb": 4.0}, {"t_end": 106.5}]
    attach_storage(quarters, cycles, t0=100.0)  # the newest cycle ended before each sample; none before the first
    assert [q["spark_storage_mb"] for q in quarters] == [None, None, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    blocks = {r["process"]: r for r in resource_table(quarters)}["spark blocks"]
    assert (blocks["figure"], blocks["first"], blocks["peak"], blocks["q2"], blocks["q4"]) == \
        ("storage_mb", 3.0, 4.0, 3.5, 4.0)
    from lab.campaign import incarnation_table

    spark[1]["incarnation"] = spark[2]["incarnation"] = 1  # a restart after the first sample
    rows = incarnation_table(spark)
    assert [(r["incarnation"], r["from_s"], r["to_s"], r["executor_jvms"], r["jvm_mb"]) for r in rows] == \
        [(0, 0, 0, 2, None), (1, 2, 4, 4, None)]


@pytest.fixture
def agent_socket(tmp_path):
    """A real :class:`~mpca.runtime.agent_server.ChannelServer` on a Unix socket, answering ``deliver`` of shard 0
    as the agent does (the wire's length check, a refusal of what is not finite), in a thread."""
    import numpy as np

    from mpca.algorithm.wire import Codec
    from mpca.runtime.agent_server import ChannelServer
    from mpca.runtime.channel import Channel, listen

    secret, codec, taken = os.urandom(32), Codec.of("fp32", 256, "float32"), []

    def handle(header, payload):
        if header.get("op") != "deliver":
            raise ValueError("unknown op")
        vec = codec.decode(payload, 16)
        if not np.isfinite(vec).all():
            raise ValueError("a shard that is not finite")
        taken.append(vec)
        return {"ok": True}, None

    path = str(tmp_path / "agent.sock")
    stop = threading.Event()
    server = ChannelServer("agent 0", secret, 1 << 20, handle, stop.is_set)
    thread = threading.Thread(target=server.serve, args=(listen(path),), daemon=True)
    thread.start()

    def good() -> dict:
        ch = Channel.connect(path, secret)
        try:
            return ch.request({"op": "deliver", "shard": 0}, np.ones(16, np.float32).tobytes(), timeout=5)[0]
        finally:
            ch.close()

    yield path, secret, good, taken
    stop.set()
    thread.join(5)


@pytest.mark.parametrize("variant,outcome", [("junk", "closed"), ("truncated", "closed"), ("malformed", "closed"),
                                             ("oversized", "closed"), ("wrong_size", "error: "),
                                             ("nonfinite", "error: ")])
def test_each_broken_message_is_refused_and_the_agent_still_serves(agent_socket, variant, outcome):
    path, secret, good, taken = agent_socket
    got = bad_frames.send(variant, path, None if variant == "junk" else secret, shard_bytes=64, timeout=5)
    assert got.startswith(outcome), got
    assert taken == []  # nothing of it reached the agent's model
    assert good() == {"ok": True} and len(taken) == 1  # and the next honest request is served
    with pytest.raises(ValueError, match="secret"):
        bad_frames.send("malformed", path, None)
    with pytest.raises(ValueError, match="unknown variant"):
        bad_frames.send("bitflip", path, secret)


def test_a_decommission_whose_agent_is_being_replaced_is_tried_again_until_it_lands(tmp_path, monkeypatch):
    """Campaign._until_injected: in runs 8 and 9 the one decommission came while its agent was being replaced and
    was never injected; now it is tried each second (for a minute), and given up after that."""
    from lab.campaign import Campaign

    campaign, tries = Campaign(str(tmp_path), []), []

    def inject(fault):  # agent 1 has a process again at the third try, agent 0 never
        tries.append(fault.kind)
        if len(tries) == 3 and fault.agent == 1:
            fault.injected_at = 1.0

    monkeypatch.setattr(campaign, "inject", inject)
    fault = Fault(0.0, "decommission", 1)
    campaign._until_injected(fault, within_s=30.0)
    assert fault.injected_at == 1.0 and tries == ["decommission"] * 3
    tries.clear()
    never = Fault(0.0, "decommission", 0)
    campaign._until_injected(never, within_s=1.5)  # gives up
    assert never.injected_at is None and 2 <= len(tries) <= 3


def test_a_fault_whose_agent_has_no_process_hits_an_agent_up_and_says_which_it_drew(tmp_path, monkeypatch):
    """Campaign.inject: on CI's machine 22 of 33 faults found their agent's replacement still starting and were
    left out; now such a fault hits an agent that has a process (``drawn_agent`` keeps the draw),
    and one that finds none up is left out with the reason.  A decommission stays on its drawn agent (it leaves
    the run for good: the schedule keeps them on distinct agents)."""
    from lab.campaign import Campaign

    campaign = Campaign(str(tmp_path), [], agents=3)
    os.makedirs(campaign.here("agents"))
    up = {2: 4242}
    monkeypatch.setattr(campaign, "agent_pid", lambda agent: up.get(agent))
    nan = Fault(5.0, "nan", 0)
    campaign.inject(nan)
    assert (nan.agent, nan.drawn_agent, nan.pid, nan.skipped) == (2, 0, 4242, None) and nan.injected_at is not None
    assert os.path.exists(campaign.here("agents", "nan-2"))
    on_own = Fault(6.0, "nan", 2)
    campaign.inject(on_own)
    assert (on_own.agent, on_own.drawn_agent) == (2, None)
    leaving = Fault(7.0, "decommission", 1)
    campaign.inject(leaving)
    assert (leaving.agent, leaving.injected_at, leaving.skipped) == (1, None, "no agent process")
    up.clear()
    none_up = Fault(8.0, "stop", 1, hold_s=1.0)
    campaign.inject(none_up)
    assert (none_up.agent, none_up.drawn_agent, none_up.injected_at, none_up.skipped) == \
        (1, None, None, "no agent process")


def test_a_fault_whose_agent_is_down_is_drawn_uniformly_among_the_agents_up(tmp_path, monkeypatch):
    """K = 4, agent 0's replacement starting: its faults go to agents 1, 2 and 3 alike (the next agent in order
    had taken them all), and the same fault draws the same agent again."""
    from lab.campaign import Campaign

    campaign = Campaign(str(tmp_path), [], agents=4)
    monkeypatch.setattr(campaign, "agent_pid", lambda agent: None if agent == 0 else 100 + agent)
    hits = collections.Counter()
    for i in range(600):
        fault = Fault(float(i), "nan", 0)
        assert campaign._hit_next_agent_up(fault) == 100 + fault.agent and fault.drawn_agent == 0
        hits[fault.agent] += 1
    assert sorted(hits) == [1, 2, 3] and all(160 <= n <= 240 for n in hits.values()), hits  # 200 each, ± 3σ (~35)
    first, again = Fault(7.0, "nan", 0), Fault(7.0, "nan", 0)
    campaign._hit_next_agent_up(first)
    campaign._hit_next_agent_up(again)
    assert again.agent == first.agent  # a schedule replays the same


def test_a_replacement_s_start_is_the_median_from_its_executor_to_its_model_then_to_its_recovery():
    """lab.campaign.replacement_start against hand-computed medians: kills with both times only."""
    from lab.campaign import replacement_start

    faults = [dict(kind="kill", replacement_up_s=0.1, agent_up_s=9.1, recovered_s=15.1),
              dict(kind="kill", replacement_up_s=1.0, agent_up_s=6.0, recovered_s=7.0),
              dict(kind="kill", replacement_up_s=0.5, agent_up_s=20.5, recovered_s=None),
              dict(kind="kill", replacement_up_s=None, agent_up_s=40.0, recovered_s=50.0),
              dict(kind="stop", replacement_up_s=0.0, agent_up_s=1.0, recovered_s=2.0)]
    rows = [dict(t_submit=0.0, t_end=0.3), dict(t_submit=1.0, t_end=1.5), dict(t_submit=2.0, t_end=None)]
    start = replacement_start(faults, rows)
    assert start["to_agent_s"] == pytest.approx(9.0) and start["to_agent_min_s"] == pytest.approx(5.0)
    assert start["to_agent_max_s"] == pytest.approx(20.0)
    assert start["to_recovery_s"] == pytest.approx(3.5)  # (6.0 + 1.0) / 2
    assert start["cycle_s"] == pytest.approx(0.4)
    assert replacement_start([faults[4]], rows) is None


class _FakeTime:
    """The fault schedule's clock and sleep without real time: a wait advances the clock, to the run's end at most."""

    def __init__(self, end: float):
        self.t, self.end = 0.0, end

    def now(self) -> float:
        return self.t

    def wait(self, seconds: float) -> bool:
        self.t = min(self.t + max(seconds, 1e-6), self.end)  # as in real time, a wait takes some time
        return self.t >= self.end


def test_the_up_clock_counts_only_the_seconds_with_an_agent_up_and_the_wall_clock_counts_all(tmp_path, monkeypatch):
    """Campaign.run_faults: on CI's slowest machine the first agent came up 37 s in and 22 of 33 faults fell where
    none was up.  On the up clock a fault at 0.3 s falls 0.3 s after an agent came up (here 0.4 s in, so about
    0.7 s), ``up_t`` keeps the schedule's time; the down time of a resume (0.9–1.3 s) does not count either; a
    fault the run did not live to is skipped as the run having ended.  The wall clock hits at the time itself.
    On a clock of the test's own, so a loaded machine cannot make it late."""
    from lab.campaign import ENDED, UP_POLL_S, Campaign

    up_between = [(0.4, 0.9), (1.3, 99.0)]  # an agent up from 0.4 s, down for the resume, up again from 1.3 s
    fell = []

    def campaign(faults, end):
        clock = _FakeTime(end)
        c = Campaign(str(tmp_path), faults, agents=2, now=clock.now)
        monkeypatch.setattr(c, "wait", clock.wait)
        monkeypatch.setattr(c, "agent_pid", lambda agent: 7 if agent == 0 and any(a <= clock.t < b for a, b in
                                                                                  up_between) else None)
        monkeypatch.setattr(c, "inject", lambda fault: fell.append((fault.up_t, clock.t)))
        return c

    up = campaign([Fault(0.3, "nan", 0), Fault(0.7, "nan", 1), Fault(50.0, "kill", 1)], end=2.0)
    up.run_faults(0.0, "up")
    assert [f[0] for f in fell] == [0.3, 0.7]
    # never early; late by at most a poll (UP_POLL_S) each time an agent came up
    assert 0.7 <= fell[0][1] <= 0.7 + UP_POLL_S + 1e-9, fell  # 0.4 s down, then 0.3 s up
    assert 1.5 <= fell[1][1] <= 1.5 + 2 * UP_POLL_S + 1e-9, fell  # 0.5 s up by 0.9 s, 0.2 s more from 1.3 s
    assert [f.t for f in up.faults[:2]] == [pytest.approx(fell[0][1], abs=1e-3), pytest.approx(fell[1][1], abs=1e-3)]
    assert up.faults[2].skipped == ENDED and up.faults[2].t == 50.0 and up.faults[2].up_t is None
    fell.clear()
    wall = campaign([Fault(0.3, "nan", 0), Fault(60.0, "nan", 1)], end=0.6)
    wall.run_faults(0.0, "wall")
    assert fell == [(None, pytest.approx(0.3))]
    assert wall.faults[1].skipped == ENDED
