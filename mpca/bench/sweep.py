"""`mpca bench compare --agents 1,2,4,8`: one comparison per number of agents, then one table over K.

Each K runs the same command in its own cluster (``training.agents=K``; on local-cluster ``K`` executors of
the configured cores and memory; on the emulated network ``K`` worker hosts) and writes its own
``--out/K<k>/``.  ``sweep.csv`` then holds, per K and algorithm, the median time to each target, its
min–max over the repeats, the ratio to mpca's, whether the emulated devices held and whether the repeats
disagreed: the K at which an algorithm stops scaling, or this machine stops holding the emulation, is in
one place.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, List

from mpca.local_cluster import LocalCluster, parse_local_cluster


def per_k_argv(argv: List[str], k: int, out: str) -> List[str]:
    """The command for one K: without ``--agents``, its own ``--out``, and K agents (and executors)."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--agents", "--out"):
            skip = True
            continue
        if a.startswith(("--agents=", "--out=")):
            continue
        rest.append(a)
    master = next((a.split("=", 1)[1] for a in rest if a.startswith("cluster.master=")), None)
    rest = [a for a in rest if not a.startswith(("training.agents=", "cluster.master="))]
    given = parse_local_cluster(master)
    local = LocalCluster(k, given.cores, given.memory_mb) if given else LocalCluster(k, 2, 1024)
    return rest + ["--out", os.path.join(out, f"K{k}"), f"training.agents={k}", f"cluster.master={local.master}"]


def sweep_table(out: str, ks: List[int]):
    """One row per K and algorithm from each ``--out/K<k>/compare.json``."""
    import pandas as pd

    rows = []
    for k in ks:
        path = os.path.join(out, f"K{k}", "compare.json")
        if not os.path.exists(path):
            continue
        js = json.load(open(path))
        ref = js["algorithms"].get("mpca", {}).get("time_to", {})
        for label, r in js["algorithms"].items():
            row = {"K": k, "algorithm": label, "setting": r.get("setting") or ""}
            for t in js["targets"]:
                key = str(t)
                v = _num(r["time_to"].get(key))
                lo, hi = (_num(x) for x in (r.get("time_range", {}).get(key) or [None, None]))
                row[f"t({100 * t:g}%) s"] = v
                row[f"t({100 * t:g}%) min-max"] = "" if math.isnan(lo) else f"{lo:.3g}-{hi:.3g}"
                base = _num(ref.get(key))
                row[f"t({100 * t:g}%)/mpca"] = v / base if base and not math.isnan(base) else math.nan
            checks = [c for c in r.get("emulation") or [] if c.get("holds") is not None]
            row["emulated devices"] = "" if not checks else ("ok" if all(c["holds"] for c in checks) else "INVALID")
            row["repeats differ"] = "; ".join(r.get("spread") or [])
            row["comm/comp"] = _num(js.get("comm_comp_ratio"))
            rows.append(row)
    return pd.DataFrame(rows)


def run_sweep(main: Callable[[List[str]], int], argv: List[str], ks: List[int], out: str) -> int:
    """Run ``main`` once per K, then write and print ``sweep.csv``; the first failing K's exit status."""
    import pandas as pd

    status = 0
    for k in ks:
        print(f"=== K = {k} agent(s) ===", flush=True)
        rc = main(per_k_argv(argv, k, out))
        status = status or rc
    tab = sweep_table(out, ks)
    os.makedirs(out, exist_ok=True)
    tab.to_csv(os.path.join(out, "sweep.csv"), index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.float_format", "{:.3g}".format):
        print(f"\ntime to accuracy over K ({', '.join(map(str, ks))} agents):")
        print(tab.to_string(index=False))
    print(f"\nwrote {out}/sweep.csv", flush=True)
    return status


def _num(v) -> float:
    return math.nan if v is None else float(v)
