"""Results as data: the tables of the results pages generated from JSON files (an MkDocs hook: ``hooks:`` in
mkdocs.yml).

Every benchmark or simulation table the docs quote is a file ``docs/results/<name>.json``; a page holds the line
``<!-- mpca:results-table <name> -->`` and the hook replaces it, at build time, with the table rendered from that
file.  The numbers in a file are derived from the measured data beside the pages (``mpca bench compare``'s
``compare.json``: every repeat's time to each target) wherever that data exists, or transcribed from the page
where it does not (and marked so).  ``python docs/hooks/results.py refresh`` re-derives the numbers of every
file from its measured data and rewrites the files; ``python docs/hooks/results.py check`` says what differs
(``tests/unit/test_docs.py`` runs the same check, validates every file against the schema below and checks that
every marker names an existing file).

The schema (``"schema": 1``)::

    {
      "schema": 1,
      "name": "rivals-k4",                 # the file's stem; the marker's argument
      "title": "...",                      # what the table shows
      "command": "..." | ["...", ...],     # the command(s) that measured it (required, non-empty)
      "commit": "51b64d1...",              # the commit of the code measured (required, 7-40 hex digits)
      "commit_note": "...",                # optional: how the commit was found
      "date": "2026-11-28",                # the day of the measurement (ISO)
      "machine": "...",                    # where it ran
      "page": "2026-11-28-rivals.md",      # the page the table is on (relative to docs/results/)
      "columns": [{"key": "regime", "label": "regime"}, ...],
      "rows": [{"regime": <cell>, ...}, ...],   # every row has every column's key
      "notes": "..."                       # optional
    }

A cell is text, a *figure*, or a list of them (joined without separators).  A figure is a dict:

* measured (``"from"``: a ``compare.json`` relative to ``docs/results/``)::

    {"from": "2026-11-28-rivals/k4-12c.json", "series": "mpca", "metric": "time_to:0.24",
     "repeats": "all" | [0, ...],           # which repeats (indices into the series' runs)
     "values": [...], "n": 3, "median": 22.93, "min": 21.99, "max": 24.22,   # derived (refresh)
     "format": "{median:.1f}", "missing": "not in 120 s"}

  ``metric``: ``time_to:<target>`` (seconds to a target, per repeat; a repeat that never reached it is null and
  the median is then null, as ``bench compare`` reports it), ``first_exchange_s`` (per repeat), or
  ``grid:<setting>:time_to:<target>`` or ``grid:<setting>:final_error`` (one run of the series' ``--tune`` grid,
  ``n`` = 1), or ``reported:<key>`` (a figure ``bench compare`` reports once per series, e.g. ``bytes``, ``cycles``,
  ``duty_cycle``: ``n`` = 1, no spread; ``"scale"`` multiplies it, e.g. 1e-6 for MB), or
  ``sim_time_to:<target>`` (``"from"`` an ``mpca simulate --json`` file, no ``series``: its virtual time to the
  target, one seed, ``n`` = 1), or ``sim:<figure>`` (the same file: ``steps``, ``virtual_s``, ``wall_s``,
  ``bytes_on_driver_port``, ``final_error``, ``mean_cycle_s``, ``cycle_count``, ``missed_cycles:<agent>`` or
  ``joined_at:<agent>``; ``"scale"`` as above), or ``row:<i>:<field>`` (``"from"`` a lab script's ``--json`` file
  of ``"rows"``, e.g. ``python -m lab.seeds_sim``: that field of row ``i``), or ``campaign:<figure>`` (``"from"`` a ``python -m lab.campaign --json`` file, no
  ``series``, ``n`` = 1; ``"scale"`` as above): ``injected``, ``recovered`` or ``scheduled`` (every kind, or
  ``…:<kind>``), ``median_s:<kind>``, ``max_s:<kind>``, ``median_after_s:<kind>``,
  ``median_cycles_after_up:<kind>``, ``median_cycles_after_agent_up:<kind>`` (the campaign's summary), ``final_error``, ``reference_final_error``,
  ``restarts`` (driver incarnations − 1), ``peak:<process>:<figure>`` and ``q4_over_q2:<process>:<figure>`` (its
  resource table: the last quarter's median over the second's), ``at:<t>:<process>:<figure>`` (its first resource
  sample at or after ``t`` s: ``driver`` or ``driver_jvm`` with ``rss_mb``, ``fds`` or ``threads``, or
  ``checkpoint:entries``), or ``connect:<mode>:<field>`` (``"from"`` a
  ``python -m lab.connect_overhead --json`` file, no ``series``: ``field`` of every repeat of ``mode``, ``classic``
  or ``connect``, e.g. ``to_target_s``, ``to_first_exchange_s``, ``cycles_per_s``), or
  ``scaling:<link>:<algorithm>:<K>`` (``"from"`` a ``python -m lab.scaling`` file, no ``series``, ``n`` = 1: that
  cell's simulated time to the file's target error at that link; null where it was not reached), or
  ``plan:<figure>`` (``"from"`` an ``mpca plan --json`` file, no ``series``, ``n`` = 1): ``time:<algorithm>:<K>``
  (that cell's predicted time to the target), ``steps:<algorithm>:<K>`` (its agent steps),
  ``setting:<algorithm>:<K>:<key>`` (a numeric setting it ran with, e.g. ``every``), ``proxy_time:<algorithm>:<K>`` (the proxy's time before the
  noise-scale correction), ``noise_scale`` (the job's B) or ``proxy_noise_scale`` (the proxy's), or
  ``history:<final|min>:<column>`` (``"from"`` a run's ``*.history.csv``, as ``bench compare`` keeps them, no
  ``series``, ``n`` = 1: the column's last or smallest value, e.g. ``holdout_error``; ``"scale"`` as above).  ``format`` is a Python
  format string over ``median``, ``min``, ``max``, ``n``, ``reached`` (the repeats that reached the target);
  ``missing`` (formatted the same way) is shown when the median is null;
* a ratio of two measured medians: ``{"ratio": [<figure>, <figure>], "value": 0.81, "format": "{value:.2f}"}``
  (an operand may itself be a ratio: a speed-up predicted over a speed-up measured);
* transcribed (``"transcribed"``: where on which page the figure was read; the numbers as printed there)::

    {"transcribed": "2026-11-28-rivals.md, session D", "median": 16.1, "min": 16.1, "max": 16.1, "n": 1,
     "format": "{median:.1f}"}

  where the page printed a median without its spread and the data was not kept, ``min`` and ``max`` are null
  (and ``n`` the repeats the page names, or null); a file of such figures says in ``notes`` what was lost;

The module imports nothing of MkDocs (``tests/unit/test_docs.py`` imports it by path, as it does reference.py).
"""
from __future__ import annotations

import csv
import io
import json
import math
import pathlib
import re
import statistics
import sys
from typing import Any, Dict, List, Optional

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"
MARKER = re.compile(r"^<!-- mpca:results-table ([A-Za-z0-9_.-]+) -->[ \t]*$", re.M)
REQUIRED = ("schema", "name", "title", "command", "commit", "date", "machine", "columns", "rows")
DERIVED = ("values", "n", "median", "min", "max")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def names() -> List[str]:
    """The stems of every results file (``docs/results/*.json``)."""
    return sorted(p.stem for p in RESULTS.glob("*.json"))


def load(name: str) -> Dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def markers(markdown: str) -> List[str]:
    """The results files a page's marker lines name."""
    return MARKER.findall(markdown)


# ---------------------------------------------------------------------------------------------------------------
# deriving the figures from the measured data

_SOURCES: Dict[str, Any] = {}


def _source(path: str) -> Any:
    """A data file beside the pages: JSON, or a CSV (a run's history) as a list of rows."""
    if path not in _SOURCES:
        text = (RESULTS / path).read_text(encoding="utf-8")
        _SOURCES[path] = list(csv.DictReader(io.StringIO(text))) if path.endswith(".csv") else json.loads(text)
    return _SOURCES[path]


def history_figure(rows: List[Dict[str, str]], figure: str) -> Optional[float]:
    """One figure of a run's history CSV (see ``history:`` above); empty cells are skipped."""
    what, column = figure.split(":")
    if what not in ("final", "min"):
        raise ValueError(f"unknown history figure {figure!r}")
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    if not values:
        return None
    return _finite(values[-1] if what == "final" else min(values))


def _median(values: List[Optional[float]]) -> Optional[float]:
    return None if not values or any(v is None for v in values) else statistics.median(values)


def _finite(value: Any) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def campaign_figure(doc: Dict[str, Any], figure: str) -> Optional[float]:
    """One figure of a fault campaign's JSON (``python -m lab.campaign --json``; see ``campaign:`` above)."""
    what, *args = figure.split(":")
    if what in ("final_error", "reference_final_error"):
        return _finite(doc.get(what))
    if what == "restarts":
        return doc["incarnations"] - 1
    if what in ("injected", "recovered", "scheduled"):
        return sum(r[what] for r in doc.get("summary", []) if not args or r["kind"] == args[0])
    if what in ("median_s", "max_s", "median_after_s", "median_cycles_after_up", "median_cycles_after_agent_up"):
        return next((_finite(r.get(what)) for r in doc.get("summary", []) if r["kind"] == args[0]), None)
    if what == "at":
        t, process, name = args
        sample = next((s for s in doc["samples"] if s["t"] >= float(t)), None)
        if sample is None:
            return None
        return sample["checkpoint_entries"] if process == "checkpoint" else _finite((sample[process] or {}).get(name))
    if what in ("peak", "q4_over_q2"):
        row = next((r for r in doc.get("resources", []) if [r["process"], r["figure"]] == args), None)
        if row is None:
            return None
        if what == "peak":
            return row["peak"]
        q2, q4 = _finite(row.get("q2")), _finite(row.get("q4"))
        return q4 / q2 if q2 and q4 is not None else None
    raise ValueError(f"unknown campaign figure {figure!r}")


def scaling_figure(doc: Dict[str, Any], figure: str) -> Optional[float]:
    """One cell of a K-scaling simulation's JSON (``python -m lab.scaling``; see ``scaling:`` above)."""
    link, algorithm, agents = figure.split(":")
    rows = [r for r in doc["links"][link]["rows"] if r["algorithm"] == algorithm and r["agents"] == int(agents)]
    if len(rows) != 1:
        raise ValueError(f"scaling figure {figure!r}: {len(rows)} cells, expected one")
    return _finite(rows[0]["time_s"])


def plan_figure(doc: Dict[str, Any], figure: str) -> Optional[float]:
    """One figure of an ``mpca plan --json`` file (see ``plan:`` above)."""
    what, *args = figure.split(":")
    if what in ("time", "steps", "setting"):
        rows = [r for r in doc["rows"] if [r["algorithm"], str(r["agents"])] == args[:2]]
        if len(rows) != 1:
            raise ValueError(f"plan figure {figure!r}: {len(rows)} cells, expected one")
        if what == "setting":
            return _finite(rows[0]["settings"].get(args[2]))
        return _finite(rows[0]["time_s" if what == "time" else "steps"])
    if what == "proxy_time":
        return _finite(doc["proxy_times"].get(f"{args[0]}@{args[1]}"))
    if what == "noise_scale":
        return _finite(doc["config"]["noise_scale"])
    if what == "proxy_noise_scale":
        return _finite(doc["proxy_noise"]["b_simple"])
    raise ValueError(f"unknown plan figure {figure!r}")


def sim_figure(doc: Dict[str, Any], figure: str) -> Optional[float]:
    """One figure of an ``mpca simulate --json`` file (see ``sim:`` above)."""
    what, *args = figure.split(":")
    if what == "missed_cycles":
        return doc["missed_cycles"].get(args[0], 0)
    if what == "joined_at":
        return next((t for a, t in doc["joins"] if a == int(args[0])), None)
    if what not in SIM_FIGURES:
        raise ValueError(f"unknown simulation figure {figure!r}")
    return _finite(doc[what])


SIM_FIGURES = ("steps", "virtual_s", "wall_s", "bytes_on_driver_port", "final_error", "mean_cycle_s", "cycle_count")
ONE_FIGURE = ("sim_time_to:", "sim:", "campaign:", "scaling:", "row:", "plan:", "history:")  # metrics of one figure, from no series


def derive(figure: Dict[str, Any]) -> Dict[str, Any]:
    """The derived fields (values, n, median, min, max) of a measured figure, from its ``compare.json``."""
    metric = figure["metric"]
    if metric.startswith(ONE_FIGURE):  # a simulation's, a campaign's or a lab script's row: one figure
        source, what = _source(figure["from"]), metric.split(":", 1)[1]
        if metric.startswith("campaign:"):
            value = campaign_figure(source, what)
        elif metric.startswith("scaling:"):
            value = scaling_figure(source, what)
        elif metric.startswith("sim:"):
            value = sim_figure(source, what)
        elif metric.startswith("plan:"):
            value = plan_figure(source, what)
        elif metric.startswith("history:"):
            value = history_figure(source, what)
        elif metric.startswith("row:"):
            index, field = what.split(":", 1)
            value = _finite(source["rows"][int(index)][field])
        else:
            value = source["time_to_target"].get(what)
        value = value * figure.get("scale", 1) if value is not None else None
        return {"values": [value], "n": 1, "median": value, "min": value, "max": value}
    if metric.startswith("connect:"):  # lab.connect_overhead: one value per repeat of each mode
        _, mode, field = metric.split(":")
        return _spread([run.get(field) for run in _source(figure["from"])["runs"][mode]])
    series = _source(figure["from"])["algorithms"][figure["series"]]
    if metric.startswith("reported:") or metric.startswith("grid:"):
        value = series[metric.split(":", 1)[1]] if metric.startswith("reported:") else grid_figure(series, metric)
        value = value * figure.get("scale", 1) if value is not None else None
        return {"values": [value], "n": 1, "median": value, "min": value, "max": value}
    runs = series["runs"]
    picked = range(len(runs)) if figure.get("repeats", "all") == "all" else figure["repeats"]
    if metric.startswith("time_to:"):
        target = metric.split(":", 1)[1]
        values = [runs[i]["time_to"].get(target) for i in picked]
    elif metric == "first_exchange_s":
        values = [runs[i]["first_exchange_s"] for i in picked]
    else:
        raise ValueError(f"unknown metric {metric!r}")
    return _spread(values)


def grid_figure(series: Dict[str, Any], metric: str) -> Optional[float]:
    """``grid:<setting>:time_to:<target>`` or ``grid:<setting>:final_error``: that setting's one run in the
    series' ``--tune`` grid (compare.json's ``grid``; a target it never reached: None)."""
    rest = metric.split(":", 1)[1]
    if ":time_to:" in rest:
        setting, target = rest.rsplit(":time_to:", 1)
    elif rest.endswith(":final_error"):
        setting, target = rest[:-len(":final_error")], None
    else:
        raise ValueError(f"unknown metric {metric!r}: grid:<setting>:time_to:<target> or grid:<setting>:final_error")
    point = next((p for p in series.get("grid", []) if p["setting"] == setting), None)
    if point is None:
        raise ValueError(f"{metric!r}: the series' grid has no setting {setting!r}")
    return _finite(point["time_to"].get(target) if target is not None else point["final_error"])


def _spread(values: List[Optional[float]]) -> Dict[str, Any]:
    """The derived fields of per-repeat values (None: a repeat that never reached its target)."""
    reached = [v for v in values if v is not None]
    return {"values": values, "n": len(values), "median": _median(values),
            "min": min(reached) if reached else None, "max": max(reached) if reached else None}


def _figures(cell: Any):
    """Every figure of a cell (ratios' operands included, at any depth), outermost first."""
    for part in (cell if isinstance(cell, list) else [cell]):
        if isinstance(part, dict):
            yield part
            yield from _figures(part.get("ratio", []))


def _value(figure: Dict[str, Any]) -> Optional[float]:
    """A figure's median (derived already: :func:`refresh`), or a ratio's value from its operands'."""
    if "ratio" in figure:
        a, b = (_value(f) for f in figure["ratio"])
        return a / b if a is not None and b else None
    return figure["median"]


def refresh(doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` with every measured figure's derived fields (and every ratio's value) recomputed from its data."""
    doc = json.loads(json.dumps(doc))
    for row in doc["rows"]:
        for cell in row.values():
            for figure in _figures(cell):
                if "from" in figure:
                    figure.update(derive(figure))
            for figure in _figures(cell):
                if "ratio" in figure:
                    figure["value"] = _value(figure)
    return doc


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def stale(doc: Dict[str, Any]) -> List[str]:
    """Where a file's numbers differ from what its measured data gives (empty: they agree)."""
    fresh, out = refresh(doc), []
    for i, (old, new) in enumerate(zip(doc["rows"], fresh["rows"])):
        for key in old:
            for a, b in zip(_figures(old[key]), _figures(new[key])):
                for field in DERIVED + ("value",):
                    if field in b and not _close(a.get(field), b[field]):
                        out.append(f"{doc['name']}: row {i}, {key}: {field} {a.get(field)!r} != {b[field]!r}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the schema

def problems(doc: Dict[str, Any], name: Optional[str] = None) -> List[str]:
    """What makes ``doc`` invalid against the schema (empty: valid)."""
    out = [f"missing key {key!r}" for key in REQUIRED if key not in doc]
    if out:
        return out
    if doc["schema"] != 1:
        out.append(f"schema {doc['schema']!r}, expected 1")
    if name is not None and doc["name"] != name:
        out.append(f"name {doc['name']!r} is not the file's stem {name!r}")
    commands = doc["command"] if isinstance(doc["command"], list) else [doc["command"]]
    if not commands or not all(isinstance(c, str) and c.strip() for c in commands):
        out.append("command: a non-empty string or list of non-empty strings")
    if not isinstance(doc["commit"], str) or not COMMIT.match(doc["commit"]):
        out.append(f"commit {doc['commit']!r}: 7-40 lowercase hex digits")
    if not isinstance(doc["date"], str) or not DATE.match(doc["date"]):
        out.append(f"date {doc['date']!r}: YYYY-MM-DD")
    for key in ("title", "machine"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            out.append(f"{key}: a non-empty string")
    keys = [c.get("key") for c in doc["columns"]]
    if not keys or not all(isinstance(c, dict) and c.get("key") and "label" in c for c in doc["columns"]):
        out.append("columns: a non-empty list of {key, label}")
    if not doc["rows"]:
        out.append("rows: none")
    for i, row in enumerate(doc["rows"]):
        if set(row) != set(keys):
            out.append(f"row {i}: keys {sorted(row)} are not the columns' {sorted(keys)}")
        for key, cell in row.items():
            for figure in _figures(cell):
                out += [f"row {i}, {key}: {p}" for p in _figure_problems(figure)]
    return out


def _figure_problems(f: Dict[str, Any]) -> List[str]:
    kinds = [k for k in ("from", "ratio", "transcribed") if k in f]
    if len(kinds) != 1:
        return [f"a figure has exactly one of from / ratio / transcribed, not {kinds}"]
    if "ratio" in f:
        return [] if len(f["ratio"]) == 2 and "value" in f and "format" in f else ["ratio: two figures, value, format"]
    out = [f"missing {k!r}" for k in ("n", "median", "min", "max") if k not in f]
    if "from" in f:
        out += [f"missing {k!r}" for k in ("metric",) if k not in f]
        if "series" not in f and not str(f.get("metric")).startswith(ONE_FIGURE + ("connect:",)):
            out.append("missing 'series'")
        if "values" in f and f.get("n") != len(f["values"]):
            out.append("n is not the number of values")
    if out:
        return out
    if f["median"] is None:
        if "format" in f and "missing" not in f:
            out.append("a null median needs 'missing' (the text shown instead)")
    elif "transcribed" in f and f["min"] is None and f["max"] is None:
        pass  # a figure read off a page that printed no spread (and whose data was not kept)
    elif f["min"] is None or f["max"] is None or not f["min"] <= f["median"] <= f["max"]:
        out.append(f"median {f['median']!r} not within its spread {f['min']!r}–{f['max']!r}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# rendering

def _part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if "ratio" in part:
        return part.get("missing", "—") if part["value"] is None else part["format"].format(value=part["value"])
    reached = sum(v is not None for v in part.get("values", [part["median"]]))
    fields = dict(median=part["median"], min=part["min"], max=part["max"], n=part["n"], reached=reached)
    if part["median"] is None:
        return part["missing"].format(**fields)
    return part.get("format", "{median:.1f}").format(**fields)


def cell_text(cell: Any) -> str:
    return "".join(_part(p) for p in (cell if isinstance(cell, list) else [cell])).replace("|", "\\|")


def table(name: str) -> str:
    """The Markdown table of ``docs/results/<name>.json``."""
    doc = load(name)
    keys = [c["key"] for c in doc["columns"]]
    lines = ["| " + " | ".join(c["label"] for c in doc["columns"]) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell_text(row[k]) for k in keys) + " |" for row in doc["rows"]]
    return "\n".join(lines)


def render(markdown: str) -> str:
    """``markdown`` with every results marker line replaced by its table."""
    return MARKER.sub(lambda m: table(m.group(1)), markdown)


def on_page_markdown(markdown: str, page=None, config=None, files=None, **kwargs) -> str:
    return render(markdown)


def main(argv: List[str]) -> int:
    what = argv[0] if argv else "check"
    if what == "refresh":
        for name in names():
            path = RESULTS / f"{name}.json"
            path.write_text(json.dumps(refresh(load(name)), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return 0
    if what == "table":
        print(table(argv[1]))
        return 0
    bad = [f"{name}: {p}" for name in names() for p in problems(load(name), name)]
    bad += [p for name in names() for p in stale(load(name))]
    print("\n".join(bad) or f"{len(names())} results files valid, their numbers as their data give them")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
