"""Wire formats and error feedback against hand-computed values (mpca.algorithm.wire)."""
import numpy as np
import pytest

from mpca.algorithm.wire import FORMATS, Codec, ErrorFeedback


def test_int8_block_scales_and_values_by_hand():
    c = Codec("int8", block=2)
    x = np.array([1.0, -2.0, 0.5, 4.0], dtype=np.float32)
    data = c.encode(x)
    assert len(data) == c.nbytes(4) == 2 * 4 + 4  # two float32 scales, one byte a value
    scales = np.frombuffer(data[:8], dtype=np.float32)
    np.testing.assert_allclose(scales, [2 / 127, 4 / 127], rtol=1e-7)
    # 1 / (2/127) = 63.5 → 64 (ties to even), −2 → −127; 0.5 / (4/127) = 15.875 → 16, 4 → 127
    assert np.frombuffer(data[8:], dtype=np.int8).tolist() == [64, -127, 16, 127]
    np.testing.assert_allclose(c.decode(data, 4), [64 * 2 / 127, -2.0, 16 * 4 / 127, 4.0], rtol=1e-6)


def test_int4_packs_two_values_a_byte_by_hand():
    c = Codec("int4", block=4)
    data = c.encode(np.array([7.0, -7.0, 3.5, 0.0], dtype=np.float32))
    assert len(data) == c.nbytes(4) == 4 + 2
    assert np.frombuffer(data[:4], dtype=np.float32).tolist() == [1.0]  # max|x| / 7
    # nibbles q + 8, the first value low: (7+8) | (−7+8) << 4 = 31; round(3.5) = 4 → 12 | 8 << 4 = 140
    assert list(data[4:]) == [31, 140]
    assert c.decode(data, 4).tolist() == [7.0, -7.0, 4.0, 0.0]
    odd = Codec("int4", block=4)
    assert odd.decode(odd.encode(np.array([1.0, -1.0, 0.5], dtype=np.float32)), 3).shape == (3,)


def test_bf16_rounds_to_nearest_even_by_hand():
    c = Codec("bf16")
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5], dtype=np.float32)
    assert len(c.encode(x)) == 2 * 4
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the even one, 1; 1 + 3·2^-8 between 1 + 2^-7 and 1 + 2^-6: 1 + 2^-6
    assert c.decode(c.encode(x), 4).tolist() == [1.0, 1.0, 1 + 2 ** -6, -2.5]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_round_trip_is_within_half_a_step_of_each_block(fmt):
    rng = np.random.default_rng(0)
    c = Codec(fmt, block=64)
    x = (rng.standard_normal(1000) * rng.uniform(0.01, 10, 1000)).astype(np.float32)
    y = c.decode(c.encode(x), x.size)
    levels = 127 if fmt == "int8" else 7
    step = np.repeat(np.abs(np.pad(x, (0, 24))).reshape(-1, 64).max(axis=1) / levels, 64)[:1000]
    assert (np.abs(y - x) <= step / 2 * (1 + 1e-5)).all()


def test_bf16_round_trip_is_within_one_rounding():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    y = Codec("bf16").decode(Codec("bf16").encode(x), 1000)
    assert (np.abs(y - x) <= np.abs(x) * 2 ** -8).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fp32_is_bit_exact_in_the_values_own_dtype(dtype):
    x = np.random.default_rng(2).standard_normal(257).astype(dtype)
    c = Codec("fp32", dtype=dtype)
    data = c.encode(x)
    assert data == x.tobytes() and len(data) == c.nbytes(257)
    assert c.decode(data, 257).tobytes() == x.tobytes()
    assert ErrorFeedback(c).encode(0, x) == x.tobytes()  # nothing lost, nothing kept


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_nan_or_inf_in_a_block_is_refused(fmt):
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="NaN/Inf"):
            Codec(fmt, block=4).encode(np.array([1.0, bad, 0.0], dtype=np.float32))


def test_bytes_per_value_against_fp32():
    n = 10 ** 6
    fp32 = Codec("fp32").nbytes(n)
    assert Codec("bf16").nbytes(n) / fp32 == 0.5
    assert Codec("int8").nbytes(n) / fp32 == pytest.approx((n + 4 * 245) / (4 * n))  # 245 blocks of 4096: 0.2502
    assert Codec("int4").nbytes(n) / fp32 == pytest.approx((n / 2 + 4 * 245) / (4 * n))
    with pytest.raises(ValueError, match="one of"):
        Codec("fp8")
    assert FORMATS == ("fp32", "bf16", "int8", "int4")


def _received_minus_true(feedback: bool, messages: int = 100) -> np.ndarray:
    c = Codec("int4", block=2)
    x = np.array([1.0, 0.3], dtype=np.float32)  # 0.3 · 7 = 2.1 → 2: every message alone loses 0.3 − 2/7 ≈ 0.0143
    ef = ErrorFeedback(c)
    received = sum(c.decode(ef.encode("s", x) if feedback else c.encode(x), 2) for _ in range(messages))
    return received - messages * x


def test_error_feedback_keeps_the_sum_of_what_was_sent_within_one_step():
    step = 1 / 7  # this block's quantisation step
    assert np.abs(_received_minus_true(True)).max() <= step
    assert np.abs(_received_minus_true(False)).max() > 1.0  # without the residual the bias adds up: 100 × 0.0143


def test_error_feedback_keeps_one_residual_per_stream_and_survives_a_checkpoint():
    c = Codec("int8", block=4)
    ef = ErrorFeedback(c)
    x = np.array([1.0, 0.001, 0.5, 0.25], dtype=np.float32)
    ef.encode(0, x)
    ef.encode(1, -x)
    np.testing.assert_allclose(ef.residual[0], -ef.residual[1], atol=1e-7)
    again = ErrorFeedback(c)
    again.load_state_dict(ef.state_dict())
    assert ef.encode(0, x) == again.encode(0, x)


def test_encoded_partials_combine_like_eq_9_within_one_step_per_level():
    from mpca.algorithm.wire import EncodedSum

    c = Codec("int8", block=4)
    a, b = np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([4.0, 3.0, 2.0, -1.0], np.float32)
    root = EncodedSum.of(a, 1.0, c).combine(EncodedSum.of(b, 3.0, c)).combine(EncodedSum.of(a, 0.0, c))
    assert root.weight == 4.0 and root.n == 4
    total = root.decoded().total
    exact = a * 1 + b * 3  # (13, 11, 9, 1): Σ τ x
    # half a step per rounding: leaf a (max 4), leaf 3·b (max 12), the combining level (max 13 and its error)
    assert np.abs(total - exact).max() <= (4 + 12 + 13.1) / 127 / 2
    assert EncodedSum.of(a, 0.0, c).data is None and EncodedSum.of(a, 0.0, c).decoded().total is None


@pytest.mark.parametrize("fmt", ["int8", "int4", "bf16", "fp32"])
def test_a_received_contribution_scales_by_tau_as_decode_and_encode_would(fmt):
    """int8/int4: τ·x is the same q with each block's scale times τ — by hand, block 2, q = (127, 64) and
    (127, −127): scales (2/127, 1/127) × 3 → (6/127, 3/127).  Every format: the values of τ·decode(x)."""
    from mpca.algorithm.wire import EncodedSum

    c = Codec(fmt, block=2)
    x = np.array([2.0, 1.0079, 1.0, -1.0], np.float32)
    data = c.encode(x)
    got = EncodedSum.received(data, 4, 3.0, c)
    expected = EncodedSum.of(c.decode(data, 4), 3.0, c)
    assert got.weight == 3.0 and np.allclose(got.values(), expected.values(), rtol=1e-6, atol=0)
    if fmt == "int8":
        assert np.array_equal(np.frombuffer(got.data[:8], np.float32), np.float32([6 / 127, 3 / 127]))
        assert got.data[8:] == data[8:] == np.int8([127, 64, 127, -127]).tobytes()
    assert EncodedSum.received(data, 4, 0.0, c).data is None
    with pytest.raises(ValueError, match="bytes"):
        EncodedSum.received(data[:-1], 4, 1.0, c)
