"""An agent's rows while they arrive (mpca.data.stream): the ramp's rule by hand, the buffers, the checks."""
import threading

import numpy as np
import torch

from mpca.data.stream import RAMP_DOUBLING_STEPS, START_ROWS, LoadingRows, ramp_rows


def _chunk(lo, hi, width=3):
    x = np.repeat(np.arange(lo, hi, dtype=np.float32)[:, None], width, axis=1)
    return x, np.arange(lo, hi, dtype=np.int32)


def test_the_ramp_doubles_the_rows_a_step_draws_from_every_few_steps():
    assert START_ROWS == 1024 and RAMP_DOUBLING_STEPS == 8
    assert [ramp_rows(s) for s in (0, 7, 8, 15, 16, 24, 40)] == [1024, 1024, 2048, 2048, 4096, 8192, 32768]


def test_rows_arrive_in_order_through_doubling_buffers_and_readers_keep_what_they_hold():
    rows = LoadingRows((3,))
    chunks = [_chunk(0, 700), _chunk(700, 1500), _chunk(1500, 4000)]
    seen = []

    def convert(c):
        if seen:  # after the first chunk: what a reader holds stays valid while the buffers grow
            held_x, held_y, n = seen[0]
            assert torch.equal(held_x[:n, 0], torch.arange(n, dtype=torch.float32))
        n = rows.ready()
        seen.append((*rows.view(), n))
        return c

    rows.load(chunks, convert)
    assert rows.done and rows.ready() == 4000 and rows.error is None and rows.problem is None
    x, y = rows.rows()
    assert x.shape == (4000, 3) and y.dtype == torch.int64  # integer labels as int64, cut to size
    assert torch.equal(y, torch.arange(4000)) and torch.equal(x[:, 2], torch.arange(4000, dtype=torch.float32))
    assert len(rows.view()[0]) >= 4000  # the buffer: doubled, not grown chunk by chunk


def test_a_reader_waits_for_the_rows_it_wants_or_the_end():
    rows = LoadingRows((3,))
    release = threading.Event()

    def chunks():
        yield _chunk(0, 500)
        release.wait(5)
        yield _chunk(500, 1200)

    rows.start(chunks(), lambda c: c)
    assert rows.wait(400, timeout=5) >= 400
    assert rows.wait(1000, timeout=0.2) == 500 and not rows.done  # not there yet: gives up after the timeout
    release.set()
    assert rows.wait(1000, timeout=5) == 1200
    assert rows.wait(5000, timeout=5) == 1200 and rows.done  # the end: fewer than wanted
    rows.drop_rest(5)


def test_a_label_problem_stops_taking_rows_but_the_input_is_read_to_its_end():
    taken = []

    def check(y):
        return "labels reach 9" if int(y.max()) >= 9 else None

    rows = LoadingRows((1,), check=check)
    batches = [(np.zeros((2, 1), np.float32), np.array([0, 1])), (np.zeros((2, 1), np.float32), np.array([2, 9])),
               (np.zeros((2, 1), np.float32), np.array([3, 4]))]
    rows.load((taken.append(b) or b for b in batches), lambda b: b)
    assert rows.problem == "labels reach 9" and rows.ready() == 2 and len(taken) == 3


def test_an_unreadable_batch_is_the_agents_error_and_dropping_the_rest_reads_without_converting():
    converted = []

    def convert(b):
        converted.append(b)
        if b == "bad":
            raise ValueError("feature column contains null rows")
        return _chunk(0, 4)

    rows = LoadingRows((3,))
    rows.load(["ok", "bad", "later"], convert)
    assert isinstance(rows.error, ValueError) and converted == ["ok", "bad"] and rows.ready() == 4
    dropped = LoadingRows((3,))
    dropped._dropping = True
    dropped.load(["a", "b"], convert)
    assert dropped.done and dropped.ready() == 0 and converted == ["ok", "bad"]


def test_no_rows_at_all():
    rows = LoadingRows((2, 2))
    rows.load([], lambda b: b)
    x, y = rows.rows()
    assert rows.done and x.shape == (0, 2, 2) and y.shape == (0,)
