"""The local (central, plaintext) oracle: the reference implementation of `Oracle`.

It holds the per-user matrix, encodes it exactly as clients do (`mpc.ring.encode`),
sums it, and answers streams with the same exact samplers, noise models and ledger
rules as the servers — with one party's noise (central DP), the two-server
noise model (two independent full draws per term), or a joint-noise task's
(`noise="joint"`: one draw per term of the garbled sampler's exact law,
`dp.joint.sample`, with its δ charged as the servers charge it).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from svtagg.analyst.oracle import OracleStats, TournamentProgress
from svtagg.dp import accuracy
from svtagg.dp.errors import NotFound, Refusal
from svtagg.dp.jointsvt import (
    INDEPENDENT,
    JOINT,
    JOINT_KINDS,
    NOISE_OPTIONS,
    JointStreamNoise,
    check_joint_kind,
    check_joint_queries,
    check_joint_tournament,
    joint_charge,
    joint_stream_noise,
)
from svtagg.dp.kinds import (
    StreamKind,
    StreamRequest,
    as_fraction,
    default_tau_bound,
    validate_stream,
)
from svtagg.dp.ledger import Ledger
from svtagg.dp.noise import RandomSource
from svtagg.dp.noisy_max import chunked_noisy_argmax, noisy_argmax
from svtagg.dp.plans import PlanBook, PlanCharge, parse_groups
from svtagg.dp.queries import (
    Budget,
    Number,
    Outcome,
    Query,
    check_chunk_size,
    check_ctt_gaps,
    check_stream_chunks,
    encode_thresholds,
    tournament_chunks,
)
from svtagg.dp.svt import AboveThresholdStream, CompareToThresholdsStream
from svtagg.mpc.ring import DEFAULT_FRAC_BITS, encode, sensitivity


class LocalStream:
    """A stream of the local oracle; see `oracle.Stream` for the contract."""

    def __init__(
        self,
        oracle: LocalOracle,
        kind: StreamKind,
        epsilon: Fraction,
        delta: Fraction,
        mech: AboveThresholdStream | CompareToThresholdsStream,
    ) -> None:
        self._oracle = oracle
        self.kind = kind
        self.epsilon = epsilon
        self.delta = delta
        self._mech = mech
        self._chunks = 0

    @property
    def closed(self) -> bool:
        return self._mech.closed

    @property
    def queries_answered(self) -> int:
        return self._mech.queries_answered

    def alpha(self, k: int, beta: float) -> float:
        return self._oracle.accuracy(self.kind, self.epsilon, k, beta)

    def _check(self, k: int) -> None:
        """The chunk's size, the stream's chunks and (joint noise) its queries,
        as the servers check them."""
        check_chunk_size(k)
        check_stream_chunks(self._chunks)
        if self._oracle.noise == JOINT:
            check_joint_queries(self._mech.queries_answered, k)

    def ask(self, chunk: Sequence[tuple[Query, Number]]) -> int | None:
        if not isinstance(self._mech, AboveThresholdStream):
            raise ValueError("a CompareToThresholds stream answers `compare`, not `ask`")
        self._check(len(chunk))
        scores = self._oracle._scores([q for q, _ in chunk])
        taus = self._oracle._encode_taus([t for _, t in chunk])
        before = self._mech.queries_answered
        out = self._mech.ask(scores, taus)
        self._chunks += 1
        self._oracle._count(self._mech.queries_answered - before)
        return out

    def compare(self, chunk: Sequence[tuple[Query, Number, Number]]) -> list[Outcome]:
        if not isinstance(self._mech, CompareToThresholdsStream):
            raise ValueError("only a CompareToThresholds stream answers `compare`")
        self._check(len(chunk))
        check_ctt_gaps(
            chunk, self.epsilon, self.delta, self._oracle.parties, self._oracle.joint_frac_bits
        )
        scores = self._oracle._scores([q for q, _, _ in chunk])
        lows = self._oracle._encode_taus([lo for _, lo, _ in chunk])
        highs = self._oracle._encode_taus([hi for _, _, hi in chunk])
        out = self._mech.compare(scores, lows, highs)
        self._chunks += 1
        self._oracle._count(len(out))
        return out


class LocalOracle:
    """Central oracle over a plaintext n × d matrix of per-user values in [0, 1]."""

    def __init__(
        self,
        data: npt.ArrayLike,
        epsilon_total: Number | str,
        delta_total: Number | str = 0,
        frac_bits: int = DEFAULT_FRAC_BITS,
        parties: int = 1,
        seed: bytes | int | None = None,
        noise: str = INDEPENDENT,
        epsilon_min: Number | str | None = None,
    ) -> None:
        matrix = np.asarray(data, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
            raise ValueError(f"data must be a non-empty n × d matrix, got shape {matrix.shape}")
        if parties not in (1, 2):
            raise ValueError(f"parties must be 1 or 2, got {parties}")
        self._n, self._d = int(matrix.shape[0]), int(matrix.shape[1])
        self.frac_bits = frac_bits
        self._parties = parties
        if noise not in NOISE_OPTIONS:
            raise ValueError(f"noise must be one of {NOISE_OPTIONS}, got {noise!r}")
        #: The task option it simulates: "independent" or "joint" (dp/jointsvt.py).
        self.noise = noise
        #: The smallest ε one stream may take (None: no floor), as a task's.
        self.epsilon_min = None if epsilon_min is None else as_fraction(epsilon_min, "epsilon_min")
        # Exact integer sums of the encoded values, as the servers' shares add up to.
        self._sums = encode(matrix, frac_bits).astype(np.int64).sum(axis=0)
        self._ledger = Ledger(epsilon_total, delta_total)
        self._plans: dict[str, PlanBook] = {}
        if isinstance(seed, int):
            seed = seed.to_bytes(16, "little", signed=True)
        self._rng = RandomSource(seed)
        self._stats = OracleStats()

    @classmethod
    def from_sums(
        cls,
        sums: npt.ArrayLike,
        n: int,
        epsilon_total: Number | str,
        delta_total: Number | str = 0,
        frac_bits: int = DEFAULT_FRAC_BITS,
        parties: int = 1,
        seed: bytes | int | None = None,
        noise: str = INDEPENDENT,
    ) -> LocalOracle:
        """An oracle from already-encoded grid sums (e.g. for large synthetic data)."""
        self = cls(np.zeros((1, 1)), epsilon_total, delta_total, frac_bits, parties, seed, noise)
        arr = np.asarray(sums, dtype=np.int64)
        if arr.ndim != 1 or (arr < 0).any() or (arr > n * sensitivity(frac_bits)).any():
            raise ValueError("sums must be a vector of grid sums in [0, n·2^F]")
        self._sums, self._n, self._d = arr.copy(), int(n), int(arr.size)
        return self

    # -- Oracle protocol ---------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._n

    @property
    def d(self) -> int:
        return self._d

    @property
    def parties(self) -> int:
        return self._parties

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
    ) -> LocalStream:
        req = validate_stream(kind, epsilon, delta, self._parties)
        if req.kind == StreamKind.NMAX:
            raise ValueError("a report-noisy-max is run with `noisy_max`, not a stream")
        if req.kind == StreamKind.CRAWL:
            raise ValueError(
                "a crawl level is run by the prefix crawl (analyst.crawl), not a stream"
            )
        self._check_floor(req.epsilon)
        joint = None
        if self.noise == JOINT:  # as the servers: the kind checked, the sampler's δ charged
            joint = joint_stream_noise(check_joint_kind(req.kind), req.epsilon, self.frac_bits)
            req = StreamRequest(req.kind, req.epsilon, req.delta, joint_charge(req, self.frac_bits))
        self._charge(req, plan)
        mech = (  # subclasses (the audit's broken controls) override the two-argument form
            self._make_mechanism(req.kind, req.epsilon)
            if joint is None
            else self._make_mechanism(req.kind, req.epsilon, joint)
        )
        return LocalStream(self, req.kind, req.epsilon, req.delta, mech)

    def _check_floor(self, epsilon: Fraction) -> None:
        if self.epsilon_min is not None and epsilon < self.epsilon_min:
            raise ValueError(
                f"epsilon={epsilon} is below the task's epsilon_min={self.epsilon_min}"
            )

    def _charge(self, req: StreamRequest, plan: tuple[str, int] | None) -> None:
        """Charge before any noise is drawn: to the budget, or to a plan's group."""
        if plan is None:
            self._ledger.charge(req.epsilon, req.charge_delta)
        else:
            self._plan(plan[0]).admit(plan[1], req.epsilon, req.charge_delta)
        self._stats.streams += 1
        self._stats.epsilon_spent += req.epsilon
        self._stats.delta_spent += req.charge_delta
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
        """Report-noisy-max over `queries` (`dp.noisy_max`): the candidates are
        checked, ε is charged (to the budget or a plan's group), then each party
        draws its noise; the position of the largest noisy score.  Over several
        chunks (`tournament_chunks`) it runs as the servers do
        (`chunked_noisy_argmax`: the noise drawn chunk by chunk, the winner
        carried)."""
        req = validate_stream(StreamKind.NMAX, epsilon, 0, self._parties)
        joint = None
        if self.noise == JOINT:  # as the servers: one sampler draw per candidate, its δ
            joint = joint_stream_noise(StreamKind.NMAX, req.epsilon, self.frac_bits)
            req = StreamRequest(req.kind, req.epsilon, req.delta, joint.delta_charge)
            check_joint_tournament(len(queries))
        self._check_floor(req.epsilon)
        chunks = tournament_chunks(len(queries), chunk_size)
        scores = self._scores(queries)
        self._charge(req, plan)
        if len(chunks) == 1:
            out = noisy_argmax(scores, req.epsilon, self.frac_bits, self._rng, self._parties, joint)
        else:
            out = chunked_noisy_argmax(
                scores, req.epsilon, self.frac_bits, self._rng, self._parties, chunks, joint
            )
        for lo, hi in chunks:
            self._count(hi - lo)
            if progress is not None:
                progress(hi, len(queries))
        return out

    def reserve_plan(
        self, groups: Sequence[tuple[Number | str, Number | str]], delta_slack: Number | str = 0
    ) -> tuple[str, PlanCharge]:
        """Reserve a budget plan's composed charge (see `svtagg.dp.plans`); the
        same rule the servers apply.  BudgetExhausted: nothing is spent."""
        book = PlanBook.reserve(parse_groups(groups), as_fraction(delta_slack, "delta_slack"))
        self._ledger.charge(book.charge.epsilon, book.charge.delta)
        plan_id = f"local-{len(self._plans)}"
        self._plans[plan_id] = book
        return plan_id, book.charge

    def end_plan(self, plan_id: str) -> tuple[Fraction, Fraction]:
        """End a plan; returns (and gives back) what it did not use (basic plans)."""
        book = self._plan(plan_id)
        back = book.refund()
        self._ledger.refund(*back)
        del self._plans[plan_id]
        return back

    def _plan(self, plan_id: str) -> PlanBook:
        if plan_id not in self._plans:
            raise NotFound(f"unknown or ended plan {plan_id!r}")
        return self._plans[plan_id]

    def _make_mechanism(
        self, kind: StreamKind, eps: Fraction, joint: JointStreamNoise | None = None
    ) -> AboveThresholdStream | CompareToThresholdsStream:
        if kind == StreamKind.CTT:
            return CompareToThresholdsStream(eps, self.frac_bits, self._rng, self._parties, joint)
        return AboveThresholdStream(kind, eps, self.frac_bits, self._rng, self._parties, joint)

    def accuracy(self, kind: StreamKind | str, epsilon: Number | str, k: int, beta: float) -> float:
        if self.noise == JOINT and StreamKind.parse(kind) in JOINT_KINDS:
            return accuracy.joint_alpha(kind, epsilon, k, beta, self.frac_bits)  # one draw
        return accuracy.alpha(kind, epsilon, k, beta, self._parties, self.frac_bits)

    def budget(self) -> Budget:
        return self._ledger.budget()

    def stats(self) -> OracleStats:
        return self._stats

    # -- helpers -------------------------------------------------------------------------
    def true_scores(self) -> npt.NDArray[np.float64]:
        """Exact scores in score units (for experiments and tests, never for algorithms)."""
        return self._sums / float(sensitivity(self.frac_bits))

    def _scores(self, queries: Sequence[Query]) -> npt.NDArray[np.int64]:
        idx = np.fromiter((q.index for q in queries), dtype=np.int64, count=len(queries))
        if idx.size and (idx.min() < 0 or idx.max() >= self._d):
            raise Refusal(f"query index out of range [0, {self._d})")
        comp = np.fromiter((q.complement for q in queries), dtype=bool, count=len(queries))
        s = self._sums[idx]
        full = self._n * sensitivity(self.frac_bits)
        return np.where(comp, full - s, s)

    def _encode_taus(self, taus: Sequence[Number]) -> npt.NDArray[np.int64]:
        """Thresholds on the grid, refused beyond ±4n (as the servers refuse them):
        far thresholds carry no information and would overflow int64 arithmetic."""
        return encode_thresholds(taus, self.frac_bits, default_tau_bound(self._n, self.frac_bits))

    def _count(self, answered: int) -> None:
        self._stats.queries += answered
        self._stats.chunks += 1
