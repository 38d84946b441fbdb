"""Models and functions used by integration tests (shipped to executors by value)."""
import functools
import os
import time

import numpy as np
import torch
from torch import nn

from mpca.models import SmallCNN


def small_cnn():
    return SmallCNN(8)


def per_process_cnn():
    """A model_fn that builds other weights in every process (its own random source): executors cannot rebuild
    the driver's initial model from the run's seed."""
    torch.manual_seed(os.getpid())
    return SmallCNN(8)


def slowly(batches):
    """A mapInArrow body: a source that takes its time, 0.5 s a batch (longer than a Python worker takes to start)."""
    for b in batches:
        time.sleep(0.5)
        yield b


def adam(params):
    return torch.optim.Adam(params, lr=1e-3)


def cross_entropy(out, y):
    return nn.functional.cross_entropy(out, y)


class FixedPoint(nn.Module):
    """w is pulled to an agent-specific fixed point by one SGD(lr=1) step: w ← w - (w - t_i) = t_i.

    On agent i (Spark partition i) t_i = (i + 1) · [0, 1, ..., d-1]; on the driver t = 0.  Whatever the
    elastic pull did before the step, the agent's shard is t_i at every yield, so the driver's joint model
    after N cycles follows from the recorded τ alone.
    """

    def __init__(self, d: int = 30):
        super().__init__()
        from pyspark import TaskContext

        tc = TaskContext.get()
        agent = tc.partitionId() if tc is not None else -1
        self.w = nn.Parameter(torch.zeros(d, dtype=torch.float64))
        self.fixed = agent_target(agent, d)

    def forward(self, x):
        return (self.w - self.fixed).expand(x.shape[0], -1)


def agent_target(agent: int, d: int = 30) -> torch.Tensor:
    return torch.arange(d, dtype=torch.float64) * (agent + 1)


def fixed_point_model():
    return FixedPoint()


def half_squared_norm(out, y):
    return 0.5 * (out ** 2).sum(dim=1).mean()


def sgd_one(params):
    return torch.optim.SGD(params, lr=1.0)


class PoisonedCNN(SmallCNN):
    """A SmallCNN whose forward pass turns NaN on agent 1 for two calls (an injected numerical fault)."""

    def __init__(self, first_bad_call: int = 40):
        super().__init__(8)
        from pyspark import TaskContext

        tc = TaskContext.get()
        self.agent = tc.partitionId() if tc is not None else -1
        self.calls, self.first_bad_call = 0, first_bad_call

    def forward(self, x):
        self.calls += 1
        out = super().forward(x)
        if self.agent == 1 and self.first_bad_call <= self.calls < self.first_bad_call + 2:
            out = out * float("nan")
        return out


def poisoned_cnn():
    return PoisonedCNN()


class BatchNormCNN(nn.Module):
    """A small CNN with BatchNorm, for digits."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(16 * 64, 10))

    def forward(self, x):
        return self.net(x * 4.0 + 2.0)  # inputs far from zero mean and unit variance: statistics matter


def bn_cnn():
    return BatchNormCNN()


def hanging_cnn_fn(after=None):
    """A fresh SmallCNN model_fn whose agent 1 stops its own process for 8 s once (lab.faults), once the
    file ``after`` exists when given."""
    from lab.faults import faulty

    return faulty(small_cnn, "hang", at_call=1, after=after)  # at its first step once ``after`` exists


def executor_killing_cnn_fn(after=None):
    """A fresh SmallCNN model_fn whose agent 1 kills its executor's JVM once (lab.faults), once the file
    ``after`` exists when given."""
    from lab.faults import faulty

    return faulty(small_cnn, "kill-executor", after=after)


def executor_stopping_cnn_fn(after=None, hold_s: float = 12.0):
    """A fresh SmallCNN model_fn whose agent 1 stops its executor's JVM for ``hold_s`` once (lab.faults: the
    agent trains on, but no task reaches that executor, as when its link is down), once ``after`` exists."""
    from lab.faults import faulty

    return faulty(small_cnn, "stop-executor", at_call=1, hang_s=hold_s, after=after)


class FaultThenRecovery:
    """An ``on_cycle`` hook for the fault tests: arms the fault (creates the file ``go``) at the first evaluation
    after a cycle, never at start-up; once an evaluation found an agent missing (``row["agents"]`` below
    ``agents``) and ``after`` later ones found all of them again, it stops the run (``trainer``, set once
    built) — rather than run to a fixed time that is long on a fast machine and may be short on a slow one."""

    def __init__(self, go, agents: int = 2, after: int = 3):
        self.go, self.agents, self.after = go, agents, after
        self.trainer = None
        self.lost = False
        self.back = 0

    def __call__(self, row) -> None:
        if row["cycle"] > 0 and not self.go.exists():
            self.go.touch()
        elif self.go.exists() and row["agents"] and row["agents"] < self.agents:
            self.lost, self.back = True, 0
        elif self.lost and row["agents"] == self.agents:
            self.back += 1
            if self.back >= self.after and self.trainer is not None:
                self.trainer.request_stop()


def assert_replayed_handshake_refused(connect_raw, secret: bytes) -> None:
    """A recording of a good client's handshake (its nonce and MAC) is worthless on a new connection: the
    server's fresh nonce makes the old MAC wrong, and a request sent after it gets no answer."""
    import json

    from mpca.runtime.channel import NONCE_BYTES, PREFIX, mac, recv_exact

    s1 = connect_raw()
    server_nonce = bytes(recv_exact(s1, NONCE_BYTES))
    recorded = os.urandom(NONCE_BYTES) + mac(secret, b"client", server_nonce)  # what a good client sent
    s1.sendall(recorded)
    assert len(recv_exact(s1, 32)) == 32  # the server's proof: that handshake went through
    s1.close()
    s2 = connect_raw()
    s2.settimeout(5)
    recv_exact(s2, NONCE_BYTES)  # a new nonce
    s2.sendall(recorded)  # replayed
    recv_exact(s2, 32)  # the server's own proof comes before it checks ours
    hello = json.dumps({"op": "hello", "agent": 0}).encode()
    try:
        s2.sendall(PREFIX.pack(len(hello), 0) + hello)
        answer = s2.recv(1)
    except OSError:
        answer = b""
    s2.close()
    assert answer == b"", "a replayed handshake was answered"


class InProcessService:
    """The driver's parameter service in-process: an agent rule's request goes straight to a server rule, with
    the payload as raw bytes both ways (as over the wire)."""

    def __init__(self, server):
        self.server = server

    def request(self, header, payload):
        values = np.frombuffer(payload, dtype=np.float32).copy()  # the agents' default wire: fp32 bytes
        reply, values = self.server.serve(header["agent"], header, torch.from_numpy(values))
        return {**reply, "n": values.numel()}, values.numpy().tobytes()  # as DriverService answers


def checkpoint_at(cycle, value=1.0):
    """A small MPCA checkpoint of ``cycle``: a SmallCNN's state and one 3-value shard of ``value``."""
    from mpca.checkpoint import Checkpoint

    m = SmallCNN(8)
    state = {"joint": [torch.full((3,), value)], "velocity": [torch.zeros(3)], "reductions": [cycle], "buf": None}
    return Checkpoint(cycle=cycle, algorithm="mpca", driver_state=state, model_state=m.state_dict(),
                      layout=[("a", 3, "torch.float32")], shards=1, wall_s=1.5)


class TrackedFit:
    """What trackers read of a finished fit (``Trackers.finish``)."""

    class final:
        error, loss = 0.02, 0.1

    wall_s, cycles, stop_reason = 12.5, 40, "target"


def tracked_rows():
    """Three evaluation rows of a history as trackers get them (the last one's error NaN: not logged)."""
    return [{"cycle": c, "holdout_error": e, "holdout_loss": 2 * e, "samples_per_s": 100.0, "epochs": c / 10,
             "weight": {0: 3}} for c, e in [(5, 0.5), (10, 0.2), (15, float("nan"))]]


def agents_job_only(batches):
    """A mapInArrow body that fails outside the agents' own job (its job group ends in ``-agents``): any other
    read of the rows — a driver's check of the first rows, a holdout scan — raises."""
    from pyspark import TaskContext

    group = TaskContext.get().getLocalProperty("spark.jobGroup.id") or ""
    if not group.endswith("-agents"):
        raise RuntimeError(f"rows read outside the agents' job (job group {group!r})")
    yield from batches


def only_partition_zero(batches):
    """A mapInArrow body that fails in every partition but the first: a read of any other partition raises."""
    from pyspark import TaskContext

    if TaskContext.get().partitionId() != 0:
        raise RuntimeError("partition read beyond the first")
    yield from batches


TINY_LM = {"vocab_size": 256, "context": 32, "width": 32, "layers": 2, "heads": 2}


def tiny_lm():
    """A byte transformer small enough for a test's few hundred steps (mpca.models.ByteTransformer)."""
    from mpca.models import ByteTransformer

    return ByteTransformer(**TINY_LM)


def tiny_resnet():
    """A residual CNN with BatchNorm (ResNet-8: n = 1) for 8×8 single-channel digits."""
    from mpca.models import CifarResNet

    return CifarResNet(n=1, num_classes=10, in_channels=1)


def adamw_3e3(params):
    return torch.optim.AdamW(params, lr=3e-3)


def answered(*agents, joining=()):
    """What a cycle's job returned when ``agents`` answered (``joining``: replacements among them)."""
    from mpca.runtime.record import ExchangeRecord
    from mpca.runtime.reports import AgentReport

    rec = ExchangeRecord()
    for a in agents:
        rec.agents[a] = AgentReport(agent=a, t_yield=1.0, joining=a in joining)
    return rec


def late_on_agent(model_fn, agent: int = 2, seconds: float = 6.0):
    """A model_fn whose agent ``agent`` (its first process) builds its model ``seconds`` late: in an elastic run it
    comes up after the run has started and joins from the joint model."""
    return functools.partial(_late_build, model_fn, agent, seconds)


def _late_build(model_fn, agent: int, seconds: float):
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is not None and tc.partitionId() == agent and tc.attemptNumber() == 0:
        time.sleep(seconds)
    return model_fn()
