"""The `fedat` command: `fedat run EXPERIMENT.yaml`, `fedat compare COMPARISON.yaml`, `fedat tabulate`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fedat.run import load_experiment, run


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and dispatch."""
    p = argparse.ArgumentParser(prog="fedat")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one experiment with every service as a local process")
    r.add_argument("experiment", type=Path)
    r.add_argument("--minutes", type=float, default=None, help="wall-clock budget (default: the experiment's)")
    r.add_argument("--results", type=Path, default=Path("results"))
    r.add_argument("--amqp-url", default=None, help="use this broker/vhost instead of a fresh local vhost")
    c = sub.add_parser("compare", help="run several methods with the same budget and seed, then tabulate")
    c.add_argument("comparison", type=Path)
    c.add_argument("--minutes", type=float, default=None, help="budget per method (default: the file's)")
    c.add_argument("--results", type=Path, default=Path("results"))
    t = sub.add_parser("tabulate", help="rewrite a finished comparison's tables and plots from its compare.json")
    t.add_argument("results_dir", type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        if args.command == "run":
            run(load_experiment(args.experiment), args.results, args.minutes, args.amqp_url)
        elif args.command == "tabulate":
            from fedat.compare_run import tabulate

            print(tabulate(args.results_dir))
        else:
            from fedat.compare_run import compare

            compare(args.comparison, args.results, args.minutes)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
