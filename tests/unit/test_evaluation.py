"""The background evaluator's rules (mpca.evaluation.BackgroundEvaluator), without Spark."""
import torch

from mpca.algorithm import ShardLayout
from mpca.evaluation import BackgroundEvaluator


def _evaluator():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    bound = ShardLayout.from_module(model, 2).bind_module(model)
    hx, hy = torch.randn(100_000, 3), torch.randint(0, 2, (100_000,))  # a scoring that takes a while
    return BackgroundEvaluator(model, bound, "average", hx, hy, torch.nn.functional.cross_entropy), bound


def test_a_submission_after_wait_is_taken_so_the_score_due_with_the_initial_one_is_not_skipped():
    """The trainer scores the initial model and then at once the joint model due now (the holdout arrived): it
    waits for the first, or the second would be skipped as busy and scored a whole cycle later."""
    ev, bound = _evaluator()
    joints = [bound.read(s) for s in range(2)]
    assert ev.submit(joints, -1, 0.0, {})
    ev.wait()
    assert ev.submit(joints, 0, 1.5, {})  # not busy any more
    ev.close()
    rows = ev.drain()
    assert [(r["cycle"], r["wall_s"]) for r in rows] == [(0, 0.0), (1, 1.5)]
    assert rows[0]["holdout_error"] == rows[1]["holdout_error"]  # the same weights scored twice


def test_a_submission_while_one_is_scored_is_skipped():
    ev, bound = _evaluator()
    joints = [bound.read(s) for s in range(2)]
    assert ev.submit(joints, -1, 0.0, {})
    assert not ev.submit(joints, 0, 1.0, {})  # busy: skipped rather than stalling the pipeline
    ev.close()
    assert [r["cycle"] for r in ev.drain()] == [0]
