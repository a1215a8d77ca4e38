"""Refusals a server can give, as domain exceptions; the service edge maps each
to one gRPC status code (see `servers.service.STATUS_OF`)."""

from __future__ import annotations


class ServerError(Exception):
    """A refusal with a message meant for the caller."""


class InvalidArgument(ServerError):
    """Malformed or out-of-range input (INVALID_ARGUMENT)."""


class NotFound(ServerError):
    """Unknown task or stream (NOT_FOUND)."""


class AlreadyExists(ServerError):
    """Task id taken, or a report id already stored: a replay (ALREADY_EXISTS)."""


class FailedPrecondition(ServerError):
    """Right input at the wrong time: collection state, closed stream (FAILED_PRECONDITION)."""


class ResourceExhausted(ServerError):
    """Privacy budget or a capacity limit (n_max) exhausted (RESOURCE_EXHAUSTED)."""


class PeerUnavailable(ServerError):
    """The other server could not be reached or failed mid-protocol (UNAVAILABLE)."""
