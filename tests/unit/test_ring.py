"""DDP's compressed ring all-reduce (mpca.algorithm.ring), K ranks driven in lock step in one thread: the
chunks, a hand-computed int8 ring, identical results on every rank, error feedback and the bytes per rank."""
import numpy as np
import pytest

from mpca.algorithm.ring import chunk_bounds, ring_in_lock_step
from mpca.algorithm.wire import Codec, ErrorFeedback


def run_ring(xs, feedbacks):
    return ring_in_lock_step(xs, feedbacks)


def test_chunks_cover_the_vector_and_differ_by_at_most_one():
    assert chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]  # fewer values than ranks: empty chunks
    for n, k in ((1000, 7), (5, 5), (0, 3)):
        sizes = [b - a for a, b in chunk_bounds(n, k)]
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


def test_fp32_ring_is_the_exact_sum_on_every_rank():
    xs = [np.array([1, 2, 3, 4, 5], np.float32) * (r + 1) for r in range(3)]
    results, _ = run_ring(xs, [ErrorFeedback(Codec("fp32")) for _ in xs])
    for res in results:
        assert np.array_equal(res, np.array([6, 12, 18, 24, 30], np.float32))


def test_int8_ring_by_hand_with_two_ranks():
    """Chunks [0, 2) and [2, 4), block 2.  Reduce: rank 0 sends [1.0, 0.3] as q = [127, 38] (s = 1/127) →
    [1.0, 0.2992]; rank 1 sends [1.0, 1.0] exactly.  Rank 0 owns [2 + 1, 0 + 1] = [3, 1] → q = [127, 42]
    (s = 3/127) → [3, 0.99213]; rank 1 owns [0.5 + 1.0, 0.5 + 0.29921] → q = [127, 68] (s = 1.5/127) →
    [1.5, 0.80315].  Both ranks decode the owners' bytes."""
    xs = [np.array([1.0, 0.3, 2.0, 0.0], np.float32), np.array([0.5, 0.5, 1.0, 1.0], np.float32)]
    results, sent = run_ring(xs, [ErrorFeedback(Codec("int8", block=2)) for _ in xs])
    expected = np.array([1.5, 68 * 1.5 / 127, 3.0, 42 * 3 / 127], np.float32)
    for res in results:
        assert np.allclose(res, expected, rtol=0, atol=1e-6), res
    assert sent == [2 * (4 + 2)] * 2  # two messages of one scale and two int8 values


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_lossy_rings_agree_bit_for_bit_on_every_rank_and_send_2_k_minus_1_over_k(fmt):
    rng = np.random.default_rng(0)
    K, n = 4, 4 * 4096
    xs = [rng.normal(size=n).astype(np.float32) for _ in range(K)]
    codec = Codec(fmt, block=4096)
    results, sent = run_ring(xs, [ErrorFeedback(codec) for _ in range(K)])
    assert all(np.array_equal(results[0], res) for res in results[1:])  # the replicas stay identical
    step = {"bf16": 2.0 ** -7 * 8, "int8": 4 * 8 / 127, "int4": 4 * 8 / 7}[fmt]  # generous: |sum| ≲ 8
    assert np.abs(results[0] - sum(xs)).max() < step
    assert sent == [2 * (K - 1) * codec.nbytes(n // K)] * K  # 2 (K − 1) / K of the encoded vector


def test_error_feedback_keeps_the_sum_of_many_steps_within_a_step():
    """The same gradients 50 times: with each rank's residuals the applied sums track 50 × the true sum;
    with fresh senders every step (no feedback) the rounding error adds up."""
    rng = np.random.default_rng(1)
    K, n, steps = 3, 300, 50
    xs = [rng.normal(size=n).astype(np.float32) for _ in range(K)]
    truth = steps * sum(xs)
    kept = [ErrorFeedback(Codec("int8", block=100)) for _ in range(K)]
    with_ef = sum(run_ring(xs, kept)[0][0] for _ in range(steps))
    without = sum(run_ring(xs, [ErrorFeedback(Codec("int8", block=100)) for _ in range(K)])[0][0]
                  for _ in range(steps))
    one_step = np.abs(sum(xs)).max() / 127 * K  # a few quantisation steps of the largest values
    assert np.abs(with_ef - truth).max() < one_step
    assert np.abs(without - truth).max() > 5 * one_step
