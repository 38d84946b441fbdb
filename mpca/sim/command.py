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
from mpca.sim.run_settings import by_option
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
            raise UserError(f"override {item!r}: expected algorithm.KEY=VALUE (with --config: any SECTION.KEY=VALUE "
                            "of the job)")
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


# Options that a run's settings spell (mpca.sim.run_settings: the setting, and the default without --config): with
# --config the job's YAML and its SECTION.KEY=VALUE overrides give them, as mpca train reads them — one spelling
RUN_OPTIONS = by_option()
# the teacher MLP's task (without --config): with --config the job's own model trains on a sample of its rows
TEACHER_OPTIONS = {"hidden": "1024,1024", "lr": 1e-3, "task_seed": None, "holdout_split": None}
# the simulator's own options whose default without --config differs from the one with it
OWN_DEFAULTS = {"targets": "0.5,0.4", "holdout": 2_000}


def _default(name: str):
    """An option's default without --config (its help text says it from here)."""
    return RUN_OPTIONS[name].default if name in RUN_OPTIONS else TEACHER_OPTIONS.get(name, OWN_DEFAULTS.get(name))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", action="append", default=[], metavar="YAML",
                   help="the job's YAML, as mpca train -c (repeatable, later files win): its algorithm, training, "
                        "wire, cluster, stop and seed settings, and its model trained on a sample of its rows "
                        "(--rows per agent, --holdout); SECTION.KEY=VALUE overrides after the options")
    p.add_argument("--algorithm", "-a", default=None, help="algorithm name (mpca, sync, diloco, easgd, ...; "
                   f"default {_default('algorithm')})")
    p.add_argument("--agents", "-k", type=int, default=None, help=f"training.agents (default {_default('agents')})")
    p.add_argument("--link", default="100mbit", help="every host's port: 100mbit, 1gbit, 10gbit, inf")
    p.add_argument("--device-step-s", type=float, default=None, metavar="SECONDS",
                   help="T: every agent's step takes this device time (emulation.device_step_s; "
                        f"default {_default('device_step_s')})")
    p.add_argument("--jitter", type=float, default=0.0, help="log-normal σ of the step time (0: fixed)")
    p.add_argument("--device-speed", default=None, metavar="AGENT:SPEED,...",
                   help="stragglers, e.g. 1:0.5: agent 1's steps take T / 0.5 (emulation.device_speed)")
    refuse_renamed(p, "--step-s", "--speeds")
    p.add_argument("--wire", default=None, help="fp32, bf16, int8 or int4 (default: the algorithm's: int8 for mpca, "
                   "int4 for streaming_diloco, fp32 otherwise)")
    p.add_argument("--max-seconds", type=float, default=None, help="virtual seconds at most (stop.max_seconds; "
                   f"default {_default('max_seconds'):g})")
    p.add_argument("--max-cycles", type=int, default=None, metavar="N",
                   help="stop.max_cycles: end after N exchange cycles (the joint model then takes every reduction)")
    p.add_argument("--lock-step", type=int, default=None, metavar="STEPS",
                   help="training.lock_step: each agent takes exactly STEPS steps per cycle (a reproducible run)")
    p.add_argument("--reduce", choices=["tree", "ordered"], default=None,
                   help="cluster.reduce: tree (treeReduce's levels) or ordered (the partials added in agent "
                        f"order); default {_default('reduce')}")
    p.add_argument("--eval-every", type=float, default=5.0, help="virtual seconds between evaluations")
    p.add_argument("--targets", default=None, help="holdout errors (or losses, eval.metric: loss), comma-separated "
                   f"(default: the job's stop target with --config, else {_default('targets')})")
    p.add_argument("--hidden", default=None, help="the teacher MLP's hidden widths (default "
                   f"{_default('hidden')}: the benchmark's)")
    p.add_argument("--rows", type=int, default=20_000, help="rows per agent (the teacher's, or a sample of the job's)")
    p.add_argument("--holdout", type=int, default=None, help="holdout rows (after the agents' rows; default "
                   f"{_default('holdout')}; "
                   "with --config: the job's own holdout where it has one, else its data.holdout share of the rows "
                   "read)")
    p.add_argument("--holdout-split", type=int, default=None, metavar="ROWS",
                   help="evaluate on the runtime's holdout instead: the rows of the task's first ROWS that the "
                        "trainer's hash split (data.holdout 1%%, seed 0) holds out, which the agents never train on "
                        "(1000000 with --task-seed 0: the holdout of bench compare's task)")
    p.add_argument("--lr", type=float, default=None, help=f"the teacher MLP's Adam learning rate (default {_default('lr'):g})")
    p.add_argument("--batch-size", type=int, default=None, help=f"training.batch_size (default {_default('batch_size')})")
    p.add_argument("--job-overhead", type=float, default=None, help="seconds per Spark job (default: the constant)")
    add_exchange_cpu_arguments(p)
    p.add_argument("--seed", type=int, default=None, help="the run's seed: initial model, batch order, step jitter "
                   f"(default {_default('seed')})")
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
    p.add_argument("overrides", nargs="*", help="algorithm.KEY=VALUE, e.g. algorithm.every=20 (with --config: any "
                   "SECTION.KEY=VALUE of the job, as mpca train takes them)")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(args, names) -> List[str]:
    return [n for n in names if getattr(args, n) is not None]


def config_from(args) -> SimConfig:
    """A validated :class:`SimConfig`; every mistake as one UserError line."""
    try:
        return _config_of_job(args) if args.config else _config_of_options(_with_defaults(args))
    except UserError:
        raise
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "settings"
        raise UserError(f"simulate: {where}: {first['msg']}") from None
    except ValueError as e:
        raise UserError(f"simulate: {str(e).splitlines()[0]}") from None


def _with_defaults(args):
    """Without ``--config``: the defaults of the options a job would spell."""
    for name in (*RUN_OPTIONS, *TEACHER_OPTIONS, *OWN_DEFAULTS):
        if getattr(args, name) is None:
            setattr(args, name, _default(name))
    return args


def _network(args) -> NetworkConstants:
    net = NetworkConstants(link_bps=parse_rate(args.link), exchange_cpu_s_per_mb=args.exchange_cpu,
                           host_cores=args.host_cores)
    if args.job_overhead is not None:
        net = NetworkConstants(**{**net.to_dict(), "job_overhead_s": args.job_overhead})
    return net


def _absences(args) -> tuple:
    return tuple([Absence.parse(h, "hang") for h in args.hang] + [Absence.parse(x, "lost") for x in args.lose])


def _config_of_job(args) -> SimConfig:
    """``--config``: the run's settings from the job's YAML and its overrides (:func:`mpca.config.load_config`, as
    ``mpca train`` reads them: :meth:`SimConfig.from_settings`), the job's model on a sample of its rows; the
    simulator's own options (link, jitter, absences, evaluation, start-up) from the command line."""
    from mpca.config import load_config
    from mpca.sim.simulator import SimConfig, unsimulated
    from mpca.sim.workload import job_workload

    twice = _given(args, RUN_OPTIONS)
    if twice:
        name = twice[0]
        raise UserError(f"simulate: {_option(name)} and --config: the job spells it {RUN_OPTIONS[name].setting}; "
                        f"give {RUN_OPTIONS[name].setting}=VALUE after the options instead")
    teacher = _given(args, TEACHER_OPTIONS)
    if teacher:
        raise UserError(f"simulate: {_option(teacher[0])} is the teacher MLP's task; with --config the job's own "
                        "model trains (drop it)")
    job = load_config(args.config, args.overrides)  # a UserError names the key
    problem = unsimulated(job)
    if problem:  # before the job's rows are read
        raise UserError(f"simulate: {problem}")
    K = job.training.agents
    work = job_workload(job, args.rows * K, args.holdout).split(K, args.rows * K)
    own = {} if args.targets is None else {"targets": tuple(parse_floats(args.targets))}
    return SimConfig.from_settings(job, jitter=args.jitter, network=_network(args), workload=work,
                                   eval_every_s=args.eval_every, absences=_absences(args), startup_s=args.startup,
                                   agent_starts_s=tuple(parse_floats(args.agent_starts)), **own)


def _config_of_options(args) -> SimConfig:
    from mpca.sim.simulator import SimConfig  # torch: imported when a simulation runs, not when the parser is built
    from mpca.sim.workload import TeacherWorkload

    hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    return SimConfig(algorithm={"name": args.algorithm, **parse_overrides(args.overrides)}, agents=args.agents,
                     wire=args.wire, network=_network(args),
                     compute=ComputeModel(step_s=args.device_step_s, jitter=args.jitter,
                                          speeds=parse_device_speed(args.device_speed), seed=args.seed),
                     workload=TeacherWorkload(hidden=hidden, rows_per_agent=args.rows, holdout=args.holdout, lr=args.lr,
                                              seed=args.seed if args.task_seed is None else args.task_seed,
                                              split_rows=args.holdout_split),
                     batch_size=args.batch_size, max_virtual_s=args.max_seconds, eval_every_s=args.eval_every,
                     targets=tuple(parse_floats(args.targets)), seed=args.seed, absences=_absences(args),
                     agent_wait_s=args.agent_wait, startup_s=args.startup,
                     agent_starts_s=tuple(parse_floats(args.agent_starts)), lock_step=args.lock_step,
                     reduce=args.reduce, max_cycles=args.max_cycles)


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
