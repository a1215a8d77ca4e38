"""Ask chunks on one long-lived call (`Analyst.AskStream`, analyst/ask_stream.py):
the same answers and refusals as the unary Ask, against two server processes;
the client's fallbacks (busy, older leader) and its deadline on fakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import ProcessDeployment

from svtagg.analyst.ask_stream import AskCall
from svtagg.analyst.remote_oracle import RemoteOracle
from svtagg.deploy.tasks import task_spec
from svtagg.dp.errors import PeerUnavailable, RateLimited, StreamClosed
from svtagg.dp.queries import Query
from svtagg.proto import svtagg_pb2 as pb

N, D = 6, 4


def _task(pd: ProcessDeployment, task_id: str = "t") -> None:
    spec = task_spec(task_id, D, 100, "1000", frac_bits=8, epsilon_min="1/10")
    pd.stub().CreateTask(spec, timeout=30)
    with pd.uploader() as up:
        up.upload(task_id, np.eye(D)[[0, 0, 0, 1, 2, 3]])  # S = (3, 1, 1, 1)
    pd.stub().CloseCollection(pb.TaskRef(task_id=task_id), timeout=30)


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessDeployment]:
    d = ProcessDeployment(tmp_path_factory.mktemp("askstream")).start()
    _task(d)
    try:
        yield d
    finally:
        d.stop()


def _oracle(pd: ProcessDeployment, stream: bool) -> RemoteOracle:
    return RemoteOracle.from_certs(pd.address("leader"), "t", pd.certs, ask_stream=stream)


@pytest.mark.parametrize("stream", [True, False])
def test_answers_as_the_unary_ask(pd: ProcessDeployment, stream: bool) -> None:
    """Far thresholds (|noise| at ε = 50 is far below 100 users) give NO, thresholds
    far below every score a YES at the first query, on both paths; the answers,
    the stream's state and the counts agree."""
    with _oracle(pd, stream) as o:
        s = o.open_stream(50)
        for _ in range(5):
            assert s.ask([(Query(j), 100) for j in range(D)]) is None
        assert s.ask([(Query(1), 100), (Query(0), -100), (Query(2), -100)]) == 1
        assert s.closed and s.queries_answered == 5 * D + 2
        with pytest.raises(StreamClosed):
            s.ask([(Query(0), 0)])
        assert o._asks.supported is stream


def test_a_refusal_ends_the_call_and_the_next_chunk_opens_another(pd: ProcessDeployment) -> None:
    with _oracle(pd, True) as o:
        a, b = o.open_stream(50), o.open_stream(50)
        assert a.ask([(Query(0), -100)]) == 0  # YES: a is closed on the servers
        a._closed = False  # the client forgets it: the leader refuses, as to a unary Ask
        with pytest.raises(StreamClosed):
            a.ask([(Query(0), -100)])
        assert o._asks._answers is None  # the call ended with the refusal
        assert b.ask([(Query(1), 100)]) is None  # a new call
        assert o._asks._answers is not None


def test_concurrent_streams_of_one_oracle_all_answer(pd: ProcessDeployment) -> None:
    """Threads that find the call busy use the unary Ask: every chunk is answered."""
    with _oracle(pd, True) as o:
        streams = [o.open_stream(50) for _ in range(6)]

        def run(s: Any) -> list[int | None]:
            return [s.ask([(Query(j % D), 100)]) for j in range(8)] + [s.ask([(Query(0), -100)])]

        with ThreadPoolExecutor(6) as pool:
            out = list(pool.map(run, streams))
        assert out == [[None] * 8 + [0]] * 6


def test_ask_stream_needs_an_analyst_certificate(pd: ProcessDeployment) -> None:
    stub = pd.stub("client")
    request = pb.AskRequest(stream_id="x", queries=pb.Queries(index=[0]), tau=[0])
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.AskStream(iter([request]), timeout=10)))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]


def test_each_request_on_the_call_counts_against_the_rate_limit(tmp_path: Path) -> None:
    pd = ProcessDeployment(tmp_path, ["--rate-limit", "5", "--rate-burst", "10"]).start()
    try:
        _task(pd)
        time.sleep(2.5)  # the set-up's calls refilled
        with _oracle(pd, True) as o:
            s = o.open_stream(50)
            with pytest.raises(RateLimited):
                for _ in range(40):
                    assert s.ask([(Query(0), 100)]) is None
    finally:
        pd.stop()


# ---------------------------------------------------------------- fakes


class _Error(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name

    def trailing_metadata(self) -> tuple[()]:
        return ()


class _Call:
    """A stream-stream call that answers each request after `delay` seconds with
    the request's stream id as peer_bytes, or fails with `fail`."""

    def __init__(self, requests: Iterator[Any], delay: float, fail: grpc.StatusCode | None) -> None:
        self._requests, self._delay, self._fail = requests, delay, fail
        self._cancelled = threading.Event()

    def __iter__(self) -> _Call:
        return self

    def __next__(self) -> pb.AskResponse:
        if self._fail is not None:
            raise _Error(self._fail)
        request = next(self._requests)
        if self._cancelled.wait(self._delay):
            raise _Error(grpc.StatusCode.CANCELLED)
        return pb.AskResponse(peer_bytes=int(request.stream_id))

    def cancel(self) -> None:
        self._cancelled.set()

    def done(self) -> bool:
        return self._cancelled.is_set()


class _Stub:
    def __init__(self, delay: float = 0.0, fail: grpc.StatusCode | None = None) -> None:
        self.calls = 0
        self.delay, self.fail = delay, fail

    def AskStream(self, requests: Iterator[Any]) -> _Call:  # noqa: N802 - the RPC's name
        self.calls += 1
        return _Call(requests, self.delay, self.fail)


def test_one_call_answers_request_after_request() -> None:
    stub = _Stub()
    call = AskCall(stub, timeout=5)
    try:
        for i in range(5):
            answer = call.ask(pb.AskRequest(stream_id=str(i)))
            assert answer is not None and answer.peer_bytes == i
        assert stub.calls == 1
    finally:
        call.close()


def test_an_older_leader_leaves_the_unary_ask() -> None:
    call = AskCall(_Stub(fail=grpc.StatusCode.UNIMPLEMENTED), timeout=5)
    assert call.ask(pb.AskRequest(stream_id="1")) is None
    assert not call.supported
    assert call.ask(pb.AskRequest(stream_id="1")) is None  # without trying again
    call.close()


def test_a_late_answer_fails_at_the_deadline() -> None:
    stub = _Stub(delay=30)
    call = AskCall(stub, timeout=0.4)
    t = time.monotonic()
    with pytest.raises(PeerUnavailable, match="within 0.4s"):
        call.ask(pb.AskRequest(stream_id="1"))
    assert time.monotonic() - t < 5
    stub.delay = 0
    answer = call.ask(pb.AskRequest(stream_id="2"))  # a new call
    assert answer is not None and answer.peer_bytes == 2 and stub.calls == 2
    call.close()


def test_a_busy_call_sends_the_caller_to_the_unary_ask() -> None:
    stub = _Stub(delay=0.5)
    call = AskCall(stub, timeout=5)
    first = threading.Thread(target=call.ask, args=(pb.AskRequest(stream_id="1"),))
    first.start()
    time.sleep(0.1)
    assert call.ask(pb.AskRequest(stream_id="2")) is None  # busy: use the unary Ask
    first.join()
    call.close()


def test_a_call_that_ended_while_idle_is_replaced_before_the_request() -> None:
    """The leader restarted between two chunks: the old call has ended, so the next
    request goes on a new call instead of failing on the dead one."""
    stub = _Stub()
    call = AskCall(stub, timeout=5)
    assert call.ask(pb.AskRequest(stream_id="1")) is not None
    call._answers.cancel()  # the call ends while no request is in flight
    answer = call.ask(pb.AskRequest(stream_id="2"))
    assert answer is not None and answer.peer_bytes == 2 and stub.calls == 2
    call.close()


def test_the_leader_restarting_between_chunks_costs_no_chunk(tmp_path: Path) -> None:
    pd = ProcessDeployment(tmp_path).start()
    try:
        _task(pd)
        with _oracle(pd, True) as o:
            s = o.open_stream(50)
            assert s.ask([(Query(0), 100)]) is None
            pd.dep.stop_role("leader")
            pd.restart("leader")
            time.sleep(0.5)
            assert s.ask([(Query(1), 100)]) is None  # on a new call to the new process
    finally:
        pd.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_an_open_call_does_not_hold_the_leader_at_shutdown(tmp_path: Path, stream: bool) -> None:
    """SIGTERM with an idle AskStream call open: the leader ends the call and
    stops at once, not after its 5 s grace (as with unary calls only)."""
    pd = ProcessDeployment(tmp_path).start()
    try:
        _task(pd)
        with _oracle(pd, stream) as o:
            assert o.open_stream(50).ask([(Query(0), 100)]) is None  # the call is open
            t = time.monotonic()
            assert pd.dep.stop_role("leader") == 0
            assert time.monotonic() - t < 3.0
    finally:
        pd.stop()
