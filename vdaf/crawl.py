"""The incremental verifiable DPF of the prefix crawl over bit strings (heavy
hitters over unbounded domains), and one server's side of a walk over many
reports (`CrawlReports`).

The walk (`analyst.crawl`) and its privacy mechanism (`dp.crawl`,
docs/privacy.md "The prefix crawl") run against two in-process
`CrawlReports` (`analyst.crawl.DpfCrawlOracle`) or through the gRPC servers
(servers/crawl.py), each holding one `CrawlReports` per walk.

A report for a string α of BITS bits is a key pair of the GGM tree of
vdaf/sparse.py with an output and a proof correction at *every* level, so each
server can evaluate its share of F(x) = [x is a prefix of α] at any prefix x,
level by level, without the client.  A crawl keeps, per report, the nodes of
the prefixes the analyst kept at the previous level (`Nodes`), and evaluates
the children of those — the level's candidates — at the next.

The check of one level (one exchange of 32-byte prep shares per report):

- **at most one live candidate**: each candidate's proof H_t(s ⊕ 5) is keyed
  by its control bit, with the level's one proof correction where t = 1 (as
  sparse.py's leaves: a seed-only proof admits the split report, see
  docs/vdaf.md), compressed into a digest under the level's key (`level_key`:
  AES of the level's number under a key of the servers' verify key, the
  report id and the public share's hash, `base_key`);
- **its weight is the previous level's**: the share of Σ_{candidates} y minus
  the share of the previous level's kept total opens to 0, with the root's
  total 1 (so level 1's two candidates hold exactly one unit).

So at every level a report counts for at most one candidate, with weight 0 or
1.  And its unit follows one path: a node both servers hold alike (same seed
and bit) has children both hold alike, so a live candidate is always the child
of a live node of the previous level — which, being a candidate then, was
checked then.

The numpy code below is the reference; the native core (`vdaf/_sparse.c`,
`crawl_gen`, `crawl_expand`) makes the same bytes, a report's levels of one
step of the walk in one call.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from svtagg.vdaf import native, sparse
from svtagg.vdaf.field import FIELD128
from svtagg.vdaf.sparse import (
    CONVERT,
    KEY_SIZE,
    NONCE_SIZE,
    RAND_SIZE,
    Accumulator,
    P,
    SparseError,
    _blocks,
    _digest_key,
    _Hash,
    _hash_key,
    _leaf_proofs,
    _to_field,
    children,
    ctrl_bits,
    digest_with,
    gen_level,
    leaf_outputs,
    pack_ctrl,
    unpack_ctrl,
)

DST = b"svtagg/prefix-crawl/v1"
#: Strings of up to 256 bits.
MAX_BITS = 256
LEVEL_BYTES = 16 + 16 + 16  # seed, proof and output corrections
PREP_SHARE_SIZE = 32


_M64 = (1 << 64) - 1
T = TypeVar("T")
#: The most nodes one native call evaluates (its scratch, 2 MiB a buffer).
NATIVE_MAX_NODES = 1 << 17


def _native() -> bool:
    return sparse._core is not None and native.active() == "native"


def _report_keys(nonce: bytes) -> tuple[bytes, bytes, bytes]:
    """The report's tree key and its two proof keys (`_hash_key` usages 0–2)."""
    return tuple(_hash_key(nonce, usage, DST) for usage in range(3))  # type: ignore[return-value]


def paths_of(parents: list[int], prefixes: list[int], steps: int) -> tuple[bytes, bytes]:
    """Where each of `prefixes` hangs: the index of its parent among
    `parents` (int32) and its last `steps` bits (uint32), as `descend` takes
    them; SparseError for a prefix extending no parent, or one given twice."""
    at = {x: i for i, x in enumerate(parents)}
    if len(set(prefixes)) != len(prefixes):
        raise SparseError("the kept prefixes must be distinct")
    try:
        up = np.array([at[x >> steps] for x in prefixes], dtype=np.int32)
    except KeyError:
        raise SparseError("a kept prefix extends no node of the last level") from None
    ext = np.array([x & ((1 << steps) - 1) for x in prefixes], dtype=np.uint32)
    return up.tobytes(), ext.tobytes()


#: A prefix as the wire and the servers' records carry it: 32 bytes, big-endian
#: (strings of up to 256 bits).
PREFIX_BYTES = 32


def prefixes_to_bytes(prefixes: Sequence[int]) -> bytes:
    return b"".join(int(p).to_bytes(PREFIX_BYTES, "big") for p in prefixes)


def prefixes_from_bytes(data: bytes) -> tuple[int, ...]:
    """SparseError unless `data` is whole prefixes."""
    if len(data) % PREFIX_BYTES:
        raise SparseError(f"prefixes are {PREFIX_BYTES} bytes each, got {len(data)} bytes")
    return tuple(
        int.from_bytes(data[i : i + PREFIX_BYTES], "big") for i in range(0, len(data), PREFIX_BYTES)
    )


def pack_bits(bits: Sequence[bool]) -> bytes:
    """A level's answers on the wire: one bit per candidate, least significant
    bit of each byte first."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little").tobytes()


def unpack_bits(data: bytes, k: int) -> tuple[bool, ...]:
    """`pack_bits` back; SparseError unless `data` is exactly k bits' bytes."""
    if len(data) != (k + 7) // 8:
        raise SparseError(f"{len(data)} bytes for {k} bits ({(k + 7) // 8} expected)")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[:k]
    return tuple(bool(b) for b in bits)


def base_key(verify_key: bytes, nonce: bytes, phash: bytes) -> bytes:
    """A report's key for its levels' digest keys: SHAKE128 of the servers'
    verify key (clients do not hold it), the report id and the public
    share's hash (so two servers handed different public shares for one
    report get different digests at every level)."""
    return _digest_key(verify_key, nonce, phash, DST)


def level_key(base: bytes, level: int) -> bytes:
    """Level `level`'s digest key: AES under the report's base key of the
    level's number (a PRF, so each level's key is independent)."""
    enc = Cipher(algorithms.AES(base), modes.ECB()).encryptor()
    return enc.update(level.to_bytes(16, "little"))


def public_hash(public: bytes) -> bytes:
    """What each level's digest key binds of a report's public share: its
    SHAKE128 hash (32 bytes), so a level's key costs a short hash however
    long the share is (8 KB at 256 bits)."""
    return hashlib.shake_128(DST + b"/public" + public).digest(32)


@dataclass(frozen=True)
class ReportView:
    """What a server reads of one report at every step of a walk, decoded
    once (`PrefixDpf.view`): its id, its three AES keys, the corrections of
    every level (48 bytes each: seed, proof, output), the control
    corrections (two 0/1 bytes a level) and the public share's hash."""

    nonce: bytes
    keys: tuple[bytes, bytes, bytes]
    body: bytes
    ctrl: bytes
    public_hash: bytes


def _bits(x: int, n: int) -> list[int]:
    return [(x >> (n - 1 - i)) & 1 for i in range(n)]


@dataclass(frozen=True)
class Level:
    """One level's public corrections."""

    seed: bytes
    ctrl: tuple[bool, bool]
    proof: bytes
    output: int


@dataclass
class Nodes:
    """One server's kept nodes of one report after a level: their prefixes
    (as integers of `level` bits), seeds, control bits, and the server's share
    of their total (the root: 1 on server 0, 0 on server 1)."""

    level: int
    prefixes: list[int]
    seeds: npt.NDArray[np.uint64]
    ctrl: npt.NDArray[np.bool_]
    total: int


@dataclass(frozen=True)
class Evaluated:
    """One server's evaluation of one report's candidates at a level."""

    candidates: list[int]
    seeds: npt.NDArray[np.uint64]
    ctrl: npt.NDArray[np.bool_]
    shares: list[int]  # Field128 output shares, in candidate order
    prep_share: bytes  # digest ‖ (Σ shares − previous total) share


def _level_at(data: bytes, head: int, ctrl: list[tuple[bool, bool]], i: int) -> Level:
    at = head + LEVEL_BYTES * i
    output = int.from_bytes(data[at + 32 : at + 48], "little")
    if output >= P:
        raise SparseError("an output correction is not below the Field128 modulus")
    return Level(data[at : at + 16], ctrl[i], data[at + 16 : at + 32], output)


class PrefixDpf:
    """Incremental verifiable DPF keys for strings of `bits` bits."""

    def __init__(self, bits: int) -> None:
        if not 1 <= bits <= MAX_BITS:
            raise SparseError(f"strings of 1 to {MAX_BITS} bits")
        self.bits = bits

    def public_share_bytes(self) -> int:
        return (2 * self.bits + 7) // 8 + LEVEL_BYTES * self.bits

    def encode(self, levels: list[Level]) -> bytes:
        body = b"".join(lv.seed + lv.proof + lv.output.to_bytes(16, "little") for lv in levels)
        return pack_ctrl([lv.ctrl for lv in levels]) + body

    def decode(self, data: bytes) -> list[Level]:
        ctrl, head = unpack_ctrl(data, self.bits, self.public_share_bytes())
        return [_level_at(data, head, ctrl, i) for i in range(self.bits)]

    def level(self, data: bytes, level: int) -> Level:
        """Level `level`'s corrections (1-based) alone, the share's length and
        padding checked."""
        ctrl, head = unpack_ctrl(data, self.bits, self.public_share_bytes())
        return _level_at(data, head, ctrl, level - 1)

    # ------------------------------------------------------------ the client
    def gen(
        self, alpha: int, nonce: bytes, rand: bytes, weight: int = 1
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """The public share and the two keys for the string `alpha` (an
        integer of `bits` bits); a weight other than 1 makes a report the
        servers refuse (tests)."""
        if not 0 <= alpha < 1 << self.bits:
            raise SparseError(f"alpha is a string of {self.bits} bits")
        if len(nonce) != NONCE_SIZE or len(rand) != RAND_SIZE:
            raise SparseError(f"a nonce of {NONCE_SIZE} bytes and {RAND_SIZE} random bytes")
        keys = (rand[:KEY_SIZE], rand[KEY_SIZE:])
        if _native():
            public = sparse._core.crawl_gen(
                *_report_keys(nonce),
                self.bits,
                alpha.to_bytes((self.bits + 7) // 8, "big"),
                rand,
                (weight % P).to_bytes(16, "little"),
            )
            return bytes(public), keys
        h = _Hash(_hash_key(nonce, 0, DST))
        seed = _blocks(rand)
        ctrl = np.array([False, True])
        levels = []
        for bit in _bits(alpha, self.bits):
            seed, ctrl, seed_cw, ctrl_cw = gen_level(h, seed, ctrl, bit)
            conv = FIELD128.to_ints(_to_field(h(seed, CONVERT)))
            proofs = _leaf_proofs(nonce, seed, ctrl, DST)
            sign = 1 if ctrl[0] else -1  # t₀ − t₁
            levels.append(
                Level(
                    seed_cw,
                    ctrl_cw,
                    (proofs[0] ^ proofs[1]).astype("<u8").tobytes(),
                    sign * (weight - conv[0] + conv[1]) % P,
                )
            )
        return self.encode(levels), keys

    # ------------------------------------------------------------ the servers
    def root(self, agg_id: int, key: bytes) -> Nodes:
        if agg_id not in (0, 1) or len(key) != KEY_SIZE:
            raise SparseError("a server id of 0 or 1 and a 16-byte key")
        return Nodes(0, [0], _blocks(key), np.array([bool(agg_id)]), 1 - agg_id)

    def expand(
        self,
        agg_id: int,
        verify_key: bytes,
        nonce: bytes,
        public: bytes,
        kept: Nodes,
    ) -> Evaluated:
        """This server's shares of the children of `kept` (the level's
        candidates) and its prep share of the level's check."""
        level = kept.level + 1
        if level > self.bits:
            raise SparseError(f"the strings have {self.bits} bits")
        cw = self.level(public, level)
        h = _Hash(_hash_key(nonce, 0, DST))
        kids, t = children(h, kept.seeds, kept.ctrl, cw.seed, cw.ctrl)
        y = FIELD128.to_ints(leaf_outputs(h, kids, t, cw.output, agg_id))
        proofs = _leaf_proofs(nonce, kids, t, DST)
        key = level_key(base_key(verify_key, nonce, public_hash(public)), level)
        dg = digest_with(key, proofs, t, cw.proof)
        diff = (sum(y) - kept.total) % P
        candidates = [2 * x + b for x in kept.prefixes for b in (0, 1)]
        return Evaluated(candidates, kids, t, y, dg + diff.to_bytes(16, "little"))

    def expand_steps(
        self, agg_id: int, verify_key: bytes, nonce: bytes, public: bytes, kept: Nodes, steps: int
    ) -> tuple[Evaluated, list[bytes]]:
        """The reference of a walk's step: `steps` binary levels from `kept`,
        every child kept between them; the last one's evaluation and each
        one's prep share."""
        if steps < 1 or kept.level + steps > self.bits:
            raise SparseError(f"{steps} more levels past {kept.level} of {self.bits}")
        shares = []
        for step in range(steps):
            ev = self.expand(agg_id, verify_key, nonce, public, kept)
            shares.append(ev.prep_share)
            if step + 1 < steps:
                kept = self.keep(ev, ev.candidates, kept.level + 1)
        return ev, shares

    def view(self, nonce: bytes, public: bytes) -> ReportView:
        """The report decoded once for a walk (`ReportView`); SparseError if
        its public share does not decode."""
        if len(nonce) != NONCE_SIZE:
            raise SparseError(f"a nonce of {NONCE_SIZE} bytes")
        bits, head = ctrl_bits(public, self.bits, self.public_share_bytes())
        body = public[head:]
        for i in range(self.bits):
            if int.from_bytes(body[LEVEL_BYTES * i + 32 : LEVEL_BYTES * (i + 1)], "little") >= P:
                raise SparseError("an output correction is not below the Field128 modulus")
        return ReportView(
            nonce, _report_keys(nonce), body, bits.astype(np.uint8).tobytes(), public_hash(public)
        )

    def _step_args(self, view: ReportView, first: int, steps: int) -> tuple[bytes, bytes]:
        """Binary levels first … first + steps − 1's corrections, as the native
        core takes them: 48 bytes (seed, proof, output) and 2 control bits each."""
        if first < 1 or steps < 1 or first - 1 + steps > self.bits:
            raise SparseError(f"{steps} more levels past {first - 1} of {self.bits}")
        lo, hi = first - 1, first - 1 + steps
        return view.body[LEVEL_BYTES * lo : LEVEL_BYTES * hi], view.ctrl[2 * lo : 2 * hi]

    def expand_into(
        self,
        acc: Accumulator,
        agg_id: int,
        verify_key: bytes,
        view: ReportView,
        kept: Nodes,
        steps: int,
        negate: bool = False,
    ) -> list[bytes]:
        """The native step: add this server's output shares of the last of
        `steps` binary levels from `kept` (every child kept between them) to
        the wide accumulator `acc` (one coordinate per node, in candidate
        order; subtract them when `negate`), and return each binary level's
        prep share — `expand_steps`'s bytes."""
        if not _native() or acc.wide is None:
            raise SparseError("the native core and a wide accumulator")
        if agg_id not in (0, 1):
            raise SparseError("a server id of 0 or 1")
        first = kept.level + 1
        body, ctrl = self._step_args(view, first, steps)
        if acc.d != len(kept.prefixes) << steps:
            raise SparseError(f"the accumulator holds {acc.d} nodes")
        base = base_key(verify_key, view.nonce, view.public_hash)
        prep = bytearray(32 * steps)
        sparse._core.crawl_expand_many(
            b"".join(view.keys), base, first, agg_id, body, ctrl,
            kept.seeds.astype("<u8").tobytes(), kept.ctrl.astype(np.uint8).tobytes(),
            kept.total.to_bytes(16, "little"), b"\x01", negate, acc.wide, prep,
        )  # fmt: skip
        return [bytes(prep[32 * i : 32 * i + 32]) for i in range(steps)]

    def descend(
        self,
        agg_id: int,
        view: ReportView,
        kept: Nodes,
        steps: int,
        prefixes: list[int],
        paths: tuple[bytes, bytes] | None = None,
    ) -> Nodes:
        """The native `keep` after a step: the nodes of `prefixes` (each a
        kept node's prefix extended by `steps` bits), walked down their paths
        alone, and this server's share of their total.  `paths`: `paths_of`
        the prefixes, when the caller computed them once for many reports."""
        if not _native():
            raise SparseError("the native core")
        body, ctrl = self._step_args(view, kept.level + 1, steps)
        parents, exts = paths if paths is not None else paths_of(kept.prefixes, prefixes, steps)
        m = len(prefixes)
        seeds, bits, total = bytearray(16 * m), bytearray(m), bytearray(16)
        sparse._core.crawl_descend_many(
            b"".join(view.keys), agg_id, body, ctrl,
            kept.seeds.astype("<u8").tobytes(), kept.ctrl.astype(np.uint8).tobytes(),
            parents, exts, b"\x01", seeds, bits, total,
        )  # fmt: skip
        return Nodes(
            kept.level + steps,
            prefixes,
            np.frombuffer(seeds, dtype="<u8").reshape(-1, 2).astype(np.uint64),
            np.frombuffer(bits, dtype=np.uint8).astype(bool),
            int.from_bytes(total, "little"),
        )

    @staticmethod
    def decide(leader: bytes, helper: bytes) -> bool:
        """The level holds: equal digests, and the weight differences add to 0."""
        if len(leader) != PREP_SHARE_SIZE or len(helper) != PREP_SHARE_SIZE:
            raise SparseError(f"a prep share is {PREP_SHARE_SIZE} bytes")
        a, b = (int.from_bytes(x[16:], "little") for x in (leader, helper))
        return leader[:16] == helper[:16] and (a + b) % P == 0

    @staticmethod
    def keep(ev: Evaluated, prefixes: list[int], level: int) -> Nodes:
        """The nodes of the candidates the crawl keeps, and this server's
        share of their total, for the next level."""
        at = {x: i for i, x in enumerate(ev.candidates)}
        if len(set(prefixes)) != len(prefixes):
            raise SparseError("the kept prefixes must be distinct")
        missing = [x for x in prefixes if x not in at]
        if missing:
            raise SparseError(f"prefix {missing[0]} was not a candidate at level {level}")
        where = [at[x] for x in prefixes]
        total = sum(ev.shares[i] for i in where) % P
        return Nodes(level, list(prefixes), ev.seeds[where], ev.ctrl[where], total)


class CrawlReports:
    """One server's side of a walk over many reports: each report's kept
    nodes, level after level, and the reports found invalid (dropped for the
    rest of the walk, by both servers alike, since `decide` is symmetric).

    A level of the walk extends every kept prefix by `steps` bits: `steps`
    binary levels, all children kept between them, each with its own check;
    the candidates come out in order (kept prefix, then extension).  With the
    native core (`_NativeWalk`) every report's step runs in one call over all
    reports, adding their output shares to one wide accumulator (refused
    reports are evaluated again, negated, to take them out), and keeping
    walks each report down the kept paths alone, so a report holds only its
    kept nodes between levels; the reference (`reference`, or no core) holds
    each report's evaluation until the keep, one report at a time."""

    def __init__(
        self,
        bits: int,
        agg_id: int,
        verify_key: bytes,
        reports: list[tuple[bytes, bytes, bytes]],
        reference: bool = False,
    ) -> None:
        """`reports`: (nonce, public share, this server's key) each;
        `reference`: the numpy path even where the native core is."""
        self.dpf = PrefixDpf(bits)
        self.agg_id, self.verify_key = agg_id, verify_key
        self.reports = reports
        views: list[ReportView | None] = []
        for nonce, public, key in reports:
            view: ReportView | None = None
            try:  # a report that does not decode is refused from the start
                if len(key) == KEY_SIZE:
                    view = self.dpf.view(nonce, public)
            except SparseError:
                pass
            views.append(view)
        self._walk: _NativeWalk | _ReferenceWalk = (
            _NativeWalk(self.dpf, agg_id, verify_key, reports, views)
            if _native() and not reference
            else _ReferenceWalk(self.dpf, agg_id, verify_key, reports, views)
        )
        self.native = isinstance(self._walk, _NativeWalk)
        self.depth = 0  # bits of the current candidates
        self.candidates: list[int] = [0]  # the root: the empty prefix
        self._prev: list[int] = [0]
        self._steps = 0
        self._kept = True  # the nodes match `candidates` (no level evaluated since)
        self._resumed = False  # `resume`d: the next keep descends from the root

    @property
    def live(self) -> npt.NDArray[np.bool_]:
        """The reports still in the walk."""
        return self._walk.live.copy()

    @property
    def kept(self) -> bool:
        """Whether the nodes are the candidates' (no level evaluated since the
        last keep); False after a level, until its prefixes are kept."""
        return self._kept

    def extend(self, steps: int) -> npt.NDArray[np.uint8]:
        """Evaluate the next level's candidates (every kept prefix extended by
        `steps` bits); returns, per report, its prep share of each binary level
        (a row of 32·steps bytes; zeros for a dropped report)."""
        if not 1 <= steps or self.depth + steps > self.dpf.bits:
            raise SparseError(f"{steps} more bits past {self.depth} of {self.dpf.bits}")
        if not self._kept:
            raise SparseError("keep the last level's prefixes before the next level")
        n = len(self.candidates) << steps
        if n > NATIVE_MAX_NODES:
            raise SparseError(f"a level of {n:,} candidates (at most {NATIVE_MAX_NODES:,})")
        shares = self._walk.extend(self.depth + 1, steps, len(self.candidates))
        if isinstance(shares, list):
            shares = shares_array(shares, steps)
        self.depth += steps
        self._steps = steps
        self._prev = self.candidates
        self.candidates = [(p << steps) | x for p in self.candidates for x in range(1 << steps)]
        self._kept = False
        return shares

    def drop(self, invalid: npt.NDArray[np.bool_]) -> None:
        """Take the reports the level's check refused out of the walk (and
        their shares out of the level's sums)."""
        self._walk.drop(np.asarray(invalid, dtype=bool) & self._walk.live)

    def count_shares(self) -> list[int]:
        """This server's Field128 share of each candidate's count over the
        reports still in the walk."""
        return self._walk.count_shares(len(self.candidates))

    def resume(self, candidates: list[int], depth: int, dropped: npt.NDArray[np.bool_]) -> None:
        """Stand where a walk stood after a level whose candidates (`depth`
        bits each) were `candidates`, without evaluating any level: the
        reports in `dropped` out of the walk (refused by its checks so far),
        and the next `keep` descends from the root to the prefixes it keeps
        (hops of at most 16 bits through their ancestors).  How a server
        rebuilds a walk from its record after a restart (servers/crawl.py)."""
        if self.depth or not self._kept:
            raise SparseError("only a walk that has run no level resumes")
        if not 1 <= depth <= self.dpf.bits or any(not 0 <= c < 1 << depth for c in candidates):
            raise SparseError(f"candidates of {depth} bits, within {self.dpf.bits}")
        self._walk.drop_only(np.asarray(dropped, dtype=bool))
        self.depth, self.candidates, self._prev = depth, list(candidates), [0]
        self._steps, self._kept, self._resumed = depth, False, True

    def keep(self, prefixes: list[int]) -> None:
        """Keep the nodes of `prefixes` (candidates of the last level) for the
        next level."""
        if self._kept:
            raise SparseError("evaluate a level before keeping its prefixes")
        known = set(self.candidates)
        if len(set(prefixes)) != len(prefixes) or not known.issuperset(prefixes):
            raise SparseError("the kept prefixes must be distinct candidates of the last level")
        kept = list(prefixes)
        if self._resumed:  # from the root, in hops through the kept prefixes' ancestors
            prev, at = [0], 0
            while at < self.depth:
                hop = min(16, self.depth - at)
                shift = self.depth - at - hop
                nodes = sorted({p >> shift for p in kept}) if shift else kept
                self._walk.descend(prev, nodes, at + 1, hop)
                prev, at = nodes, at + hop
            self._resumed = False
        else:
            self._walk.keep(self._prev, kept, self._steps, self.depth)
        self.candidates = kept
        self._kept = True


class _ReferenceWalk:
    """`CrawlReports`'s state on the numpy reference: each report's nodes,
    and its last evaluation until the keep."""

    def __init__(
        self,
        dpf: PrefixDpf,
        agg_id: int,
        verify_key: bytes,
        reports: list[tuple[bytes, bytes, bytes]],
        views: list[ReportView | None],
    ) -> None:
        self.dpf, self.agg_id, self.verify_key, self.reports = dpf, agg_id, verify_key, reports
        self._nodes: list[Nodes | None] = [
            None if v is None else dpf.root(agg_id, r[2])
            for r, v in zip(reports, views, strict=True)
        ]
        self._last: list[Evaluated | None] = [None] * len(reports)

    @property
    def live(self) -> npt.NDArray[np.bool_]:
        return np.array([n is not None for n in self._nodes], dtype=bool)

    def extend(self, first: int, steps: int, kept: int) -> list[list[bytes]]:
        shares: list[list[bytes]] = []
        for i, (nonce, public, _) in enumerate(self.reports):
            nodes = self._nodes[i]
            if nodes is None:
                shares.append([])
                continue
            ev, mine = self.dpf.expand_steps(
                self.agg_id, self.verify_key, nonce, public, nodes, steps
            )
            self._last[i] = ev
            shares.append(mine)
        return shares

    def drop(self, invalid: npt.NDArray[np.bool_]) -> None:
        for i in np.flatnonzero(invalid):
            self._nodes[i], self._last[i] = None, None

    def drop_only(self, invalid: npt.NDArray[np.bool_]) -> None:
        self.drop(invalid)

    def descend(self, prev: list[int], kept: list[int], first: int, steps: int) -> None:
        """From the nodes of `prev` (first − 1 bits) to those of `kept`."""
        del prev  # each report's nodes are `prev`'s
        for i, (nonce, public, _) in enumerate(self.reports):
            nodes = self._nodes[i]
            if nodes is not None:
                ev, _ = self.dpf.expand_steps(
                    self.agg_id, self.verify_key, nonce, public, nodes, steps
                )
                self._nodes[i] = self.dpf.keep(ev, kept, first - 1 + steps)

    def count_shares(self, n: int) -> list[int]:
        totals = [0] * n
        for ev in self._last:
            if ev is not None:
                for j, y in enumerate(ev.shares):
                    totals[j] += y
        return [t % P for t in totals]

    def keep(self, prev: list[int], kept: list[int], steps: int, depth: int) -> None:
        for i, ev in enumerate(self._last):
            if ev is not None:
                self._nodes[i] = self.dpf.keep(ev, kept, depth)
                self._last[i] = None


class _NativeWalk:
    """`CrawlReports`'s state on the native core, as arrays over all
    reports: their keys and corrections (decoded once), their kept nodes
    (seeds, bits, total shares), the level's accumulator."""

    def __init__(
        self,
        dpf: PrefixDpf,
        agg_id: int,
        verify_key: bytes,
        reports: list[tuple[bytes, bytes, bytes]],
        views: list[ReportView | None],
    ) -> None:
        self.dpf, self.agg_id, self.verify_key = dpf, agg_id, verify_key
        r, bits = len(reports), dpf.bits
        self.live = np.array([v is not None for v in views], dtype=bool)
        self._keys = np.zeros((r, 48), dtype=np.uint8)
        self._body = np.zeros((r, LEVEL_BYTES * bits), dtype=np.uint8)
        self._ctrl = np.zeros((r, 2 * bits), dtype=np.uint8)
        self._seeds = np.zeros((r, 1, 16), dtype=np.uint8)
        self._bits = np.zeros((r, 1), dtype=np.uint8)
        self._totals = np.zeros((r, 16), dtype=np.uint8)
        self._base = np.zeros((r, 16), dtype=np.uint8)
        for i, (v, (_, _, key)) in enumerate(zip(views, reports, strict=True)):
            if v is None:
                continue
            self._keys[i] = np.frombuffer(b"".join(v.keys), dtype=np.uint8)
            self._base[i] = np.frombuffer(base_key(verify_key, v.nonce, v.public_hash), np.uint8)
            self._body[i] = np.frombuffer(v.body, dtype=np.uint8)
            self._ctrl[i] = np.frombuffer(v.ctrl, dtype=np.uint8)
            self._seeds[i, 0] = np.frombuffer(key, dtype=np.uint8)
            self._bits[i, 0] = agg_id
            self._totals[i, 0] = 1 - agg_id  # the root's total: 1 on server 0
        self._acc: Accumulator | None = None
        self._step: tuple[int, int] = (0, 0)
        self._prep = np.zeros((r, 0), dtype=np.uint8)

    def _args(self, first: int, steps: int) -> tuple[npt.NDArray[np.uint8], ...]:
        lo, hi = first - 1, first - 1 + steps
        body = np.ascontiguousarray(self._body[:, LEVEL_BYTES * lo : LEVEL_BYTES * hi])
        return body, np.ascontiguousarray(self._ctrl[:, 2 * lo : 2 * hi])

    def _run(self, which: npt.NDArray[np.bool_], negate: bool) -> None:
        first, steps = self._step
        assert self._acc is not None and self._acc.wide is not None
        body, ctrl = self._args(first, steps)
        marks = which.astype(np.uint8)

        def part(lo: int, hi: int) -> Accumulator:
            acc = Accumulator(self._acc.d, wide=True)  # type: ignore[union-attr]
            sparse._core.crawl_expand_many(
                self._keys[lo:hi], self._base[lo:hi], first, self.agg_id, body[lo:hi],
                ctrl[lo:hi], self._seeds[lo:hi], self._bits[lo:hi], self._totals[lo:hi],
                marks[lo:hi], negate, acc.wide, self._prep[lo:hi],
            )  # fmt: skip
            return acc

        for acc in _in_threads(part, len(which)):
            self._acc.add(acc)

    def extend(self, first: int, steps: int, kept: int) -> npt.NDArray[np.uint8]:
        self._acc = Accumulator(max(kept << steps, 1), wide=True)
        self._step = (first, steps)
        self._prep = np.zeros((len(self.live), 32 * steps), dtype=np.uint8)
        if kept and self.live.any():
            self._run(self.live, negate=False)
        return self._prep

    def drop(self, invalid: npt.NDArray[np.bool_]) -> None:
        if invalid.any() and self._acc is not None:
            self._run(invalid, negate=True)
        self.live &= ~invalid

    def drop_only(self, invalid: npt.NDArray[np.bool_]) -> None:
        """Out of the walk, with no level's sums to take them out of."""
        self.live &= ~invalid

    def descend(self, prev: list[int], kept: list[int], first: int, steps: int) -> None:
        """From the nodes of `prev` (first − 1 bits) to those of `kept`
        (first − 1 + steps bits): `keep` of levels [first, first + steps)."""
        self._step = (first, steps)
        self.keep(prev, kept, steps, first - 1 + steps)

    def count_shares(self, n: int) -> list[int]:
        assert self._acc is not None
        return FIELD128.to_ints(self._acc.value())[:n]

    def keep(self, prev: list[int], kept: list[int], steps: int, depth: int) -> None:
        first, _ = self._step
        parents, exts = paths_of(prev, kept, steps)
        r, m = len(self.live), len(kept)
        seeds = np.zeros((r, max(m, 1), 16), dtype=np.uint8)
        bits = np.zeros((r, max(m, 1)), dtype=np.uint8)
        totals = np.zeros((r, 16), dtype=np.uint8)
        if m and self.live.any():
            body, ctrl = self._args(first, steps)
            marks = self.live.astype(np.uint8)

            def part(lo: int, hi: int) -> None:
                sparse._core.crawl_descend_many(
                    self._keys[lo:hi], self.agg_id, body[lo:hi], ctrl[lo:hi],
                    self._seeds[lo:hi], self._bits[lo:hi], parents, exts, marks[lo:hi],
                    seeds[lo:hi], bits[lo:hi], totals[lo:hi],
                )  # fmt: skip

            _in_threads(part, r)
        self._seeds, self._bits, self._totals = seeds, bits, totals
        self._acc = None


#: Threads a walk's step runs on (the native calls run without the GIL): the
#: machine's CPUs, at most 8, each with at least `_PER_THREAD` reports.
WALK_THREADS = min(8, os.cpu_count() or 1)
_PER_THREAD = 512


def _in_threads(part: Callable[[int, int], T], rows: int) -> list[T]:
    """`part` over [0, rows) cut into contiguous ranges, one per thread; the
    results in range order (the bytes do not depend on the cut)."""
    count = max(1, min(WALK_THREADS, rows // _PER_THREAD))
    cuts = [rows * i // count for i in range(count + 1)]
    if count == 1:
        return [part(0, rows)]
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(part, cuts[:-1], cuts[1:]))


def check_level(
    leader: npt.NDArray[np.uint8], helper: npt.NDArray[np.uint8], live: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Per report, whether every binary level of a walk's step held on both
    servers' prep shares (`extend`'s arrays: 32 bytes a binary level), as
    `PrefixDpf.decide` on each, over the reports `live` on both before the
    step: equal digests, and weight differences adding to 0 mod p."""
    if leader.shape != helper.shape or leader.shape[0] != len(live) or leader.shape[1] % 32:
        raise SparseError("the two servers' prep shares differ in shape")
    r, steps = leader.shape[0], leader.shape[1] // 32
    a = np.ascontiguousarray(leader).reshape(r, steps, 32)
    b = np.ascontiguousarray(helper).reshape(r, steps, 32)
    same = (a[:, :, :16] == b[:, :, :16]).all(axis=2)
    x = a[:, :, 16:].copy().view("<u8").reshape(r, steps, 2).astype(np.uint64)
    y = b[:, :, 16:].copy().view("<u8").reshape(r, steps, 2).astype(np.uint64)
    lo = x[..., 0] + y[..., 0]
    c0 = (lo < x[..., 0]).astype(np.uint64)
    hi = x[..., 1] + y[..., 1]
    top = hi < x[..., 1]
    hi2 = hi + c0
    top |= hi2 < hi
    zero = np.zeros_like(top)
    for k in (0, 1, 2):  # the 129-bit sum is 0, p or 2p
        v = k * P
        zero |= (
            (lo == np.uint64(v & _M64))
            & (hi2 == np.uint64((v >> 64) & _M64))
            & (top == bool(v >> 128))
        )
    return np.asarray(live, dtype=bool) & (same & zero).all(axis=1)


#: Bytes one server sends per report for a step's check when the servers
#: compare hashes of what the check compares (`check_values`).
CHECK_VALUE_SIZE = 16
_CHECK_PERSON = b"svtagg-crawl-chk"


def check_values(
    prep: npt.NDArray[np.uint8], agg_id: int, live: npt.NDArray[np.bool_]
) -> npt.NDArray[np.uint8]:
    """Per report, a 16-byte hash (BLAKE2b) of what a step's check compares
    on this server's side: each binary level's digest and its weight share,
    negated mod p on server 1.  The two servers' values of a report are
    equal exactly when `check_level` holds on their prep shares (but for a
    BLAKE2b-128 collision, 2^−128 per report), so exchanging them decides the
    same, reveals only that equality (the prep shares revealed more), and
    moves 16 bytes per report and step instead of 32 per binary level.
    Zeros for a report out of the walk."""
    r, width = prep.shape
    if width % 32 or len(live) != r:
        raise SparseError("prep shares of 32 bytes per binary level, one row per report")
    rows = np.ascontiguousarray(prep).reshape(r, width // 32, 32).copy()
    w = rows[:, :, 16:].view("<u8")  # (r, steps, 2): each weight's low and high words
    w[:] = _canonical(w, negate=agg_id == 1)
    out = np.zeros((r, CHECK_VALUE_SIZE), dtype=np.uint8)
    flat = rows.reshape(r, width)
    for i in np.flatnonzero(live):
        h = hashlib.blake2b(flat[i].tobytes(), digest_size=CHECK_VALUE_SIZE, person=_CHECK_PERSON)
        out[i] = np.frombuffer(h.digest(), dtype=np.uint8)
    return out


_P_LO, _P_HI = np.uint64(P & _M64), np.uint64(P >> 64)


def _canonical(w: npt.NDArray[np.uint64], negate: bool) -> npt.NDArray[np.uint64]:
    """128-bit field elements as (low, high) words, reduced below p once (a
    share is below 2^128 < 2p) and, with `negate`, replaced by p − w mod p."""
    lo, hi = w[..., 0].copy(), w[..., 1].copy()
    ge = (hi > _P_HI) | ((hi == _P_HI) & (lo >= _P_LO))
    borrow = (lo < _P_LO) & ge
    lo = np.where(ge, lo - _P_LO, lo)
    hi = np.where(ge, hi - _P_HI - borrow.astype(np.uint64), hi)
    if negate:
        zero = (lo == 0) & (hi == 0)
        borrow = lo > _P_LO
        nlo = _P_LO - lo
        nhi = _P_HI - hi - borrow.astype(np.uint64)
        lo, hi = np.where(zero, lo, nlo), np.where(zero, hi, nhi)
    return np.stack([lo, hi], axis=-1)


def check_hashed(
    leader: npt.NDArray[np.uint8], helper: npt.NDArray[np.uint8], live: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """`check_level` from the two servers' `check_values`."""
    if leader.shape != helper.shape or leader.shape != (len(live), CHECK_VALUE_SIZE):
        raise SparseError("the two servers' check values differ in shape")
    return np.asarray(live, dtype=bool) & (leader == helper).all(axis=1)


def step_level(leader: CrawlReports, helper: CrawlReports, steps: int) -> npt.NDArray[np.bool_]:
    """One step of a walk on both servers' sides: each extends by `steps`
    bits, the level's check runs on both prep shares, and the reports it
    refuses are dropped on both (what the servers' per-level exchange will
    do).  Returns the reports refused at this step."""
    was = leader.live | helper.live
    ok = check_level(leader.extend(steps), helper.extend(steps), leader.live & helper.live)
    invalid = was & ~ok
    for side in (leader, helper):
        side.drop(invalid)
    return invalid


def level_counts(leader: CrawlReports, helper: CrawlReports) -> list[int]:
    """The candidates' counts: the two servers' count shares added (what
    only the comparison may see; in process, the tests' and oracle's view)."""
    return [(a + b) % P for a, b in zip(leader.count_shares(), helper.count_shares(), strict=True)]


def shares_array(shares: list[list[bytes]], steps: int) -> npt.NDArray[np.uint8]:
    """Per-report prep-share lists as `check_level` takes them (zeros for a
    report with none)."""
    out = np.zeros((len(shares), 32 * steps), dtype=np.uint8)
    for i, mine in enumerate(shares):
        if mine:
            out[i] = np.frombuffer(b"".join(mine), dtype=np.uint8)
    return out


def ring_shares(count_shares: list[int], agg_id: int) -> npt.NDArray[np.uint64]:
    """A server's Field128 count shares as additive shares mod 2^64, with no
    exchange: p ≡ 1 (mod 2^64), and two shares a, b of a count c add up, as
    integers, to c + p unless a ≤ c — probability (c + 1)/p < 2^−107 for
    c < 2^20 once one honest report's (pseudorandom) share is in the sum — so
    server 0 takes (a mod 2^64) − 1 and server 1 b mod 2^64.  What the
    servers' comparison of a level's counts takes (servers/crawl.py)."""
    if agg_id not in (0, 1):
        raise SparseError("a server id of 0 or 1")
    low = np.array([x & _M64 for x in count_shares], dtype=np.uint64)
    return low - np.uint64(1 - agg_id) if agg_id == 0 else low
