"""The simulator runs the library's own rules on real gradients in virtual time (mpca.sim)."""
import numpy as np
import pytest
import torch

from mpca.algorithm.ddp import DDPAgent
from mpca.algorithm.ring import chunk_bounds
from mpca.algorithm.rounds import digest
from mpca.algorithm.sync import SyncDriver
from mpca.algorithm.wire import Codec
from mpca.sim import NetworkConstants, SimConfig, Simulator, simulate
from mpca.sim.clock import VirtualClock
from mpca.exchange.device import ComputeModel
from mpca.sim.workload import TeacherWorkload

TINY = TeacherWorkload(hidden=(16,), rows_per_agent=256, holdout=256, optimizer="sgd", lr=0.1)


def config(algorithm, agents=2, **kw):
    base = dict(algorithm=algorithm, agents=agents, workload=TINY, batch_size=16,
                compute=ComputeModel(step_s=1.0), eval_every_s=1000.0, max_virtual_s=20.0)
    return SimConfig(**{**base, **kw})


# --------------------------------------------------------------------------- the clock
def test_clock_runs_events_in_time_order_and_ties_in_scheduling_order():
    clock, seen = VirtualClock(), []
    for t, name in [(2.0, "c"), (1.0, "a"), (2.0, "d"), (1.5, "b")]:
        clock.schedule(t, lambda when, name=name: seen.append((when, name)))
    clock.run_until(1.9)
    assert seen == [(1.0, "a"), (1.5, "b")] and clock.now == 1.9
    clock.run_until(10)
    assert [n for _, n in seen] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError):
        clock.schedule(1.0, lambda when: None)  # the past


# --------------------------------------------------------------------------- a deterministic replay
def hand_replay_sync(work, agents, every, rounds, batch_size, seed=0):
    """SparkNet's rounds done by hand: each agent's H steps (the runtime's seeds and batch order), then the
    average (Eq. 9 with weight 1: Σ x / K) replaces every model."""
    torch.manual_seed(seed)
    init = {k: v.clone() for k, v in work.model_fn().state_dict().items()}
    models, opts, data, orders = [], [], [], []
    for a in range(agents):
        torch.manual_seed(seed + 1000 * a)
        m = work.model_fn()
        m.load_state_dict(init)
        models.append(m)
        opts.append(work.optimizer_fn(m.parameters()))
        data.append(work.agent_rows(a, agents))
        gen = torch.Generator().manual_seed(seed + 7919 * a)
        orders.append([gen, torch.randperm(work.rows_per_agent, generator=gen), 0])
    for _ in range(rounds):
        for a in range(agents):
            for _ in range(every):
                gen, order, lo = orders[a]
                if lo >= work.rows_per_agent:
                    order, lo = torch.randperm(work.rows_per_agent, generator=gen), 0
                idx = order[lo:lo + batch_size]
                orders[a] = [gen, order, lo + batch_size]
                x, y = data[a][0][idx], data[a][1][idx]
                opts[a].zero_grad(set_to_none=True)
                work.loss_fn(models[a](x), y).backward()
                opts[a].step()
        flats = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
        total = flats[0] * 1.0
        for f in flats[1:]:
            total = total + f * 1.0
        avg = total / float(agents)
        for m in models:
            torch.nn.utils.vector_to_parameters(avg.clone(), m.parameters())  # its own copy each
    return [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]


def test_two_agents_on_a_free_network_equal_a_replay_by_hand_bit_for_bit():
    every, rounds = 3, 4
    # step_s = 1: round r's steps at 3r .. 3r + 2, its average delivered at 3r + 2, the next step at 3r + 3
    sim = Simulator(config({"name": "sync", "every": every}, network=NetworkConstants.free(),
                           max_virtual_s=every * rounds - 0.5))
    sim.run()
    expected = hand_replay_sync(TINY, 2, every, rounds, 16)
    for agent, vec in zip(sim.agents, expected):
        assert agent.steps == every * rounds
        assert torch.equal(agent.shards.read(0), vec)
    assert torch.equal(sim.rule.joint[0], expected[0])


# --------------------------------------------------------------------------- the rules are the library's
def test_swapping_a_library_rule_changes_the_simulated_trajectory(monkeypatch):
    cfg = config({"name": "sync", "every": 3}, max_virtual_s=30.0)
    normal = Simulator(cfg)
    normal.run()
    start = Simulator(cfg).rule.joint[0].clone()
    assert not torch.equal(normal.rule.joint[0], start)
    # a driver that never moves: every round restarts from the initial model
    monkeypatch.setattr(SyncDriver, "on_reduced", lambda self, c, s, partial: self.next_round(self.joint[0]))
    frozen = Simulator(cfg)
    frozen.run()
    assert frozen.rule.rounds == normal.rule.rounds > 1
    assert torch.equal(frozen.rule.joint[0], start)


def test_parked_round_agents_wait_for_the_delivery_and_start_from_it():
    # every = 3 steps of 1 s, then a job of 5 s overhead: agents park from t = 3 until the delivery
    net = NetworkConstants(link_bps=1e12, latency_s=0.0, job_overhead_s=5.0)
    sim = Simulator(config({"name": "sync", "every": 3}, network=net, max_virtual_s=12.5))
    sim.run()
    # round 0: steps at 0, 1, 2; job 0 runs 0..~5 (yield at 5), job 1 delivers at ~10: round 1's steps at 10, 11, 12
    assert [a.steps for a in sim.agents] == [6, 6]
    for a in sim.agents:
        assert a.rule.round == 1
    delivered = Simulator(config({"name": "sync", "every": 3}, network=net, max_virtual_s=10.2))
    delivered.run()
    for a in delivered.agents:  # right after the delivery, before the next steps: the round began from x̃
        assert a.rule.start_digest == digest(delivered.rule.joint[0])


def test_waiting_is_the_round_agents_seam():
    sim = Simulator(config({"name": "sync", "every": 2}, max_virtual_s=0.5))
    rule = sim.agents[0].rule
    assert not rule.waiting()
    sim.agents[0].step()
    assert not rule.waiting()
    sim.agents[0].step()
    assert rule.waiting()
    rule.start_round(rule.ctx.shards.split(0, sim.rule.joint[0]), {"round": 1})
    assert not rule.waiting()
    mpca = Simulator(config("mpca", max_virtual_s=0.5))
    assert not mpca.agents[0].rule.waiting()  # the base rule never waits


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("algorithm", ["mpca", "easgd", {"name": "diloco", "every": 5}])
def test_a_small_simulation_reaches_a_loose_target(algorithm):
    work = TeacherWorkload(hidden=(32,), rows_per_agent=2000, holdout=500, optimizer="adam", lr=0.003)
    res = simulate(SimConfig(algorithm=algorithm, agents=2, workload=work, batch_size=32,
                             compute=ComputeModel(step_s=0.1), eval_every_s=1.0, max_virtual_s=60.0,
                             targets=(0.8, 0.7), network=NetworkConstants(link_bps=1e9)))
    assert res.time_to_target["0.7"] is not None, res.history[-3:]
    assert 0 < res.time_to_target["0.8"] <= res.time_to_target["0.7"] <= res.virtual_s
    assert res.history[0].holdout_error > 0.7  # it started above the target
    if res.algorithm == "easgd":
        assert res.service_requests > 0 and res.service_bytes_in > 0 and not res.cycles
    else:
        assert res.cycles and all(c.end > c.start for c in res.cycles)


def test_the_network_decides_the_time_to_target():
    slow = simulate(config({"name": "sync", "every": 3}, network=NetworkConstants(link_bps=1e4)))  # ~4 s a model
    fast = simulate(config({"name": "sync", "every": 3}, network=NetworkConstants(link_bps=1e9)))
    assert slow.steps < fast.steps  # the agents waited longer for each round's model
    slow_cycle = np.mean([c.end - c.start for c in slow.cycles])
    fast_cycle = np.mean([c.end - c.start for c in fast.cycles])
    assert slow_cycle > fast_cycle


def test_start_up_holds_every_step_and_cycle_and_times_count_from_fits_start():
    """With the runtime's start-up (3 s), nothing steps or exchanges before it, the model evaluated meanwhile
    is the initial one, and sync (deterministic) then reads what it reads without start-up, 3 s later."""
    algo = {"name": "sync", "every": 2}
    plain = simulate(config(algo, eval_every_s=1.0, max_virtual_s=10.0))
    late = simulate(config(algo, eval_every_s=1.0, max_virtual_s=13.0, startup_s=3.0))
    initial = plain.history[0].holdout_error
    assert [(r.t, r.steps, r.holdout_error) for r in late.history[:3]] == [(t, 0, initial) for t in (0, 1, 2)]
    assert plain.cycles[0].start < 3.0 <= late.cycles[0].start
    shifted = {r.t - 3.0: (r.steps, r.holdout_error) for r in late.history if r.t >= 3.0}
    assert [(r.steps, r.holdout_error) for r in plain.history] == [shifted[r.t] for r in plain.history]
    assert plain.history[-1].holdout_error < initial and late.settings["startup_s"] == 3.0


def test_the_exchange_cpu_lengthens_every_cycle_by_its_seconds_per_mb():
    """mpca, 2 agents on 1 shared core at 1 s/MB: every cycle ends (up + down bytes) × 1 s/MB × 2 later than
    without the CPU term (same network, same first cycle)."""
    base = NetworkConstants(link_bps=1e9)
    plain = simulate(config("mpca", network=base, max_virtual_s=6.0))
    cpu = simulate(config("mpca", network=NetworkConstants(link_bps=1e9, exchange_cpu_s_per_mb=1.0, host_cores=1),
                          max_virtual_s=6.0))
    for c in (0, 1, 3):  # cycle 0: shards up only; cycles 1 and 3: a broadcast too (2 broadcasts nothing)
        a, b = plain.cycles[c], cpu.cycles[c]
        assert b.bytes_up == a.bytes_up > 0 and b.bytes_out == a.bytes_out
        up, down = a.bytes_up / 2, a.bytes_out / 2  # per agent; the driver sends each broadcast twice at K = 2
        assert (b.end - b.start) - (a.end - a.start) == pytest.approx((up + down) / 1e6 * 1.0 * 2, rel=1e-6)
    assert plain.cycles[1].bytes_out > 0 and plain.cycles[3].bytes_out > 0


def test_service_round_trips_are_charged_the_exchange_cpu_too():
    """EASGD's requests: at 50 s/MB each round trip costs its agent (request + answer bytes) × 50 s more
    (~0.5 s for the tiny model), so the agents take fewer steps in the same virtual time (1 s steps, 20 s)."""
    plain = simulate(config({"name": "easgd", "every": 2}, network=NetworkConstants(link_bps=1e9)))
    cpu = simulate(config({"name": "easgd", "every": 2},
                          network=NetworkConstants(link_bps=1e9, exchange_cpu_s_per_mb=50.0)))
    per_request = (plain.service_bytes_in + plain.service_bytes_out) / plain.service_requests / 1e6 * 50.0
    assert per_request > 0.2
    assert cpu.steps < plain.steps


def test_lossy_wire_formats_move_fewer_bytes():
    fp32 = simulate(config("mpca", wire="fp32", max_virtual_s=5.0))
    int8 = simulate(config("mpca", max_virtual_s=5.0))  # mpca's default format
    assert int8.cycles[0].bytes_up < fp32.cycles[0].bytes_up / 3


@pytest.mark.parametrize("wire", ["fp32", "int8"])
def test_ddp_keeps_replicas_identical_and_pays_the_ring(wire):
    """ddp's own agent rule over the simulator's transport.  fp32: the mean gradient and the two flags (stop,
    re-form) in one all-reduce, as on Spark (the simulator's copy of the arithmetic had one flag); int8: the
    runtime's compressed ring itself (mpca.algorithm.ring), a quarter of the bytes and still identical
    replicas."""
    sim = Simulator(config("ddp", max_virtual_s=5.5, wire=wire))
    res = sim.run()
    assert all(type(ag.rule) is DDPAgent for ag in sim.agents)  # the library's own rule, no stand-in
    a, b = (ag.shards.read(0) for ag in sim.agents)
    assert torch.equal(a, b) and sim.agents[0].steps == sim.agents[1].steps
    n = sum(p.numel() for p in sim.agents[0].model.parameters())
    per_step = res.ring_bytes / sim.agents[0].steps
    # at K = 2 each rank sends each of the two chunks once (2 (K − 1) / K = 1 of the vector), every chunk encoded
    # with its own block scales
    chunks = sum(Codec("int8").nbytes(hi - lo) for lo, hi in chunk_bounds(n, 2))
    assert per_step == (4 * (n + 2) if wire == "fp32" else chunks)


@pytest.mark.parametrize("algorithm, wire, why", [("rudra-hardsync", "fp32", "waits inside serve"),
                                                  ("weaksync", "fp32", "waits inside serve")])
def test_what_it_cannot_run_is_refused_in_one_line(algorithm, wire, why):
    with pytest.raises(ValueError, match=why):
        Simulator(config(algorithm, wire=wire))


def test_rudra_softsync_runs_its_service_calls_inside_after_backward():
    res = simulate(config({"name": "rudra-async"}, max_virtual_s=5.0))
    assert res.service_requests == res.steps > 0


def test_the_simulator_imports_neither_spark_nor_the_runtime():
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "mpca" / "sim"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.startswith(("pyspark", "mpca.runtime"))], path.name


def test_history_rows_carry_the_driver_rules_metrics():
    """rudra-async with 2 learners in lock step: the first push of each sees σ = 0, every later one was
    computed on weights one update old (the other learner pushed in between): σ = 1 — the run's ⟨σ⟩ over its
    U updates is (U − 2) / U, read back from the history rows as the runtime's history carries it."""
    from mpca.sim.grid import mean_metric

    sim = Simulator(config("rudra-async", 2, eval_every_s=3.0, max_virtual_s=10.0))
    res = sim.run()
    sigmas = [s for _, s, _ in sim.rule.history]
    updates = len(sigmas)
    assert sigmas[:2] == [0.0, 0.0] and set(sigmas[2:]) == {1.0} and updates == res.steps
    assert sum(r.metrics.get("updates", 0) for r in res.history) == updates
    assert mean_metric(res.history, "mean_staleness", "updates") == pytest.approx((updates - 2) / updates)


def test_one_agent_is_evaluated_on_its_own_model_not_the_drivers_snapshot():
    from mpca.evaluation import evaluate

    sim = Simulator(config("single", 1, eval_every_s=1000.0, max_virtual_s=7.55, compute=ComputeModel(step_s=0.1)))
    res = sim.run()
    hx, hy = TINY.holdout_rows(1)
    own = evaluate(sim.agents[0].model, hx, hy, TINY.loss_fn)
    assert res.history[-1].holdout_error == pytest.approx(own.error) and res.history[-1].t == 7.55


def test_the_runtimes_holdout_is_the_hash_splits_rows_and_no_agent_trains_on_them():
    """split_rows: the holdout the trainer's hash split takes from the task's first rows, of which it evaluates
    the split_max_rows of the smallest row hash; agents skip every holdout row."""
    from mpca.data.split import holdout_mask
    from mpca.data.xxhash import row_hash

    work = TeacherWorkload(hidden=(16,), rows_per_agent=3000, split_rows=5000, split_fraction=0.1, split_seed=2)
    hx, hy = work.holdout_rows(2)
    x, y = work.task(2).take(np.arange(5000))
    mask = holdout_mask(x, y, 0.1, 2)
    assert 400 <= len(hy) <= 600 and {tuple(r) for r in hx.numpy().tolist()} == {tuple(r) for r in x[mask].tolist()}
    evaluated = TeacherWorkload(hidden=(16,), rows_per_agent=3000, split_rows=5000, split_fraction=0.1, split_seed=2,
                                split_max_rows=100).holdout_rows(2)[0].numpy()
    first = np.argsort(row_hash(2, x[mask], y[mask]))[:100]  # the 100 smallest hashes, the signed order
    assert np.array_equal(evaluated, x[mask][first])
    held = {tuple(r) for r in x[mask].tolist()}
    a0, _ = work.agent_rows(0, 2)
    a1, _ = work.agent_rows(1, 2)  # rows 3000..5999: its first 2000 can be holdout rows, the rest cannot
    assert not held & {tuple(r) for r in a0.numpy().tolist()} and not held & {tuple(r) for r in a1.numpy().tolist()}
    assert len(a0) == 3000 - mask[:3000].sum() and len(a1) == 3000 - mask[3000:].sum()
    with pytest.raises(ValueError, match="split_fraction"):
        TeacherWorkload(split_rows=10, split_fraction=1.0)


# --------------------------------------------------------------------------- agents that come and go
def test_a_hung_agent_is_waited_for_once_then_the_cycles_go_on_without_it_until_it_answers_again():
    """Agent 1 stops at 4 s for 6 s: one cycle waits agent_wait_s for it, later ones do not wait, and its first
    contribution after it resumes counts again; it made no step meanwhile."""
    from mpca.sim.presence import Absence

    free = NetworkConstants(link_bps=1e9)
    plain = Simulator(config("mpca", network=free, max_virtual_s=16.0, compute=ComputeModel(step_s=0.25)))
    plain.run()
    sim = Simulator(config("mpca", network=free, max_virtual_s=16.0, compute=ComputeModel(step_s=0.25),
                           absences=(Absence(1, 4.0, 6.0, "hang"),), agent_wait_s=1.0))
    res = sim.run()
    without = [c for c in res.cycles if c.missing == [1]]
    assert without and all(4.0 <= c.end <= 10.5 for c in without), [(c.start, c.end, c.missing) for c in res.cycles]
    waited = max(c.end - c.start for c in res.cycles)
    assert 1.0 <= waited < 1.5  # the one bounded wait; no cycle waited for the whole hang
    assert sum(c.end - c.start > 0.9 for c in res.cycles) == 1  # absent agents are not waited for again
    after = [c for c in without if c.end - c.start < 0.9]  # the cycles after the wait: the stopped agent's handshake
    assert after and all(c.end - c.start >= 0.25 + 0.5 - 1e-9 for c in after)  # job overhead + absent_claim_s
    assert not res.cycles[-1].missing and not sim.presence.absent  # it answers again
    assert plain.agents[0].steps - 1 <= sim.agents[0].steps <= plain.agents[0].steps + 1
    assert plain.agents[1].steps - sim.agents[1].steps == pytest.approx(6.0 / 0.25, abs=2)  # no steps while stopped


def test_a_lost_agents_replacement_joins_from_the_joint_model_and_contributes_again(monkeypatch):
    """Agent 1's process is lost at 4 s; its replacement is up at 7 s and, at the end of the next cycle, takes the
    driver rule's join vectors exactly (its rule receives them, on_reset), then steps and contributes; the driver
    rule hears the agents present (on_membership: 1, then 2)."""
    from mpca.algorithm.mpca import MPCADriver
    from mpca.sim.presence import Absence

    heard, joined = [], {}
    monkeypatch.setattr(MPCADriver, "on_membership", lambda self, agents: heard.append(agents), raising=False)
    sim = Simulator(config("mpca", network=NetworkConstants(link_bps=1e9), max_virtual_s=14.0,
                           compute=ComputeModel(step_s=0.25), absences=(Absence(1, 4.0, 3.0, "lost"),),
                           agent_wait_s=1.0))
    join = sim._join

    def watched(agents, params, t):
        expected = [v.clone() for v in sim.rule.join_vectors()]
        join(agents, params, t)
        joined[t] = (agents, expected, [sim.agents[1].shards.read(s) for s in range(len(expected))])

    sim._join = watched
    sim.pipeline.join = watched
    old = sim.agents[1]
    res = sim.run()
    ((t, (agents, expected, got)),) = joined.items()
    assert agents == [1] and 7.0 <= t < 9.0 and all(torch.equal(a, b) for a, b in zip(expected, got))
    assert sim.agents[1] is not old and 0 < sim.agents[1].steps <= (14.0 - t) / 0.25 + 1
    assert any(c.joined == [1] for c in res.cycles) and any(c.missing == [1] for c in res.cycles)
    assert not res.cycles[-1].missing and heard == [1, 2]
    assert res.steps == old.steps + sim.agents[0].steps + sim.agents[1].steps


def test_absences_are_refused_where_they_are_not_simulated():
    from mpca.sim.presence import Absence

    with pytest.raises(ValueError, match="simulated for mpca, sync and diloco"):
        Simulator(config("easgd", absences=(Absence(1, 1.0, 1.0),)))
    with pytest.raises(ValueError, match="agents 0..1"):
        Simulator(config("mpca", absences=(Absence(2, 1.0, 1.0),)))
    with pytest.raises(ValueError, match="AGENT:AT:FOR"):
        Absence.parse("1:20", "hang")
    with pytest.raises(ValueError, match="one of"):
        Absence(0, 1.0, 1.0, "gone")


def test_a_round_waits_for_an_agent_that_answered_its_task_but_not_for_one_that_is_lost_mid_round():
    """DiLoCo's round: a hung agent that answered the round's task is waited for (the runtime's yield waits; its
    claim succeeded before the hang), so the round ends after the hang; a lost one fails the task at once and the
    round reduces without it, and its replacement joins at the round's end."""
    from mpca.sim.presence import Absence

    diloco = {"name": "diloco", "every": 10}
    free = NetworkConstants(link_bps=1e9)
    kw = dict(network=free, max_virtual_s=12.0, compute=ComputeModel(step_s=0.25), agent_wait_s=0.5)
    hung = simulate(config(diloco, absences=(Absence(1, 1.0, 4.0, "hang"),), **kw))
    assert hung.cycles[0].missing == [] and hung.cycles[0].end > 5.0  # the 2.5 s round took the 4 s hang too
    lost = simulate(config(diloco, absences=(Absence(1, 1.0, 1.0, "lost"),), **kw))
    first = lost.cycles[0]
    assert first.missing == [1] and first.end < 3.0 and first.joined == [1]  # not stuck on the lost agent
    assert lost.cycles[-1].missing == [] and len(lost.cycles) >= 3  # the replacement contributes to later rounds


def test_the_simulators_absent_claim_is_the_runtimes():
    from mpca.runtime.exchange import ABSENT_CLAIM_S

    assert NetworkConstants().absent_claim_s == ABSENT_CLAIM_S


def test_each_agent_steps_from_its_own_start_and_the_exchange_from_the_start_up():
    """The runtime's agents train from the moment each is built: with starts 0.5 s and 2.5 s (start-up 2.5 s,
    1 s steps) agent 0 has made one step at t = 1 and two at t = 2, alone, and both step from 2.5 s; the
    exchange's cycles start with the start-up, as without the starts."""
    kw = dict(eval_every_s=1.0, max_virtual_s=3.2, startup_s=2.5)
    spread = simulate(config("mpca", agent_starts_s=(0.5, 2.5), **kw))
    together = simulate(config("mpca", **kw))
    assert [r.steps for r in spread.history[:4]] == [0, 1, 2, 4]  # t = 0..3: agent 0 at 0.5, 1.5, 2.5; 1 at 2.5
    assert [r.steps for r in together.history[:4]] == [0, 0, 0, 2]
    assert spread.cycles[0].start >= 2.5 and spread.settings["agent_starts_s"] == [0.5, 2.5]
    for bad in [(0.5,), (0.5, 3.0), (-0.1, 2.0)]:  # one per agent, none after the start-up or before 0
        with pytest.raises(ValueError, match="agent_starts_s gives each of the 2 agents its start"):
            config("mpca", agent_starts_s=bad, startup_s=2.5)


def test_the_virtual_pipeline_broadcasts_each_reduction_when_the_runtime_does():
    """S = 3 (the runtime's pipeline's rule, DriverRule.stage_lag): staged between jobs (MPCA's default) cycle
    c broadcasts the reduction of cycle c − 1; overlapped (Fig. 8) cycle 1 broadcasts shard 0 (the fill's first
    reduction, staged at once), cycle 2 nothing, then the reduction of cycle c − 2."""
    res = simulate(config("mpca", max_virtual_s=12.0))
    assert [c.bcast_shard for c in res.cycles[:7]] == [None, 0, 1, 2, 0, 1, 2]
    res = simulate(config({"name": "mpca", "stage": "overlapped"}, max_virtual_s=12.0))
    assert [c.bcast_shard for c in res.cycles[:7]] == [None, 0, None, 1, 2, 0, 1]


def test_the_simulator_asks_the_algorithms_what_they_are_not_their_names():
    """Which model is scored and who averages are the algorithm's declarations (Algorithm.scored_model,
    Algorithm.collective), not names the simulator knows: a name tested in mpca/sim goes red here."""
    import pathlib
    import re

    from mpca.algorithm import algorithm_names, build_algorithm

    declared = {n: (build_algorithm(n).scored_model, build_algorithm(n).collective) for n in algorithm_names()}
    assert declared["ddp"] == ("agent", True) and declared["single"] == ("agent", False)
    assert declared["mpca"] == declared["sync"] == declared["easgd"] == ("joint", False)
    names = "|".join(re.escape(n) for n in algorithm_names())
    sim = pathlib.Path(__file__).resolve().parents[2] / "mpca" / "sim"
    by_name = [f"{p.name}:{i + 1}" for p in sorted(sim.glob("*.py")) if p.name not in ("plan.py", "plan_command.py")
               for i, line in enumerate(p.read_text(encoding="utf-8").splitlines())
               if re.search(rf"""name\s*(==|!=|in)\s*\(?[^)]*["']({names})["']""", line)]
    assert not by_name, f"the simulator tests algorithm names: {by_name}"


# --------------------------------------------------------------------------- lock step (training.lock_step)
def _joint_after(cycles, **kw):
    sim = Simulator(config("mpca", agents=3, max_virtual_s=10_000.0, max_cycles=cycles, reduce="ordered", **kw))
    result = sim.run()
    return result, sim.joint_vectors()


def test_in_lock_step_the_joint_model_does_not_depend_on_the_timing():
    """Windows of 3 steps: a straggler, a slower network or another step time change when things happen, not what
    is computed; without the lock step the straggler changes the bits."""
    base, joint = _joint_after(6, lock_step=3)
    assert len(base.cycles) == 6 and base.steps == 3 * 6 * 3  # 3 agents, 6 windows of 3 steps
    for other in (dict(compute=ComputeModel(step_s=1.0, speeds={2: 0.25})),
                  dict(compute=ComputeModel(step_s=0.1, jitter=0.3)),
                  dict(network=NetworkConstants(job_overhead_s=3.0))):
        result, again = _joint_after(6, lock_step=3, **other)
        assert result.mean_cycle_s != base.mean_cycle_s, other  # the timing did change
        assert all(torch.equal(a, b) for a, b in zip(joint, again)), other
    _, free = _joint_after(6, compute=ComputeModel(step_s=1.0))
    _, straggling = _joint_after(6, compute=ComputeModel(step_s=1.0, speeds={2: 0.25}))
    assert not all(torch.equal(a, b) for a, b in zip(free, straggling))


@pytest.mark.parametrize("algorithm", [{"name": "sync", "every": 6}, {"name": "diloco", "every": 6},
                                       {"name": "streaming_diloco", "every": 6, "fragments": 2},
                                       {"name": "delayed_diloco", "every": 6}])
def test_agents_that_wait_for_the_driver_need_only_the_ordered_sum_to_ignore_the_timing(algorithm):
    """Their rounds pace them: with cluster.reduce: ordered a straggler or another step time and job overhead
    change when things happen, not what is computed (the scenario test checks sync and DiLoCo on Spark)."""
    def joint(**kw):
        sim = Simulator(config(algorithm, agents=3, max_virtual_s=1e4, max_cycles=12, reduce="ordered", **kw))
        sim.run()
        return sim.joint_vectors()

    base = joint(compute=ComputeModel(step_s=1.0))
    for other in (dict(compute=ComputeModel(step_s=1.0, speeds={2: 0.25})),
                  dict(compute=ComputeModel(step_s=0.1, jitter=0.3), network=NetworkConstants(job_overhead_s=2.0))):
        assert all(torch.equal(a, b) for a, b in zip(base, joint(**other))), other


def test_lock_step_is_refused_for_agents_that_wait_for_the_driver_themselves():
    with pytest.raises(ValueError, match="lock_step paces agents that never wait"):
        Simulator(config({"name": "sync", "every": 3}, lock_step=3))


def test_a_runs_membership_is_replayed_cycle_for_cycle():
    from mpca.sim.presence import MembershipChange, replayed

    # cycles 0-1 without agent 2 (late), joined after cycle 1; agent 1 lost from cycle 3, back after cycle 4
    missing, joined = [[2], [2], [], [1], [1], []], [[], [2], [], [], [1], []]
    script = replayed(missing, joined)
    assert script == (MembershipChange(0, 2, "lost"), MembershipChange(1, 2, "joined"),
                      MembershipChange(3, 1, "lost"), MembershipChange(4, 1, "joined"))
    result = Simulator(config("mpca", agents=3, max_virtual_s=1e4, max_cycles=6, membership=script)).run()
    assert [c.missing for c in result.cycles] == missing and [c.joined for c in result.cycles] == joined
    with pytest.raises(ValueError, match="membership names agents"):
        config("mpca", agents=2, membership=script)
