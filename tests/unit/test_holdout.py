"""The holdout the agents set aside as they load (mpca.data.holdout), against values worked out by hand."""
import numpy as np
import pyarrow as pa
import pytest

from mpca.data.holdout import HASH_COLUMN, HoldoutKeeper, decode_rows, holdout_cut_off
from mpca.data.split import BUCKETS


def _batch(hashes, labels):
    """Rows whose two features are (label, label + 0.5), with the given hashes."""
    feats = [[float(v), float(v) + 0.5] for v in labels]
    return pa.RecordBatch.from_pydict({"features": feats, "label": list(labels), HASH_COLUMN: list(hashes)})


def test_an_agent_trains_on_the_rest_in_order_and_keeps_its_smallest_hashed_holdout_rows():
    cut = 10  # a row is held out when hash mod 1,000,000 < 10 (Spark's pmod: -999,995 mod 1e6 = 5)
    keeper = HoldoutKeeper(cut, 2, "features", "label", (2,))
    batches = [_batch([BUCKETS + 3, 50, -999_995, 7], [0, 1, 2, 3]),  # held: 1e6+3 (3), -999,995 (5), 7 (7)
               _batch([2 * BUCKETS + 1, 60], [4, 5])]  # held: 2e6+1 (1)
    out = list(keeper.training_batches(batches))
    assert [b.column_names for b in out] == [["features", "label"]] * 2  # the hash column dropped
    assert [v for b in out for v in b.column("label").to_pylist()] == [1, 5]  # the rest, in order
    # of the held rows' hashes (1e6+3, -999,995, 7, 2e6+1) the 2 smallest, ascending: the negative one and 7
    assert keeper.hashes().tolist() == [-999_995, 7]
    header, payload = keeper.rows_up_to(7)
    assert header == {"rows": 2, "label_dtype": "int64", "label_shape": []}  # small: the hashes travel in the payload
    assert np.frombuffer(payload[:16], np.int64).tolist() == [-999_995, 7]
    x = np.frombuffer(payload[16:32], np.float32).reshape(2, 2)
    assert x.tolist() == [[2.0, 2.5], [3.0, 3.5]] and np.frombuffer(payload[32:], np.int64).tolist() == [2, 3]
    assert keeper.rows_up_to(-1_000_000)[0]["rows"] == 0 and keeper.rows_up_to(0)[0]["rows"] == 1


def test_the_keeper_holds_at_most_about_twice_max_rows_whatever_the_partition():
    keeper = HoldoutKeeper(BUCKETS, 3, "features", "label", (2,))  # every row held out
    for lo in range(0, 40, 4):
        list(keeper.training_batches([_batch(range(100 - lo, 96 - lo, -1), range(4))]))
        assert sum(len(p[0]) for p in keeper._parts) <= 2 * 3 + 4
    assert keeper.hashes().tolist() == [61, 62, 63]  # 100 down to 61: the three smallest


def test_a_default_holdout_of_5000_hashes_fits_the_channel_as_a_payload_not_a_header():
    from mpca.runtime.channel import MAX_HEADER

    keeper = HoldoutKeeper(BUCKETS, 5000, "features", "label", (2,))
    list(keeper.training_batches([_batch(range(-10**18, -10**18 + 6000), [0] * 6000)]))
    header, payload = keeper.rows_up_to(int(keeper.hashes()[-1]))
    assert len(keeper.hashes()) == 5000 and len(str(header)) < 100 < MAX_HEADER and len(payload) == 5000 * 24


def test_the_driver_takes_the_smallest_hashes_over_all_agents_in_two_steps():
    a = HoldoutKeeper(BUCKETS, 3, "features", "label", (2,))
    b = HoldoutKeeper(BUCKETS, 3, "features", "label", (2,))
    list(a.training_batches([_batch([40, 10, 30, 90], [4, 1, 3, 9])]))
    list(b.training_batches([_batch([20, 80, 5], [2, 8, 0])]))
    # hellos: a's 3 smallest (10, 30, 40), b's (5, 20, 80); of all six, the 3rd smallest is 20
    assert holdout_cut_off(np.concatenate([a.hashes(), b.hashes()]), 3) == 20
    assert holdout_cut_off([7], 3) == 7 and holdout_cut_off([], 3) is None
    parts = [a.rows_up_to(20), b.rows_up_to(20)]  # a: hash 10; b: 5 and 20 — three rows moved, no more
    assert [p[0]["rows"] for p in parts] == [1, 2]
    x, y, h = decode_rows(parts, 3, (2,))
    assert h.tolist() == [5, 10, 20] and y.tolist() == [0, 1, 2] and x[:, 0].tolist() == [0.0, 1.0, 2.0]
    x, y, h = decode_rows([({"rows": 0, "label_dtype": "int64"}, b"")], 3, (2,))
    assert x.shape == (0, 2) and y.shape == (0,)


def test_float_labels_travel_as_float32():
    keeper = HoldoutKeeper(BUCKETS, 2, "features", "label", (2,))
    list(keeper.training_batches([pa.RecordBatch.from_pydict(
        {"features": [[1.0, 2.0]], "label": [0.25], HASH_COLUMN: [3]})]))
    header, payload = keeper.rows_up_to(3)
    assert header["label_dtype"] == "float32"
    assert decode_rows([(header, payload)], 2, (2,))[1].tolist() == [0.25]


@pytest.mark.parametrize("max_rows", [1, 4])
def test_ties_beyond_max_rows_are_cut_by_the_driver(max_rows):
    keeper = HoldoutKeeper(BUCKETS, 4, "features", "label", (2,))
    list(keeper.training_batches([_batch([9, 9, 9, 9], [0, 1, 2, 3])]))  # identical hashes
    x, _, h = decode_rows([keeper.rows_up_to(holdout_cut_off(keeper.hashes(), max_rows))], max_rows, (2,))
    assert h.tolist() == [9] * max_rows and len(x) == max_rows
