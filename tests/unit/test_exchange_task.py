"""An exchange task (mpca.runtime.exchange.exchange_partition) whose agent stops answering mid-request: the cycle goes on
without that agent, as without one that never answered, instead of failing the run (lab.campaign: a SIGSTOP
that came after the claim timed the yield out, and the run ended with "cycle failed ...: TimeoutError")."""
import numpy as np

from mpca.runtime import exchange
from mpca.runtime.exchange import ExchangePlan


class Silent:
    """A claimed agent's channel whose requests of ``failing`` ops raise ``error``; a yield otherwise answers."""

    def __init__(self, error, failing=("yield", "deliver")):
        self.error, self.failing = error, failing

    def request(self, header, payload=b"", timeout=None):
        if header["op"] in self.failing:
            raise self.error
        if header["op"] == "yield":
            return {"agent": 3, "weight": 2.0}, np.ones(4, np.float32).tobytes()
        return {"ok": True}, None

    def close(self):
        pass


def _run(monkeypatch, op, channel, bcast=None):
    monkeypatch.setattr(exchange, "_claim", lambda plan, candidates: (channel, {"agent": 3}, lambda timeout: channel))
    monkeypatch.setattr(exchange.placement, "executor_id", lambda: "7")
    plan = ExchangePlan(run_id="r", secret=b"s", token="t", op=op, cycle=5, reduce_shard=0, bcast_shard=0,
                        reduce_numel=4, timeout_s=1.0)
    return next(exchange.exchange_partition(plan, bcast, iter(())))


class Broadcast:
    value = np.zeros(4, np.float32).tobytes()


def test_a_yield_that_times_out_leaves_the_agent_missing_not_failed(monkeypatch):
    rec = _run(monkeypatch, "reduce", Silent(TimeoutError("timed out")))
    assert rec.agents == {} and rec.partial.total is None and rec.errors() == {}
    rec = _run(monkeypatch, "deliver", Silent(ConnectionResetError()), Broadcast())
    assert rec.delivered == {} and rec.errors() == {}


def test_a_cycle_whose_shard_went_up_but_hand_off_timed_out_counts_the_agent_undelivered(monkeypatch):
    rec = _run(monkeypatch, "cycle", Silent(TimeoutError("timed out"), failing=("deliver",)), Broadcast())
    assert list(rec.agents) == [3] and rec.delivered == {} and rec.partial.weight == 2.0 and rec.errors() == {}


def test_any_other_error_still_fails_the_run_with_its_message(monkeypatch):
    rec = _run(monkeypatch, "reduce", Silent(ValueError("bad header")))
    assert rec.errors() == {3: "reduce failed on executor 7: ValueError('bad header')"}
