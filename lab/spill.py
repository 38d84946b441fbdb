"""Training throughput with the agent's partition memory-mapped from local disk against in memory.

    python -m lab.spill [-c conf/digits.yaml] [--repeats 3] [--seconds 15] [key=value ...]

Runs one agent (``single``) on the same job, alternately with ``data.agent_memory_mb`` unset (in memory) and
0 (every partition spilled to local disk and memory-mapped), and prints the agent's samples/s — its own
counters: samples trained over the seconds it was alive, loading excluded — per run, the medians, and
their ratio.  The default
job is the digits MLP (64 inputs, hidden 256 and 128).
"""
from __future__ import annotations

import argparse
import statistics

DIGITS_MLP = ["model.name=mlp", "model.args={in_features: 64, hidden: [256, 128], num_classes: 10}",
              "data.input_shape=[64]"]


def _rate(fit) -> float:
    agent = fit.agents[0]
    return float(agent["samples"]) / float(agent["alive_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from mpca.config import load_config, settings_from
    from mpca.data.sources import job_dataframe
    from mpca.models import training_functions
    from mpca.runtime.cluster import session_for
    from mpca.trainer import Trainer

    cfg = load_config(args.config or ["conf/digits.yaml"], (DIGITS_MLP if not args.config else []) + args.overrides)
    spark, _ = session_for(cfg.cluster, cfg.run.name)
    rates = {"memory": [], "disk": []}
    try:
        df = job_dataframe(spark, cfg.data)
        for r in range(args.repeats):
            for mode, budget in (("memory", None), ("disk", 0.0)):
                settings = settings_from(cfg, cluster={**cfg.cluster.model_dump(), "master": "existing"},
                                         algorithm="single", agents=1, progress="off",
                                         data={**cfg.data.model_dump(), "agent_memory_mb": budget},
                                         stop={"max_seconds": args.seconds, "target_error": None},
                                         eval={"every_cycles": None, "every_seconds": 1.0},
                                         checkpoint={"dir": None, "init_from": None})
                fit = Trainer(*training_functions(cfg.model, cfg.optimizer), settings, spark=spark).fit(df)
                on_disk = [bool(a.get("data_on_disk")) for a in fit.agents]
                if on_disk != [mode == "disk"]:
                    raise RuntimeError(f"{mode} run: the agent reported data_on_disk={on_disk}")
                rates[mode].append(_rate(fit))
                print(f"repeat {r}: {mode:<6} {rates[mode][-1]:>10.0f} samples/s", flush=True)
    finally:
        spark.stop()
    mem, disk = statistics.median(rates["memory"]), statistics.median(rates["disk"])
    print(f"\nmedian samples/s: in memory {mem:.0f}, memory-mapped from disk {disk:.0f}; disk / memory = "
          f"{disk / mem:.3f} ({args.repeats} runs of {args.seconds:g}s each, alternating)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
