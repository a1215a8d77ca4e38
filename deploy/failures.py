"""How an expected failure reads on the command line: the exit codes (the
table in `svtagg.deploy.cli`'s docstring) and the one line each failure
becomes, with TLS and connection failures explained.  Shared by the command
line and `svtagg doctor`."""

from __future__ import annotations

import re
import sqlite3

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no detail)"


#: gRPC/OpenSSL wording of a failed TLS handshake → what it means for the caller.
_TLS_FAILURES = (
    (
        ("hostname verification", "peer name", "target name"),
        "the server's certificate is not for the role dialled (is the address the "
        "leader's, not the helper's or another service's?)",
    ),
    (
        ("bad_signature", "certificate_verify_failed", "certificate verify failed",
         "unable to get local issuer", "self signed", "self-signed"),
        "the server's certificate was not issued by the CA in your certificate "
        "directory's ca.pem (certificates of another deployment?)",
    ),
    (
        ("unknown ca", "unknown_ca", "bad certificate", "bad_certificate",
         "certificate required", "alert"),
        "the server refused this certificate (not issued by its CA, or not for this role)",
    ),
)  # fmt: skip


def explain_tls(details: str) -> str | None:
    """One line for a TLS handshake failure in gRPC's `details`, else None."""
    text = details.lower()
    if not any(w in text for w in ("ssl", "tls", "handshake", "certificate", "verification")):
        return None
    for words, meaning in _TLS_FAILURES:
        if any(word in text for word in words):
            return f"TLS handshake failed: {meaning}"
    return "TLS handshake failed (run with GRPC_VERBOSITY=DEBUG for the details)"


def explain_connect(details: str) -> str | None:
    """One line for a connection nobody answered (a wrong port or host, a server
    not started) in gRPC's `details`, else None."""
    text = details.lower()
    # Not "socket closed" after a TLS handshake, and not the leader's relayed
    # "helper unreachable" (its words name the server that failed).
    if "connection refused" not in text or "helper unreachable" in text:
        return None
    found = re.search(r"(?:ipv4:|ipv6:|dns:)?(\[[^\]]+\]:\d+|[\w.-]+:\d+)", details)
    where = found.group(1) if found else "the address given"
    return (
        f"nothing answers at {where} (connection refused: is the address right and the "
        "server running? `svtagg doctor --leader ADDR --certs DIR` checks a deployment)"
    )


def explain_unreachable(details: str) -> str:
    """`details` of an unreachable server, explained where the cause is known."""
    return explain_tls(details) or explain_connect(details) or details


def describe_failure(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one-line message) for an expected failure; None: a bug."""
    import grpc

    from svtagg.client.upload import InputError, UploadError
    from svtagg.dp.errors import PeerUnavailable, Refusal
    from svtagg.proto.tls import CertificateError

    unreachable = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    if isinstance(exc, grpc.RpcError):
        code = exc.code()  # type: ignore[attr-defined]
        details = _one_line(exc.details())  # type: ignore[attr-defined]
        if code in unreachable:
            why = explain_tls(details) or explain_connect(details) or f"{code.name}: {details}"
            return EXIT_UNREACHABLE, f"unreachable: {why}"
        return EXIT_REFUSED, f"refused: {code.name}: {details}"
    if isinstance(exc, UploadError):
        rc = EXIT_UNREACHABLE if exc.unreachable else EXIT_REFUSED
        text = _one_line(str(exc))
        tls = explain_tls(text)
        if tls is not None:  # keep which server failed ("helper could not be reached")
            text = f"{text.split(': ', 1)[0]}: {tls}"
        return rc, f"upload failed: {text}"
    if isinstance(exc, InputError):
        return EXIT_USAGE, f"bad input: {_one_line(str(exc))}"
    if isinstance(exc, CertificateError):
        return EXIT_ENVIRONMENT, f"certificate: {_one_line(str(exc))}"
    if isinstance(exc, PeerUnavailable):
        return EXIT_UNREACHABLE, f"unreachable: {explain_unreachable(_one_line(str(exc)))}"
    if isinstance(exc, Refusal):
        return EXIT_REFUSED, f"refused: {type(exc).__name__}: {_one_line(str(exc))}"
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        where = exc.filename or ""
        return EXIT_ENVIRONMENT, f"{exc.strerror or 'not found'}: {where}".rstrip(": ")
    if isinstance(exc, PermissionError):
        return EXIT_ENVIRONMENT, f"permission denied: {exc.filename or _one_line(str(exc))}"
    if isinstance(exc, FileExistsError):
        return EXIT_ENVIRONMENT, _one_line(str(exc))
    if isinstance(exc, OSError):
        return EXIT_ENVIRONMENT, _one_line(str(exc))
    if isinstance(exc, sqlite3.Error):
        return EXIT_ENVIRONMENT, f"store: {_one_line(str(exc))}"
    if isinstance(exc, ValueError):
        return EXIT_USAGE, f"error: {_one_line(str(exc))}"
    return None
