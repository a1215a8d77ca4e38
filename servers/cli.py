"""`svtagg server` (run a leader or helper) and `svtagg certs` (make a local CA)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from svtagg.dp.kinds import as_fraction
from svtagg.mpc.millionaire import PathRule, server_path
from svtagg.mpc.softspoken import parse_ot, server_ot
from svtagg.proto.tls import DEFAULT_HOSTS, ROLES, load_identity, write_deployment
from svtagg.proto.vocab import MAX_TASKS
from svtagg.servers.edge.admission import CallLimits
from svtagg.servers.exchange.garbling import DEFAULT_GARBLING, GARBLING_SCHEMES

if TYPE_CHECKING:
    from svtagg.servers.service import ServerConfig

#: The budget cap a server applies when its operator names none.  ε_total = 10:
#: a total above the budgets of published deployments, where the guarantee is
#: already weak (e^10 ≈ 22,000).  δ_total = 10^-5: below 1/n for every task of up
#: to 10^5 users, since a δ near 1/n allows publishing one user's record.
#: "none" lifts a cap explicitly.
DEFAULT_MAX_EPSILON_TOTAL = "10"
DEFAULT_MAX_DELTA_TOTAL = "1/100000"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("server", help="run the leader or helper server")
    p.add_argument(
        "--config",
        help="a TOML file whose [server] table gives this server's options (keys are the "
        "option names: role, db, certs, listen, helper, ...; flags true/false); the "
        "command line wins, relative paths are relative to the file",
    )
    p.add_argument("--role", choices=["leader", "helper"], required=True)
    p.add_argument(
        "--db",
        required=True,
        help="store of this server: a SQLite file (a path or sqlite:///path, the default)"
        " or a PostgreSQL database (postgresql://user@host:port/dbname; needs the"
        " postgres extra)",
    )
    p.add_argument("--certs", required=True, help="directory made by `svtagg certs`")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: pick one)")
    p.add_argument("--helper", help="helper host:port (leader only)")
    p.add_argument(
        "--ingest-listen",
        help="extra host:port with server-only TLS for clients without certificates",
    )
    p.add_argument(
        "--data-port",
        default="0",
        help="helper: TCP port of the comparison data channel (mutual TLS, same "
        "certificates) on the --listen host; 0 picks a free port and announces it to "
        "the leader per session; 'off' keeps the protocol inside the gRPC stream. "
        "Leader: 'off' never asks for it (default 0)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of the native comparison core (default: one per CPU; "
        "the environment variable SVTAGG_THREADS sets the same)",
    )
    p.add_argument(
        "--garbling",
        choices=GARBLING_SCHEMES,
        default=DEFAULT_GARBLING,
        help="garbling scheme of the comparison sessions: halfgates (32 bytes per AND "
        "gate) or threehalves (24.625 bytes, more CPU); both servers must name the same, "
        f"the helper refuses a leader on another (default {DEFAULT_GARBLING}; docs/mpc.md)",
    )
    p.add_argument(
        "--ot",
        default=None,
        metavar="EXTENSION",
        help="OT extension of the comparison sessions: softspoken[:k] (4 bytes per "
        "OT at k = 4), iknp (16 bytes), ferret[:b10..b13] (≈ 0.5 bytes per OT, more CPU "
        "and ≈ 35 MB per session); both servers must name the same, the helper refuses a "
        "leader on another (default: the environment variable SVTAGG_OT, else "
        "softspoken:4; docs/mpc.md)",
    )
    p.add_argument(
        "--comparison",
        default=None,
        metavar="PATH",
        help="leader: which path first-YES and CompareToThresholds chunks take: garbled "
        "(one round trip, ≈ 1,200 bytes per comparison at w = 34), ot (the OT-based "
        "millionaires' path: ≈ 300 bytes with softspoken:4, ≈ 110 with ferret, three "
        "round trips, more CPU) or auto:RTT_MS:MBPS (per chunk, the faster of the two "
        "for the stated link, e.g. auto:10:1000); the helper follows its leader "
        "(default: the environment variable SVTAGG_COMPARISON, else garbled; docs/mpc.md)",
    )
    p.add_argument(
        "--ingest-only",
        action="store_true",
        help="an ingest replica of this role: serves uploads (and health) only, on the "
        "PostgreSQL store of the role's main process (--db postgresql://...); run as "
        "many as needed, each on its own --listen.  A leader replica verifies proofs "
        "with the helper process named by --helper (the helper's main process or a "
        "helper replica, which also answers the per-batch Verify)",
    )
    p.add_argument(
        "--lease-work",
        action="store_true",
        help="leader on PostgreSQL: queue the comparison chunks and the close-time "
        "passes in the store for --worker processes instead of running them here",
    )
    p.add_argument(
        "--worker",
        action="store_true",
        help="a comparison worker of this role on the PostgreSQL store of the role's "
        "main process: a leader worker takes leased jobs (give it --helper: the helper "
        "process it pairs with), a helper worker serves comparison sessions",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=None,
        help="a leader worker's lease on each job in seconds (default 10): a worker "
        "silent for this long is taken as lost and its stream is failed closed",
    )
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument(
        "--metrics-listen",
        help="host:port for a Prometheus /metrics endpoint (plain HTTP: bind it to a "
        "private interface; port 0 picks one, logged at start); off when not given",
    )
    p.add_argument("--grace", type=float, default=5.0, help="shutdown grace period (s)")
    p.add_argument(
        "--rate-limit",
        type=float,
        default=1000.0,
        help="requests/s per caller certificate (0: no limit; the leader is exempt)",
    )
    p.add_argument("--rate-burst", type=float, default=2000.0, help="token-bucket burst size")
    defaults = CallLimits()
    for flag, default, text in (
        ("--max-calls-per-caller", defaults.calls_per_caller,
         "calls in flight per caller, streaming calls included (0: no bound)"),
        ("--max-calls", defaults.calls_total,
         "calls in flight in all, the leader's not counted (0: no bound)"),
        ("--max-uploads-per-caller", defaults.uploads_per_caller,
         "Upload calls reading or processing a batch per caller; more wait (0: no bound)"),
        ("--max-uploads", defaults.uploads_total,
         "Upload calls reading or processing a batch in all; more wait"),
        ("--max-tasks", MAX_TASKS, "tasks this server holds at most"),
    ):  # fmt: skip
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="svtagg's own log level",
    )
    p.add_argument(
        "--grpc-log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="log level of the gRPC library's internals, kept apart from --log-level "
        "(when given, also the C core's GRPC_VERBOSITY, which is otherwise silent)",
    )
    p.add_argument(
        "--max-epsilon-total",
        default=DEFAULT_MAX_EPSILON_TOTAL,
        help="refuse tasks whose total ε exceeds this, the operator's policy "
        f"(default {DEFAULT_MAX_EPSILON_TOTAL}; 'none': the analyst chooses)",
    )
    p.add_argument(
        "--max-delta-total",
        default=DEFAULT_MAX_DELTA_TOTAL,
        help=f"refuse tasks whose total δ exceeds this (default {DEFAULT_MAX_DELTA_TOTAL}; "
        "'none': no cap)",
    )
    p.add_argument(
        "--require-validation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refuse tasks whose reports carry no validity proof (a task's --validity); "
        "--no-require-validation also serves tasks of plain shares, which only the "
        "robust aggregates bound (default: required)",
    )
    p.set_defaults(handler=run_server)

    c = sub.add_parser("certs", help="make a local CA and the certificates of a deployment")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument(
        "--hosts",
        default=",".join(DEFAULT_HOSTS),
        help="comma-separated DNS names / IPs the servers answer on",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="replace an existing CA and keys (every certificate issued before stops working)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(handler=run_certs)


def run_certs(args: argparse.Namespace) -> int:
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
    if not hosts:
        raise ValueError("--hosts names no host")
    out = write_deployment(args.out, hosts, force=args.force)
    if getattr(args, "json", False):
        import json

        files = sorted(p.name for p in out.iterdir() if p.suffix in (".pem", ".key"))
        print(json.dumps({"directory": str(out), "hosts": list(hosts), "files": files}))
        return 0
    print(f"wrote ca.pem and {', '.join(ROLES)} certificates (hosts {', '.join(hosts)}) to {out}")
    print("keep ca.key offline; give each party only its own <role>.pem/.key and ca.pem")
    return 0


def check_startup(args: argparse.Namespace) -> ServerConfig:
    """The server's configuration, with everything checked that can be checked
    before anything is created: the process kind the flags ask for, the
    leader's --helper (and, if it answers, its certificate), the certificate
    directory and its role, the store's directory and the budget caps.  Raises
    (one-line messages) instead of starting half-way."""
    from svtagg.proto.vocab import Role
    from svtagg.servers.service import ProcessKind, ServerConfig
    from svtagg.servers.store.opener import sqlite_file

    role = Role(args.role)
    parse_ot(args.ot or server_ot())  # an unknown --ot or SVTAGG_OT, before anything starts
    PathRule.parse(args.comparison or server_path())  # likewise --comparison
    kind = ProcessKind.from_flags(
        role,
        args.db,
        ingest_only=args.ingest_only,
        worker=args.worker,
        lease_work=args.lease_work,
    )
    if args.lease is not None and not (kind is ProcessKind.WORKER and role == Role.LEADER):
        raise ValueError("--lease is for a leader --worker only")
    if args.lease is not None and not 0.5 <= args.lease <= 3600:
        raise ValueError("--lease must be in [0.5, 3600] seconds")
    if role == Role.LEADER and not args.helper and kind.runs_protocol:
        raise ValueError("the leader needs --helper host:port (the helper's address)")
    if role == Role.HELPER and args.helper:
        raise ValueError("--helper is for the leader only")
    identity = load_identity(args.certs, role)
    if role == Role.LEADER and args.helper:
        from svtagg.servers.edge.peer import check_helper_certificate

        check_helper_certificate(args.helper, identity)
    db_file = sqlite_file(args.db)  # None: a PostgreSQL URL, checked when the store opens
    if db_file is not None:
        db = Path(db_file)
        if db.is_dir():
            raise IsADirectoryError(21, "--db names a directory, not a store file", str(db))
        parent = db.parent if str(db.parent) else Path(".")
        if not parent.is_dir():
            raise FileNotFoundError(2, "--db: no such directory", str(parent))
        if not os.access(parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise PermissionError(13, "--db is not writable", str(db))
    if args.port_file and not Path(args.port_file).resolve().parent.is_dir():
        raise FileNotFoundError(
            2, "--port-file: no such directory", str(Path(args.port_file).parent)
        )
    max_epsilon_total = _cap(args.max_epsilon_total, "--max-epsilon-total")
    max_delta_total = _cap(args.max_delta_total, "--max-delta-total")
    data_port = _data_port(args.data_port)
    _threads(args.threads)
    return ServerConfig(
        role=role,
        store_path=args.db,
        identity=identity,
        listen=args.listen,
        helper_address=args.helper,
        ingest_listen=args.ingest_listen,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        max_tasks=args.max_tasks,
        call_limits=CallLimits(
            calls_per_caller=args.max_calls_per_caller,
            calls_total=args.max_calls,
            uploads_per_caller=args.max_uploads_per_caller,
            uploads_total=args.max_uploads,
        ),
        max_epsilon_total=max_epsilon_total,
        max_delta_total=max_delta_total,
        require_validation=args.require_validation,
        data_port=data_port,
        metrics_listen=args.metrics_listen,
        kind=kind,
        garbling=args.garbling,
        ot=args.ot,
        comparison=args.comparison,
        **({"lease_seconds": args.lease} if args.lease is not None else {}),
    )


def run_server(args: argparse.Namespace) -> int:
    config = check_startup(args)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # gRPC's own loggers (and its C core's tracing) answer to --grpc-log-level only.
    logging.getLogger("grpc").setLevel(getattr(logging, args.grpc_log_level))
    logging.getLogger("asyncio").setLevel(max(logging.INFO, getattr(logging, args.log_level)))
    return asyncio.run(_serve(args, config))


def describe_store(db: str) -> str:
    """Which store a server opened, for its log: the SQLite file's absolute path,
    or the PostgreSQL URL without its password."""
    from svtagg.servers.store.opener import sqlite_file

    path = sqlite_file(db)
    if path is not None:
        return f"SQLite {Path(path).resolve()}"
    from svtagg.servers.store.postgres import redact

    return f"PostgreSQL {redact(db)}"


def _cap(value: str | None, flag: str) -> Fraction | None:
    if value is None or value.strip().lower() == "none":
        return None
    try:
        cap = as_fraction(value, flag)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if cap <= 0:
        raise ValueError(f"{flag} must be > 0")
    return cap


def _data_port(value: str) -> int | None:
    if value.strip().lower() == "off":
        return None
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"--data-port: expected a port number or 'off', got {value!r}") from None
    if not 0 <= port < 65536:
        raise ValueError("--data-port must be in [0, 65535]")
    return port


def _threads(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 64:
        raise ValueError("--threads must be in [1, 64]")
    return value


async def _serve(args: argparse.Namespace, config: ServerConfig) -> int:
    from svtagg.mpc import native
    from svtagg.servers.service import SvtaggServer

    if args.threads is not None:
        native.set_threads(args.threads)
    server = SvtaggServer(config)  # binds the ports, then opens the store
    log = logging.getLogger("svtagg.server")
    log.info("%s store: %s", args.role, describe_store(args.db))
    log.info(
        "comparison engine: %s; garbling: %s; OT extension: %s; comparison path: %s",
        native.describe(),
        config.garbling,
        config.ot or server_ot(),
        # The helper runs whatever path each leader announces.
        PathRule.parse(config.comparison or server_path())
        if args.role == "leader"
        else "the leader's",
    )
    for name, cap, default in (
        ("epsilon", config.max_epsilon_total, DEFAULT_MAX_EPSILON_TOTAL),
        ("delta", config.max_delta_total, DEFAULT_MAX_DELTA_TOTAL),
    ):
        flag = f"--max-{name}-total"
        if cap is None:
            log.warning("%s none: the analyst chooses each task's total %s", flag, name)
        elif getattr(args, flag[2:].replace("-", "_")) == default:
            log.info("budget cap: total %s <= %s (the default; set %s to change)", name, cap, flag)
        else:
            log.info("budget cap: total %s <= %s", name, cap)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers before the port file: a supervisor that stops the server as soon as
    # the file appears gets the orderly shutdown, not the default signal death.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(server.port))
        tmp.replace(args.port_file)
    stopping = asyncio.ensure_future(stop.wait())
    failing = asyncio.ensure_future(server.failed.wait())
    await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    failing.cancel()
    logging.getLogger("svtagg.server").info("shutting down (grace %.1fs)", args.grace)
    await server.stop(args.grace)
    return 1 if server.failed.is_set() else 0
