"""Console entry point: ``mpca train --config conf/digits.yaml [key=value ...]``, ``mpca predict ...``,
``mpca bench ...``, ``mpca data ...``, ``mpca simulate ...``, ``mpca plan ...``.

Exit codes: 0 done (or target reached), 2 user error (one line, no traceback),
3 the run failed, 4 stopped at a time/cycle/epoch limit without reaching the
target error.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from mpca.errors import RunFailedError, UserError

EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 3


def _train(args) -> int:
    from mpca import job
    from mpca.config import load_config

    if not args.config:
        raise UserError("give a job config: mpca train -c conf/digits.yaml [key=value ...]")
    cfg = load_config(args.config, args.overrides)
    if args.quiet:
        cfg.progress = "off"
    if args.dry_run:
        return job.dry_run(cfg)
    try:
        return job.run(cfg).exit_code
    except UserError as e:
        job.write_failure_summary(cfg, "user_error", EXIT_USER_ERROR, str(e))
        raise
    except RunFailedError as e:
        job.write_failure_summary(cfg, "failed", EXIT_RUN_FAILED, str(e))
        raise


def _predict(args) -> int:
    from mpca.config import load_config
    from mpca.predict import predict

    if not args.config:
        raise UserError("give the job config the model was trained with: mpca predict -c conf/digits.yaml ...")
    cfg = load_config(args.config, args.overrides)
    return predict(cfg, args.model, args.data, args.out, args.overwrite, args.prediction_col)


def _data(args) -> int:
    if args.dataset == "pytext":
        from mpca.data.text import TextCorpus

        corpus = TextCorpus(root=args.root, window=args.window, holdout=args.holdout, max_mb=args.max_mb)
        s = corpus.write_parquet(args.path)
        print(f"{args.path}: byte windows of {s['window']} tokens from {s['root']}, split by file:")
        for side in ("train", "holdout"):
            print(f"  {side:<8} {s[side]['files']:>5} files {s[side]['bytes'] / 1e6:8.2f} MB "
                  f"{s[side]['windows']:>8} windows -> {args.path}/{side}")
        print(f"  files of each side: {args.path}/files.json; train with data.path={args.path}/train "
              f"data.holdout_path={args.path}/holdout")
        return 0
    from mpca.data.datasets import write_parquet

    print(write_parquet(args.dataset, args.path))
    return 0


def _bench(args) -> int:
    if args.which == "pull":
        from mpca.bench.pull import main as pull_main

        return pull_main(args.rest)
    if args.which == "compare":
        from mpca.bench.compare import main as compare_main

        return compare_main(args.rest)
    from mpca.bench.exchange import main as exchange_main

    return exchange_main(args.rest)


def _simulate(args) -> int:
    from mpca.sim.command import run

    return run(args)


def _plan(args) -> int:
    from mpca.sim.plan_command import run

    return run(args)


def _version() -> str:
    import importlib.metadata as md

    from mpca import __version__

    def v(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    return f"mpca {__version__} (pyspark {v('pyspark')}, torch {v('torch')}, Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)  # -v / -q before or after the subcommand
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log at INFO level (Spark stays at ERROR)")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="errors and the final result only (no progress, no INFO logs)")
    ap = argparse.ArgumentParser(prog="mpca", description="MPCA SGD: coordinated asynchronous training on Spark",
                                 parents=[common])
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a model from a YAML config", parents=[common])
    t.add_argument("--config", "-c", action="append", default=[],
                   help="YAML file, e.g. conf/digits.yaml; repeat to merge presets (later files win)")
    t.add_argument("--dry-run", action="store_true", help="check the config, the data source and the cluster's "
                   "room for the agents, print the resolved config and exit (0, or 2 with the problem) without training")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. training.agents=2 stop.max_cycles=50")
    t.set_defaults(func=_train)
    p = sub.add_parser("predict", help="score a data set with a trained model (batch inference; Parquet out)",
                       parents=[common])
    p.add_argument("--config", "-c", action="append", default=[], help="the job config (features, input_shape, "
                   "cluster; model.name where no model.json lies beside the model)")
    p.add_argument("--model", required=True, help="a model.pt written by mpca train (or save_model)")
    p.add_argument("--data", required=True, help="file or directory to score, read as data.format (default Parquet)")
    p.add_argument("--out", required=True, help="where the scored Parquet goes")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--prediction-col", default="prediction")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    p.set_defaults(func=_predict)
    d = sub.add_parser("data", help="write a bundled dataset as Parquet (pytext: the Python standard library's "
                                    "source as byte windows, train/ and holdout/ split by file)", parents=[common])
    d.add_argument("dataset", choices=["digits", "mnist5k", "pytext"])
    d.add_argument("path")
    d.add_argument("--window", type=int, default=128, help="pytext: tokens (bytes) per row")
    d.add_argument("--holdout", type=float, default=0.1, help="pytext: the share of files held out")
    d.add_argument("--max-mb", type=float, default=None, help="pytext: at most this many MB of whole files")
    d.add_argument("--root", default=None, help="pytext: another directory of text files (default: the stdlib)")
    d.set_defaults(func=_data)
    b = sub.add_parser("bench", help="benchmarks: compare (time to accuracy per algorithm), pull (Eq. 7 cost), "
                                     "exchange (runtime)", parents=[common])
    b.add_argument("which", choices=["compare", "pull", "exchange"])
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)
    s = sub.add_parser("simulate", help="K agents and the driver in virtual time: the library's rules, real "
                                        "gradients, simulated network and devices", parents=[common])
    from mpca.sim.command import add_arguments

    add_arguments(s)
    s.set_defaults(func=_simulate)
    pl = sub.add_parser("plan", help="which algorithm and how many agents for your model, step time and link: "
                                     "predicted by short simulations", parents=[common])
    from mpca.sim.plan_command import add_arguments as add_plan_arguments

    add_plan_arguments(pl)
    pl.set_defaults(func=_plan)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UserError as e:  # an option's value or an old spelling (mpca.spellings)
        print(f"mpca: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    args.verbose, args.quiet = getattr(args, "verbose", False), getattr(args, "quiet", False)
    if args.verbose and args.quiet:
        print("mpca: error: -v/--verbose and -q/--quiet exclude each other", file=sys.stderr)
        return EXIT_USER_ERROR
    level = logging.INFO if args.verbose or (args.command == "train" and not args.quiet) else logging.WARNING
    logging.basicConfig(level=logging.ERROR if args.quiet else level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return args.func(args)
    except UserError as e:
        print(f"mpca: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunFailedError as e:
        print(f"mpca: run failed: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        print("mpca: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
