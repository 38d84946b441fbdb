"""The simulator's transport for ddp: K ranks in K threads meet in one room; sums in rank order, the source's
tensor, the encoded ring as every rank's side of it in lock step; a rank that fails breaks the others' wait."""
import threading

import numpy as np
import pytest
import torch

from mpca.algorithm.ring import ring_in_lock_step
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.sim.collective import Room


def _ranks(world, fn):
    """fn(rank, handle) in one thread per rank; their results by rank, and what each raised."""
    room = Room(world)
    out, errors = [None] * world, [None] * world

    def run(rank):
        try:
            out[rank] = fn(rank, room.member(rank))
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors[rank] = e
            room.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out, errors


def test_all_reduce_gives_every_rank_the_sum_and_broadcast_the_sources_tensor():
    def fn(rank, group):
        x = torch.tensor([1.0, 2.0]) * 10 ** rank  # 1, 2 · 10, 20 · 100, 200
        group.all_reduce_(x)
        y = torch.full((2,), float(rank))
        group.broadcast_(y, 1)
        return x, y

    out, errors = _ranks(3, fn)
    assert errors == [None] * 3
    for x, y in out:
        assert x.tolist() == [111.0, 222.0] and y.tolist() == [1.0, 1.0]


def test_the_sum_is_taken_in_rank_order_whichever_thread_comes_first():
    # float32 rounds 1 + 1e8 to 1e8: x₀ + x₁ + x₂ in rank order is 0, while rank 0's 1 added last (the order the
    # threads arrive in) would leave 1
    values = [1.0, 1e8, -1e8]

    def fn(rank, group):
        if rank == 0:
            threading.Event().wait(0.05)  # rank 0 comes last
        x = torch.tensor([values[rank]], dtype=torch.float32)
        group.all_reduce_(x)
        return float(x)

    out, _ = _ranks(3, fn)
    assert out == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_the_ring_is_every_ranks_side_of_the_encoded_ring_in_lock_step(fmt):
    codec = Codec(fmt)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(37).astype(np.float32) for _ in range(3)]
    want, sent = ring_in_lock_step([x.copy() for x in xs], [ErrorFeedback(codec) for _ in xs])

    def fn(rank, group):
        flat = torch.from_numpy(xs[rank].copy())
        return flat, group.ring_all_reduce_(flat, ErrorFeedback(codec))

    out, errors = _ranks(3, fn)
    assert errors == [None] * 3
    for rank, (flat, n) in enumerate(out):
        assert np.array_equal(flat.numpy(), want[rank]) and n == sent[rank]


def test_a_rank_that_fails_breaks_the_others_wait_and_another_group_is_refused():
    def fn(rank, group):
        if rank == 1:
            raise KeyError("rank 1 failed")
        group.all_reduce_(torch.zeros(1))

    _, errors = _ranks(2, fn)
    assert isinstance(errors[1], KeyError) and isinstance(errors[0], threading.BrokenBarrierError)
    group = Room(2).member(0)
    assert group.form(None, 0, 2, torch.device("cpu"), lossy=False) == "lock step"
    with pytest.raises(ValueError, match="does not simulate ddp's re-forming"):
        group.form(None, 0, 1, torch.device("cpu"), lossy=False)
