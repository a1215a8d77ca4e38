"""The one wire vocabulary: roles, limits, channel options, deadlines, the
protobuf ↔ domain conversions, and the table between refusals and gRPC status
codes.  Every role imports these from here; nothing else defines them."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from svtagg.dp.errors import (
    AlreadyExists,
    BudgetExhausted,
    ChunkTooLarge,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PeerUnavailable,
    RateLimited,
    Refusal,
    ResourceExhausted,
    StreamClosed,
)
from svtagg.dp.kinds import StreamKind
from svtagg.dp.plans import PlanBook
from svtagg.dp.queries import Outcome
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.terms import (  # noqa: F401 - re-exported: vocab is every role's one import
    CALL_DEADLINE,
    CHUNK_DEADLINE,
    FRAGMENT,
    MAX_BATCH_REPORTS,
    MAX_BATCH_VALUES,
    MAX_MESSAGE_BYTES,
    MAX_TASKS,
    MAX_VERIFY_BYTES,
    PASS_ID_BYTES,
    PEER_DEADLINE,
    REPORT_ID_BYTES,
    REPORT_PAGE,
    SEED_BYTES,
    SERVER_ROLES,
    SETUP_DEADLINE,
    VERIFY_SLOTS,
    Role,
    check_address,
)

#: Message-size limits for every channel, on both ends.
CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
#: A server also refuses to share its port (so a second server on it fails loudly).
SERVER_OPTIONS: list[tuple[str, int | str]] = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]

# ---------------------------------------------------------------- conversions
KIND_TO_PB = {
    StreamKind.LAP24: pb.LAP24,
    StreamKind.LAP3: pb.LAP3,
    StreamKind.EXP3: pb.EXP3,
    StreamKind.CTT: pb.CTT,
    StreamKind.NMAX: pb.NMAX,
    StreamKind.CRAWL: pb.CRAWL,
}
_KIND_FROM_PB = {v: k for k, v in KIND_TO_PB.items()}

OUTCOME_TO_PB = {Outcome.HIGH: pb.HIGH, Outcome.LOW: pb.LOW, Outcome.CLOSE: pb.CLOSE}
_OUTCOME_FROM_PB = {v: k for k, v in OUTCOME_TO_PB.items()}
#: The comparison circuit's codes (svtagg.mpc.circuits.CttCode: 0, 1, 2).
OUTCOME_OF_CODE = (Outcome.HIGH, Outcome.LOW, Outcome.CLOSE)


def kind_from_pb(value: int) -> StreamKind:
    if value not in _KIND_FROM_PB:
        raise InvalidArgument(f"unknown stream kind {value}")
    return _KIND_FROM_PB[value]  # type: ignore[index]


def outcome_from_pb(value: int) -> Outcome:
    if value not in _OUTCOME_FROM_PB:
        raise ValueError(f"unknown outcome {value}")
    return _OUTCOME_FROM_PB[value]  # type: ignore[index]


def plan_request(task_id: str, book: PlanBook, plan_id: str = "") -> pb.PlanRequest:
    """The request that reserves `book`'s groups and slack δ' (the leader names
    the plan when it forwards it to the helper)."""
    return pb.PlanRequest(
        task_id=task_id,
        plan_id=plan_id,
        groups=[pb.PlanGroup(epsilon=str(g.epsilon), delta=str(g.delta)) for g in book.groups],
        delta_slack=str(book.slack),
    )


def join_ids(ids: Sequence[bytes]) -> bytes:
    return b"".join(ids)


def split_ids(blob: bytes) -> list[bytes]:
    """Concatenated 16-byte report ids back to a list."""
    if len(blob) % REPORT_ID_BYTES:
        raise InvalidArgument(f"report ids must be {REPORT_ID_BYTES} bytes each")
    return [blob[i : i + REPORT_ID_BYTES] for i in range(0, len(blob), REPORT_ID_BYTES)]


# ---------------------------------------------------------------- refusals ↔ status codes
#: Each refusal's status code.  Several refusals share a code; the trailing
#: metadata entry REFUSAL_KEY (or PeerStatus.refusal) names the exact class, so
#: the receiving side tells budget exhaustion from a rate limit without reading
#: message text.
STATUS_OF: dict[type[Refusal], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    StreamClosed: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    BudgetExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RateLimited: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ChunkTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
}
_BY_NAME = {cls.__name__: cls for cls in STATUS_OF}
#: Trailing-metadata key carrying the refusal's class name.
REFUSAL_KEY = "svtagg-refusal"


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """(status code, refusal name) of a refusal, None for an internal error.  A
    bare ValueError from domain code is a bad argument."""
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls], cls.__name__  # type: ignore[attr-defined]
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument.__name__
    return None


def refusal_of(code: grpc.StatusCode | int, message: str, name: str = "") -> Refusal:
    """The domain refusal for a status (by name when the sender gave one; by code
    otherwise; anything unknown means the other side is unavailable)."""
    if isinstance(code, int):
        code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    cls = _BY_NAME.get(name)
    if cls is None or STATUS_OF[cls] != code:
        cls = next((c for c, s in STATUS_OF.items() if s == code), PeerUnavailable)
    return cls(message)


def refusal_from_rpc(exc: grpc.RpcError, prefix: str = "") -> Refusal:
    """The refusal a failed call stands for, keeping the server's message."""
    code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
    name = ""
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == REFUSAL_KEY:
            name = value if isinstance(value, str) else value.decode()
    return refusal_of(code, f"{prefix}{code.name}: {exc.details()}", name)  # type: ignore[attr-defined]


def refusal_status(exc: BaseException) -> pb.PeerStatus:
    """A refusal as a PeerStatus frame (unknown errors become INTERNAL)."""
    found = status_of(exc)
    code, name = found if found else (grpc.StatusCode.INTERNAL, "")
    return pb.PeerStatus(ok=False, code=code.value[0], message=str(exc), refusal=name)


def refusal_from_status(status: pb.PeerStatus, prefix: str = "") -> Refusal:
    return refusal_of(status.code, f"{prefix}{status.message}", status.refusal)
