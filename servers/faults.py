"""Crash points for fault-injection tests (issue 6): a server started with
SVTAGG_CRASH_AT=<point> exits at once, as with kill -9, when it reaches that
point.  Unset in production, where `crash_point` is one dictionary lookup."""

from __future__ import annotations

import os

#: The points the server passes, in order of a request's life.
POINTS = (
    "upload.after_store",   # a batch is committed, the answer not yet sent
    "open.after_charge",    # the ledger charge is committed, γ not yet drawn
    "open.before_helper",   # the leader has charged and drawn γ_L, the helper not yet
    "chunk.after_mark",     # the in_chunk mark is committed, the circuit not yet run
    "chunk.after_result",   # the circuit ran, its result not yet recorded
)


def crash_point(name: str) -> None:
    if os.environ.get("SVTAGG_CRASH_AT") == name:
        os._exit(137)
