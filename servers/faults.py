"""Crash points for fault-injection tests (issue 6): a server started with
SVTAGG_CRASH_AT=<point> kills itself with SIGKILL when it reaches that point
(after skipping the first SVTAGG_CRASH_SKIP passes, default 0).  Unset in
production, where `crash_point` is one dictionary lookup."""

from __future__ import annotations

import os
import signal

#: The points the server passes, in order of a request's life.
POINTS = (
    "upload.mid_store",     # inside the batch's transaction: shares appended, not committed
    "upload.after_store",   # a batch is committed, the answer not yet sent
    "open.after_charge",    # the ledger charge is committed, γ not yet drawn
    "open.before_helper",   # the leader has charged and drawn γ_L, the helper not yet
    "chunk.after_mark",     # the in_chunk mark is committed, the circuit not yet run
    "chunk.after_result",   # the circuit ran (e.g. a YES), its result not yet recorded
)

_passes: dict[str, int] = {}


def crash_point(name: str) -> None:
    if os.environ.get("SVTAGG_CRASH_AT") != name:
        return
    seen = _passes.get(name, 0)
    _passes[name] = seen + 1
    if seen >= int(os.environ.get("SVTAGG_CRASH_SKIP", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
