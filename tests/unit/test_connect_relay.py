"""A Spark Connect run's pieces without Spark: the run's directory (mpca.runtime.rundir), the coordinator's relay
jobs against agents' real channel servers on TCP in threads (mpca.runtime.relay), an agent's reading of the
coordinator's services, and the client's timeline and history rows rebuilt from the coordinator's JSON."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from mpca.algorithm.wire import Codec
from mpca.runtime.agent_server import ChannelServer
from mpca.runtime.channel import listen_tcp
from mpca.runtime.relay import AgentDirectory, HeldBroadcasts, RelayJobs
from mpca.runtime.roster import AgentRoster
from mpca.runtime.rundir import COORDINATOR, RunDir

SECRET = b"k" * 32


def test_history_rows_are_read_in_order_up_to_the_first_gap_and_announcements_by_agent(tmp_path):
    rundir = RunDir(str(tmp_path / "run")).create()
    for n in (0, 1, 3):
        rundir.write_row(n, {"cycle": n})
    assert [r["cycle"] for r in rundir.rows_from(0)] == [0, 1]  # row 2 not there yet: 3 waits for it
    assert rundir.row_count() == 3
    assert rundir.rows_from(2) == []
    rundir.write_row(2, {"cycle": 2})
    assert [r["cycle"] for r in rundir.rows_from(1)] == [1, 2, 3]
    rundir.announce_agent(0, "10.0.0.1", 4000, attempt=0)
    rundir.announce_agent(0, "10.0.0.2", 4001, attempt=1)  # a replacement's announcement replaces its predecessor's
    rundir.announce_agent(3, "10.0.0.3", 4002, attempt=0)
    agents = rundir.agents()
    assert sorted(agents) == [0, 3] and (agents[0]["host"], agents[0]["port"], agents[0]["attempt"]) == ("10.0.0.2", 4001, 1)
    assert rundir.read("missing.json") is None and rundir.wait_for("missing.json", 0.05) is None
    assert not any("secret" in json.dumps(rundir.read(n)) for n in rundir.names())


class FakeAgent:
    """An agent's channel server on TCP answering claims once per token, yields with its shard and weight, and
    deliveries (recorded)."""

    def __init__(self, agent: int, shard: np.ndarray, weight: float):
        self.agent, self.shard, self.weight = agent, shard.astype(np.float32), weight
        self.delivered, self.tokens, self.stopped = [], set(), False
        self.srv = listen_tcp("127.0.0.1", 0)
        server = ChannelServer(f"agent {agent}", SECRET, 1 << 20, self.handle, lambda: self.stopped)
        threading.Thread(target=server.serve, args=(self.srv,), daemon=True).start()

    def handle(self, header, payload):
        info = {"agent": self.agent, "pid": 100 + self.agent, "executor": "x"}
        if header["op"] == "claim":
            fresh = header["token"] not in self.tokens
            self.tokens.add(header["token"])
            return {**info, "ok": fresh}, None
        if header["op"] == "yield":
            return {**info, "weight": self.weight}, self.shard.tobytes()
        if header["op"] == "deliver":
            self.delivered.append(np.frombuffer(bytes(payload), np.float32).tolist())
            return {**info, "ok": True}, None
        return {"error": "unknown"}, None

    def close(self):
        self.stopped = True
        self.srv.close()


def test_a_relay_job_reaches_each_announced_agent_over_tcp_and_sums_eq_9_as_the_tree_would(tmp_path):
    """Two agents with shards (1, 1) and (2, 4) and weights τ = 2 and 3: the reduce part's partial is
    2·(1, 1) + 3·(2, 4) = (8, 14) with weight 5, both agents are counted, and the deliver part hands each the
    held payload; an agent that has not announced itself is reported misplaced by each part, not waited for."""
    rundir = RunDir(str(tmp_path / "run")).create()
    agents = [FakeAgent(0, np.array([1.0, 1.0]), 2.0), FakeAgent(1, np.array([2.0, 4.0]), 3.0)]
    try:
        for a in agents:
            rundir.announce_agent(a.agent, "127.0.0.1", a.srv.getsockname()[1], attempt=0)
        roster = AgentRoster([0, 1, 2])
        jobs = RelayJobs(AgentDirectory(rundir, SECRET, 1 << 20), "r", SECRET, roster, Codec(), task_timeout_s=5)
        held = HeldBroadcasts(Codec()).create(__import__("torch").tensor([0.5, 0.25]), shard=0)
        reduce = jobs.plan("c0/r", "reduce", cycle=0, reduce_shard=0, reduce_numel=2)
        deliver = jobs.plan("c0/b", "deliver", cycle=0, bcast_shard=0)
        rec = jobs.run_parts([(deliver, 2, held), (reduce, 2, None)], "cycle 0", "cycle")
        assert rec.partial.weight == 5.0 and np.asarray(rec.partial.total).tolist() == [8.0, 14.0]
        assert sorted(rec.agents) == [0, 1] and sorted(rec.delivered) == [0, 1] and rec.misplaced == ["agent 2's relay"] * 2
        assert [a.delivered for a in agents] == [[[0.5, 0.25]]] * 2
        assert jobs.counts == {"cycle": 1, "deliver": 1, "correction": 0, "control": 0}
        again = jobs.run(jobs.plan("c0/r", "reduce", cycle=0, reduce_shard=0, reduce_numel=2), 2, None, "again")
        assert again.agents == {}  # one answer per agent and token, as for Spark's tasks
        jobs.close()
        restarted = RelayJobs(AgentDirectory(rundir, SECRET, 1 << 20), "r", SECRET, roster, Codec(), 5, attempt=1)
        plan = restarted.plan("c0/r", "reduce", cycle=0, reduce_shard=0, reduce_numel=2)
        assert plan.token == "1:c0/r" and sorted(restarted.run(plan, 2, None, "again").agents) == [0, 1]
        restarted.close()  # a coordinator started again counts from its checkpoint: its tokens are new
    finally:
        for a in agents:
            a.close()


def test_an_agent_reads_the_coordinators_services_and_refuses_a_malformed_file(tmp_path, monkeypatch):
    from mpca.runtime import agent as agent_module
    from mpca.runtime.agent import AgentSpec, with_coordinator

    rundir = RunDir(str(tmp_path / "run")).create()
    spec = AgentSpec(run_id="r", secret=SECRET, model_fn=None, loss_fn=None, optimizer_fn=None, layout=None,
                     initial=None, relay=rundir.location)
    monkeypatch.setattr(agent_module, "COORDINATOR_WAIT_S", 0.1)
    with pytest.raises(RuntimeError, match="did not say where it is"):
        with_coordinator(spec)
    rundir.write(COORDINATOR, {"host": "10.0.0.9", "service": ["10.0.0.9", 7077], "rendezvous": {"port": 5}})
    got = with_coordinator(spec)
    assert got.service == ("10.0.0.9", 7077) and got.rendezvous == {"port": 5} and got.secret == SECRET
    rundir.write(COORDINATOR, {"host": "h", "service": "10.0.0.9:7077"})
    with pytest.raises(ValueError, match="not \\[host, port\\]"):
        with_coordinator(spec)


def test_the_clients_timeline_and_history_come_back_from_the_coordinators_json():
    """Rows through JSON (dict keys as strings, NaN as null) read back as a classic run's: agent ids as ints, the
    totals summed — 2 cycles that broadcast and reduced, one of them overlapping — and NaN errors."""
    from mpca.connect.client import history_row, timeline_row
    from mpca.connect.coordinator import plain
    from mpca.runtime.timeline import CycleRecord, Timeline

    recs = [CycleRecord(c, reduce_shard=c % 2, bcast_shard=(c + 1) % 2 if c else None, t_submit=float(c),
                        bytes_up=10, bytes_down=4 * c) for c in range(3)]
    recs[1].bcast_end, recs[1].reduce_start = 1.5, 1.2  # cycle 1's broadcast ends after its reduce started
    recs[2].bcast_end, recs[2].reduce_start = 2.1, 2.5
    classic = Timeline()
    for r in recs:
        classic.add(r)
    sent = json.loads(json.dumps(plain(classic.rows())))
    timeline = Timeline.of_rows(timeline_row(r) for r in sent)
    assert timeline.rows() == classic.rows()
    assert (timeline.totals.bytes_up, timeline.totals.bytes_down) == (30, 12)
    assert (timeline.totals.exchanged, timeline.totals.overlapped, timeline.totals.shards) == \
        (classic.totals.exchanged, classic.totals.overlapped, {0, 1})
    assert timeline.overlap_fraction(0) == classic.overlap_fraction(0)
    row = history_row(json.loads(json.dumps(plain({"holdout_error": float("nan"), "weight": {3: 2.0}}))))
    assert np.isnan(row["holdout_error"]) and row["weight"] == {3: 2.0}


def test_a_connect_server_older_than_spark_3_5_is_refused_in_one_line():
    import types

    from mpca.connect.client import check_server
    from mpca.errors import UserError

    for version in ("3.5.3", "4.0.0", "4.3.0", "10.0.1"):
        check_server(types.SimpleNamespace(version=version))
    with pytest.raises(UserError, match="Spark 3.4.1; mpca's Connect mode needs Spark 3.5 or newer"):
        check_server(types.SimpleNamespace(version="3.4.1"))


def test_the_coordinators_warnings_and_an_agents_early_end_reach_the_clients_log_once_each(tmp_path, caplog):
    import logging

    from mpca.connect.client import relay_notes
    from mpca.connect.coordinator import NotesToRunDir
    from mpca.runtime.agent_job import error_line, note_ending

    rundir = RunDir(str(tmp_path / "run")).create()
    source = logging.getLogger("mpca.test-coordinator")
    source.setLevel(logging.INFO)
    notes = NotesToRunDir(rundir, cap=2)
    source.addHandler(notes)
    try:
        source.info("an info line stays in the executor's log")
        source.warning("agent %s did not answer in cycle %d", 1, 7)
        note_ending(str(tmp_path / "run"), 1, "agent 1 could not start:\nTraceback (most recent call last):\n"
                                              "  File x\nValueError: bad shape")
        source.warning("second")
        source.warning("third: over the cap")
        source.warning("fourth: not written at all")
    finally:
        source.removeHandler(notes)
    rundir.write("note-x-1.json", {"origin": "someone", "level": "not a level", "message": "m", "at": 1e18})
    noted: set = set()
    with caplog.at_level(logging.INFO, logger="mpca.connect"):
        assert relay_notes(rundir, noted) == 5
        assert relay_notes(rundir, noted) == 0  # each note once
    lines = [r.getMessage() for r in caplog.records if r.name == "mpca.connect"]
    assert lines == ["coordinator: agent 1 did not answer in cycle 7",
                     "agent 1: its Spark task ended early: agent 1 could not start: ValueError: bad shape",
                     "coordinator: second",
                     "coordinator: more than 2 warnings: the rest are only in the coordinator's executor log",
                     "someone: m"]  # a malformed level (the directory is not trusted): a warning
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "mpca.connect")
    assert error_line("agent 0: executor slot cpu already holds an agent of this run") == \
        "agent 0: executor slot cpu already holds an agent of this run"
