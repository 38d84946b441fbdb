"""``mpca simulate``: one simulation from command-line options; prints the constants and a table, writes JSON."""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Dict, List, Optional

from pydantic import ValidationError

from mpca.errors import UserError
from mpca.exchange.device import ComputeModel
from mpca.sim.constants import NetworkConstants
from mpca.sim.presence import Absence
from mpca.spellings import parse_device_speed, refuse_renamed

if TYPE_CHECKING:
    from mpca.sim.simulator import SimConfig

RATES = {"mbit": 1e6, "gbit": 1e9, "kbit": 1e3}


def parse_rate(text: str, command: str = "simulate") -> float:
    """``100mbit``, ``1gbit``, ``inf`` or bits per second (a bad one: a UserError naming ``command``)."""
    t = text.strip().lower()
    if t in ("inf", "unlimited"):
        return math.inf
    try:
        for unit, scale in RATES.items():
            if t.endswith(unit):
                return float(t[: -len(unit)]) * scale
        return float(t)
    except ValueError:
        raise UserError(f"{command}: --link {text!r}: give a rate such as 100mbit, 1gbit, 10gbit or inf") from None


def parse_floats(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_overrides(items: List[str]) -> Dict[str, object]:
    """``algorithm.every=20`` → {"every": 20} (values read as YAML scalars)."""
    import yaml

    out: Dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("algorithm."):
            raise UserError(f"override {item!r}: expected algorithm.KEY=VALUE")
        node = out
        parts = key.split(".")[1:]
        for p in parts[:-1]:
            node = node.setdefault(p, {})  # type: ignore[assignment]
        node[parts[-1]] = yaml.safe_load(value)
    return out


def add_exchange_cpu_arguments(p: argparse.ArgumentParser) -> None:
    """The exchange's CPU (mpca.sim.constants), for ``mpca simulate`` and ``mpca plan``."""
    p.add_argument("--exchange-cpu", type=float, default=0.0, metavar="S_PER_MB",
                   help="CPU seconds per MB an agent moves in an exchange (default 0: no CPU modelled; 0.06 was "
                        "measured on a 2-core machine, see mpca.sim.constants)")
    p.add_argument("--host-cores", type=int, default=None, metavar="N",
                   help="every host's exchange shares N cores (an emulated cluster on one machine; default: "
                        "each host its own)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", "-a", default="mpca", help="algorithm name (mpca, sync, diloco, easgd, ...)")
    p.add_argument("--agents", "-k", type=int, default=4)
    p.add_argument("--link", default="100mbit", help="every host's port: 100mbit, 1gbit, 10gbit, inf")
    p.add_argument("--device-step-s", type=float, default=0.3, metavar="SECONDS",
                   help="T: every agent's step takes this device time (training.device_step_s)")
    p.add_argument("--jitter", type=float, default=0.0, help="log-normal σ of the step time (0: fixed)")
    p.add_argument("--device-speed", default="", metavar="AGENT:SPEED,...",
                   help="stragglers, e.g. 1:0.5: agent 1's steps take T / 0.5 (training.device_speed)")
    refuse_renamed(p, "--step-s", "--speeds")
    p.add_argument("--wire", default=None, help="fp32, bf16, int8 or int4 (default: the algorithm's: int8 for mpca, "
                   "int4 for streaming_diloco, fp32 otherwise)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="virtual seconds at most")
    p.add_argument("--max-cycles", type=int, default=None, metavar="N",
                   help="stop.max_cycles: end after N exchange cycles (the joint model then takes every reduction)")
    p.add_argument("--lock-step", type=int, default=None, metavar="STEPS",
                   help="training.lock_step: each agent takes exactly STEPS steps per cycle (a reproducible run)")
    p.add_argument("--reduce", choices=["tree", "ordered"], default="tree",
                   help="cluster.reduce: tree (treeReduce's levels) or ordered (the partials added in agent order)")
    p.add_argument("--eval-every", type=float, default=5.0, help="virtual seconds between evaluations")
    p.add_argument("--targets", default="0.5,0.4", help="holdout errors, comma-separated")
    p.add_argument("--hidden", default="1024,1024", help="the MLP's hidden widths (1024,1024: the benchmark's)")
    p.add_argument("--rows", type=int, default=20_000, help="teacher rows per agent")
    p.add_argument("--holdout", type=int, default=2_000, help="holdout rows (after the agents' rows)")
    p.add_argument("--holdout-split", type=int, default=None, metavar="ROWS",
                   help="evaluate on the runtime's holdout instead: the rows of the task's first ROWS that the "
                        "trainer's hash split (data.holdout 1%%, seed 0) holds out, which the agents never train on "
                        "(1000000 with --task-seed 0: the holdout of bench compare's task)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--job-overhead", type=float, default=None, help="seconds per Spark job (default: the constant)")
    add_exchange_cpu_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="the run's seed: initial model, batch order, step jitter")
    p.add_argument("--hang", action="append", default=[], metavar="AGENT:AT:FOR",
                   help="agent AGENT's process stops AT virtual seconds into the run for FOR seconds, then resumes "
                        "(repeatable)")
    p.add_argument("--lose", action="append", default=[], metavar="AGENT:AT:FOR",
                   help="agent AGENT's process is lost AT seconds into the run; its replacement is up FOR seconds "
                        "later and joins from the joint model (repeatable)")
    p.add_argument("--agent-wait", type=float, default=None,
                   help="seconds a cycle waits for a silent agent (cluster.agent_wait_s; default: 5 x the median "
                        "recent cycle within 2-10 s)")
    p.add_argument("--startup", type=float, default=0.0, metavar="SECONDS",
                   help="the runtime's start-up: nothing steps or exchanges before SECONDS, and times count from "
                        "fit's start (bench compare prints the measured start-up; default 0)")
    p.add_argument("--agent-starts", default="", metavar="S0,S1,...",
                   help="each agent's own start, seconds on fit's clock, each at most --startup (bench compare "
                        "keeps every run's as agent_starts_s in run.json): the runtime's agents step from the "
                        "moment each is built, out of phase by their spread; default: all at --startup")
    p.add_argument("--task-seed", type=int, default=None,
                   help="the teacher task's seed (default: --seed; 0 is the benchmark's task, conf/teacher_mlp.yaml): "
                        "keep it fixed and vary --seed to see one task's run-to-run spread")
    p.add_argument("--json", default=None, help="write the result here as JSON")
    p.add_argument("overrides", nargs="*", help="algorithm.KEY=VALUE, e.g. algorithm.every=20")


def config_from(args) -> SimConfig:
    """A validated :class:`SimConfig`; every mistake as one UserError line."""
    from mpca.sim.simulator import SimConfig  # torch: imported when a simulation runs, not when the parser is built
    from mpca.sim.workload import TeacherWorkload

    try:
        net = NetworkConstants(link_bps=parse_rate(args.link), exchange_cpu_s_per_mb=args.exchange_cpu,
                               host_cores=args.host_cores)
        if args.job_overhead is not None:
            net = NetworkConstants(**{**net.to_dict(), "job_overhead_s": args.job_overhead})
        hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
        return SimConfig(algorithm={"name": args.algorithm, **parse_overrides(args.overrides)}, agents=args.agents,
                         wire=args.wire, network=net,
                         compute=ComputeModel(step_s=args.device_step_s, jitter=args.jitter,
                                              speeds=parse_device_speed(args.device_speed),
                                              seed=args.seed),
                         workload=TeacherWorkload(hidden=hidden, rows_per_agent=args.rows, holdout=args.holdout, lr=args.lr,
                                                   seed=args.seed if args.task_seed is None else args.task_seed,
                                                   split_rows=args.holdout_split),
                         batch_size=args.batch_size, max_virtual_s=args.max_seconds, eval_every_s=args.eval_every,
                         targets=tuple(parse_floats(args.targets)), seed=args.seed,
                         absences=tuple([Absence.parse(h, "hang") for h in args.hang] +
                                        [Absence.parse(x, "lost") for x in args.lose]),
                         agent_wait_s=args.agent_wait, startup_s=args.startup,
                         agent_starts_s=tuple(parse_floats(args.agent_starts)), lock_step=args.lock_step,
                         reduce=args.reduce, max_cycles=args.max_cycles)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "settings"
        raise UserError(f"simulate: {where}: {first['msg']}") from None
    except ValueError as e:
        raise UserError(f"simulate: {str(e).splitlines()[0]}") from None


def run(args) -> int:
    from mpca.sim.simulator import simulate

    cfg = config_from(args)
    try:
        result = simulate(cfg)
    except ValueError as e:
        raise UserError(f"simulate: {str(e).splitlines()[0]}") from None
    print(f"constants: {cfg.network.describe()}")
    print(f"compute: step {cfg.compute.step_s:g} s, jitter {cfg.compute.jitter:g}, speeds {dict(cfg.compute.speeds)}; "
          f"model {result.settings['parameters']:,} parameters, batch {cfg.batch_size}")
    print(result.table())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(result.to_json())
        print(f"wrote {args.json}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="mpca simulate")
    add_arguments(p)
    return run(p.parse_args(argv))
