"""Crash points for fault-injection tests (issue 6).  A server kills itself with
SIGKILL when it reaches the armed point, after skipping that point's first
`skip` passes.  Arm it at start with SVTAGG_CRASH_AT=<point> (and optionally
SVTAGG_CRASH_SKIP=<skip>), or at run time: a server started with
SVTAGG_CRASH_CONTROL=<file> reads "<point> [skip]" from that file at every
point (tests write it to arm a running server).  With neither variable set, as
in production, `crash_point` is one dictionary lookup."""

from __future__ import annotations

import os
import signal

#: The points the server passes, in order of a request's life.
POINTS = (
    "upload.mid_store",  # inside the batch's transaction: shares appended, not committed
    "upload.after_store",  # a batch is committed, the answer not yet sent
    "plan.before_helper",  # the leader's plan reservation is committed, the helper's not made
    "open.after_charge",  # the ledger charge is committed, γ not yet drawn
    "open.before_helper",  # the leader has charged and drawn γ_L, the helper not yet
    "chunk.after_mark",  # the in_chunk mark is committed, the circuit not yet run
    "chunk.after_result",  # the circuit ran (e.g. a YES), its result not yet recorded
)

_passes: dict[str, int] = {}


def _armed() -> tuple[str, int] | None:
    control = os.environ.get("SVTAGG_CRASH_CONTROL")
    if control:
        try:
            with open(control) as f:
                words = f.read().split()
        except OSError:
            return None
        return (words[0], int(words[1]) if len(words) > 1 else 0) if words else None
    point = os.environ.get("SVTAGG_CRASH_AT")
    return (point, int(os.environ.get("SVTAGG_CRASH_SKIP", "0"))) if point else None


def crash_point(name: str) -> None:
    if "SVTAGG_CRASH_AT" not in os.environ and "SVTAGG_CRASH_CONTROL" not in os.environ:
        return
    armed = _armed()
    if armed is None or armed[0] != name:
        return
    seen = _passes.get(name, 0)
    _passes[name] = seen + 1
    if seen >= armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)
