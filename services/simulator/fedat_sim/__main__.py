"""`python -m fedat_sim EXPERIMENT.yaml --virtual-minutes M --results DIR`: one experiment in virtual time."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, simulate, print the summary."""
    p = argparse.ArgumentParser(prog="python -m fedat_sim", description=__doc__)
    p.add_argument("experiment", type=Path)
    p.add_argument("--virtual-minutes", type=float, default=None, help="virtual time to simulate (default: minutes)")
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--seed", type=int, default=None, help="replaces the experiment's seed setting")
    p.add_argument("--tag", default="", help="name of the run folder (default: time, name, random suffix)")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes to train in (the same run on more cores; needs step_seconds)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # A simulation dead-letters stale stragglers by the thousand, as a real run does; its log is for errors only.
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s: %(message)s")
    from fedat_sim.simulate import simulate, stop_on_sigterm

    try:
        summary = simulate(
            args.experiment,
            args.results,
            args.virtual_minutes,
            args.seed,
            tag=args.tag,
            stop=stop_on_sigterm(),
            processes=args.processes,
        )
    except (OSError, ValueError) as exc:
        sys.exit(f"fedat simulate: {exc}")
    print(json.dumps(summary, indent=2))
    if summary.get("failure"):
        sys.exit(f"fedat simulate failed: {summary['failure']}")


if __name__ == "__main__":
    main()
