"""The prefix crawl through the servers: `analyst.crawl.LevelOracle` over the
leader's `Analyst.CrawlLevel` call, so `analyst.crawl.crawl` walks a task of
strings (validity crawl:B) held by the two servers unchanged.

Each level is one call: the parents (the last level's kept prefixes, each
32 bytes big-endian, ascending; none at the root), their depth in bits, the
bits `steps` each is extended by, the level's ε and the threshold τ.  The
leader answers one bit per candidate — parent-major, each parent's 2^steps
children in order, packed least significant bit first — and the walk id,
which the next level sends back ("" starts a walk).  Both servers charge the
level's ε to the task's ledgers (a CRAWL stream per level).

The candidates a walk asks about are checked here first, before any call: they
must be exactly every extension of their parents by `steps` bits, in order, so
that what the servers answer is what the walk asked (a request the servers
would refuse costs a call and nothing else, but is refused here the same
way).  Refusals are the oracle's own exceptions, as `RemoteOracle`'s:
`svtagg.proto.vocab.refusal_from_rpc` (BudgetExhausted, FailedPrecondition for
an open collection, InvalidArgument, PeerUnavailable ...), and InvalidArgument
(a ValueError) for a bad request caught here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import grpc

from svtagg.dp.crawl import MAX_CRAWL_BITS, MAX_LEVEL_CANDIDATES, MAX_STRIDE
from svtagg.dp.errors import InvalidArgument, Refusal
from svtagg.proto import svtagg_pb2 as pb
from svtagg.proto.vocab import refusal_from_rpc
from svtagg.vdaf.crawl import prefixes_to_bytes, unpack_bits
from svtagg.vdaf.sparse import SparseError


@dataclass
class CrawlStats:
    """What a walk through the servers cost so far: its levels, the ε they
    charged (each level's, on both ledgers), the reports the levels' checks
    took out of the walk, the bytes between the servers, the levels' stream
    ids and the time in calls."""

    levels: int = 0
    epsilon_spent: Fraction = Fraction(0)
    refused: int = 0
    peer_bytes: int = 0
    seconds_in_calls: float = 0.0
    stream_ids: list[str] = field(default_factory=list)
    #: level → reports its check refused.
    refused_at: dict[int, int] = field(default_factory=dict)


def pack_parents(parents: Sequence[int]) -> bytes:
    """The parents as the request sends them: 32 bytes big-endian each."""
    return prefixes_to_bytes(parents)


def unpack_above(data: bytes, candidates: int) -> list[bool]:
    """The response's bits, one per candidate (`vdaf.crawl.unpack_bits`);
    Refusal if the leader sent another number of bytes."""
    try:
        return list(unpack_bits(data, candidates))
    except SparseError:
        raise Refusal(
            f"the leader answered {len(data)} bytes for {candidates} candidates "
            f"({(candidates + 7) // 8} expected)"
        ) from None


def level_parents(candidates: Sequence[int], prefix_bits: int, steps: int) -> list[int]:
    """The parents a level's candidates extend (`c >> steps`, each once, in
    order), refusing (InvalidArgument) candidates that are not exactly every
    extension of those parents by `steps` bits, parent-major and ascending."""
    if not candidates:
        raise InvalidArgument("a level asks about at least one candidate")
    if len(candidates) > MAX_LEVEL_CANDIDATES:
        raise InvalidArgument(
            f"{len(candidates):,} candidates in one level, more than the "
            f"{MAX_LEVEL_CANDIDATES:,} a level may hold"
        )
    if any(not 0 <= int(c) < 1 << prefix_bits for c in candidates):
        raise InvalidArgument(f"a candidate is not a prefix of {prefix_bits} bits")
    parents = list(dict.fromkeys(int(c) >> steps for c in candidates))
    if any(a >= b for a, b in zip(parents, parents[1:], strict=False)):
        raise InvalidArgument("the candidates' parents must be ascending")
    full = [(p << steps) | x for p in parents for x in range(1 << steps)]
    if full != [int(c) for c in candidates]:
        raise InvalidArgument(
            f"the candidates must be every extension of their parents by {steps} bits, in "
            f"order ({len(parents)} parents: {len(full):,} candidates, got {len(candidates):,})"
        )
    return parents


class RemoteCrawlOracle:
    """One walk of the prefix crawl over task `task_id`, through the leader's
    Analyst service (`stub`, an `AnalystStub` or anything with its
    `CrawlLevel(request, timeout=...)`).  `bits`, when known (the task's
    crawl:B), is checked against each level's prefix length.  Level 1 starts
    a walk (again, on an oracle that walked before); each later level must
    follow the last one."""

    def __init__(
        self, stub: Any, task_id: str, *, bits: int | None = None, timeout: float = 600.0
    ) -> None:
        if bits is not None and not 1 <= bits <= MAX_CRAWL_BITS:
            raise InvalidArgument(f"strings of 1 to {MAX_CRAWL_BITS} bits, got {bits}")
        self._stub = stub
        self.task_id = task_id
        self.bits = bits
        self.timeout = timeout
        #: The walk so far: its id ("" before the first level), the bits of
        #: the last level's prefixes and that level's number.
        self.walk_id = ""
        self.depth = 0
        self.level = 0
        self.stats = CrawlStats()

    def above(
        self, level: int, candidates: Sequence[int], prefix_bits: int, epsilon: Fraction,
        threshold: int,
    ) -> list[bool]:  # fmt: skip
        """One level (`analyst.crawl.LevelOracle`): which candidates hold a
        noisy count of at least `threshold`; both servers charge `epsilon`."""
        request = self.request(level, candidates, prefix_bits, epsilon, threshold)
        start = time.perf_counter()
        try:
            resp: pb.CrawlLevelResponse = self._stub.CrawlLevel(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise refusal_from_rpc(exc) from None
        finally:
            self.stats.seconds_in_calls += time.perf_counter() - start
        if int(resp.candidates) != len(candidates):
            raise Refusal(
                f"the leader answered {resp.candidates} candidates, the level asked about "
                f"{len(candidates)}"
            )
        if not resp.walk_id:
            raise Refusal("the leader answered a crawl level without a walk id")
        answers = unpack_above(resp.above, len(candidates))
        self.walk_id, self.depth, self.level = resp.walk_id, prefix_bits, level
        st = self.stats
        st.levels += 1
        st.epsilon_spent += Fraction(epsilon)
        st.refused += int(resp.refused)
        st.refused_at[level] = int(resp.refused)
        st.peer_bytes += int(resp.peer_bytes)
        st.stream_ids.append(resp.stream_id)
        return answers

    def request(
        self, level: int, candidates: Sequence[int], prefix_bits: int, epsilon: Fraction,
        threshold: int,
    ) -> pb.CrawlLevelRequest:  # fmt: skip
        """The CrawlLevel request of a level, every argument checked (nothing
        is sent or changed)."""
        root = level == 1
        if not root and level != self.level + 1:
            raise InvalidArgument(
                f"level {level} does not follow this walk's last level ({self.level})"
            )
        depth = 0 if root else self.depth
        walk_id = "" if root else self.walk_id
        steps = prefix_bits - depth
        if not 1 <= steps <= MAX_STRIDE:
            raise InvalidArgument(
                f"a level extends its parents by 1 to {MAX_STRIDE} bits: prefixes of "
                f"{prefix_bits} bits after {depth}"
            )
        if self.bits is not None and prefix_bits > self.bits:
            raise InvalidArgument(f"prefixes of {prefix_bits} bits: the strings have {self.bits}")
        parents = level_parents(candidates, prefix_bits, steps)  # [0] at the root
        eps = Fraction(epsilon)
        if eps <= 0:
            raise InvalidArgument(f"a level's ε must be positive, got {epsilon}")
        if not 0 <= int(threshold) < 1 << 64:
            raise InvalidArgument(f"the threshold is a count in [0, 2^64), got {threshold}")
        return pb.CrawlLevelRequest(
            task_id=self.task_id,
            walk_id=walk_id,
            parents=b"" if root else pack_parents(parents),
            depth=depth,
            steps=steps,
            epsilon=str(eps),
            tau=int(threshold),
        )
