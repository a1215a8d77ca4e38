"""The one refusal hierarchy.  Oracles, servers and the remote client raise these
domain exceptions; `svtagg.proto.vocab` maps each to exactly one gRPC status code
and back, so a refusal keeps its meaning across the wire."""

from __future__ import annotations


class Refusal(Exception):
    """A request refused with a message meant for the caller (never naming data)."""


class InvalidArgument(Refusal, ValueError):
    """Malformed or out-of-range input.  Also a ValueError, the Python meaning."""


class NotFound(Refusal):
    """Unknown task or stream."""


class AlreadyExists(Refusal):
    """Task id taken, or a report id already stored: a replay."""


class FailedPrecondition(Refusal):
    """Right input at the wrong time: collection state, a stream's state."""


class StreamClosed(FailedPrecondition):
    """The stream already answered YES / Close (or failed) and answers no more."""


class ResourceExhausted(Refusal):
    """A capacity bound (n_max, batch or chunk size) was reached."""


class BudgetExhausted(ResourceExhausted):
    """Opening the stream would exceed the task's (ε, δ) budget."""


class RateLimited(ResourceExhausted):
    """Too many requests from one caller; retry later (spends nothing)."""


class ChunkTooLarge(ResourceExhausted, ValueError):
    """More queries than one chunk may hold: a capacity bound, and for in-process
    callers a bad argument, so it is both."""


class PeerUnavailable(Refusal):
    """The other server (or the servers, seen from a client) could not be reached
    or failed mid-protocol."""
