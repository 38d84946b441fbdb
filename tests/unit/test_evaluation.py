"""The background evaluator's rules (mpca.evaluation.BackgroundEvaluator), without Spark."""
import time

import pytest
import torch

from mpca.algorithm import ShardLayout
from mpca.evaluation import BackgroundEvaluator


def _evaluator(rows: int = 1_000, loss_fn=torch.nn.functional.cross_entropy):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    bound = ShardLayout.from_module(model, 2).bind_module(model)
    hx, hy = torch.randn(rows, 3), torch.randint(0, 2, (rows,))
    return BackgroundEvaluator(model, bound, "average", loss_fn), bound, (hx, hy)


def test_one_submission_waits_while_another_is_scored_and_a_third_is_skipped():
    """The initial model's score and the one due at once (the holdout just arrived) are both taken: the second
    waits for the first instead of being skipped a whole cycle; a third, while both are held, is skipped."""
    ev, bound, holdout = _evaluator()
    joints = [bound.read(s) for s in range(2)]
    assert ev.submit(joints, -1, 0.0, {})  # held: no holdout yet, so neither is scored while the test asks
    assert ev.submit(joints, 0, 1.5, {})  # queued behind the first
    assert not ev.submit(joints, 1, 2.0, {})  # no room: skipped rather than holding more copies
    ev.set_holdout(*holdout)
    ev.close()
    rows = ev.drain()
    assert [(r["cycle"], r["wall_s"]) for r in rows] == [(0, 0.0), (1, 1.5)]
    assert rows[0]["holdout_error"] == rows[1]["holdout_error"]  # the same weights scored twice


def test_snapshots_taken_before_the_holdout_are_scored_when_it_comes_under_their_own_time():
    ev, bound, holdout = _evaluator()
    joints = [bound.read(s) for s in range(2)]
    assert ev.submit(joints, -1, 0.0, {})
    moved = [j + 1.0 for j in joints]
    assert ev.submit(moved, 1, 7.25, {})  # the model as it was at 7.25 s, not as it is when scored
    time.sleep(0.2)
    assert ev.drain() == []  # nothing to score on yet
    for j in joints:
        j.add_(5.0)  # the trainer's joint model moves on: the snapshot must not
    ev.set_holdout(*holdout)
    ev.wait()
    rows = ev.drain()
    assert [(r["cycle"], r["wall_s"]) for r in rows] == [(0, 0.0), (2, 7.25)]
    assert torch.equal(rows[1]["_snapshot"][0], moved[0])
    assert rows[0]["holdout_loss"] != rows[1]["holdout_loss"]
    ev.close()


def test_closing_without_a_holdout_drops_the_queue_at_once():
    ev, bound, _ = _evaluator(rows=10)
    assert ev.submit([bound.read(s) for s in range(2)], -1, 0.0, {})
    started = time.time()
    ev.close()
    assert time.time() - started < 5 and ev.drain() == []
    assert not ev.submit([bound.read(s) for s in range(2)], 0, 1.0, {})  # closed


def test_a_scoring_that_fails_is_raised_by_drain():
    def broken(out, y):
        raise ValueError("loss cannot be computed")

    ev, bound, holdout = _evaluator(rows=10, loss_fn=broken)
    ev.set_holdout(*holdout)
    ev.submit([bound.read(s) for s in range(2)], -1, 0.0, {})
    ev.wait()
    with pytest.raises(ValueError, match="loss cannot be computed"):
        ev.drain()
    ev.close()
