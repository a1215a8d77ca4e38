"""The remote oracle: the `Oracle` interface backed by the leader's Analyst API.

Selection algorithms and applications run on it unchanged.  Thresholds are
encoded onto the task's grid here, exactly as the local oracle does, and sent
as integers; the servers hold the data and the noise, and return only the
first-YES index (or CompareToThresholds outcomes) of each chunk.  Refusals come
back as the oracle's own exceptions: RESOURCE_EXHAUSTED → BudgetExhausted, a
closed or failed stream → StreamClosed, bad input → InvalidArgument (a
ValueError); `svtagg.proto.vocab` holds the table.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from svtagg.analyst.ask_stream import AskCall
from svtagg.analyst.oracle import OracleStats, TournamentProgress
from svtagg.dp import accuracy
from svtagg.dp.errors import Refusal, StreamClosed
from svtagg.dp.jointsvt import (
    INDEPENDENT,
    JOINT,
    JOINT_KINDS,
    check_joint_tournament,
    joint_charge,
)
from svtagg.dp.kinds import StreamKind, StreamRequest, as_fraction, validate_stream
from svtagg.dp.plans import PlanBook, PlanCharge, Rule, parse_groups
from svtagg.dp.queries import (
    Budget,
    Number,
    Outcome,
    Query,
    ask_progress,
    check_chunk_size,
    check_ctt_gaps,
    encode_thresholds,
    tournament_chunks,
)
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto import svtagg_pb2_grpc as pb_grpc
from svtagg.proto.tls import tls_target
from svtagg.proto.vocab import (
    CHANNEL_OPTIONS,
    KIND_TO_PB,
    Role,
    outcome_from_pb,
    plan_request,
    refusal_from_rpc,
)


@dataclass
class RemoteStats(OracleStats):
    """OracleStats plus what only the distributed system has: bytes between servers."""

    peer_bytes: int = 0
    seconds_in_calls: float = 0.0
    #: Joint noise: the queries sent in Ask chunks, and those of them whose ν
    #: the servers drew in the chunk (none was ready ahead of it).
    noise_queries: int = 0
    noise_drawn: int = 0
    #: Joint noise: the Ask queries sent per sampler shape "kind:ε" — what
    #: `svtagg analyst prepare-noise --like` prepares for a run like this one.
    noise_shapes: dict[str, int] = field(default_factory=dict)


def _one_or_each(taus: list[Number]) -> list[Number]:
    """A chunk's thresholds as sent: one when they are all equal (AboveThreshold
    compares every query of a stream with one threshold), else one per query."""
    return taus[:1] if taus and taus.count(taus[0]) == len(taus) else taus


def _pb_queries(queries: Sequence[Query]) -> pb.Queries:
    comp = [q.complement for q in queries]
    return pb.Queries(index=[q.index for q in queries], complement=comp if any(comp) else [])


class RemoteStream:
    """One SVT stream held by the two servers; see `oracle.Stream` for the contract."""

    def __init__(
        self,
        oracle: RemoteOracle,
        info: pb.StreamInfo,
        kind: StreamKind,
        eps: Fraction,
        delta: Fraction,
    ) -> None:
        self._oracle = oracle
        self.stream_id = info.stream_id
        self.kind = kind
        self.epsilon = eps
        self.delta = delta
        self._closed = False
        self._answered = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queries_answered(self) -> int:
        return self._answered

    def alpha(self, k: int, beta: float) -> float:
        return self._oracle.accuracy(self.kind, self.epsilon, k, beta)

    def _queries(self, queries: Sequence[Query]) -> pb.Queries:
        check_chunk_size(len(queries))
        if self._closed:
            raise StreamClosed("this stream has already answered and is closed")
        return _pb_queries(queries)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return self._oracle._call(method, request)
        except StreamClosed:
            self._closed = True
            raise

    def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
        if self.kind == StreamKind.CTT:
            raise ValueError("a CompareToThresholds stream answers `compare`, not `ask`")
        queries = self._queries([q for q, _ in chunk])
        taus = self._oracle.encode_taus(_one_or_each([t for _, t in chunk]))
        resp = self._call(
            "Ask", pb.AskRequest(stream_id=self.stream_id, queries=queries, tau=taus.tolist())
        )
        self._closed = resp.closed
        answered = ask_progress(int(resp.index) if resp.yes else None, len(chunk)).answered
        self._answered += answered
        self._oracle._count(answered, resp.peer_bytes)
        self._oracle._stats.noise_drawn += resp.noise_drawn
        if self._oracle.noise == JOINT:
            stats = self._oracle._stats
            stats.noise_queries += len(chunk)
            shape = f"{self.kind.value}:{self.epsilon}"
            stats.noise_shapes[shape] = stats.noise_shapes.get(shape, 0) + len(chunk)
        return int(resp.index) if resp.yes else None

    def compare(self, chunk: Sequence[tuple[Query, Number, Number]]) -> list[Outcome]:
        if self.kind != StreamKind.CTT:
            raise ValueError("only a CompareToThresholds stream answers `compare`")
        queries = self._queries([q for q, _, _ in chunk])
        check_ctt_gaps(
            chunk, self.epsilon, self.delta, self._oracle.parties, self._oracle.joint_frac_bits
        )
        lows = self._oracle.encode_taus(_one_or_each([lo for _, lo, _ in chunk]))
        highs = self._oracle.encode_taus(_one_or_each([hi for _, _, hi in chunk]))
        resp = self._call(
            "Compare",
            pb.CompareRequest(
                stream_id=self.stream_id,
                queries=queries,
                tau_low=lows.tolist(),
                tau_high=highs.tolist(),
            ),
        )
        out = [outcome_from_pb(o) for o in resp.outcomes]
        self._closed = resp.closed
        self._answered += len(out)
        self._oracle._count(len(out), resp.peer_bytes)
        return out


class RemoteOracle:
    """Oracle over one closed task on a leader (blocking API, mutual TLS)."""

    def __init__(
        self,
        leader: str,
        task_id: str,
        ca: bytes,
        cert: bytes,
        key: bytes,
        *,
        timeout: float = 600.0,
        ask_stream: bool = True,
    ) -> None:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        self._channel = grpc.secure_channel(
            leader, creds, options=[*CHANNEL_OPTIONS, *tls_target(Role.LEADER)]
        )
        self._stub = pb_grpc.AnalystStub(self._channel)
        self.task_id = task_id
        self.timeout = timeout
        #: Ask chunks travel on one long-lived call (`analyst.ask_stream`).
        self._asks = AskCall(self._stub, timeout)
        self._asks.supported = ask_stream  # False: every Ask a unary call
        self._stats = RemoteStats()
        info = self.describe()
        if info.collection_open:
            raise Refusal(f"task {task_id!r}: close the collection before querying")
        self._n = int(info.n)
        self._d = int(info.spec.d)
        self.frac_bits = int(info.spec.frac_bits)
        #: The smallest ε the servers let one stream of this task use.
        self.epsilon_min = Fraction(info.spec.epsilon_min or 0)
        #: The task's noise option: "independent" or "joint" (dp/jointsvt.py).
        self.noise = info.spec.noise or INDEPENDENT

    @classmethod
    def from_certs(cls, leader: str, task_id: str, certs: str | Path, **kw: Any) -> RemoteOracle:
        """The oracle over `task_id` on the leader at `leader` ("host:port"), as the
        analyst whose ca.pem, analyst.pem and analyst.key are in `certs`.  The
        task's collection must be closed.  `svtagg.connect(...).task(id).oracle()`
        is the same object reached from the front door."""
        d = Path(certs)
        return cls(
            leader,
            task_id,
            (d / "ca.pem").read_bytes(),
            (d / "analyst.pem").read_bytes(),
            (d / "analyst.key").read_bytes(),
            **kw,
        )

    def close(self) -> None:
        self._asks.close()
        self._channel.close()

    def __enter__(self) -> RemoteOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        start = time.perf_counter()
        try:
            if method == "Ask":  # on the open AskStream call, unless busy or unsupported
                answer = self._asks.ask(request)
                if answer is not None:
                    return answer
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise refusal_from_rpc(exc) from None
        finally:
            self._stats.seconds_in_calls += time.perf_counter() - start

    def describe(self) -> pb.TaskInfo:
        info: pb.TaskInfo = self._call("DescribeTask", pb.TaskRef(task_id=self.task_id))
        return info

    # -- Oracle protocol -------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._n

    @property
    def d(self) -> int:
        return self._d

    @property
    def parties(self) -> int:
        return 2

    @property
    def joint_frac_bits(self) -> int | None:
        """F on a joint-noise task (its CompareToThresholds gap depends on it:
        `dp.jointsvt.joint_ctt_gap`), None otherwise."""
        return self.frac_bits if self.noise == JOINT else None

    def open_stream(
        self,
        epsilon: Number | str,
        kind: StreamKind | str = StreamKind.LAP24,
        delta: Number | str = 0,
        plan: tuple[str, int] | None = None,
    ) -> RemoteStream:
        # The same check the servers apply; they apply it again and are authoritative.
        req = validate_stream(kind, epsilon, delta, self.parties)
        if req.kind == StreamKind.NMAX:
            raise ValueError("a report-noisy-max is run with `noisy_max`, not a stream")
        if req.kind == StreamKind.CRAWL:
            raise ValueError(
                "a crawl level is run by the prefix crawl (analyst.crawl), not a stream"
            )
        info = self._open(req, plan)
        return RemoteStream(self, info, req.kind, req.epsilon, req.delta)

    #: `open_streams` runs its calls concurrently (`Session.open_ahead` uses it).
    opens_concurrently = True

    def open_streams(
        self,
        epsilons: Sequence[Number | str],
        kind: StreamKind | str = StreamKind.LAP24,
        plan: tuple[str, int] | None = None,
    ) -> list[RemoteStream]:
        """Open several pure-ε streams of one kind at once: the OpenStream calls run
        concurrently, so opening k streams waits about one call's round trips
        instead of k.  Each is charged on both servers exactly as `open_stream`
        charges it; if some are refused, the others stay open and charged (as they
        would have been, opened one after another) and the first refusal is raised."""
        reqs = [validate_stream(kind, e, 0, self.parties) for e in epsilons]
        if any(r.kind == StreamKind.NMAX for r in reqs):
            raise ValueError("a report-noisy-max is run with `noisy_max`, not a stream")
        start = time.perf_counter()
        calls = [
            self._stub.OpenStream.future(self._open_request(r, plan), timeout=self.timeout)
            for r in reqs
        ]
        streams: list[RemoteStream] = []
        refused: Exception | None = None
        for req, call in zip(reqs, calls, strict=True):
            try:
                info = call.result()
            except grpc.RpcError as exc:
                refused = refused or refusal_from_rpc(exc)
                continue
            self._opened(req)
            streams.append(RemoteStream(self, info, req.kind, req.epsilon, req.delta))
        self._stats.seconds_in_calls += time.perf_counter() - start
        if refused is not None:
            raise refused
        return streams

    def _open(self, req: StreamRequest, plan: tuple[str, int] | None) -> pb.StreamInfo:
        """Open a stream of the checked request on both servers (each charges)."""
        info: pb.StreamInfo = self._call("OpenStream", self._open_request(req, plan))
        self._opened(req)
        return info

    def _charge_delta(self, req: StreamRequest) -> Fraction:
        if self.noise == JOINT:  # the stream's δ and the sampler's, as the servers charge
            with contextlib.suppress(ValueError):  # the servers refuse what the sampler cannot fit
                return joint_charge(req, self.frac_bits)
        return req.charge_delta

    def _open_request(
        self, req: StreamRequest, plan: tuple[str, int] | None
    ) -> pb.OpenStreamRequest:
        return pb.OpenStreamRequest(
            task_id=self.task_id,
            kind=KIND_TO_PB[req.kind],
            epsilon=str(req.epsilon),
            delta=str(req.delta),
            plan_id=plan[0] if plan else "",
            plan_group=plan[1] if plan else 0,
        )

    def _opened(self, req: StreamRequest) -> None:
        self._stats.streams += 1
        self._stats.epsilon_spent += req.epsilon
        self._stats.delta_spent += self._charge_delta(req)
        self._stats.by_kind[req.kind.value] = self._stats.by_kind.get(req.kind.value, 0) + 1

    def noisy_max(
        self,
        queries: Sequence[Query],
        epsilon: Number | str,
        plan: tuple[str, int] | None = None,
        *,
        chunk_size: int | None = None,
        progress: TournamentProgress | None = None,
    ) -> int:
        """Report-noisy-max through the servers: an NMAX stream of ε is opened
        (both servers charge it, in `plan`'s group if given), then NoisyMax
        chunks of the candidates (`tournament_chunks`), each but the last with
        `more` set; each server adds its own one-sided Exp(2Δ/ε) noise per
        candidate to its share (on a joint-noise task: its share of one joint
        draw per candidate, dp/jointsvt.py), the winner so far is carried secret-shared from
        chunk to chunk, and only the position of the largest noisy sum comes
        back, after the last chunk, which closes the stream.  The candidates
        are checked here first (count, indices), so a refusal costs nothing."""
        req = validate_stream(StreamKind.NMAX, epsilon, 0, self.parties)
        chunks = tournament_chunks(len(queries), chunk_size)
        if any(not 0 <= q.index < self._d for q in queries):
            raise ValueError(f"a candidate's index is out of range [0, {self._d})")
        if self.noise == JOINT:
            check_joint_tournament(len(queries))
        info = self._open(req, plan)
        for lo, hi in chunks:
            more = hi < len(queries)
            request = pb.NoisyMaxRequest(
                stream_id=info.stream_id, queries=_pb_queries(queries[lo:hi]), more=more
            )
            resp = self._call("NoisyMax", request)
            if resp.closed == more:
                raise Refusal("the leader closed the tournament at the wrong chunk")
            self._count(hi - lo, resp.peer_bytes)  # every candidate is answered
            if progress is not None:
                progress(hi, len(queries))
        index = int(resp.index)
        if not 0 <= index < len(queries):
            raise Refusal(f"the leader answered an impossible index {index}")
        return index

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        if self.noise == JOINT and StreamKind.parse(kind) in JOINT_KINDS:
            return accuracy.joint_alpha(kind, epsilon, k, beta, self.frac_bits)  # one draw
        return accuracy.alpha(kind, epsilon, k, beta, self.parties, self.frac_bits)

    def budget(self) -> Budget:
        b = self._call("Budget", pb.TaskRef(task_id=self.task_id)).budget
        return Budget(
            Fraction(b.epsilon_total),
            Fraction(b.delta_total),
            Fraction(b.epsilon_spent),
            Fraction(b.delta_spent),
        )

    def stats(self) -> RemoteStats:
        return self._stats

    def reserve_plan(
        self, groups: Sequence[tuple[Number | str, Number | str]], delta_slack: Number | str = 0
    ) -> tuple[str, PlanCharge]:
        """Reserve a budget plan on both servers (each computes and checks its
        composed charge); BudgetExhausted: nothing is spent."""
        book = PlanBook.reserve(parse_groups(groups), as_fraction(delta_slack, "delta_slack"))
        info = self._call("ReservePlan", plan_request(self.task_id, book))
        charge = PlanCharge(Fraction(info.epsilon), Fraction(info.delta), Rule(info.rule))
        return info.plan_id, charge

    def active_plans(self) -> list[str]:
        """The ids of this task's plans still active on the leader."""
        listing = self._call("ListPlans", pb.TaskRef(task_id=self.task_id))
        return [p.plan_id for p in listing.plans]

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        info = self._call("EndPlan", pb.PlanRef(plan_id=plan_id))
        return Fraction(info.refunded_epsilon), Fraction(info.refunded_delta)

    # -- helpers ---------------------------------------------------------------------
    def encode_taus(self, taus: Sequence[Number]) -> npt.NDArray[np.int64]:
        """Thresholds onto the task's grid, exactly (as `LocalOracle` does); the
        leader enforces the ±4·n_max bound."""
        return encode_thresholds(taus, self.frac_bits)

    def _count(self, answered: int, peer_bytes: int) -> None:
        self._stats.queries += answered
        self._stats.chunks += 1
        self._stats.peer_bytes += peer_bytes
