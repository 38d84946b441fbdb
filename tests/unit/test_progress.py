import io
import logging

from mpca.progress import Progress


def test_bar_mode_rewrites_one_line():
    out = io.StringIO()
    p = Progress("bar", target=0.05, stream=out)
    p.update(1, 0.5, 1000.0)
    p.update(2, 0.3, 1200.0)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and "cycle 2" in text and "30.00%" in text and "1,200 samples/s" in text


def test_log_mode_when_not_a_terminal(caplog):
    out = io.StringIO()  # not a tty
    p = Progress("auto", stream=out)
    assert p.mode == "log"
    with caplog.at_level(logging.INFO, logger="mpca.progress"):
        p.update(3, 0.2, 10.0)
    assert "holdout error 20.00%" in caplog.text and out.getvalue() == ""


def test_time_to_target_from_rate_of_improvement():
    p = Progress("off", target=0.1)
    p._errors = [(0.0, 0.5), (10.0, 0.3)]  # 0.02 per second → 10 s more to reach 0.1
    assert abs(p.eta_to_target() - 10.0) < 1e-9
    p._errors.append((20.0, 0.6))  # worse than the window's start: no estimate
    assert p.eta_to_target() is None


def test_summary_files_are_strict_json(tmp_path):
    import json
    import math

    from mpca.report import write_json

    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    path = write_json(str(tmp_path / "summary.json"), {"error": math.nan, "t": {0.1: math.inf}, "ok": [1.5, -math.inf]})
    data = json.loads(open(path).read(), parse_constant=refuse)
    assert data == {"error": None, "t": {"0.1": None}, "ok": [1.5, None]}
    assert not list(tmp_path.glob("*.tmp"))


def test_auto_in_a_notebook_kernel_updates_one_output_line(monkeypatch):
    """A Jupyter/Databricks kernel: stderr is no terminal and INFO logs are hidden, so progress goes to one
    output line of the cell, updated in place (IPython's display handle)."""
    import sys
    import types

    class ZMQInteractiveShell:  # the kernel's shell class, by name
        pass

    shown = []

    class Handle:
        def update(self, obj):
            shown.append(("update", obj))

    def display(obj, display_id=False):
        shown.append(("display", obj))
        return Handle()

    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))
    monkeypatch.setitem(sys.modules, "IPython.display", types.SimpleNamespace(display=display))
    p = Progress("auto", target=0.05, stream=io.StringIO())
    assert p.mode == "notebook"
    p.update(1, 0.5, 100.0)
    p.update(2, 0.2, 100.0)
    assert [k for k, _ in shown] == ["display", "update"] and "cycle 2" in shown[-1][1]


class _Report:
    def __init__(self, samples):
        self.samples = samples


def test_sample_rate_from_the_first_cycle_over_a_window():
    from mpca.evaluation import SampleRate

    rate = SampleRate(window_s=2.0)
    assert rate.observe({0: _Report(100), 1: _Report(None)}, now=10.0) == {}  # the agents' counts at start
    assert rate.observe({0: _Report(400)}, now=11.0) == {0: 300.0}  # the first cycle already has a rate
    assert rate.observe({0: _Report(600)}, now=12.0) == {0: 250.0}  # (600 - 100) / 2 s
    assert rate.observe({0: _Report(1000)}, now=13.0) == {0: 300.0}  # 10.0 dropped: (1000 - 400) / 2 s
    assert rate.observe({0: _Report(50)}, now=14.0) == {}  # a replacement agent counts from 0 again
    assert rate.observe({0: _Report(150)}, now=14.5) == {0: 200.0}


def test_early_evaluations_after_cycles_1_2_4_8_then_every_nth():
    from types import SimpleNamespace

    from mpca.config import Settings
    from mpca.trainer import Trainer

    t = SimpleNamespace(settings=Settings.model_validate({"eval": {"every_cycles": 10}}))
    due = [c + 1 for c in range(35) if Trainer._eval_due(t, c, last_eval=float("inf"))]
    assert due == [1, 2, 4, 8, 10, 20, 30]
    t = SimpleNamespace(settings=Settings.model_validate({"eval": {"every_cycles": 1}}))
    assert [c + 1 for c in range(4) if Trainer._eval_due(t, c, last_eval=float("inf"))] == [1, 2, 3, 4]


def test_membership_shows_in_the_line_and_a_change_is_logged_at_once(caplog):
    p = Progress("log", log_every_s=3600)
    with caplog.at_level(logging.INFO, logger="mpca.progress"):
        p.update(1, 0.5, 10.0, agents=(2, 2))  # an evaluation: logged
        p.update(2, None, 10.0, agents=(2, 2))  # nothing new: not logged
        p.update(3, None, 10.0, agents=(1, 2))  # an agent gone: logged at once
        p.update(4, None, 10.0, agents=(1, 2))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "cycle 1 | agents 2/2 |" in lines[0] and "cycle 3 | agents 1/2 |" in lines[1], lines
