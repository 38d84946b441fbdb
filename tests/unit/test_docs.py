"""The documentation against the code (no process, no Spark): every settings key has a description (the
configuration reference is generated from them), every error message listed in troubleshooting still exists
in the code, every Python example in the README and the docs is marked (run by
tests/integration/test_doc_examples.py, or needing what the tests lack) and compiles, every ``mpca`` command in
their shell blocks parses and its settings validate (:mod:`tests.doc_examples`), and the generated references
name every key, command and algorithm.  The site itself is built by ``make docs`` (strict)."""
import ast
import importlib.util
import pathlib
import re

import pytest

from tests.doc_examples import MARKDOWN, SHELL, blocks, mpca_commands, python_blocks, undated

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
ERROR_LINE = re.compile(r"^> error: `(.+)`\s*$")  # how troubleshooting.md lists a message; … = the user's value


def _reference():
    """docs/hooks/reference.py, the site's generator (outside the package), imported by path."""
    spec = importlib.util.spec_from_file_location("mpca_docs_reference", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_settings_key_has_a_description():
    missing = _reference().missing_descriptions()
    assert missing == [], (f"settings keys without a description (Field(..., description=...) in mpca/config.py; "
                           f"the configuration reference is generated from them): {missing}")


def test_the_configuration_reference_names_every_key():
    reference = _reference()
    text = reference.config_reference()
    keys = [key for key, _, section in reference.settings_keys() if not section]
    assert len(keys) > 50
    assert [k for k in keys if f"`{k}`" not in text] == []


def test_the_cli_and_algorithm_references_name_every_command_and_algorithm():
    reference = _reference()
    helps = reference.cli_help()
    assert {"mpca", "mpca train", "mpca predict", "mpca data", "mpca simulate", "mpca plan"} <= set(helps)
    assert all("usage: mpca" in text for text in helps.values())
    text = reference.algorithms_reference()
    from mpca.algorithm import registry

    assert [n for n in registry.names() if f"| `{n}` |" not in text] == []


def _literals():
    """Every string literal of the package, f-strings with each replacement field written as ``…``."""
    found = []
    for path in (ROOT / "mpca").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                found.append("".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values))
    return found


def documented_errors(text: str):
    return [m.group(1) for m in map(ERROR_LINE.match, text.splitlines()) if m]


def missing_errors(messages, literals):
    """The documented messages no string literal of the code matches (``…`` matches anything)."""
    gone = []
    for message in messages:
        pattern = re.compile(".*?".join(re.escape(part) for part in message.split("…")), re.S)
        if not any(pattern.search(s) for s in literals):
            gone.append(message)
    return gone


def test_every_error_in_troubleshooting_still_exists_in_the_code():
    messages = documented_errors(TROUBLESHOOTING.read_text(encoding="utf-8"))
    assert len(messages) >= 25, "troubleshooting.md lists its messages as lines: > error: `message`"
    for message in messages:
        assert len(message.replace("…", "").strip()) >= 12, f"too little of the message to check: {message!r}"
    assert missing_errors(messages, _literals()) == [], "documented in docs/troubleshooting.md, gone from mpca/"


def test_the_check_fails_for_a_message_that_is_gone():
    literals = ["cluster too small: … agent(s) need … each"]
    assert missing_errors(["cluster too small: … agent(s) need … each"], literals) == []
    assert missing_errors(["cluster is far too small"], literals) == ["cluster is far too small"]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_is_marked_and_compiles(path):
    """A block marked ``runs`` is run by tests/integration/test_doc_examples.py; one marked ``needs …`` says what
    it needs that the tests do not have."""
    for block in python_blocks(path):
        assert block.mark == "runs" or (block.mark or "").startswith("needs "), (
            f"{block.where}: mark the ```python block with <!-- example: runs --> or <!-- example: needs WHAT --> "
            f"on the line above it")
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as e:
            pytest.fail(f"{block.where}, the ```python block: {e}")


def command_problem(argv):
    """Why ``mpca <argv>`` would not start as the docs write it (its parser refuses it, or its configuration
    files and overrides do not validate), or None."""
    import contextlib
    import io

    from mpca.bench.compare import DEFAULT_CONFIG, build_parser as compare_parser
    from mpca.cli import build_parser
    from mpca.config import load_config
    from mpca.errors import UserError

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                if argv[:2] == ["bench", "compare"]:
                    args = compare_parser().parse_args(argv[2:])
                    configs = args.config or ([] if args.task else [DEFAULT_CONFIG])
                else:
                    args = build_parser().parse_args(argv)
                    configs = getattr(args, "config", None) if args.command in ("train", "predict") else None
            except SystemExit as e:
                return None if e.code == 0 else err.getvalue().strip().splitlines()[-1]
        if configs is not None and all((ROOT / c).is_file() for c in configs):  # a reader's own job.yaml: parsed only
            load_config([str(ROOT / c) for c in configs], args.overrides)
    except UserError as e:
        return str(e)
    return None


def test_the_command_check_refuses_an_old_option_an_unknown_key_and_a_bad_value():
    assert command_problem(["train", "-c", "conf/digits.yaml", "training.agents=2"]) is None
    assert command_problem(["--version"]) is None
    assert "--device-step-s" in command_problem(["bench", "compare", "--device-step", "0.3"])
    assert "unrecognized arguments" in command_problem(["simulate", "--no-such-option"])
    assert command_problem(["train", "-c", "conf/digits.yaml", "training.agentz=2"]) is not None
    assert command_problem(["bench", "compare", "training.agents=zero"]) is not None
    assert command_problem(["train", "-c", "job.yaml", "training.agents=2"]) is None  # the reader's file: parsed


@pytest.mark.parametrize("path", [p for p in MARKDOWN if undated(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_mpca_command_in_the_docs_parses_and_its_settings_validate(path):
    problems = [f"{block.where}: mpca {' '.join(argv)}: {problem}"
                for block in blocks(path) if block.lang in SHELL
                for argv in mpca_commands(block) if (problem := command_problem(argv)) is not None]
    assert problems == []


def test_the_readme_has_examples_and_stays_short():
    readme = ROOT / "README.md"
    assert len(python_blocks(readme)) >= 1
    lines = readme.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 320, "README.md stays short: the rest goes to docs/ (the site)"
    assert any("make test" in line for line in lines), "CI (.ci/run) runs the README's test command, make test"


# ---------------------------------------------------------------------------------------------------------------
# results as data: docs/results/<name>.json, the tables the results pages generate from them (docs/hooks/results.py)

def _results():
    spec = importlib.util.spec_from_file_location("mpca_docs_results", DOCS / "hooks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESULTS_FILES = sorted((DOCS / "results").glob("*.json"))


def test_there_are_results_files():
    assert len(RESULTS_FILES) >= 1, "the figures the docs quote live as docs/results/<name>.json"


@pytest.mark.parametrize("path", RESULTS_FILES, ids=lambda p: p.name)
def test_every_results_file_validates_and_agrees_with_its_data(path):
    results = _results()
    doc = results.load(path.stem)
    assert results.problems(doc, path.stem) == [], f"{path.relative_to(ROOT)} against the schema (docs/hooks/results.py)"
    assert results.stale(doc) == [], (f"{path.relative_to(ROOT)}: numbers differ from the measured data they name "
                                      f"(python docs/hooks/results.py refresh re-derives them)")
    assert results.table(path.stem).count("\n") >= 2


@pytest.mark.parametrize("key", ["command", "commit", "date", "machine"])
def test_a_results_file_without_its_provenance_is_invalid(key):
    results = _results()
    doc = results.load("rivals-k4")
    assert results.problems(doc, "rivals-k4") == []
    broken = dict(doc)
    del broken[key]
    assert results.problems(broken, "rivals-k4") == [f"missing key {key!r}"]
    assert results.problems(dict(doc, **{key: ""}), "rivals-k4") != []
    assert results.problems(dict(doc, command=[]), "rivals-k4") != []


def test_a_median_outside_its_spread_is_invalid():
    results = _results()
    doc = results.load("rivals-k4")
    figure = doc["rows"][0]["mpca"][0]
    figure["median"] = figure["max"] + 1
    assert any("not within its spread" in p for p in results.problems(doc, "rivals-k4"))
    assert results.stale(doc) != []


def test_every_results_marker_names_an_existing_file():
    results = _results()
    named = {}
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for name in results.markers(path.read_text(encoding="utf-8")):
            named.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert named, "no page holds a <!-- mpca:results-table <name> --> marker"
    assert {n: p for n, p in named.items() if not (DOCS / "results" / f"{n}.json").is_file()} == {}
    assert results.markers("<!-- mpca:results-table no-such-table -->") == ["no-such-table"]


def test_the_headline_table_quoted_by_hand_is_the_generated_one():
    """README.md (GitHub renders no hook) and the pages that quote the headline table by hand quote it as generated."""
    table = _results().table("rivals-k4")
    quoting = [p for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
               if "| regime | mpca | Streaming DiLoCo (best period measured) |" in p.read_text(encoding="utf-8")]
    assert quoting, "README.md quotes the headline table"
    assert [str(p.relative_to(ROOT)) for p in quoting if table not in p.read_text(encoding="utf-8")] == []


def test_a_campaigns_figures_come_from_its_summary_and_resource_table():
    """campaign:<figure> (docs/hooks/results.py) against a hand-written campaign JSON."""
    results = _results()
    nan = float("nan")
    doc = {"incarnations": 8, "final_error": 0.0036, "reference_final_error": 0.0073,
           "summary": [{"kind": "kill", "scheduled": 30, "injected": 22, "recovered": 21, "median_s": 36.2,
                        "max_s": 90.0, "median_after_s": 36.2, "median_cycles_after_up": 1.5},
                       {"kind": "cut", "scheduled": 20, "injected": 11, "recovered": 11, "median_s": 60.0,
                        "max_s": 99.0, "median_after_s": 17.0, "median_cycles_after_up": nan}],
           "resources": [{"process": "driver", "figure": "rss_mb", "first": 1, "last": 2, "peak": 520.0, "q2": 500.0,
                          "q4": 510.0},
                         {"process": "spark blocks", "figure": "storage_mb", "first": 0, "last": 0, "peak": 1.0,
                          "q2": nan, "q4": 0.5}]}
    f = results.campaign_figure
    assert (f(doc, "injected"), f(doc, "recovered:cut"), f(doc, "scheduled:kill"), f(doc, "restarts")) == (33, 11, 30, 7)
    assert (f(doc, "median_s:kill"), f(doc, "median_after_s:cut"), f(doc, "median_cycles_after_up:kill")) == \
        (36.2, 17.0, 1.5)
    assert f(doc, "median_cycles_after_up:cut") is None and f(doc, "median_s:stop") is None  # NaN, or no such kind
    assert f(doc, "q4_over_q2:driver:rss_mb") == pytest.approx(1.02) and f(doc, "peak:driver:rss_mb") == 520.0
    assert f(doc, "q4_over_q2:spark blocks:storage_mb") is None and f(doc, "final_error") == 0.0036
    with pytest.raises(ValueError):
        f(doc, "no_such_figure")
    figure = {"from": "x.json", "metric": "campaign:final_error", "scale": 100, "n": 1, "median": 0.36,
              "min": 0.36, "max": 0.36, "format": "{median:.2f}%"}
    assert results.problems({**results.load("rivals-k4"), "rows": [{k: figure for k in
                                                                    [c["key"] for c in results.load("rivals-k4")["columns"]]}]},
                            "rivals-k4") == []  # a campaign figure needs no series


def test_a_scaling_figure_is_one_cell_of_a_k_scaling_simulation():
    """scaling:<link>:<algorithm>:<K> (docs/hooks/results.py) against a hand-written lab.scaling JSON: the cell's
    time to the target, null where it was not reached; a cell that is missing or twice there is an error."""
    results = _results()
    doc = {"links": {"1gbit": {"rows": [{"algorithm": "single", "agents": 1, "time_s": 41.7},
                                        {"algorithm": "mpca", "agents": 4, "time_s": 12.9},
                                        {"algorithm": "sync", "agents": 4, "time_s": None},
                                        {"algorithm": "ddp", "agents": 4, "time_s": 9.0},
                                        {"algorithm": "ddp", "agents": 4, "time_s": 9.5}]}}}
    f = results.scaling_figure
    assert (f(doc, "1gbit:single:1"), f(doc, "1gbit:mpca:4"), f(doc, "1gbit:sync:4")) == (41.7, 12.9, None)
    for bad in ("1gbit:mpca:8", "1gbit:ddp:4"):
        with pytest.raises(ValueError):
            f(doc, bad)
    results._SOURCES["scaling.json"] = doc
    speedup = {"ratio": [{"from": "scaling.json", "metric": "scaling:1gbit:single:1"},
                         {"from": "scaling.json", "metric": "scaling:1gbit:mpca:4"}], "value": None, "format": "{value:.2f}x"}
    assert results.refresh({"rows": [{"k": speedup}]})["rows"][0]["k"]["value"] == pytest.approx(41.7 / 12.9)


def test_a_connect_figure_is_the_spread_of_its_repeats():
    """connect:<mode>:<field> (docs/hooks/results.py) against a hand-written lab.connect_overhead JSON: the median
    of the repeats, null when one never reached the target, with the spread of those that did."""
    results = _results()
    results._SOURCES["overhead.json"] = {"runs": {
        "classic": [{"to_target_s": 3.0}, {"to_target_s": 1.0}, {"to_target_s": 2.5}],
        "connect": [{"to_target_s": 4.0}, {"to_target_s": None}, {"to_target_s": 1.5}]}}
    classic = results.derive({"from": "overhead.json", "metric": "connect:classic:to_target_s"})
    assert classic == {"values": [3.0, 1.0, 2.5], "n": 3, "median": 2.5, "min": 1.0, "max": 3.0}
    connect = results.derive({"from": "overhead.json", "metric": "connect:connect:to_target_s"})
    assert connect == {"values": [4.0, None, 1.5], "n": 3, "median": None, "min": 1.5, "max": 4.0}


def test_a_simulation_figure_and_a_lab_row_figure_read_their_json():
    """sim:<figure> against a hand-written ``mpca simulate --json`` file (mpca.sim.result's fields; an agent never
    away missed no cycle and has no join) and row:<i>:<field> against a lab script's rows; "scale" multiplies."""
    results = _results()
    results._SOURCES["sim.json"] = {"steps": 268, "virtual_s": 20.0, "wall_s": 0.6, "bytes_on_driver_port": 15202032,
                                    "final_error": 0.326, "mean_cycle_s": float("nan"), "cycle_count": 77,
                                    "missed_cycles": {"1": 10}, "joins": [[1, 20.3], [1, 31.0]]}
    results._SOURCES["rows.json"] = {"rows": [{"n": 1, "mean_staleness": 0.96}, {"n": 2, "mean_staleness": 1.93}]}

    def one(source, metric, **extra):
        return results.derive({"from": source, "metric": metric, **extra})["median"]

    assert (one("sim.json", "sim:steps"), one("sim.json", "sim:cycle_count"), one("sim.json", "sim:mean_cycle_s")) == \
        (268, 77, None)
    assert one("sim.json", "sim:bytes_on_driver_port", scale=1e-6) == pytest.approx(15.202032)
    assert (one("sim.json", "sim:missed_cycles:1"), one("sim.json", "sim:missed_cycles:2")) == (10, 0)
    assert (one("sim.json", "sim:joined_at:1"), one("sim.json", "sim:joined_at:2")) == (20.3, None)
    assert one("rows.json", "row:1:mean_staleness") == 1.93
    with pytest.raises(ValueError):
        one("sim.json", "sim:no_such_figure")
    figure = {"from": "sim.json", "metric": "sim:steps", "n": 1, "median": 268, "min": 268, "max": 268}
    columns = [c["key"] for c in results.load("rivals-k4")["columns"]]
    assert results.problems({**results.load("rivals-k4"), "rows": [{k: figure for k in columns}]}, "rivals-k4") == []


def test_a_transcribed_figure_may_lack_its_spread_and_a_measured_one_may_not():
    results = _results()
    columns = [c["key"] for c in results.load("rivals-k4")["columns"]]
    doc = results.load("rivals-k4")
    read = {"transcribed": "a page", "median": 12.7, "min": None, "max": None, "n": None, "format": "{median:.1f}"}
    assert results.problems({**doc, "rows": [{k: read for k in columns}]}, "rivals-k4") == []
    measured = {"from": "x.json", "metric": "sim:steps", "median": 12.7, "min": None, "max": None, "n": 1, "values": [1]}
    assert any("not within its spread" in p for p in
               results.problems({**doc, "rows": [{k: measured for k in columns}]}, "rivals-k4"))


def test_a_plan_figure_reads_a_cell_its_steps_and_settings_the_proxys_time_or_a_noise_scale():
    """plan:<figure> (docs/hooks/results.py) against a hand-written ``mpca plan --json`` file: a cell's predicted
    time (null where it was not reached), the proxy's uncorrected time and the two noise scales; a cell that is
    missing is an error. A ratio's operand may be a ratio: 84/21 predicted over 92/23 measured is exactly 1."""
    results = _results()
    doc = {"rows": [{"algorithm": "single", "agents": 1, "time_s": 84.0},
                    {"algorithm": "mpca", "agents": 2, "time_s": 21.0, "steps": 148.0, "settings": {"every": 215}},
                    {"algorithm": "mpca", "agents": 4, "time_s": None}],
           "proxy_times": {"single@1": 80.0, "mpca@2": 40.0}, "config": {"noise_scale": 186.3},
           "proxy_noise": {"b_simple": 658.7}}
    f = results.plan_figure
    assert (f(doc, "time:single:1"), f(doc, "time:mpca:2"), f(doc, "time:mpca:4")) == (84.0, 21.0, None)
    assert (f(doc, "proxy_time:mpca:2"), f(doc, "noise_scale"), f(doc, "proxy_noise_scale")) == (40.0, 186.3, 658.7)
    assert (f(doc, "steps:mpca:2"), f(doc, "setting:mpca:2:every"), f(doc, "setting:mpca:2:shards")) == (148.0, 215, None)
    for bad in ("time:mpca:8", "no_such_figure"):
        with pytest.raises(ValueError):
            f(doc, bad)
    results._SOURCES["plan.json"] = doc
    results._SOURCES["measured.json"] = {"algorithms": {
        "single": {"runs": [{"time_to": {"0.26": t}} for t in (90.0, 92.0, 95.0)]},
        "mpca": {"runs": [{"time_to": {"0.26": t}} for t in (23.0, 22.0, 30.0)]}}}

    def ratio(a, b):
        return {"ratio": [a, b], "value": None, "format": "{value:.2f}"}
    predicted = ratio({"from": "plan.json", "metric": "plan:time:single:1"}, {"from": "plan.json", "metric": "plan:time:mpca:2"})
    measured = ratio(*({"from": "measured.json", "series": s, "metric": "time_to:0.26"} for s in ("single", "mpca")))
    cell = results.refresh({"rows": [{"k": ratio(predicted, measured)}]})["rows"][0]["k"]
    assert cell["value"] == pytest.approx((84 / 21) / (92 / 23))
    assert cell["ratio"][0]["value"] == pytest.approx(4.0) and cell["ratio"][1]["value"] == pytest.approx(4.0)


def test_a_grid_figure_is_one_tuning_run_of_its_setting():
    """grid:<setting>:time_to:<target> and grid:<setting>:final_error against a hand-written series: the setting's
    own run (a target it missed, NaN in compare.json: null); a setting the grid lacks is an error."""
    results = _results()
    series = {"grid": [{"setting": "alpha.target=0.1", "time_to": {"0.24": 53.2}, "final_error": 0.239},
                       {"setting": "alpha.target=0.1,min_cycle_interval_s=3", "time_to": {"0.24": 39.6, "0.2": float("nan")},
                        "final_error": 0.237}]}
    f = results.grid_figure
    assert f(series, "grid:alpha.target=0.1:time_to:0.24") == 53.2
    assert f(series, "grid:alpha.target=0.1,min_cycle_interval_s=3:time_to:0.24") == 39.6
    assert f(series, "grid:alpha.target=0.1,min_cycle_interval_s=3:time_to:0.2") is None
    assert f(series, "grid:alpha.target=0.1:final_error") == 0.239
    for bad in ("grid:alpha.target=0.3:time_to:0.24", "grid:alpha.target=0.1:cycles"):
        with pytest.raises(ValueError):
            f(series, bad)


def test_a_campaign_figure_at_a_time_is_its_first_resource_sample_from_then():
    """campaign:at:<t>:<process>:<figure> against hand-written samples: the first sample at or after t; an agent's
    process that was not up then is null; a time past the last sample is null."""
    results = _results()
    doc = {"samples": [{"t": 2.0, "driver": {"rss_mb": 394.0}, "checkpoint_entries": 0, "agent0": None},
                       {"t": 10.1, "driver": {"rss_mb": 497.0}, "checkpoint_entries": 2, "agent0": None},
                       {"t": 12.1, "driver": {"rss_mb": 498.0}, "checkpoint_entries": 4, "agent0": {"rss_mb": 300.0}}]}
    f = results.campaign_figure
    assert (f(doc, "at:10:driver:rss_mb"), f(doc, "at:2:driver:rss_mb"), f(doc, "at:10.2:checkpoint:entries")) == \
        (497.0, 394.0, 4)
    assert (f(doc, "at:10:agent0:rss_mb"), f(doc, "at:12:agent0:rss_mb"), f(doc, "at:13:driver:rss_mb")) == \
        (None, 300.0, None)


def test_a_history_figure_is_a_columns_last_or_smallest_value():
    """history:<final|min>:<column> against a hand-written history CSV: empty cells are skipped; an unknown
    figure is an error; the CSV is read as rows."""
    results = _results()
    rows = [{"wall_s": "0.0", "holdout_error": "0.92"}, {"wall_s": "5.7", "holdout_error": "0.19"},
            {"wall_s": "9.0", "holdout_error": ""}, {"wall_s": "11.2", "holdout_error": "0.617"}]
    f = results.history_figure
    assert (f(rows, "final:holdout_error"), f(rows, "min:holdout_error")) == (0.617, 0.19)
    with pytest.raises(ValueError):
        f(rows, "median:holdout_error")
    source = "2026-11-28-workloads/resnet20-k4-first/mpca-r0.history.csv"
    assert results.derive({"from": source, "metric": "history:final:holdout_error", "scale": 100})["median"] == \
        pytest.approx(61.67664670658682)
