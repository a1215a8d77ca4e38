"""The chunk exchange as one state machine: its states, steps and messages are
values, and its transitions touch neither a transport nor a store.

One exchange is what a chunk header starts on a comparison session: a stream
chunk (Ask, Compare, NoisyMax), a joint-noise batch or a robust-aggregate chunk
(the two close-time flows, which end with the helper's closing status).  Each
server keeps one `Exchange` per chunk and takes every step through it; the
table below refuses a step out of order (`OutOfOrder`, a bug, never a peer's
doing: the peer's frames are checked where they are parsed).  The leader's
driver (`servers/leader.py`, and through it a leased worker, which runs the
leader's own chunk path), and the helper's (`servers/helper.py`) drive the
same tables, and the session code (`servers/exchange/session.py`) asks the
machine which step is due when the protocol reaches its first reply or its
first send.

Messages, in the order they cross (`Msg`): the leader's HEADER, which carries
or precedes the protocol's first message (the evaluator's OT extension); the
helper's VERDICT (its go, riding the first fragment of the garbled tables, or
its refusal); the protocol's bulk (TABLES one way, the RESULT decoding back,
inside `Step.RUN`); on a close-time flow the helper's CLOSING status.

The durability rule — what must be on disk before which message leaves — is
stated here once and checked over every path of the tables by
tests/test_exchange_machine.py (and the stores' side of it by the same test):

* **D1, mark first.**  A server's MARK of a stream chunk (`in_chunk`, with the
  pooled joint noise the chunk consumes) or of a noise batch (its reserved
  sequence numbers) is durable before that server takes part in the chunk's
  result: the helper before its VERDICT leaves (its tables follow it), the
  leader before it reads the VERDICT (so before any table).  The leader's
  mark of a batch (its reservation) precedes the batch's HEADER.
* **D2, results may be lost, never repeated.**  A stream chunk's RECORD (what
  it answered, whether the stream closed) need not be durable: a stream found
  `in_chunk` at a restart fails closed, so a lost record costs the stream,
  never an answer given twice.  The store may therefore fold the record into
  the stream's next mark (`servers/store/sql.py`, `end_chunk`).
* **D3, the helper keeps before it confirms.**  On a close-time flow the
  helper's RECORD precedes its CLOSING status, and the leader keeps its own
  only after reading it: the leader never holds shares the helper lacks.  A
  noise batch's record is durable (a chunk may draw it after a restart); a
  robust chunk's staged shares need not be: a restart that loses them makes
  MarkAgreed refuse the pass, and the close runs a new one.
* **D4, fail closed.**  From the moment a stream chunk's HEADER has left the
  leader, or the helper has marked it, until that server's RUN has ended, any
  failure FAILs the stream on that server (and the leader fails it on the
  helper too); nothing is refunded.  A failure to RECORD after the RUN is a
  lost record (D2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class Msg(Enum):
    """What crosses between the servers for one chunk, in order."""

    HEADER = "header"  # leader → helper, with or before the protocol's first message
    VERDICT = "verdict"  # helper → leader: go (or a refusal, which ends the session)
    CLOSING = "closing"  # helper → leader, close-time flows: kept, or refused


class Flow(Enum):
    """The three exchanges a header can start."""

    STREAM = "stream"  # an Ask, Compare or NoisyMax chunk of an open stream
    BATCH = "batch"  # a joint-noise batch, ahead of a stream's chunks
    ROBUST = "robust"  # a robust-aggregate chunk of the close

    @property
    def close_time(self) -> bool:
        """Ends with the helper's CLOSING status (D3)."""
        return self is not Flow.STREAM


class Step(Enum):
    """One step of one server: a message sent or read, or a local act.  The
    value is (what the step does, the message it moves, if any)."""

    SEND_HEADER = ("send header", Msg.HEADER)
    READ_HEADER = ("read header", Msg.HEADER)
    SEND_VERDICT = ("send go", Msg.VERDICT)
    READ_VERDICT = ("read verdict", Msg.VERDICT)
    REFUSE = ("send refusal", Msg.VERDICT)  # the session ends with it
    SEND_CLOSING = ("send closing", Msg.CLOSING)
    READ_CLOSING = ("read closing", Msg.CLOSING)
    #: Durable: the stream chunk begun (with its pooled noise), or a batch's
    #: sequence numbers reserved (D1).
    MARK = ("mark", None)
    #: The comparison protocol itself, tables and result decoding included;
    #: taken when this server's part of it has ended.
    RUN = ("run", None)
    #: What the chunk produced, kept: durable for a noise batch (D3), not for
    #: a stream chunk (D2) or a robust chunk's staged shares (D3).
    RECORD = ("record", None)
    #: The stream failed closed on this server (D4).
    FAIL = ("fail", None)

    @property
    def msg(self) -> Msg | None:
        return self.value[1]

    @property
    def sends(self) -> bool:
        return self.value[0].startswith("send")

    @property
    def reads(self) -> bool:
        return self.value[0].startswith("read")


class State(Enum):
    READY = "ready"
    MARKED_FIRST = "marked, header not sent"  # leader: a noise batch
    HEADER_SENT = "header sent"
    HEADER_READ = "header read"
    MARKED = "marked"
    GO = "go"  # the helper's go sent (helper) or read (leader)
    RAN = "ran"
    CONFIRMED = "closing read"  # leader, close-time flows
    RECORDED = "recorded"
    DONE = "done"  # closing sent (helper) or recorded after it (leader)
    REFUSED = "refused"
    FAILED = "failed"


S = State
#: Each table is an opening per flow (how the header moves and where the mark
#: falls), the protocol, and an ending (a close-time flow's closing status).
_LEADER_OPENING = {
    Flow.STREAM: {
        (S.READY, Step.SEND_HEADER): S.HEADER_SENT,
        # While the first message travels; before it is made when the chunk's
        # inputs are the pooled shares the mark consumes.
        (S.HEADER_SENT, Step.MARK): S.MARKED,
    },
    Flow.BATCH: {
        (S.READY, Step.MARK): S.MARKED_FIRST,
        (S.MARKED_FIRST, Step.SEND_HEADER): S.MARKED,
    },
    # Nothing to mark: the helper stages its shares under the pass id, which
    # MarkAgreed names (a pass that fails is run again, whole).
    Flow.ROBUST: {(S.READY, Step.SEND_HEADER): S.MARKED},
}
_LEADER_RUN = {(S.MARKED, Step.READ_VERDICT): S.GO, (S.GO, Step.RUN): S.RAN}
_LEADER_END = {
    False: {(S.RAN, Step.RECORD): S.DONE},
    True: {(S.RAN, Step.READ_CLOSING): S.CONFIRMED, (S.CONFIRMED, Step.RECORD): S.DONE},
}
_HELPER_OPENING = {
    (S.READY, Step.READ_HEADER): S.HEADER_READ,
    (S.HEADER_READ, Step.REFUSE): S.REFUSED,
}
_HELPER_MARK = {
    True: {(S.HEADER_READ, Step.MARK): S.MARKED, (S.MARKED, Step.SEND_VERDICT): S.GO},
    False: {(S.HEADER_READ, Step.SEND_VERDICT): S.GO},
}
_HELPER_END = {
    False: {(S.RAN, Step.RECORD): S.DONE},
    True: {(S.RAN, Step.RECORD): S.RECORDED, (S.RECORDED, Step.SEND_CLOSING): S.DONE},
}
_LEADER: dict[Flow, dict[tuple[State, Step], State]] = {
    f: {**_LEADER_OPENING[f], **_LEADER_RUN, **_LEADER_END[f.close_time]} for f in Flow
}
_HELPER: dict[Flow, dict[tuple[State, Step], State]] = {
    f: {
        **_HELPER_OPENING,
        **_HELPER_MARK[f is not Flow.ROBUST],
        (S.GO, Step.RUN): S.RAN,
        **_HELPER_END[f.close_time],
    }
    for f in Flow
}
del S

#: Which steps must be durable on disk when taken, per flow (D1–D3).  The
#: stores' methods that take them are checked against this table.
DURABLE: dict[tuple[Flow, Step], bool] = {
    (Flow.STREAM, Step.MARK): True,
    (Flow.STREAM, Step.RECORD): False,
    (Flow.BATCH, Step.MARK): True,
    (Flow.BATCH, Step.RECORD): True,
    (Flow.ROBUST, Step.RECORD): False,
}


def table(leader: bool, flow: Flow) -> dict[tuple[State, Step], State]:
    """The transitions of one side of one flow (tests walk every path)."""
    return (_LEADER if leader else _HELPER)[flow]


class Header(Protocol):
    """A chunk header (`servers.exchange.values`) names the flow it starts."""

    @property
    def FLOW(self) -> Flow: ...  # noqa: N802 - the headers' class constant


class OutOfOrder(RuntimeError):
    """A driver took a step its exchange does not allow now: a bug in this
    server, never the peer's doing."""


@dataclass
class Exchange:
    """One chunk's exchange on one server: where it is, and the steps taken."""

    leader: bool
    flow: Flow
    state: State = State.READY
    steps: list[Step] = field(default_factory=list)

    @classmethod
    def of(cls, header: Header, *, leader: bool) -> Exchange:
        return cls(leader, header.FLOW)

    def may(self, step: Step) -> bool:
        return (self.state, step) in table(self.leader, self.flow)

    def take(self, step: Step) -> None:
        """Take `step` now (OutOfOrder if the table has no such transition)."""
        if step is Step.FAIL:
            self.state = State.FAILED
        else:
            nxt = table(self.leader, self.flow).get((self.state, step))
            if nxt is None:
                side = "leader" if self.leader else "helper"
                raise OutOfOrder(f"{side} {self.flow.value} exchange: {step.name} in {self.state}")
            self.state = nxt
        self.steps.append(step)

    @property
    def committed(self) -> bool:
        """A failure now fails the stream closed (D4): the leader's header has
        left, or the helper has marked the chunk, and the protocol has not
        ended."""
        return self.flow is Flow.STREAM and self.state in (
            State.HEADER_SENT,
            State.MARKED,
            State.GO,
        )
