"""`svtagg doctor`: what this installation runs on and a self-check of it, or,
given a deployment, a check of that deployment from this machine.

Without a deployment (no `--leader`/`--helper`, from the command line or the
settings of `svtagg.deploy.settings`; or with `--local`): names the comparison
engine in use (the native core or the numpy reference, and why), its AES path
and thread count, the base-OT group, then runs a short comparison chunk on every
available engine in this process and checks each against the plaintext answer
(and the engines against each other).  Exit code 0 when every check passes, 3
(local environment) otherwise.

With a deployment (`--leader` and/or `--helper`, and `--certs`), one line per
check, each failure with what to do:

certificates
    the directory holds ca.pem and the analyst's and/or the client's
    certificate and key; each certificate carries its role (`role_of_pem`), was
    issued by ca.pem and is valid now: days left shown, a warning under 30.
leader
    a mutual-TLS connection holding the analyst certificate (the client's when
    there is no analyst's); the certificate the server presents carries the
    leader role and was issued by ca.pem; the analyst API answers (DescribeTask
    of a task that does not exist: NOT_FOUND; Ingest GetTask with a client
    certificate); Health.Check; the round trip is the median of a few health
    checks on the open connection.
helper
    the same against the helper, holding the client certificate when there is
    one: its Ingest service answers (GetTask of no task: NOT_FOUND), and
    Health.Check.
leader -> helper
    the leader's health check answers NOT_SERVING while its own probe of the
    helper fails (`servers.edge.services.HealthService`), so SERVING from the leader
    means the leader reaches its helper, as of its last probe.
clock skew
    not measured, and the report says so: the servers expose no time.  Their
    gRPC answers carry no `date` header (a proxy in front of them may add one,
    but that is the proxy's clock), the TLS 1.3 ServerHello random holds no time
    (TLS 1.2's gmt_unix_time is random bytes in OpenSSL and BoringSSL too), and a
    certificate's validity says when it was issued, not what time it is now.

Exit code 0 when no check fails (warnings included), else that of the first
failure (docs/services.md, "Exit codes"): 3 for a certificate problem (one in
the directory, or a server certificate of the wrong role), 4 for a server that
cannot be reached (nothing at the address, a TLS
handshake refused, a leader that cannot reach its helper), 1 for a server that
refuses this certificate's calls.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import secrets
import socket
import ssl
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svtagg.deploy.failures import (
    EXIT_ENVIRONMENT,
    EXIT_OK,
    EXIT_UNREACHABLE,
    describe_failure,
    explain_tls,
)
from svtagg.proto.vocab import Role

if TYPE_CHECKING:
    import grpc

    from svtagg.proto.tls import Identity

#: Deadline of each call the deployment checks make (seconds).
DEADLINE = 5.0
#: Health checks whose median is a server's round trip.
PINGS = 5
#: A certificate with fewer days of validity left is worth a warning.
WARN_DAYS = 30
#: The statuses of a check; only FAIL sets the exit code.
OK, WARN, FAIL, SKIP, NOT_MEASURED = "ok", "warn", "FAIL", "skip", "n/a"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="name the comparison engine and self-check it, or check a deployment",
        description="Without a deployment: name the comparison engine and self-check it.  "
        "With --leader and/or --helper and --certs (or their settings): check the "
        "deployment from this machine (certificates, each server, the link between "
        "them), one line per check.",
    )
    p.add_argument("--leader", help="check the deployment of this leader (host:port)")
    p.add_argument("--helper", help="check this helper too (host:port)")
    p.add_argument(
        "--certs", help="directory with ca.pem and analyst.pem/.key and/or client.pem/.key"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="check this installation only, even when a deployment is configured",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--k", type=int, default=5000, help="comparisons in the check chunk")
    p.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    if not args.local and (args.leader or args.helper):
        return run_deployment_checks(args)
    return run_local_checks(args)


def engine_line() -> str:
    """`svtagg --version`'s second part: the engine in use."""
    from svtagg.mpc import native

    return native.describe()


async def _check(engine: str, k: int) -> dict[str, Any]:
    import numpy as np

    from svtagg.mpc import native
    from svtagg.mpc.circuits import plain_first_yes
    from svtagg.mpc.protocol import connected_pair

    before = native.active()
    native.use(engine)
    try:
        g, e = await connected_pair()
    finally:
        native.use(before)
    rng = np.random.default_rng()
    sums = -rng.integers(1, 2**30, k)
    sums[rng.integers(k // 2, k)] = 0  # one YES in the second half
    z_l = rng.integers(0, 2**64, k, dtype=np.uint64)
    z_h = sums.astype(np.int64).view(np.uint64) - z_l
    t = time.perf_counter()
    got = await asyncio.gather(g.first_yes(z_l, 40), e.first_yes(z_h, 40))
    seconds = time.perf_counter() - t
    want = plain_first_yes(z_l, z_h)
    return {
        "engine": engine,
        "ok": got == [want, want],
        "seconds": round(seconds, 4),
        "comparisons_per_s": round(k / seconds),
        "bytes_per_comparison": round((g.last_stats.bytes_sent + g.last_stats.bytes_received) / k),
    }


def run_local_checks(args: argparse.Namespace) -> int:
    """The installation's report and engine self-check (the module docstring)."""
    from svtagg import __version__
    from svtagg.mpc import native

    if args.k < 1:
        raise ValueError("--k must be >= 1")
    from svtagg.mpc.ot import default_group

    try:
        import gmpy2  # noqa: F401

        gmp = True
    except ImportError:
        gmp = False
    group = default_group()
    engines = ["numpy"] + (["native"] if native.available() else [])
    checks = [asyncio.run(_check(name, args.k)) for name in engines]
    report: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "engine": native.active(),
        "engine_detail": native.describe(),
        "native_available": native.available(),
        "threads": native.threads(),
        "base_ot_group": group,
        "gmp": gmp,
        "checks": checks,
        "ok": all(c["ok"] for c in checks),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"svtagg {__version__} on Python {report['python']}, {report['machine']}")
        print(f"comparison engine: {report['engine_detail']}")
        ref = "GMP (gmpy2)" if gmp else "Python integers (gmpy2 not installed)"
        group_text = (
            "Ed25519 (libsodium)" if group == "ed25519" else "3072-bit MODP (PyNaCl missing)"
        )
        print(f"base OTs: {group_text}; the reference MODP group on {ref}")
        for c in checks:
            verdict = "ok" if c["ok"] else "WRONG ANSWER"
            print(
                f"check {c['engine']:>6}: {verdict}; {args.k:,} comparisons in "
                f"{c['seconds']:.3f} s ({c['comparisons_per_s']:,}/s, "
                f"{c['bytes_per_comparison']:,} bytes each, both parties in this process)"
            )
    return 0 if report["ok"] else EXIT_ENVIRONMENT


# ---------------------------------------------------------------- a deployment
@dataclass(frozen=True)
class Check:
    """One line of the deployment report."""

    name: str
    status: str
    detail: str
    #: What to do about a failure or a warning.
    hint: str = ""
    #: The exit code a failure stands for.
    exit_code: int = EXIT_OK
    #: Figures for `--json` (days left, round trip in ms, ...).
    figures: dict[str, Any] = field(default_factory=dict)
    #: The server checked, if any.
    address: str = ""

    def line(self) -> str:
        label = f"{self.name} {self.address}" if self.address else self.name
        text = f"{self.status:<4} {label}: {self.detail}"
        return f"{text} — {self.hint}" if self.hint else text


@dataclass(frozen=True)
class ServerView:
    """What a server's check learned that the link check reads."""

    answered: bool
    serving: bool


def run_deployment_checks(args: argparse.Namespace) -> int:
    from svtagg import __version__

    if args.certs is None:
        raise ValueError("checking a deployment needs --certs DIR (or SVTAGG_CERTS)")
    certs = Path(args.certs)
    certificates, identities = check_certificates(certs)
    checks = [certificates]
    views: dict[Role, ServerView] = {}
    for role, address in ((Role.LEADER, args.leader), (Role.HELPER, args.helper)):
        if not address:
            option = f"--{role} or SVTAGG_{role.upper()}"
            checks.append(Check(role, SKIP, f"not checked: no address given ({option})"))
        elif not identities:
            checks.append(Check(role, SKIP, "not checked: no usable certificate"))
        else:
            found, views[role] = check_server(role, address, certs, identities)
            checks.append(replace(found, address=address))
    checks.append(check_link(views.get(Role.LEADER), views.get(Role.HELPER)))
    checks.append(
        Check("clock skew", NOT_MEASURED, "not measurable from the client (servers expose no time)")
    )
    failed = [c for c in checks if c.status == FAIL]
    rc = failed[0].exit_code if failed else EXIT_OK
    if args.json:
        report = {
            "version": __version__,
            "leader": args.leader,
            "helper": args.helper,
            "certs": str(certs),
            "checks": [asdict(c) for c in checks],
            "ok": not failed,
            "exit_code": rc,
        }
        print(json.dumps(report, indent=2))
    else:
        for c in checks:
            print(c.line())
    return rc


def _days_left(pem: bytes) -> int:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    return (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).days


def check_certificates(certs: Path) -> tuple[Check, dict[Role, Identity]]:
    """The directory's analyst and client identities that pass `load_identity`
    (the role, issued by ca.pem, valid now, the key matching), with the days
    each has left; a failure names the file at fault."""
    from svtagg.proto.tls import CertificateError, load_identity

    name = "certificates"
    roles = [r for r in (Role.ANALYST, Role.CLIENT) if (certs / f"{r}.pem").is_file()]
    try:
        # With neither certificate, load_identity says what is missing (the
        # directory, ca.pem or analyst.pem).
        identities = {r: load_identity(certs, r) for r in roles or [Role.ANALYST]}
    except CertificateError as exc:
        hint = "point --certs at the analyst's certificate directory (`svtagg certs` makes one)"
        return Check(name, FAIL, str(exc), hint, EXIT_ENVIRONMENT), {}
    ca = next(iter(identities.values())).ca
    days = {"ca": _days_left(ca), **{str(r): _days_left(i.cert) for r, i in identities.items()}}
    listed = ", ".join(f"{f}.pem ({d} days left)" for f, d in days.items())
    detail = f"{certs}: {listed}; each issued by ca.pem, with its role"
    soonest = min(days, key=days.__getitem__)
    if days[soonest] < WARN_DAYS:
        hint = f"{soonest}.pem expires in {days[soonest]} days: issue new certificates before then"
        return Check(name, WARN, detail, hint, figures={"days_left": days}), identities
    return Check(name, OK, detail, figures={"days_left": days}), identities


def check_server(
    role: Role, address: str, certs: Path, identities: dict[Role, Identity]
) -> tuple[Check, ServerView]:
    """Connect to the `role` server at `address` as the analyst (the leader) or
    the client (the helper), whichever of the two `identities` holds; see the
    module docstring for what is checked."""
    import grpc

    from svtagg.proto import health_pb2, health_pb2_grpc
    from svtagg.proto.tls import tls_target
    from svtagg.proto.vocab import CHANNEL_OPTIONS

    order = (Role.ANALYST, Role.CLIENT) if role == Role.LEADER else (Role.CLIENT, Role.ANALYST)
    holder = next(r for r in order if r in identities)
    ident = identities[holder]
    name = str(role)
    creds = grpc.ssl_channel_credentials(ident.ca, ident.key, ident.cert)
    options = [*CHANNEL_OPTIONS, *tls_target(role)]
    with grpc.secure_channel(address, creds, options=options) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        try:
            answer = health.Check(request, timeout=DEADLINE)  # connects
            rtts = []
            for _ in range(PINGS):
                start = time.perf_counter()
                answer = health.Check(request, timeout=DEADLINE)
                rtts.append(time.perf_counter() - start)
            service = _service_answers(channel, role, holder, name)
        except grpc.RpcError as exc:
            return _unreachable(exc, role, address, certs, holder), ServerView(False, False)
    serving = answer.status == health_pb2.HealthCheckResponse.SERVING
    view = ServerView(True, serving)
    if isinstance(service, Check):
        return service, view
    rtt_ms = statistics.median(rtts) * 1000
    figures: dict[str, Any] = {"as": str(holder), "rtt_ms": round(rtt_ms, 3)}
    facts = [f"as {holder}"]
    presented = _presented_certificate(address, certs, holder, role)
    if presented is not None and presented.pem is not None:
        wrong = _certificate_problems(presented.pem, ident.ca, role)
        if wrong is not None:
            return Check(name, FAIL, *wrong, EXIT_ENVIRONMENT), view
        days = _days_left(presented.pem)
        figures["days_left"] = days
        facts.append(f"{role} certificate from your CA, {days} days left")
    facts += [
        f"{service} answers",
        f"Health {'SERVING' if serving else 'NOT_SERVING'}",
        f"round trip {rtt_ms:.1f} ms (median of {PINGS})",
    ]
    detail = "; ".join(facts)
    if not serving and role == Role.LEADER:
        return Check(name, WARN, detail, "see the leader -> helper check", figures=figures), view
    if not serving:
        hint = "it is shutting down (a helper answers NOT_SERVING only then): start it again"
        return Check(name, FAIL, detail, hint, EXIT_UNREACHABLE, figures), view
    if "days_left" in figures and figures["days_left"] < WARN_DAYS:
        hint = f"its certificate expires in {figures['days_left']} days: issue a new one"
        return Check(name, WARN, detail, hint, figures=figures), view
    return Check(name, OK, detail, figures=figures), view


def _service_answers(channel: grpc.Channel, role: Role, holder: Role, name: str) -> str | Check:
    """Ask the service `holder` would use for a task that does not exist: NOT_FOUND
    proves the service answers this certificate.  Its name, or the failed Check."""
    import grpc

    from svtagg.proto import svtagg_pb2 as pb
    from svtagg.proto import svtagg_pb2_grpc as pb_grpc

    if role == Role.LEADER and holder == Role.ANALYST:
        service, call = "analyst API", pb_grpc.AnalystStub(channel).DescribeTask
    else:
        service, call = "Ingest", pb_grpc.IngestStub(channel).GetTask
    task = f"doctor-no-such-task-{secrets.token_hex(4)}"
    try:
        call(pb.TaskRef(task_id=task), timeout=DEADLINE)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return service
        found = describe_failure(exc)
        rc, message = found if found is not None else (EXIT_UNREACHABLE, str(exc))
        hint = f"the {role}'s {service} must accept a {holder} certificate of its CA"
        return Check(name, FAIL, f"{service}: {message}", hint, rc)
    return service  # a task of that name exists: the service answered all the same


def _unreachable(exc: grpc.RpcError, role: Role, address: str, certs: Path, holder: Role) -> Check:
    """The failed Check of a server whose health check did not answer: gRPC's
    reason, explained (`explain_tls`), and what the server's certificate shows."""
    import grpc

    name = str(role)
    details = " ".join(str(exc.details()).split())
    tls = explain_tls(details)
    # Not `explain_connect`: gRPC says "failed to connect" of a TLS failure too.
    if tls is None and "connection refused" in details.lower():
        detail = f"nothing answers at {address} (connection refused)"
        hint = f"is the {role}'s address right and its server running?"
        return Check(name, FAIL, detail, hint, EXIT_UNREACHABLE)
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        detail = f"no answer from {address} within {DEADLINE:g} s"
        hint = "is the host right, and its port open to this machine?"
        return Check(name, FAIL, detail, hint, EXIT_UNREACHABLE)
    found = describe_failure(exc)
    rc, detail = found if found is not None else (EXIT_UNREACHABLE, details)
    detail = tls or detail.removeprefix("unreachable: ")
    hint = "use the certificates of this deployment's CA (the one that issued its servers')"
    presented = _presented_certificate(address, certs, holder, role)
    if presented is not None and presented.pem is not None:
        wrong = _certificate_problems(presented.pem, (certs / "ca.pem").read_bytes(), role)
        if wrong:
            return Check(name, FAIL, f"{detail}; {wrong[0]}", wrong[1], rc)
    if presented is not None and presented.refused:
        detail = (
            f"TLS handshake failed: the {role} closed the connection after the handshake: "
            f"it does not accept your {holder} certificate (issued by another CA?)"
        )
        return Check(name, FAIL, detail, hint, rc)
    return Check(name, FAIL, detail, hint if tls else "", rc)


@dataclass(frozen=True)
class Presented:
    """What a server shows in a TLS handshake."""

    #: Its certificate (None if it showed none).
    pem: bytes | None
    #: It closed the connection after the handshake: it refused ours.
    refused: bool


def _presented_certificate(address: str, certs: Path, holder: Role, role: Role) -> Presented | None:
    """The handshake gRPC makes with the `role` server (HTTP/2, holding `holder`'s
    certificate), made with Python's ssl to look at the server's certificate
    whatever it is: gRPC only says that it failed to verify.  None when no
    handshake can be made."""
    from svtagg.proto.tls import server_name

    host, _, port = address.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # `_certificate_problems` inspects it
    ctx.load_cert_chain(certs / f"{holder}.pem", certs / f"{holder}.key")
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=DEADLINE) as raw,
            ctx.wrap_socket(raw, server_hostname=server_name(role)) as sock,
        ):
            der = sock.getpeercert(binary_form=True)
            # A server that accepts the certificate sends its HTTP/2 settings; one
            # that refuses it closes the connection (or sends an alert) instead.
            try:
                refused = not sock.recv(1)
            except ssl.SSLError:
                refused = True
            except OSError:
                refused = False  # silent: nothing here says a certificate is wrong
    except (OSError, ValueError):
        return None
    return Presented(ssl.DER_cert_to_PEM_cert(der).encode() if der else None, refused)


def _certificate_problems(pem: bytes, ca_pem: bytes, role: Role) -> tuple[str, str] | None:
    """What is wrong with the certificate the `role` server presents, and what to
    do about it; None if nothing."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    from svtagg.proto.tls import role_of_pem

    try:
        x509.load_pem_x509_certificate(pem).verify_directly_issued_by(
            x509.load_pem_x509_certificate(ca_pem)
        )
        ours = True
    except (ValueError, TypeError, InvalidSignature):
        ours = False
    found = role_of_pem(pem)
    if found == role and ours:
        return None
    shown = f"a {found}" if found else "no svtagg role's"
    text = f"it presents {shown} certificate{'' if ours else ' of another CA'}"
    if found != role and found is not None and ours:
        return text, f"is the address the {role}'s? It is the {found}'s"
    if found != role:
        return text, f"the {role} needs a {role} certificate of this deployment's CA"
    return text, "use the certificates of this deployment's CA (the one that issued its servers')"


def check_link(leader: ServerView | None, helper: ServerView | None) -> Check:
    """Whether the leader reaches its helper, from the leader's health status."""
    name = "leader -> helper"
    if leader is None:
        return Check(name, SKIP, "not checked: no leader checked")
    if not leader.answered:
        return Check(name, SKIP, "not checked: the leader did not answer")
    if leader.serving:
        return Check(
            name,
            OK,
            "the leader reaches its helper (its health check answers SERVING only "
            "while its own probe of the helper succeeds)",
        )
    if helper is None:
        hint = "check the helper with --helper ADDR; the leader's log names the cause"
    elif not helper.answered or not helper.serving:
        hint = "start the helper, or fix what the helper check says"
    else:
        hint = (
            "the helper answers this machine but not the leader: check the leader's "
            "--helper address, the network between them, and that both servers hold "
            "certificates of one CA; the leader's log names the cause"
        )
    detail = (
        "the leader answers NOT_SERVING: the helper is unreachable from the leader "
        "(or the leader is shutting down)"
    )
    return Check(name, FAIL, detail, hint, EXIT_UNREACHABLE)
