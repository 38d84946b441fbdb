"""``mpca plan``: the command line of :mod:`mpca.sim.plan` — read the model, the step time and the link, run
the grid, print the table, the recommendation as YAML for ``mpca train`` and the assumptions."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pydantic import ValidationError

from mpca.errors import UserError
from mpca.report import write_json
from mpca.spellings import parse_device_speed, refuse_renamed
from mpca.sim.command import add_exchange_cpu_arguments, parse_overrides, parse_rate

# mpca.sim.grid, .measure and .plan import torch: imported when a plan runs, not when the command line's parser is built
if TYPE_CHECKING:
    from mpca.sim.grid import GridRow


def add_arguments(p: argparse.ArgumentParser) -> None:
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="package.module:factory returning your torch.nn.Module")
    model.add_argument("--parameters", type=int, help="your model's parameter count (the teacher MLP sized to it)")
    model.add_argument("-c", "--config", help="your job's YAML (as mpca train -c): its model, optimizer and batch size; "
                       "every cell trains that model on a sample of the job's rows (see --gradients)")
    step = p.add_mutually_exclusive_group()  # one of them, or -c with a job that sets emulation.device_step_s
    step.add_argument("--device-step-s", type=float, metavar="SECONDS",
                      help="T: the device time of one training step (emulation.device_step_s; default: the job's "
                      "with -c)")
    step.add_argument("--measure", action="store_true", help="time a few steps of the model on this host (CPU "
                      "time on one core)")
    p.add_argument("--input-shape", default="", help="one sample's shape for --measure, e.g. 3,32,32 "
                   "(default: from the first Linear or Conv layer)")
    p.add_argument("--batch-size", type=int, default=None, help="one agent's batch (default: the job's with -c, "
                   "else 64)")
    p.add_argument("--noise-scale", type=float, default=None, help="your task's gradient noise scale B in samples, "
                   "if you know it (-c --gradients proxy measures it): corrects the proxy's gain from more agents")
    p.add_argument("--pilot-steps", type=int, default=None, help="training steps before a noise scale is measured "
                   "(default: mpca.sim.noise.PILOT_STEPS)")
    p.add_argument("--gradients", choices=["job", "proxy"], default="job", help="with -c: train your job's own model "
                   "on a sample of its rows in every cell (job), or the small proxy with your task's measured noise "
                   "scale (proxy: faster for a large model)")
    p.add_argument("--link", default="1gbit", help="every host's port: 100mbit, 1gbit, 10gbit")
    p.add_argument("--agents", default="1,2,4,8,16", help="agent counts to try")
    p.add_argument("--algorithms", default="", help="comma-separated (default: mpca.sim.plan.DEFAULT_ALGORITHMS, "
                   "one agent, mpca and the paper's and today's yardsticks)")
    p.add_argument("--wire", default=None, help="fp32, bf16, int8 or int4 (wire.format; default: the job's with -c "
                   "where it sets one, else fp32)")
    p.add_argument("--device-speed", default=None, metavar="AGENT:SPEED,...",
                   help="stragglers, e.g. 1:0.5: agent 1's steps take T / 0.5 (emulation.device_speed; default: the "
                   "job's with -c)")
    refuse_renamed(p, "--step-s", "--speeds")
    add_exchange_cpu_arguments(p)
    p.add_argument("--reduction", type=float, default=0.3, help="target: holdout error falls to this fraction "
                   "of its start")
    p.add_argument("--target-error", type=float, default=None, help="target: this holdout error of the proxy "
                   "(instead of --reduction)")
    p.add_argument("--target-loss", type=float, default=None, help="target: this holdout loss in nats (instead of an "
                   "error: a language model's)")
    p.add_argument("--tolerance", type=float, default=0.1, help="recommend the fewest agents within this "
                   "fraction of the fastest prediction")
    p.add_argument("--periods", choices=["rule-of-five", "defaults"], default="rule-of-five",
                   help="sync's, diloco's and easgd's period where you set none: H = 5 r at each K, or the defaults")
    p.add_argument("--seeds", type=int, default=1, help="simulations per cell (times averaged; 2 or 3 for steadier "
                   "times at 2-3x the wall time)")
    p.add_argument("--proxy-hidden", default="64,64", help="the gradient proxy's hidden widths, or 'sized': with "
                   "--parameters, the teacher MLP of that size itself (slower; no proxy)")
    p.add_argument("--json", default=None, help="write the plan here as JSON")
    p.add_argument("overrides", nargs="*", help="algorithm settings as in mpca train: algorithm.sync.every=20")


def _ints(text: str, what: str) -> tuple:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"plan: {what} {text!r}: give integers separated by commas") from None


def _proxy_hidden(args) -> tuple:
    from mpca.sim.measure import teacher_hidden_for

    if args.proxy_hidden.strip() == "sized":
        if not args.parameters:
            raise UserError("plan: --proxy-hidden sized goes with --parameters (the teacher MLP of that size)")
        h = teacher_hidden_for(args.parameters)
        return (h, h)
    return _ints(args.proxy_hidden, "--proxy-hidden")


def job_noise_scale(job, batch: int, steps: int):
    """The user's gradient noise scale: a pilot of the job's model and optimizer on a sample of its rows."""
    from mpca.data.sample import local_sample
    from mpca.models import training_functions
    from mpca.sim.noise import pilot

    model_fn, loss_fn, optimizer_fn = training_functions(job.model, job.optimizer)
    x, y = local_sample(job.data)
    model = model_fn()
    return pilot(model, loss_fn, optimizer_fn(model.parameters()), x, y, batch, steps)


def config_from(args) -> tuple:
    """(PlanConfig, lines describing the model, its step time and what the gradients come from, the job's own
    workload or None); every mistake as one UserError line."""
    from mpca.sim.measure import exchanged_values, load_model, measure_step_s, teacher_hidden_for, teacher_mlp_for
    from mpca.sim.noise import PILOT_STEPS
    from mpca.sim.plan import PlanConfig

    job, noise, lines, workload = None, args.noise_scale, [], None
    steps = PILOT_STEPS if args.pilot_steps is None else args.pilot_steps
    try:
        if args.config:
            from mpca.config import load_config
            from mpca.models import training_functions

            job = load_config([args.config])
            model = training_functions(job.model, job.optimizer)[0]()
            n, what = exchanged_values(model), f"{args.config} ({job.model.name})"
        elif args.model:
            model = load_model(args.model)
            n, what = exchanged_values(model), f"{args.model}"
        else:
            if args.parameters < 1:
                raise ValueError(f"--parameters must be >= 1, got {args.parameters}")
            model = teacher_mlp_for(args.parameters) if args.measure else None
            h = teacher_hidden_for(args.parameters)
            n, what = args.parameters, f"--parameters {args.parameters:,} (measured as the teacher MLP 64-{h}-{h}-10)"
        batch = args.batch_size or (job.training.batch_size if job is not None else 64)
        if args.measure:
            shape = _ints(args.input_shape, "--input-shape") or (tuple(job.data.input_shape) if job else None)
            step = measure_step_s(model, shape, batch)
            how = f"measured on this host: CPU time on one core, the fastest of 10 steps at batch {batch}"
        elif args.device_step_s is not None:
            step, how = args.device_step_s, "given"
        elif job is not None and job.emulation.device_step_s is not None:
            step, how = job.emulation.device_step_s, "the job's emulation.device_step_s"
        else:
            raise UserError("plan: give --device-step-s SECONDS (one step's device time) or --measure"
                            + (f"; {args.config} sets no emulation.device_step_s" if job is not None else ""))
        # the job's own spelling of a setting where the option is not given (as --batch-size)
        speeds = (parse_device_speed(args.device_speed) if args.device_speed is not None
                  else dict(job.emulation.device_speed) if job is not None else {})
        wire = args.wire or (job.wire.format if job is not None else None) or "fp32"
        lines.append(f"model: {what}, {n:,} values exchanged; step {step * 1e3:.3g} ms ({how})")
        own = job is not None and args.gradients == "job"
        if own:
            lines.append(f"gradients: your model on a sample of {job.data.dataset or job.data.path}'s rows "
                         "(--gradients job)")
        elif job is not None and noise is None:
            measured = job_noise_scale(job, batch, steps)
            noise = measured.b_simple
            lines.append(f"your task's gradient noise scale (pilot on {job.data.dataset or job.data.path}): "
                         f"{measured.describe()}, {measured.wall_s:.0f} s")
        elif noise is not None:
            lines.append(f"your task's gradient noise scale: B = {noise:.3g} samples (given)")
        chosen = tuple(a.strip() for a in args.algorithms.split(",") if a.strip())
        cfg = PlanConfig(parameters=n, device_step_s=step, link_bps=parse_rate(args.link, "plan"), agents=_ints(args.agents, "--agents"),
                         **({"algorithms": chosen} if chosen else {}),
                         settings=parse_overrides(args.overrides), wire=wire, batch_size=batch,
                         noise_scale=noise, pilot_steps=steps,
                         device_speed=speeds, reduction=args.reduction, target_error=args.target_error, target_loss=args.target_loss, tolerance=args.tolerance,
                         seeds=args.seeds, periods=args.periods, proxy_hidden=_proxy_hidden(args),
                         exchange_cpu_s_per_mb=args.exchange_cpu, host_cores=args.host_cores)
        if own:
            from mpca.sim.workload import job_workload

            workload = job_workload(job, cfg.rows, cfg.holdout)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "settings"
        raise UserError(f"plan: {where}: {first['msg']}") from None
    except UserError:
        raise
    except ValueError as e:
        raise UserError(f"plan: {str(e).splitlines()[0]}") from None
    return cfg, "\n".join(lines), workload


def run(args) -> int:
    from mpca.sim.plan import assumptions, plan, table, yaml_snippet

    cfg, model_line, workload = config_from(args)
    print("mpca plan: a PREDICTION from short simulations (mpca/sim), not a measurement")
    print(model_line, flush=True)
    quiet = getattr(args, "quiet", False)

    def progress(row: GridRow) -> None:
        if not quiet:
            t = "—" if row.time_s is None else f"{row.time_s:.1f} s"
            print(f"  {row.algorithm} K={row.agents}: {t}{' (' + (row.skipped or row.failed) + ')' if row.skipped or row.failed else ''}",
                  file=sys.stderr, flush=True)

    try:
        res = plan(cfg, progress, workload)
    except ValueError as e:
        raise UserError(f"plan: {str(e).splitlines()[0]}") from None
    print(table(res))
    if res.recommended is None:
        print(f"recommended: none — no algorithm reached the target within {res.horizon_s:.1f} s; train one agent "
              "(algorithm single) or raise --reduction")
    else:
        r = res.recommended
        print(f"recommended: {r.algorithm} with K = {r.agents}: {r.time_s:.1f} s predicted to the target "
              f"({res.speedup(r):.2f}x one agent). For mpca train:")
        print(yaml_snippet(res))
    print("assumptions:")
    for line in assumptions(res):
        print(f"- {line}")
    print(f"planned in {res.wall_s:.1f} s of wall time ({len(res.rows)} cells)")
    if args.json:
        print(f"wrote {write_json(args.json, res.to_dict())}")
    return 0
