"""The RPC guard every servicer method wears: the caller's role from its
(CA-verified) certificate, its rate limit, and refusals mapped to status codes
with `svtagg.proto.vocab`'s one table."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import grpc

from svtagg.dp.errors import InvalidArgument, RateLimited
from svtagg.proto.tls import role_of_pem
from svtagg.proto.vocab import REFUSAL_KEY, Role, status_of
from svtagg.proto.wire import UNDECODABLE
from svtagg.servers.edge.limits import RateLimiter

if TYPE_CHECKING:
    from svtagg.servers.edge.metrics import Metrics

log = logging.getLogger("svtagg.server")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Stands for "no client certificate", possible only on the optional
#: server-only-TLS ingest port (the main port's handshake demands a certificate).
ANONYMOUS = ""
#: Longest refusal text a call ends with (bytes of UTF-8).
MAX_DETAIL = 1000


def request_ref(request: Any) -> str:
    """The task / stream / plan a request names, for log lines ('' if none).
    Identifiers only: never values, thresholds or shares."""
    parts = []
    for attr in ("task_id", "stream_id", "plan_id"):
        value = getattr(request, attr, "")
        if isinstance(value, str) and value:
            parts.append(f"{attr.removesuffix('_id')}={value[:64]!r}")
    return " ".join(parts)


async def abort_with(
    context: grpc.aio.ServicerContext,
    exc: BaseException,
    method: str,
    request: Any = None,
    metrics: Metrics | None = None,
) -> None:
    """End the call with `exc`'s status (a refusal's code and name, logged by the
    method and the ids the request names; anything else an internal error)."""
    found = status_of(exc)
    ref = request_ref(request)
    if found is None:
        log.exception("internal error in %s %s", method, ref)
        await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
        return
    code, name = found
    if metrics is not None:
        metrics.refusals.labels(method=method, code=code.name).inc()
    # The method, the ids it names and the code: messages may name parameters, never data.
    log.info("%s %s refused: %s (%s)", method, ref or "-", code.name, name)
    # A refusal's text is cut to MAX_DETAIL: it may quote the request, and
    # gRPC's metadata limit would otherwise break the call.
    detail = str(exc)
    if len(detail.encode()) > MAX_DETAIL:  # bytes: gRPC's metadata limit counts them
        detail = detail.encode()[: MAX_DETAIL - 3].decode(errors="ignore") + "…"
    await context.abort(code, detail, trailing_metadata=((REFUSAL_KEY, name),))


def rpc(*roles: str) -> Callable[[F], F]:
    """Allow only callers whose certificate has one of `roles` (ANONYMOUS: none at
    all) and within their rate limit; map refusals to statuses."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            caller = peer_role(context) or ANONYMOUS
            if caller not in roles:
                await refuse_role(context, method.__name__, roles, caller)
            try:
                if request is UNDECODABLE:
                    raise InvalidArgument(
                        f"{method.__name__}: the request does not parse as its protobuf message"
                    )
                # The leader (the only holder of the leader certificate) drives the
                # helper at protocol speed; every other caller is rate limited.
                if caller != Role.LEADER:
                    check_rate(getattr(self, "limiter", None), context)
                return await method(self, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - every refusal becomes a status
                await abort_with(
                    context, exc, method.__name__, request, getattr(self, "metrics", None)
                )
                raise

        # The roles, for admission to refuse a caller before its request is read.
        handler.roles = tuple(roles)  # type: ignore[attr-defined]
        return handler  # type: ignore[return-value]

    return wrap


async def refuse_role(
    context: grpc.aio.ServicerContext, name: str, roles: Sequence[str], caller: str
) -> None:
    """End the call: method `name` serves only `roles` (ANONYMOUS: no
    certificate), and the caller presented `caller`."""
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        f"{name} needs a certificate of role {' or '.join(r or 'none' for r in roles)}; "
        f"caller presented {caller or 'none'}",
    )


def check_rate(
    limiter: RateLimiter | None, context: grpc.aio.ServicerContext, caller: str | None = None
) -> None:
    """One request of the caller (`caller_identity`, if not given) against its
    rate limit (RateLimited beyond it)."""
    if limiter is None:
        return
    if not limiter.allow(caller if caller is not None else caller_identity(context)):
        raise RateLimited(
            f"rate limit: at most {limiter.rate:g} requests/s "
            f"(bursts of {limiter.burst:g}) per caller; retry later"
        )


def caller_identity(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for rate limits: the certificate's hash, else the address."""
    certs = context.auth_context().get("x509_pem_cert")
    if certs:
        return "cert:" + hashlib.sha256(certs[0]).hexdigest()
    peer = context.peer() or ""
    host = peer.rsplit(":", 1)[0]
    if host.startswith("ipv6:"):
        # One IPv6 subscriber holds a /64: its addresses are one caller.
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(f"{host[5:].strip('[]').split('%')[0]}/64", strict=False)
            return f"addr:ipv6:{net}"
    return "addr:" + host


def peer_role(context: grpc.aio.ServicerContext) -> Role | None:
    certs = context.auth_context().get("x509_pem_cert")
    return role_of_pem(certs[0]) if certs else None


#: The servicer context every handler receives.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
