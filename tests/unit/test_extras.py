"""Plotting and the demo data are extras: without them mpca still trains, says what to install, and the
declared requirements are ranges, not pins."""
import configparser
import os
import sys

import pandas as pd
import pytest

from mpca.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_without_matplotlib_no_plot_and_no_error(monkeypatch, tmp_path):
    from mpca import report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    h = pd.DataFrame({"wall_s": [1.0, 2.0], "holdout_error": [0.5, 0.2]})
    assert report.plot_history(h, str(tmp_path / "h.png")) is None
    assert not (tmp_path / "h.png").exists()
    assert "-" in report.summary_table([("plot", None)])


def test_without_scikit_learn_the_digits_say_which_extra(monkeypatch):
    from mpca.data import datasets

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(UserError, match=r"mpca\[demo\]"):
        datasets.load_digits()


def test_requirements_are_ranges_and_the_pins_live_in_constraints():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    reqs = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip() and not r.strip().startswith("#")]
    assert not [r for r in reqs if "==" in r], reqs
    names = {r.split(">")[0].split("<")[0].split("=")[0].lower() for r in reqs}
    assert {"pyspark", "torch"} <= names and not names & {"matplotlib", "scikit-learn"}
    extras = cfg["options.extras_require"]
    assert "matplotlib" in extras["plot"] and "scikit-learn" in extras["demo"]
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        pins = {line.split("==")[0].lower() for line in f if "==" in line}
    assert {"pyspark", "torch"} <= pins
