"""The transport-free part of the wire vocabulary: roles, addresses, limits
and deadlines.  It imports no gRPC and no generated code, so the servers'
domain code (`servers.core`, the stores, ingest) can use it and stay
transport-free (an import contract in pyproject.toml holds them to it);
`proto.vocab` re-exports every name, with the gRPC side (channel options,
status codes, protobuf conversions)."""

from __future__ import annotations

import re
from enum import StrEnum


class Role(StrEnum):
    """Who a certificate belongs to (its subject's OU), and so which RPCs it may call."""

    LEADER = "leader"
    HELPER = "helper"
    ANALYST = "analyst"
    CLIENT = "client"


SERVER_ROLES = (Role.LEADER, Role.HELPER)

#: host:port, the host a name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


def check_address(value: str, what: str, *, listen: bool = False) -> str:
    """`value` when it is host:port (port 0, "any free port", only where a server
    listens); else ValueError naming `what`.  Without this gRPC would dial port
    443 for a bare host name, and a listener would report a port in use."""
    found = _ADDRESS_RE.fullmatch(value.strip())
    if found is None:
        raise ValueError(
            f"{what}: expected host:port (e.g. localhost:7443 or [::1]:7443), got {value!r}"
        )
    port = int(found.group(2))
    if not (0 if listen else 1) <= port <= 65535:
        lowest = 0 if listen else 1
        raise ValueError(f"{what}: port {port} is outside [{lowest}, 65535] in {value!r}")
    return value.strip()


# ---------------------------------------------------------------- limits
#: Random id of one report, the same on both servers.
REPORT_ID_BYTES = 16
#: Report ids per reconciliation message (ListReports pages, DropReports
#: batches): 1 MiB of ids, far below the message cap, whatever the task's size.
REPORT_PAGE = 65536
#: Random id of one robust-aggregate pass of a close (ChunkHeader.pass_id).
PASS_ID_BYTES = 16
#: The helper's share of a report: a PRG seed it expands to d ring elements.
SEED_BYTES = 16
#: Largest upload batch in reports.
MAX_BATCH_REPORTS = 10_000
#: Reports × d per batch: bounds the helper's seed expansion (8 bytes of AES
#: keystream per value) and the leader's share arithmetic for one request.
MAX_BATCH_VALUES = 1 << 24
#: Largest gRPC message either end accepts; protocol traffic between the servers
#: is cut into FRAGMENT-sized frames (a chunk of 10^5 comparisons sends ~350 MB).
MAX_MESSAGE_BYTES = 64 << 20
FRAGMENT = 1 << 20
#: What verifying one upload batch of a task with a validity circuit may
#: allocate on either server (`Validity.verify_bytes` per report): bounds the
#: batch before any share is decoded, whatever the shares' own size.
MAX_VERIFY_BYTES = 256 << 20
#: Upload batches one server verifies at once (each within MAX_VERIFY_BYTES);
#: more wait their turn.
VERIFY_SLOTS = 2
#: Tasks one server holds (ListTasks answers them in one message).
MAX_TASKS = 10_000

# ---------------------------------------------------------------- deadlines (seconds)
#: Every unary leader → helper call.
PEER_DEADLINE = 15.0
#: One chunk of the comparison protocol on a session.
CHUNK_DEADLINE = 600.0
#: Opening a comparison session (base OTs).
SETUP_DEADLINE = 60.0
#: Analyst and client calls (the CLI and SDK defaults).
CALL_DEADLINE = 30.0
