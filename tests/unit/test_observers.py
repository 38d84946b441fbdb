"""The Trainer's declared observers (mpca.observers): a RunObserver as it is, a function of a row wrapped, and an
object with hooks that is not a RunObserver refused in one line — not probed for its methods and half-called."""
from __future__ import annotations

import pytest

from mpca.errors import UserError
from mpca.observers import RunObserver, observer_of
from mpca.tracking import Trackers


class Recording(RunObserver):
    def __init__(self):
        self.heard = []

    def start(self, settings):
        self.heard.append(("start", settings))

    def __call__(self, row):
        self.heard.append(("row", row["cycle"]))

    def finish(self, result):
        self.heard.append(("finish", result))


def test_an_observer_hears_start_rows_and_finish_and_a_function_hears_rows():
    rec, rows = Recording(), []
    assert observer_of(rec) is rec
    fn = observer_of(rows.append)
    for o in (rec, fn):
        o.start("settings")
        o({"cycle": 3})
        o.finish(None)
    assert rec.heard == [("start", "settings"), ("row", 3), ("finish", None)]
    assert rows == [{"cycle": 3}]
    nobody = observer_of(None)
    nobody.start("s"), nobody({"cycle": 1}), nobody.finish(None)  # does nothing, fails nothing
    assert nobody.describe() == {}


class DuckTracker:
    def start(self, settings):
        pass

    def __call__(self, row):
        pass


@pytest.mark.parametrize("hook, says", [(DuckTracker(), "make it a subclass of mpca.RunObserver"),
                                        (42, "on_cycle must be a function of one history row")])
def test_a_hook_the_trainer_cannot_call_in_full_is_refused_in_one_line(hook, says):
    with pytest.raises(UserError, match=says):
        observer_of(hook)


def test_trackers_fan_every_hook_out():
    a, b, rows = Recording(), Recording(), []
    both = Trackers([a, None, b, rows.append])
    both.start("s")
    both({"cycle": 7})
    both.finish("result")
    both.take_input_example(None, None)
    both.log_outputs({})
    assert a.heard == b.heard == [("start", "s"), ("row", 7), ("finish", "result")] and rows == [{"cycle": 7}]


def test_the_trainer_refuses_a_bad_hook_before_any_run():
    import torch

    from mpca import Trainer

    with pytest.raises(UserError, match="subclass of mpca.RunObserver"):
        Trainer(lambda: torch.nn.Linear(2, 2), torch.nn.functional.cross_entropy,
                lambda p: torch.optim.SGD(p, lr=0.1), on_cycle=DuckTracker())
