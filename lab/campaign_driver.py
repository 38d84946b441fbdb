"""One incarnation of a fault campaign's driver (:mod:`lab.campaign` starts it, kills it, starts it again).

    python -m lab.campaign_driver --dir DIR --incarnation N --deadline EPOCH [-c conf] [--algorithm A]
                                  [--no-announce] [overrides…]

It is the user's job as a driver process runs it: its own Spark application (``cluster.master`` of the
config, or the emulated cluster's standalone master when it runs on that cluster's driver host), ``Trainer.fit`` with ``checkpoint.resume`` on ``DIR/checkpoints`` (the first incarnation finds none
and starts fresh; a later one resumes from the newest valid checkpoint the killed one left), until the
campaign's ``--deadline`` (wall-clock seconds since the epoch), when it asks the trainer to stop.  What the
campaign reads back, all under ``DIR``:

* ``cycles.jsonl``: a line per exchange cycle, as it ends — the incarnation, the cycle, its submission and end
  (wall-clock), each contributing agent's weight τ, the Spark storage memory in use (:func:`storage_mb`) and,
  for a parameter-service algorithm, when each agent last called the service;
* ``inc-N/agents/``: where its agents announce their processes (:class:`lab.campaign.Announced`);
* ``inc-N/run.json`` (mode 0600): the run's channel secret, hex, and shard 0's size on the wire, for the
  campaign's broken messages (:mod:`lab.bad_frames`), which need a peer that holds the secret;
* ``final-N.json``: the final holdout error, the cycles and why it stopped, once it ends by itself.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time


def appended(path: str):
    """``path`` opened to append lines, on a new line: a killed incarnation's last line may have been cut."""
    f = open(path, "a", buffering=1)
    if f.tell() > 0:
        with open(path, "rb") as r:
            r.seek(-1, os.SEEK_END)
            if r.read(1) != b"\n":
                f.write("\n")
    return f


def storage_mb(sc) -> float:
    """The storage memory in use over every block manager of the application (the driver's and each executor's,
    as Spark's scheduler knows them), MB: Spark's broadcast blocks — a cycle's joint shard among them — and any
    cached blocks (mpca caches none), so broadcasts that are never released show as a rise."""
    used, it = 0, sc._jsc.sc().getExecutorMemoryStatus().values().iterator()
    while it.hasNext():
        most_and_left = it.next()
        used += most_and_left._1() - most_and_left._2()
    return used / 2 ** 20


def instrument(run_json: str, cycles, incarnation: int) -> None:
    """Lab only: after each :class:`~mpca.runtime.run.AgentRun` is built, write its secret and shard 0's wire
    size to ``run_json`` (0600; the campaign plays a peer that holds the secret); after each of its cycles, a
    line to ``cycles`` (the incarnation, the cycle, its submission and end, each contributing agent's τ, the
    storage memory in use and — parameter-service algorithms, whose agents contribute by calling the driver's
    service, not in cycles — when each agent last called)."""
    from mpca.runtime import run as run_module

    built, cycle = run_module.AgentRun.__init__, run_module.AgentRun.cycle

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        fd = os.open(run_json + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"run_id": self.run_id, "secret": self.spec.secret.hex(),
                       "shard0_bytes": self.codec.nbytes(self.layout.shard_numel(0))}, f)
        os.replace(run_json + ".tmp", run_json)

    def one_cycle(self, c: int):
        rec = cycle(self, c)
        cycles.write(json.dumps({"inc": incarnation, "cycle": c, "t_submit": rec.t_submit, "t_end": rec.t_end,
                                 "weight": {a: r.weight for a, r in rec.agents.items()},
                                 "storage_mb": round(storage_mb(self.side.sc), 3), "left": list(rec.left),
                                 **({"calls": dict(self.service.last_call)} if self.pipeline.exchange == "service"
                                    else {})}) + "\n")
        return rec

    run_module.AgentRun.__init__, run_module.AgentRun.cycle = init, one_cycle


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--incarnation", type=int, required=True)
    ap.add_argument("--deadline", type=float, required=True)
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--algorithm", default="mpca")
    ap.add_argument("--no-announce", action="store_true", help="the plain model (a run without faults)")
    ap.add_argument("--decommission", action="store_true", help="spark.decommission.enabled (the workers have it)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from lab.campaign import announced
    from mpca.config import load_config, settings_from
    from mpca.data.sources import job_dataframe
    from mpca.models import training_functions
    from mpca.bench.emulated_cluster import inside, session_in_cluster
    from mpca.runtime.cluster import session_for
    from mpca.trainer import Trainer

    # the algorithm's own subsection of the config applies (conf/digits.yaml has one per algorithm)
    cfg = load_config(args.config or ["conf/digits.yaml"], [f"algorithm.name={args.algorithm}"] + args.overrides)
    here = os.path.join(args.dir, f"inc-{args.incarnation}")
    agents_dir = os.path.join(here, "agents")
    os.makedirs(agents_dir, exist_ok=True)
    cycles = appended(os.path.join(args.dir, "cycles.jsonl"))
    instrument(os.path.join(here, "run.json"), cycles, args.incarnation)

    if inside():  # an emulated cluster's driver host (lab.campaign --link): its standalone master
        spark = session_in_cluster(cfg.run.name, {"spark.decommission.enabled": "true"} if args.decommission else None)
    else:
        spark, _ = session_for(cfg.cluster, cfg.run.name)
    try:
        model_fn, loss_fn, optimizer_fn = training_functions(cfg.model, cfg.optimizer)
        settings = settings_from(cfg, cluster={**cfg.cluster.model_dump(), "master": "existing"},
                                 stop={"max_seconds": 24 * 3600.0, "target_error": None, "max_cycles": None},
                                 progress="off", eval={"every_cycles": None, "every_seconds": 5.0},
                                 checkpoint={**cfg.checkpoint.model_dump(), "resume": True,
                                             "dir": os.path.join(args.dir, "checkpoints")})
        trainer = Trainer(model_fn if args.no_announce else announced(model_fn, agents_dir), loss_fn, optimizer_fn,
                          settings, spark=spark)
        timer = threading.Timer(max(0.0, args.deadline - time.time()), trainer.request_stop)
        timer.daemon = True
        timer.start()
        result = trainer.fit(job_dataframe(spark, cfg.data))
        timer.cancel()
        final = {"incarnation": args.incarnation, "final_error": result.final.error, "cycles": result.cycles,
                 "first_cycle": result.first_cycle, "stop_reason": result.stop_reason}
        with open(os.path.join(args.dir, f"final-{args.incarnation}.json"), "w") as f:
            json.dump(final, f)
    finally:
        cycles.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
