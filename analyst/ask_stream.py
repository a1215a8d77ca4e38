"""Ask chunks on one long-lived call to the leader (`Analyst.AskStream`).

A unary call costs its set-up every time: on a 2-core test machine a bare unary
call to the leader (its health check) takes about 0.8 ms, a request and its
answer on an open bidirectional call about 0.55 ms (`benchmarks/bench_system.py`,
`bench_floor`; docs/scaling.md).  A selection's single-query and small chunks
pay that difference on every chunk, so `RemoteOracle` sends its Ask chunks on one
such call, opened at the first chunk and again after any failure.

The call answers one request at a time, in order: the thread that holds it sends
a request and reads its answer; a thread that finds it busy uses the unary Ask
instead (concurrent streams of one oracle never wait for each other).  A refusal
ends the call with the status Ask would have returned, raised here as the same
refusal; the next chunk opens a new call.  A call that ended while idle (the
leader restarted, the connection dropped) is replaced before the next request
goes out, as a unary call would reconnect.  A leader without `AskStream` (older)
answers UNIMPLEMENTED: the oracle then stays on the unary Ask.

Deadlines: a unary call carries its own; here a watchdog thread cancels the call
when an answer is `timeout` seconds late (checked every min(1 s, timeout / 4)),
and the wait ends with PeerUnavailable, as a timed-out unary Ask does.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from svtagg.dp.errors import PeerUnavailable
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import refusal_from_rpc

_END = object()


class AskCall:
    """One open AskStream call, or none (opened on demand)."""

    def __init__(self, stub: Any, timeout: float) -> None:
        self._stub = stub
        self.timeout = timeout
        self._lock = threading.Lock()  # held by the thread with a request in flight
        self._requests: queue.SimpleQueue[Any] | None = None
        self._answers: Any = None  # the call: an iterator of answers, and cancel()
        self._deadline: float | None = None
        self._timed_out = False
        self._closed = False
        self._watch: threading.Thread | None = None
        self._watch_cond = threading.Condition()
        #: False once the leader said it has no AskStream: unary Ask only.
        self.supported = True

    def ask(self, request: pb.AskRequest) -> pb.AskResponse | None:
        """The answer to `request` on the open call, or None when the caller should
        use the unary Ask (the call is busy in another thread, or unsupported)."""
        if not self.supported or self._closed or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._exchange(request)
        finally:
            self._lock.release()

    def _exchange(self, request: pb.AskRequest) -> pb.AskResponse | None:
        if self._answers is not None and self._answers.done():
            # Ended while idle (the leader restarted, the connection dropped): the
            # request has not been sent, so it goes on a new call, as a unary
            # call would reconnect.
            self._drop()
        if self._answers is None:
            self._open()
        assert self._requests is not None
        self._timed_out = False
        self._deadline = time.monotonic() + self.timeout
        self._requests.put(request)
        try:
            answer: pb.AskResponse = next(self._answers)
            return answer
        except StopIteration:
            self._drop()
            raise PeerUnavailable("the leader ended the Ask call") from None
        except grpc.RpcError as exc:
            self._drop()
            if self._timed_out:
                raise PeerUnavailable(
                    f"no answer from the leader within {self.timeout:g}s"
                ) from None
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                self.supported = False
                return None  # a leader without AskStream: the request was not run
            raise refusal_from_rpc(exc) from None
        finally:
            self._deadline = None

    def _open(self) -> None:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def feed() -> Iterator[pb.AskRequest]:
            while (item := requests.get()) is not _END:
                yield item

        self._requests = requests
        self._answers = self._stub.AskStream(feed())
        if self._watch is None:
            self._watch = threading.Thread(target=self._watchdog, name="svtagg-ask", daemon=True)
            self._watch.start()

    def _drop(self) -> None:
        """Forget the current call (after an error; it has ended or is cancelled)."""
        answers, requests = self._answers, self._requests
        self._answers = self._requests = None
        if requests is not None:
            requests.put(_END)
        if answers is not None:
            answers.cancel()

    def _watchdog(self) -> None:
        tick = min(1.0, self.timeout / 4)
        with self._watch_cond:
            while not self._closed:
                deadline, answers = self._deadline, self._answers
                if deadline is not None and answers is not None and time.monotonic() > deadline:
                    self._timed_out = True
                    answers.cancel()  # the waiting `next` raises CANCELLED
                    self._deadline = None
                self._watch_cond.wait(tick)

    def close(self) -> None:
        """End the call (a request in flight fails with PeerUnavailable) and the watchdog."""
        with self._watch_cond:
            self._closed = True
            self._watch_cond.notify()
        self._drop()
