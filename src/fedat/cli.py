"""The `fedat` command: `fedat run EXPERIMENT.yaml`, `fedat compare COMPARISON.yaml`, `fedat tabulate`,
`fedat provision` (vhost, least-privilege users and topology through the management API), `fedat serve` (the server
side for real clients), `fedat enroll` and `fedat revoke` (one real client's user, queues and folder)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

from fedat.deploy.experiment import load_experiment
from fedat.lab.run import run


def _become(module: str, args: list[str]) -> None:
    """Replace this process by `python -m module args`: signals (SIGTERM, Ctrl-C) then reach the simulator itself."""
    # The simulator imports every service; the core must not, so it runs as its own module, in this very process.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and dispatch."""
    p = argparse.ArgumentParser(prog="fedat")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one experiment with every service as a local process")
    r.add_argument("experiment", type=Path)
    r.add_argument("--minutes", type=float, default=None, help="wall-clock budget (default: the experiment's)")
    r.add_argument("--results", type=Path, default=Path("results"))
    r.add_argument("--amqp-url", default=None, help="use this broker/vhost instead of a fresh local vhost")
    r.add_argument("--prometheus", action="store_true", help="scrape the run with a local Prometheus (alerts too)")
    r.add_argument(
        "--emulate-slowdown",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="plan as if training and evaluation took FACTOR times what the probe measured (a slower machine)",
    )
    r.add_argument("--plan-only", action="store_true", help="measure this machine, print the plan, start nothing")
    c = sub.add_parser("compare", help="run several methods with the same budget and seed, then tabulate")
    c.add_argument("comparison", type=Path)
    c.add_argument("--minutes", type=float, default=None, help="budget per method (default: the file's)")
    c.add_argument("--results", type=Path, default=Path("results"))
    c.add_argument(
        "--simulate",
        action="store_true",
        help="in virtual time, on several seeds and every core (more options: fedat compare --simulate --help)",
    )
    t = sub.add_parser(
        "tabulate",
        help="rewrite a comparison's tables from its compare.json, or a sweep's from its records",
    )
    t.add_argument("results_dir", type=Path, nargs="?", help="a `fedat compare` results folder")
    t.add_argument("--sweeps", type=Path, help="a folder of sweep records (docs/summaries/sim)")
    t.add_argument(
        "--into",
        type=Path,
        help="with --sweeps: rebuild the report at this file (docs/results.md): its generated blocks, and beside it "
        "report/<comparison>.md, report/pipeline.md's tables and report/figures/",
    )
    t.add_argument("--minutes", type=float, help="with --sweeps, without --into: tables at this virtual budget")
    t.add_argument(
        "--experiments",
        type=Path,
        default=Path("experiments"),
        help="with --sweeps: where <comparison>.yaml is; its budget is tabled even if every run went on past it",
    )
    _provision_parser(sub)
    _client_parsers(sub)
    sm = sub.add_parser(
        "simulate",
        help="run an experiment through the same services in virtual time (services/simulator)",
        add_help=False,
    )
    sm.add_argument("rest", nargs=argparse.REMAINDER)
    # Deployment checks, each its own module (configured by FEDAT_* variables, as in the chart's hook Jobs).
    becomes = {
        "upgrade-check": ("fedat.deploy.upgrade_check", "refuse settings that the run's checkpoints do not fit"),
        "release-test": ("fedat.deploy.release_test", "check a deployment end to end (broker, seed model, metrics)"),
    }
    for name, (_, text) in becomes.items():
        sub.add_parser(name, help=text, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    k = sub.add_parser("keys", help="write each role's keyring (JSON, mode 0600) derived from a deployment secret")
    k.add_argument("--secret-file", type=Path, required=True, help="the deployment secret, hex (>= 32 bytes)")
    k.add_argument("--out-dir", type=Path, required=True, help="one <role>.json per role is written here")
    k.add_argument("--role", action="append", help="only these roles (default: every role)")
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["compare"] and "--simulate" in argv:
        rest = [a for a in argv[1:] if a != "--simulate"]
        _become("fedat_sim.compare", rest)
    if argv[:1] == ["simulate"]:
        _become("fedat_sim", argv[1:])
    if argv[:1] and argv[0] in becomes:
        _become(becomes[argv[0]][0], argv[1:])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        if args.command == "run":
            from fedat.deploy.provision import ProvisionError

            try:
                exp = load_experiment(args.experiment)
                run(
                    exp,
                    args.results,
                    args.minutes,
                    args.amqp_url,
                    prometheus=args.prometheus,
                    slowdown=args.emulate_slowdown,
                    plan_only=args.plan_only,
                )
            except ProvisionError as exc:
                sys.exit(f"fedat run: could not provision the broker: {exc}")
        elif args.command in ("enroll", "revoke", "serve"):
            clients_command(args, p)
        elif args.command == "provision":
            provision_command(args, p)
        elif args.command == "keys":
            keys_command(args.secret_file, args.out_dir, args.role)
        elif args.command == "tabulate":
            _tabulate(args, p)
        else:
            from fedat.lab.compare_run import compare

            compare(args.comparison, args.results, args.minutes)
    except KeyboardInterrupt:
        sys.exit(130)


def keys_command(secret_file: Path, out_dir: Path, roles: list[str] | None) -> None:
    """Write `<role>.json` keyrings: give each role's pods only theirs (FEDAT_KEYRING_FILE), e.g. as a Secret."""
    from fedat.protocol import signing

    secret = bytes.fromhex(secret_file.read_text().strip())
    out_dir.mkdir(parents=True, exist_ok=True)
    for role in roles or list(signing.ROLES):
        path = out_dir / f"{role}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(signing.keys_for_role(secret, role), f)
        print(f"{path}: {', '.join(sorted(signing.keys_for_role(secret, role)))}")


def _tabulate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`fedat tabulate DIR` or `fedat tabulate --sweeps DIR [--into FILE]`."""
    if args.sweeps:
        from fedat.lab import sweep
        from fedat.lab.compare_run import planned_minutes

        records = sweep.load_records(args.sweeps)
        planned, method_minutes = planned_minutes(args.experiments, records)
        if not args.into:
            print(sweep.render(records, minutes=args.minutes, planned=planned))
            return
        from fedat.lab import report

        # the chaos and scale summaries sit beside the sweep records' folder (docs/summaries)
        built = report.generate(records, args.into.name, planned, args.sweeps.parent, method_minutes)
        changed = report.write(built, args.into.parent)
        for path in changed:
            print(f"{path}: rebuilt from {args.sweeps}")
        print(f"{args.into}: {len(changed)} files changed")
        return
    if args.results_dir is None:
        parser.error("tabulate: give a results folder or --sweeps DIR")
    from fedat.lab.compare_run import tabulate

    print(tabulate(args.results_dir))


def _provision_parser(sub) -> None:
    env = os.environ
    from fedat.deploy.provision import DEFAULT_API_URL

    v = sub.add_parser(
        "provision",
        help="create (or check) a vhost, one least-privilege user per role and the whole topology",
        description="Idempotent: running it again changes nothing. Every option also comes from the environment "
        "(in brackets), so that it can run as a Kubernetes Job. Passwords are never printed.",
    )
    v.add_argument("--api-url", default=env.get("FEDAT_MANAGEMENT_URL", DEFAULT_API_URL), help="[FEDAT_MANAGEMENT_URL]")
    v.add_argument("--admin-user", default=env.get("FEDAT_ADMIN_USER", "guest"), help="[FEDAT_ADMIN_USER]")
    v.add_argument(
        "--admin-password-file",
        type=Path,
        default=env.get("FEDAT_ADMIN_PASSWORD_FILE"),
        help="[FEDAT_ADMIN_PASSWORD_FILE]; or the password itself in FEDAT_ADMIN_PASSWORD",
    )
    v.add_argument("--vhost", default=env.get("FEDAT_VHOST"), help="[FEDAT_VHOST] (required)")
    v.add_argument("--num-tiers", type=int, default=env.get("FEDAT_NUM_TIERS", "5"), help="[FEDAT_NUM_TIERS]")
    v.add_argument(
        "--credentials-out",
        type=Path,
        default=env.get("FEDAT_CREDENTIALS_OUT"),
        help="[FEDAT_CREDENTIALS_OUT] JSON file (mode 0600) of role -> username, password, amqp_url; the passwords "
        "of an existing file are kept",
    )
    v.add_argument("--user-prefix", default=env.get("FEDAT_USER_PREFIX"), help="[FEDAT_USER_PREFIX] default '<vhost>-'")
    v.add_argument(
        "--password-dir",
        type=Path,
        default=env.get("FEDAT_PASSWORD_DIR"),
        help="[FEDAT_PASSWORD_DIR] a file per role (named after the role) holding its password; others are generated",
    )
    v.add_argument(
        "--amqp-host", default=env.get("FEDAT_AMQP_HOST"), help="[FEDAT_AMQP_HOST] host:port in the URLs written out"
    )
    v.add_argument(
        "--roles",
        default=env.get("FEDAT_ROLES", ""),
        help="[FEDAT_ROLES] comma-separated roles to create users for (default: every service role)",
    )
    v.add_argument("--delete", action="store_true", help="delete the vhost and the users instead")


def provision_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`fedat provision`: print what was created, updated or deleted (never a password)."""
    from fedat.deploy.provision import ProvisionError

    try:
        _provision(args, parser)
    except (ProvisionError, ValueError, OSError) as exc:
        sys.exit(f"fedat provision failed: {exc}")


def _provision(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from fedat.deploy import provision as prov
    from fedat.deploy.roles import ROLES, SERVICE_ROLES

    if not args.vhost:
        parser.error("provision: --vhost (or FEDAT_VHOST) is required")
    if args.admin_password_file:
        admin_password = Path(args.admin_password_file).read_text().strip()
    elif os.environ.get("FEDAT_ADMIN_PASSWORD"):
        admin_password = os.environ["FEDAT_ADMIN_PASSWORD"]
    else:
        parser.error("provision: give --admin-password-file, FEDAT_ADMIN_PASSWORD_FILE or FEDAT_ADMIN_PASSWORD")
    prefix = f"{args.vhost}-" if args.user_prefix is None else args.user_prefix
    wanted = [r.strip() for r in args.roles.split(",") if r.strip()] or list(SERVICE_ROLES)
    unknown = sorted(set(wanted) - set(ROLES))
    if unknown:
        parser.error(f"provision: unknown role(s) {unknown}; roles: {', '.join(ROLES)}")
    counts: Counter[str] = Counter()

    def report(outcome: str, what: str) -> None:
        counts[outcome] += 1
        if outcome != "unchanged":
            print(f"{outcome:9s} {what}", flush=True)

    names = prov.usernames(prefix, ROLES if args.delete else wanted)
    if args.delete:
        prov.deprovision(args.api_url, args.admin_user, admin_password, args.vhost, names.values(), report=report)
        return
    if not args.credentials_out:
        parser.error("provision: --credentials-out (or FEDAT_CREDENTIALS_OUT) is required")
    previous = prov.read_credentials(args.credentials_out)
    pw = prov.passwords(wanted, args.password_dir, previous)
    users = {role: (names[role], pw[role]) for role in wanted}
    urls = prov.role_urls(args.api_url, args.vhost, users, args.amqp_host)
    # Written before the broker is touched: a provisioning that fails half-way is retried with the same passwords.
    prov.write_credentials(
        args.credentials_out,
        {role: {"username": users[role][0], "password": users[role][1], "amqp_url": urls[role]} for role in wanted},
    )
    prov.provision(
        args.api_url,
        args.admin_user,
        admin_password,
        args.vhost,
        args.num_tiers,
        users,
        amqp_host=args.amqp_host,
        report=report,
    )
    print(f"unchanged {counts['unchanged']} objects", flush=True)
    for role in wanted:
        print(f"role {role:10s} {prov.redact(urls[role])}", flush=True)
    print(f"credentials of {len(wanted)} users written to {args.credentials_out} (mode 0600)", flush=True)


def _client_parsers(sub) -> None:
    """`fedat serve`, `fedat enroll`, `fedat revoke`: real clients (docs/wire-format.md §11)."""
    env = os.environ
    s = sub.add_parser(
        "serve",
        help="run the server side for real clients on a fresh vhost, enroll N clients, follow the run until Ctrl-C",
    )
    s.add_argument("experiment", type=Path)
    s.add_argument("--clients", type=int, default=0, help="enroll clients 0..N-1 into <results>/<run-id>/clients/")
    s.add_argument("--results", type=Path, default=Path("results"))
    s.add_argument("--minutes", type=float, default=None, help="stop after this many minutes (default: Ctrl-C)")
    e = sub.add_parser(
        "enroll",
        help="enroll one real client: its broker user, its two queues, and the folder its site is handed",
        description="Idempotent: enrolling again keeps the password and changes nothing. Management options also "
        "come from the environment (in brackets), as for `fedat provision`.",
    )
    e.add_argument("client", type=int, help="the client's id, an integer >= 0")
    _client_options(e, env)
    e.add_argument("--out", type=Path, required=True, help="the folder to write (mode 0700): client.env and its files")
    e.add_argument("--num-tiers", type=int, default=int(env.get("FEDAT_NUM_TIERS", "5")), help="[FEDAT_NUM_TIERS]")
    e.add_argument(
        "--amqp-host", default=env.get("FEDAT_AMQP_HOST"), help="[FEDAT_AMQP_HOST] host:port the client connects to"
    )
    e.add_argument(
        "--tls-ca-file",
        type=Path,
        default=env.get("FEDAT_TLS_CA_FILE"),
        help="[FEDAT_TLS_CA_FILE] the broker's CA: the client connects with amqps:// and is given a copy",
    )
    r = sub.add_parser(
        "revoke",
        help="revoke one real client: delete its user, close its connections, make the profiler refuse it",
        description="Idempotent. Its queues stay (a task may still be routed there until the new tiers arrive) "
        "unless --purge.",
    )
    r.add_argument("client", type=int, help="the client's id")
    _client_options(r, env)
    r.add_argument("--purge", action="store_true", help="delete the client's two queues too")


def _client_options(parser: argparse.ArgumentParser, env) -> None:
    """The management API, the vhost, the user prefix and the deployment secret, as `fedat provision` takes them."""
    from fedat.deploy.provision import DEFAULT_API_URL

    parser.add_argument(
        "--api-url", default=env.get("FEDAT_MANAGEMENT_URL", DEFAULT_API_URL), help="[FEDAT_MANAGEMENT_URL]"
    )
    parser.add_argument("--admin-user", default=env.get("FEDAT_ADMIN_USER", "guest"), help="[FEDAT_ADMIN_USER]")
    parser.add_argument(
        "--admin-password-file",
        type=Path,
        default=env.get("FEDAT_ADMIN_PASSWORD_FILE"),
        help="[FEDAT_ADMIN_PASSWORD_FILE]; or the password itself in FEDAT_ADMIN_PASSWORD (default guest)",
    )
    parser.add_argument("--vhost", default=env.get("FEDAT_VHOST"), help="[FEDAT_VHOST] (required)")
    parser.add_argument(
        "--user-prefix", default=env.get("FEDAT_USER_PREFIX"), help="[FEDAT_USER_PREFIX] default '<vhost>-'"
    )
    parser.add_argument(
        "--secret-file",
        type=Path,
        default=env.get("FEDAT_SIGNING_SECRET_FILE"),
        help="[FEDAT_SIGNING_SECRET_FILE] the deployment secret, hex (required): the client's key is derived from it",
    )


def clients_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`fedat serve`, `fedat enroll`, `fedat revoke`: errors name what is wrong, passwords are never printed."""
    from fedat.deploy.provision import ProvisionError
    from fedat.errors import KeyringError

    try:
        if args.command == "serve":
            from fedat.lab.serve import serve

            if args.clients < 0:
                parser.error("serve: --clients must be >= 0")
            serve(load_experiment(args.experiment), args.results, args.clients, args.minutes)
        else:
            _enroll_or_revoke(args, parser)
    except (ProvisionError, KeyringError, ValueError, OSError) as exc:
        sys.exit(f"fedat {args.command} failed: {exc}")


def _enroll_or_revoke(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from fedat.deploy import enroll as enroll_mod
    from fedat.protocol.signing import hex_secret

    if not args.vhost:
        parser.error(f"{args.command}: --vhost (or FEDAT_VHOST) is required")
    if not args.secret_file:
        parser.error(f"{args.command}: --secret-file (or FEDAT_SIGNING_SECRET_FILE) is required")
    secret = hex_secret(Path(args.secret_file).read_text(), str(args.secret_file))
    if args.admin_password_file:
        admin_password = Path(args.admin_password_file).read_text().strip()
    else:
        admin_password = os.environ.get("FEDAT_ADMIN_PASSWORD", "guest")
    management = (args.api_url, args.admin_user, admin_password)

    def report(outcome: str, what: str) -> None:
        if outcome != "unchanged":
            print(f"{outcome:9s} {what}", flush=True)

    if args.command == "revoke":
        enroll_mod.revoke(
            *management, args.vhost, args.client, secret, prefix=args.user_prefix, purge=args.purge, report=report
        )
        print(f"client {args.client} revoked on {args.vhost}", flush=True)
        return
    done = enroll_mod.enroll(
        *management,
        args.vhost,
        args.client,
        secret,
        args.out,
        num_tiers=args.num_tiers,
        prefix=args.user_prefix,
        amqp_host=args.amqp_host,
        ca_file=args.tls_ca_file,
        report=report,
    )
    print(f"client {done.client} enrolled as user {done.username}; hand over {done.folder}", flush=True)
    print(f"start it there with: fedat-client --env {done.folder / enroll_mod.ENV_FILE}", flush=True)


if __name__ == "__main__":
    main()
