"""The simulator's network model against hand-computed values (mpca.sim.network)."""
import math

import pytest

from mpca.algorithm.wire import Codec
from mpca.sim.constants import NetworkConstants
from mpca.sim.network import (DriverPort, broadcast_time, cycle_time, exchange_cpu_time, payload_bytes,
                              ring_allreduce_time, tree_levels, tree_reduce_arrival, wire_time)

NET = NetworkConstants(link_bps=100e6, latency_s=0.001, job_overhead_s=0.25, block_bytes=4_000_000,
                       driver_copies_per_doubling=1.0)
MB = 1_000_000


def test_one_transfer_is_bytes_times_8_over_rate_plus_latency():
    assert wire_time(10 * MB, NET) == pytest.approx(0.8 + 0.001)
    assert wire_time(10 * MB, NetworkConstants.free()) == 0.0


def test_tree_levels_follow_pyspark_tree_aggregate_depth_2():
    assert [tree_levels(k) for k in (1, 2, 4, 5, 8, 16, 64)] == [[], [], [], [1], [2], [4], [8]]


@pytest.mark.parametrize("k, expected", [(1, 0.8 + 0.001), (2, 1.6 + 0.001), (4, 3.2 + 0.001)])
def test_tree_reduce_collects_k_partials_through_the_drivers_port(k, expected):
    assert tree_reduce_arrival([0.0] * k, 10 * MB, NET) == pytest.approx(expected)


def test_tree_reduce_waits_for_the_last_partial_and_queues_at_the_port():
    # partials ready at 0 and 5 s: the second arrives 0.8 s after it is ready; ready together they queue
    assert tree_reduce_arrival([0.0, 5.0], 10 * MB, NET) == pytest.approx(5.8 + 0.001)
    # K = 8: two reducers take 4 partials each (3.2 s + latency), then the driver takes 2 (1.6 s + latency)
    assert tree_reduce_arrival([0.0] * 8, 10 * MB, NET) == pytest.approx(3.2 + 0.001 + 1.6 + 0.001)


@pytest.mark.parametrize("k, expected", [
    (1, 0.8 + 0.001),  # one copy, one hop
    (2, 2 * 0.8 + 2 * 0.001),  # the driver sends 1 + log2 2 = 2 copies; 1 + 1 hops
    (4, 3 * 0.8 + 3 * 0.001),  # 1 + log2 4 = 3 copies; 1 + 2 hops
])
def test_broadcast_time_by_hand(k, expected):
    assert broadcast_time(k, 10 * MB, NET) == pytest.approx(expected)


def test_idealised_torrent_sends_each_block_once_then_peers_double_the_last_block():
    once = NetworkConstants(link_bps=100e6, latency_s=0.0, block_bytes=4_000_000, driver_copies_per_doubling=0.0)
    # 10 MB once (0.8 s) + the last block (4 MB, 0.32 s) doubling log2 4 = 2 times
    assert broadcast_time(4, 10 * MB, once) == pytest.approx(0.8 + 2 * 0.32)
    assert broadcast_time(1, 10 * MB, once) == pytest.approx(0.8)


def test_ring_all_reduce_takes_2_k_minus_1_hops_of_a_kth_of_the_gradient():
    assert ring_allreduce_time(4, 4 * MB, NET) == pytest.approx(6 * (0.08 + 0.001))


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int4"])
def test_wire_formats_change_bytes_as_the_codec_counts_them(fmt):
    n = 1_000_000
    assert payload_bytes(n, fmt) == Codec(fmt).nbytes(n)
    assert wire_time(payload_bytes(n, fmt), NET) == pytest.approx(Codec(fmt).nbytes(n) * 8 / 100e6 + 0.001)
    assert {"fp32": 4_000_000, "bf16": 2_000_000, "int8": 1_000_000 + 4 * 245, "int4": 500_000 + 4 * 245}[fmt] == \
        payload_bytes(n, fmt)


def test_cycle_time_overlaps_reduce_and_broadcast_unless_one_task_per_agent_does_both():
    # K = 4, 10 MB both ways: overhead + max(broadcast 2.403, reduce 3.201)
    assert cycle_time(4, 10 * MB, 10 * MB, NET) == pytest.approx(0.25 + 3.2 + 0.001)
    one = NetworkConstants(**{**NET.to_dict(), "split_tasks": False})
    assert cycle_time(4, 10 * MB, 10 * MB, one, deliver_first=True) == pytest.approx(0.25 + 2.403 + 3.201)
    assert cycle_time(4, 10 * MB, 10 * MB, one) == pytest.approx(0.25 + 3.2 + 0.001)  # reduce job, deliver job


def test_the_exchange_cpu_is_seconds_per_mb_stretched_when_hosts_share_cores():
    cpu = NetworkConstants(**{**NET.to_dict(), "exchange_cpu_s_per_mb": 0.06})
    assert exchange_cpu_time(4, 3 * MB, NET) == 0.0  # not modelled by default
    assert exchange_cpu_time(4, 3 * MB, cpu) == pytest.approx(0.18)  # each host its own cores
    shared = NetworkConstants(**{**cpu.to_dict(), "host_cores": 2})
    assert exchange_cpu_time(2, 3 * MB, shared) == pytest.approx(0.18)  # two agents on two cores
    assert exchange_cpu_time(4, 3 * MB, shared) == pytest.approx(0.36)  # four on two: twice as long
    # on the cycle's critical path, after the overlapped reduce and broadcast: 10 MB each way, 1.2 s of CPU
    assert cycle_time(4, 10 * MB, 10 * MB, cpu) == pytest.approx(0.25 + 3.2 + 0.001 + 1.2)
    with pytest.raises(ValueError, match="host_cores"):
        NetworkConstants(host_cores=0)
    with pytest.raises(ValueError, match="exchange_cpu_s_per_mb"):
        NetworkConstants(exchange_cpu_s_per_mb=-1)


def test_driver_port_is_fifo_each_way():
    port = DriverPort(NET)
    assert port.receive(0.0, 10 * MB) == pytest.approx(0.801)
    assert port.receive(0.0, 10 * MB) == pytest.approx(1.601)  # queued behind the first
    assert port.send(0.0, MB) == pytest.approx(0.081)  # the other direction is free
    assert (port.bytes_in, port.bytes_out) == (20 * MB, MB)


def test_constants_refuse_nonsense():
    with pytest.raises(ValueError):
        NetworkConstants(link_bps=0)
    with pytest.raises(ValueError):
        NetworkConstants(job_overhead_s=-1)
    assert math.isinf(NetworkConstants.free().link_bps)
