"""The two-party comparison protocol: semi-honest Yao between a garbler (on the
servers, the helper) and an evaluator (the leader) over an abstract `Channel`,
one chunk of queries per call.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from svtagg.mpc import millionaire, native
from svtagg.mpc import softspoken as otx
from svtagg.mpc.aes import Blocks, TweakableHash
from svtagg.mpc.channel import Channel, MemoryChannel
from svtagg.mpc.circuits import (
    CLOSE,
    CttCode,
    WireSource,
    any_per_group_circuit,
    argmax_circuit,
    argmax_index,
    bit_planes,
    check_width,
    clamp_reshare_circuit,
    ctt_circuit,
    ctt_logic,
    ctt_outcomes,
    field_clamp_reshare_circuit,
    field_words,
    first_yes_circuit,
    first_yes_index,
    first_yes_logic,
    index_bits,
    lane_batches,
    prime_field,
    ring_from_bits,
)

# HIGH and LOW stay importable from here, where the codes used to be defined.
from svtagg.mpc.circuits import HIGH as HIGH
from svtagg.mpc.circuits import LOW as LOW
from svtagg.mpc.garble import Backend, Bits, Wires
from svtagg.mpc.ot import KAPPA, base_ot_receive, base_ot_send
from svtagg.mpc.ring import RING_BITS, U64
from svtagg.mpc.softspoken import bytes_per_ot, extension_receiver, extension_sender, parse_ot
from svtagg.mpc.streaming import _OrderedSends, _Parts, ot_labels, send_ot_message
from svtagg.mpc.tournament import (
    CARRY_INDEX_BITS,
    TournamentChunk,
    carry_bits,
    carry_lanes,
    carry_words,
    chunk_input,
    noisy_max_chunk_circuit,
)

_CHUNK_BITS = 40  # chunk counter width inside the high tweak word

R = TypeVar("R")


@dataclass(frozen=True)
class ChunkCircuit(Generic[R]):
    """What the generic chunk flow needs to know about one kind of chunk.

    Each party passes one share vector of k ring elements per entry of `inputs`;
    they are laid end to end as the circuit's k·len(inputs) lanes. `circuit`
    returns `outputs` bundles of k wires, which only the evaluator decodes.
    """

    #: Parameter names of the input vectors, for error messages.
    inputs: tuple[str, ...]
    outputs: int
    #: (backend, garbler bits or None, evaluator-input wires, k) → output bundles.
    circuit: Callable[[Backend, Bits | None, WireSource, int], tuple[Wires, ...]]
    #: The evaluator's decoded output bundles → the result.
    decode: Callable[[list[Bits]], R]
    #: The result as the evaluator's last message (of a length fixed by k), and
    #: back (validated).
    encode: Callable[[R, int], bytes]
    parse: Callable[[bytes, int], R]
    #: The result of a chunk of no queries (nothing is sent).
    empty: Callable[[], R]
    #: Further k-vectors only the garbler supplies (constants to the circuit,
    #: after the shared inputs in its garbler bits; no OT for them).
    garbler_inputs: int = 0
    #: Table blocks per lane at most (2w − 3 for a w-bit comparison, < 6 for
    #: the chunk logic): preallocated, and the bound a receiver checks.
    tables_per_lane: int = 131
    #: Output wires of a chunk of k (the bundles laid end to end); default k each.
    output_bits: Callable[[int], int] | None = None
    #: Bits per evaluator input lane: the comparison width w (2..64).
    width: int = RING_BITS
    #: The circuit starts with the sign test over all lanes (`circuits.sign_yes`),
    #: so the garbler can stream its tables lane batch by lane batch.
    streams: bool = False

    def parts(self, k: int) -> int:
        """Messages of the garbler's tables: a lane batch's each, then the rest (1 unstreamed)."""
        if not self.streams:
            return 1
        batches = len(lane_batches(k * len(self.inputs)))
        return batches + 1 if batches > 1 else 1

    def decoding_bits(self, k: int) -> int:
        return self.output_bits(k) if self.output_bits is not None else self.outputs * k

    def max_message(self, k: int, ot_bytes: float = 16) -> int:
        """Bytes of the longest message an honest party sends in a chunk of k (OT message,
        `ot_bytes` per OT, lane batches padded to whole bytes; tables and decoding bits;
        result): a receiver refuses a longer announced length before allocating anything."""
        lanes, ots = k * len(self.inputs), 8 * sum(_ot_widths(k * len(self.inputs), self.width))
        tables = 16 * (self.tables_per_lane * lanes + 64) + (self.decoding_bits(k) + 7) // 8
        return max(int(ot_bytes * ots), tables, 8 * k)


def _encode_index(j: int | None, k: int) -> bytes:
    return (-1 if j is None else j).to_bytes(8, "little", signed=True)


def _parse_index(msg: bytes, k: int) -> int | None:
    if len(msg) != 8:
        raise ValueError("malformed result message")
    v = int.from_bytes(msg, "little", signed=True)
    if not -1 <= v < k:
        raise ValueError("peer returned an impossible index")
    return None if v < 0 else v


_CODES = tuple(CttCode)  # indexing it is far cheaper than CttCode(v) per query


#: Filler after the first CLOSE: the result message is always k bytes, so its
#: length says nothing about where the stream closed.
_NOT_ASKED = 0xFF


def _encode_outcomes(out: list[int], k: int) -> bytes:
    return bytes(out) + bytes([_NOT_ASKED]) * (k - len(out))


def _parse_outcomes(msg: bytes, k: int) -> list[int]:
    if len(msg) != k:
        raise ValueError("malformed result message")
    raw = list(msg)
    stop = raw.index(CLOSE) + 1 if CLOSE in raw else k
    out, rest = raw[:stop], raw[stop:]
    if any(v > CLOSE for v in out) or any(v != _NOT_ASKED for v in rest):
        raise ValueError("peer returned impossible outcomes")
    return [_CODES[v] for v in out]


@functools.cache  # immutable, one per width: built once, not per chunk
def first_yes_spec(width: int = RING_BITS) -> ChunkCircuit[int | None]:
    """AboveThreshold's chunk: the first YES on w-bit comparisons."""
    w = check_width(width)
    return ChunkCircuit(
        inputs=("z",),
        outputs=1,
        circuit=lambda be, a_bits, b, k: (first_yes_circuit(be, a_bits, b, k, w),),
        decode=lambda bits: first_yes_index(bits[0]),
        encode=_encode_index,
        parse=_parse_index,
        empty=lambda: None,
        tables_per_lane=2 * w + 3,
        width=w,
        streams=True,
    )


@functools.cache  # immutable, one per width: built once, not per chunk
def compare_to_thresholds_spec(width: int = RING_BITS) -> ChunkCircuit[list[int]]:
    """CompareToThresholds' chunk on w-bit comparisons."""
    w = check_width(width)
    return ChunkCircuit(
        inputs=("z_high", "z_low"),
        outputs=2,
        circuit=lambda be, a_bits, b, k: ctt_circuit(be, a_bits, b, k, w),
        decode=lambda bits: ctt_outcomes(*bits),
        encode=_encode_outcomes,
        parse=_parse_outcomes,
        empty=list,
        tables_per_lane=2 * w + 3,
        width=w,
        streams=True,
    )


def _yes_wires(be: Backend, a_bits: Bits | None, b: WireSource, n: int) -> Wires:
    """YES bits held as XOR shares (the OT path's output) as wires: the
    evaluator's share by OT (1 bit per lane), the garbler's a free XOR."""
    parts = []
    for lo, hi in lane_batches(n):
        w = b(lo, hi)[0].copy()  # the OT extension reuses its label buffer per batch
        parts.append(be.xor_const(w, None if a_bits is None else a_bits[0, lo:hi]))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@functools.cache  # immutable: built once, not per chunk
def first_yes_after_ot() -> ChunkCircuit[int | None]:
    """AboveThreshold's chunk logic on YES bits shared by the OT path."""
    return ChunkCircuit(
        inputs=("z",),
        outputs=1,
        circuit=lambda be, a_bits, b, k: (first_yes_logic(be, _yes_wires(be, a_bits, b, k)),),
        decode=lambda bits: first_yes_index(bits[0]),
        encode=_encode_index,
        parse=_parse_index,
        empty=lambda: None,
        tables_per_lane=3,
        width=1,
    )


@functools.cache  # immutable: built once, not per chunk
def ctt_after_ot() -> ChunkCircuit[list[int]]:
    """CompareToThresholds' chunk logic on YES bits shared by the OT path."""
    return ChunkCircuit(
        inputs=("z_high", "z_low"),
        outputs=2,
        circuit=lambda be, a_bits, b, k: ctt_logic(be, _yes_wires(be, a_bits, b, 2 * k), k),
        decode=lambda bits: ctt_outcomes(*bits),
        encode=_encode_outcomes,
        parse=_parse_outcomes,
        empty=list,
        tables_per_lane=6,
        width=1,
    )


def _parse_argmax(msg: bytes, k: int) -> int:
    j = _parse_index(msg, k)
    if j is None:  # k ≥ 1 candidates always have a maximum
        raise ValueError("peer returned an impossible index")
    return j


@functools.cache  # immutable, one per width: built once, not per chunk
def noisy_max_spec(width: int = RING_BITS) -> ChunkCircuit[int | None]:
    """Report-noisy-max's chunk: the first index of the largest signed w-bit
    z_L + z_H (`circuits.argmax_circuit`, ≤ 3w ANDs per lane)."""
    w = check_width(width)
    return ChunkCircuit(
        inputs=("z",),
        outputs=1,
        circuit=lambda be, a_bits, b, k: argmax_circuit(be, a_bits, b, k, w),
        decode=argmax_index,
        encode=_encode_index,
        parse=_parse_argmax,
        empty=lambda: None,
        tables_per_lane=6 * w,
        output_bits=index_bits,
        width=w,
        streams=True,
    )


def noisy_max_chunk_spec(
    width: int, where: TournamentChunk, out_mask: Bits | None = None
) -> ChunkCircuit[Any]:
    """A chunk of a chunked report-noisy-max (`tournament.noisy_max_chunk_circuit`;
    the carry's lanes, then the candidates).  The last chunk's result is the
    index over the stream, on both sides; any other's is the evaluator's masked
    carry, which it keeps (the garbler is sent nothing and keeps `out_mask`).
    Table blocks: ≤ 6w − 1 per candidate; the carry lanes' 6w + 2 each cover
    the match against the carry (≤ 4w + 170), the slack the offset's adder (62)."""
    w, first = check_width(width), carry_lanes(width) if where.carry_in else 0

    def circuit(be: Backend, a_bits: Bits | None, b: WireSource, n: int) -> tuple[Wires, ...]:
        mask = out_mask if a_bits is not None else None
        return noisy_max_chunk_circuit(be, a_bits, b, n, w, where, mask)

    def parse(msg: bytes, n: int) -> int:
        return _parse_argmax(msg, where.offset + n - first)

    last = where.final
    return ChunkCircuit(
        inputs=("z",),
        outputs=1,
        circuit=circuit,
        decode=argmax_index if last else lambda bits: carry_words(bits[0], w),
        encode=_encode_index if last else lambda y, n: b"",
        parse=parse if last else _parse_nothing,
        empty=lambda: None,
        tables_per_lane=6 * w + 2,
        output_bits=lambda n: CARRY_INDEX_BITS if last else carry_bits(w),
        width=w,
        streams=True,
    )


def _parse_nothing(msg: bytes, k: int) -> None:
    if msg:
        raise ValueError("malformed result message")


def _encode_bits(bits: list[bool], k: int) -> bytes:
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little").tobytes()


def any_per_group_spec(group: int, width: int = RING_BITS) -> ChunkCircuit[list[bool]]:
    """One bit per group of `group` lanes (OR of the group's YES, on w-bit
    comparisons): both parties learn the bit vector and nothing else."""
    w = check_width(width)

    def parse(msg: bytes, k: int) -> list[bool]:
        m = k // group
        if len(msg) != (m + 7) // 8:
            raise ValueError("malformed result message")
        bits = np.unpackbits(np.frombuffer(msg, np.uint8), bitorder="little")
        if bits[m:].any():
            raise ValueError("peer returned impossible bits")
        return [bool(v) for v in bits[:m]]

    return ChunkCircuit(
        inputs=("z",),
        outputs=1,
        circuit=lambda be, a_bits, b, k: (any_per_group_circuit(be, a_bits, b, k, group, w),),
        decode=lambda bits: [bool(v) for v in bits[0]],
        encode=_encode_bits,
        parse=parse,
        empty=list,
        output_bits=lambda k: k // group,
        tables_per_lane=2 * w + 3,
        width=w,
        streams=True,
    )


def clamp_reshare_spec(bound: int) -> ChunkCircuit[U64 | None]:
    """The robust-aggregate pass: the evaluator decodes its new share y, the
    garbler learns nothing (an empty last message keeps the flow's shape)."""
    return ChunkCircuit(
        inputs=("share",),
        outputs=RING_BITS,
        circuit=lambda be, a_bits, b, k: clamp_reshare_circuit(be, a_bits, b, k, bound),
        decode=ring_from_bits,
        encode=lambda y, k: b"",
        parse=_parse_nothing,
        empty=lambda: None,
        garbler_inputs=1,
        tables_per_lane=640,
    )


def field_clamp_reshare_spec(bound: int, field: object) -> ChunkCircuit[U64 | None]:
    """The field-to-ring pass: like `clamp_reshare_spec`, on shares of a Prio3
    field sum, each coordinate `words` 64-bit lanes (OT'd as such)."""
    f = prime_field(field)
    return ChunkCircuit(
        inputs=("share",),
        outputs=RING_BITS,
        circuit=lambda be, a_bits, b, k: field_clamp_reshare_circuit(be, a_bits, b, k, bound, f),
        decode=ring_from_bits,
        encode=lambda y, k: b"",
        parse=_parse_nothing,
        empty=lambda: None,
        garbler_inputs=1,
        # ≤ 6·w_p + 120 ANDs per coordinate, two table blocks each.
        tables_per_lane=2 * (6 * f.bits + 120) // f.words,
        output_bits=lambda k: RING_BITS * (k // f.words),
    )


@dataclass
class RunStats:
    """Cost of the last protocol run, from this party's point of view."""

    comparisons: int = 0
    and_gates: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Messages in both directions; each is one flight, so 3 = 1.5 round trips.
    messages: int = 0
    seconds: float = 0.0

    @property
    def round_trips(self) -> float:
        return self.messages / 2


def _as_ring(z: npt.ArrayLike) -> U64:
    arr = np.asarray(z)
    if arr.ndim != 1:
        raise ValueError("expected a 1-D vector of ring elements")
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr)
    if arr.dtype == np.int64:
        return np.ascontiguousarray(arr).view(np.uint64)
    raise TypeError(f"expected uint64 ring elements, got {arr.dtype}")


@dataclass(frozen=True)
class _At:
    """Where one garbled chunk runs: its OT nonce and high tweak word
    (`_Party._next_chunk`), and on the OT path its logic's inputs."""

    nonce: int
    tweak_hi: int
    logic: millionaire.LogicInputs | None = None


class _Party:
    """What both sides share: input checks, chunk counting, costs.

    A `session_id` must be fresh for every garbler/evaluator pair (the servers
    use their stream id), and both parties must run the same chunks in the same
    order with the same k, `ot` ("iknp", "softspoken[:k]", "ferret[:set]") and
    `scheme` ("halfgates" or "threehalves"; the OT path's chunk logic is always
    garbled under three-halves): the tweak of half h of the AND gate
    in lane k of layer L is (L·2^32 + 2k + h, 24-bit session tag ‖ 40-bit chunk
    counter), 3k + h under three-halves, unique across the session (`garble.py`)."""

    #: Tests may set this list to see every batch of input labels.
    input_labels_log: list[Blocks] | None = None
    #: The OT extension's sender or receiver, made by `setup`.
    _ext: Any

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        scheme: str = "halfgates",
        ot: str | None = None,
        path: str | millionaire.PathRule = "garbled",
    ) -> None:
        if not session_id:
            raise ValueError("session_id must be non-empty and fresh")
        self.channel, self.ot = channel, parse_ot(ot)  # "iknp" | "softspoken[:k]", both alike
        self.session_id = bytes(session_id)
        self._tag = int.from_bytes(hashlib.sha256(b"svtagg-gc" + self.session_id).digest()[:3])
        self._chunk = 0
        #: "native" or "numpy", fixed when the party is made (see `native.use`).
        self.engine = native.active()
        self.hasher: TweakableHash | native.NativeHash = (
            native.NativeHash() if self.engine == "native" else TweakableHash()
        )
        self.scheme = scheme
        self._garble_cls, self._eval_cls = native.backends(self.engine, scheme)
        #: The OT path's chunk logic is garbled under three-halves whatever the
        #: scheme: 24 bytes per AND instead of 32 (the path exists to save bytes).
        self._logic_cls = native.backends(self.engine, "threehalves")
        self._workspace: dict[str, Blocks] = {}  # scratch reused across chunks
        self.last_stats = RunStats()
        self._ready = False
        #: Which path first-YES and CompareToThresholds chunks take
        #: (`millionaire.PathRule`: "garbled", "ot" or "auto:RTT_MS:MBPS", per
        #: chunk size and width).  Both parties must be given the same rule (the
        #: servers: SessionOpen.comparison_path).
        self.path = (
            path if isinstance(path, millionaire.PathRule) else millionaire.PathRule.parse(path)
        )
        #: "garbled" or "ot": the path the last first-YES / CTT chunk took.
        self.last_path = "garbled"
        #: The OT path's precomputed slots and a fill still being made in a worker
        #: thread (on copies of its OT labels: it never touches the extension).
        self._slots = millionaire.SlotPool()
        self._fill_task: asyncio.Future[millionaire.Slots] | None = None
        self._labels_pending: asyncio.Future[Any] | None = None
        self._fill_gate: asyncio.Event | None = None
        self._fill_ws: dict[str, Any] = {}
        self._fill_hasher: TweakableHash | native.NativeHash = type(self.hasher)()
        self._pre_ws: dict[str, Any] = {}
        self._pre_hasher: TweakableHash | native.NativeHash = type(self.hasher)()

    async def first_yes(self, z: npt.ArrayLike, width: int = RING_BITS) -> int | None:
        """First j with signed(z_L[j] + z_H[j]) ≥ 0, or None, on both sides, from
        this party's share (either share: the circuit adds them).  `width` w < 64
        compares the low w bits (same w on both; correct if |z_L + z_H| < 2^(w−1))."""
        if self._ot_path(np.shape(z)[0], width):
            return await self._ot_chunk(first_yes_after_ot(), width, z)
        return await self._chunk_flow(first_yes_spec(width), z)

    async def compare_to_thresholds(
        self, z_high: npt.ArrayLike, z_low: npt.ArrayLike, width: int = RING_BITS
    ) -> list[int]:
        """Outcomes (HIGH, LOW, CLOSE) up to and including the first CLOSE, on both
        sides, and nothing later, from this party's shares (`width`: `first_yes`)."""
        if self._ot_path(2 * np.shape(z_high)[0], width):
            return await self._ot_chunk(ctt_after_ot(), width, z_high, z_low)
        return await self._chunk_flow(compare_to_thresholds_spec(width), z_high, z_low)

    def _ot_path(self, comparisons: int, width: int) -> bool:
        """Whether a chunk of this many comparisons runs the OT-based path (public:
        both parties decide alike).  Records the choice in `last_path`."""
        use = self.path.use_ot(comparisons, width, bytes_per_ot(self.ot))
        self.last_path = "ot" if use else "garbled"
        return use

    async def _ot_chunk(self, spec: ChunkCircuit[R], width: int, *zs: npt.ArrayLike) -> R:
        """The OT-based path on the session's precomputed slots (`millionaire.Slots`):
        filled inline when the pool is short, then the online phase (the
        evaluator's d bits, the tables, the tree), then the chunk's logic (prefix
        OR, CTT codes) garbled on the shared YES bits (`spec`, w = 1).  The next
        chunk's fill rides in the online phase's first flights (the evaluator's
        OT message after its d bits; the garbler reads it after sending its
        tables).  Up to `millionaire.MAX_SHIFTED` slots, both make it off the
        chunk's critical path: the evaluator while the previous chunk's logic
        waited for its tables (`_start_prefill`), the garbler once this chunk's
        logic tables are sent (`_open_fill_gate`); a larger fill is made in
        worker threads while the chunk goes on."""
        if not self._ready:
            raise RuntimeError("call setup() first")
        check_width(width)
        shares = [_as_ring(z) for z in zs]
        if any(s.shape != shares[0].shape for s in shares):
            raise ValueError(f"{' and '.join(spec.inputs)} differ in length")
        await self._settle_fill()
        z = shares[0] if len(shares) == 1 else np.concatenate(shares)
        lanes = z.shape[0]
        s, r, t = self.channel.bytes_sent, self.channel.bytes_received, time.perf_counter()
        p = millionaire.plan(width)
        select = getattr(self.channel, "select", None)
        if select is not None:
            select(lanes)
        limit = getattr(self.channel, "limit_messages", None)
        # A fill, inline or ahead, is of at most `lanes` slots.
        fill_bound = int(bytes_per_ot(self.ot) * 8 * sum(_ot_widths(lanes, p.fill_planes)))
        if limit is not None:
            # Any online message: the tables, κ and openings, or openings and e.
            opened = sum(p.level_openings(i) for i in range(p.depth))
            online = sum(-(-bits * lanes // 8) for bits in (p.table_bits, p.pairs, opened, 1))
            limit(max(fill_bound, online, otx.extension_bound(self.ot)))
        short = lanes - self._slots.available(width)
        if short > 0:
            await self._fill(p, short, background=False)
        slots = self._slots.take(width, lanes)
        ahead = min(lanes, millionaire.MAX_AHEAD) - self._slots.available(width)
        if ahead > 0:
            # Ferret draws the next fill's OTs now, so that no extension round
            # trip falls inside the chunk's flights.
            need = 8 * sum(_ot_widths(ahead, p.fill_planes))
            await otx.refill(self._ext, self.channel, need)
        yes, early = await self._online(p, z, slots, max(ahead, 0))
        parts = np.split(yes.astype(np.uint64), len(shares))
        self._plan_prefill(p, lanes, max(ahead, 0))
        try:
            logic = millionaire.LogicInputs(slots, early)
            result = await self._chunk_flow(spec, *parts, at_least=fill_bound, logic=logic)
        finally:
            self._pre_plan = None
        gc = self.last_stats
        self.last_stats = RunStats(
            comparisons=lanes,
            and_gates=gc.and_gates,
            bytes_sent=self.channel.bytes_sent - s,
            bytes_received=self.channel.bytes_received - r,
            messages=1 + len(millionaire.schedule(p.depth)) + gc.messages + (short > 0),
            seconds=time.perf_counter() - t,
        )
        self.last_path = "ot"
        return result

    async def _settle_fill(self) -> None:
        """Wait for the fill made in the background during the last chunk and
        add its slots (before anything else uses the OT extension: the fill
        reads the extension's label buffers)."""
        self._open_fill_gate()
        task, self._fill_task = self._fill_task, None
        self._labels_pending = None
        if task is not None:
            self._slots.add(await task)

    def _open_fill_gate(self) -> None:
        """Let a fill held back until its chunk's logic was garbled start (the
        garbler's: `ComparisonGarbler._fill`); the extension's next use waits
        for it (`_labels_pending`: the fill reads the extension's buffers)."""
        gate, self._fill_gate = self._fill_gate, None
        if gate is not None:
            gate.set()
            self._labels_pending = self._fill_task

    def _background(self, work: Callable[[], millionaire.Slots]) -> None:
        self._background_task(asyncio.ensure_future(asyncio.to_thread(work)))

    def _background_task(self, task: asyncio.Future[millionaire.Slots]) -> None:
        # A session that ends first never awaits it: retrieve its outcome anyway.
        task.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._fill_task = task

    async def _fill(self, p: millionaire.Plan, slots: int, background: bool) -> None:
        """Make `slots` slots of width p.width (both sides alike); inline, or
        with this side's work in a worker thread (`_settle_fill` collects it)."""
        raise NotImplementedError

    #: (plan, slots) of the fill the next OT-path chunk is expected to send, set
    #: while a chunk's logic runs (the evaluator makes it ahead: `_start_prefill`).
    _pre_plan: tuple[millionaire.Plan, int] | None = None

    def _plan_prefill(self, p: millionaire.Plan, lanes: int, ahead: int) -> None:
        """After a chunk's online phase: the fill the next chunk of as many lanes
        and the same width will send (its `ahead`), once this chunk's fill of
        `ahead` slots has joined the pool.  Only the evaluator acts on it."""

    async def _online(
        self, p: millionaire.Plan, z: U64, slots: millionaire.Slots, ahead: int
    ) -> tuple[Bits, bytes | memoryview | None]:
        """This side's XOR shares of YES for every lane of z, from its slots; the
        next fill of `ahead` slots rides in its first flights.  With them, the
        evaluator's logic choices when they rode its last flight (else None)."""
        raise NotImplementedError

    async def noisy_max(
        self,
        z: npt.ArrayLike,
        width: int = RING_BITS,
        carry: npt.ArrayLike | None = None,
        offset: int = 0,
    ) -> int | None:
        """Report-noisy-max: the first j maximizing signed(z_L[j] + z_H[j]) on the
        low `width` bits, on both sides, and nothing else (None for no
        candidates).  Each party's share already carries its own noise; correct
        when every |z_L + z_H| < 2^(w−1), as for `first_yes`.  The last chunk
        of a chunked tournament passes this party's `carry` from the chunk
        before and its candidates' `offset`: the index is then over the stream,
        the carried winner winning ties (docs/mpc.md, "Chunked tournaments")."""
        if carry is None and offset == 0:
            return await self._chunk_flow(noisy_max_spec(width), z)
        spec = noisy_max_chunk_spec(width, TournamentChunk(offset, carry is not None))
        zz = chunk_input(_as_ring(z), None if carry is None else _as_ring(carry), width)
        return int(await self._chunk_flow(spec, zz))

    async def noisy_max_carry(
        self, z: npt.ArrayLike, carry: npt.ArrayLike | None, offset: int, width: int = RING_BITS
    ) -> U64:
        """A chunk of a chunked report-noisy-max that is not the last: this
        party's XOR share of the winner so far (noisy value and index, as
        `tournament.carry_lanes(w)` lanes: fresh CSPRNG masks on the garbler,
        the masked winner on the evaluator); nothing is revealed.  `carry`: this
        party's share from the chunk before (None in the first, offset 0)."""
        mask = self._carry_mask(width)
        where = TournamentChunk(offset, carry is not None, final=False)
        zz = chunk_input(_as_ring(z), None if carry is None else _as_ring(carry), width)
        y = await self._chunk_flow(noisy_max_chunk_spec(width, where, mask), zz)
        return carry_words(mask, width) if mask is not None else np.asarray(y, dtype=np.uint64)

    def _carry_mask(self, width: int) -> Bits | None:
        """The garbler's fresh mask bits for a carried winner (None: evaluator)."""
        return None

    async def any_per_group(
        self, z: npt.ArrayLike, group: int, width: int = RING_BITS
    ) -> list[bool]:
        """For each run of `group` lanes: is any signed(z_L + z_H) ≥ 0 in it, on
        the low `width` bits (correct while |z_L + z_H| < 2^(width−1))?  Both
        parties get the bits (a crawl level: groups of one)."""
        return await self._chunk_flow(any_per_group_spec(group, width), z)

    async def clamp_reshare(self, share: npt.ArrayLike, bound: int) -> U64:
        """This party's new share of g(S) = min(tri(S), bound) per lane, S = share_L
        + share_H, tri(s) = min(s, 2^64 − s): the robust aggregate.  The garbler's
        is a fresh uniform r (CSPRNG), the evaluator's g(S) − r; nothing else leaks."""
        raise NotImplementedError

    async def field_clamp_reshare(self, share: npt.ArrayLike, bound: int, field: object) -> U64:
        """`clamp_reshare` for shares of a Prio3 field sum: this party's new share
        in Z_2^64 of min(tri_p(S), bound), S = share_L + share_H mod p and
        tri_p(s) = min(s, p − s).  `field`: "Field64" or "Field128" (or a
        `svtagg.vdaf` field); a share is a vector of integers in [0, p) or
        uint64 words (`circuits.field_words`).  Garbler: a fresh uniform r."""
        raise NotImplementedError

    async def _chunk_flow(
        self,
        spec: ChunkCircuit[R],
        *zs: npt.ArrayLike,
        at_least: int = 0,
        logic: millionaire.LogicInputs | None = None,
    ) -> R:
        """One garbled chunk (`at_least`: a longer message the chunk may carry,
        the OT path's next fill, which the receiver must accept; `logic`: the OT
        path's inputs, whose slots' logic OTs carry the evaluator's input bits
        instead of the extension)."""
        if not self._ready:
            raise RuntimeError("call setup() first")
        pending, self._labels_pending = self._labels_pending, None
        if pending is not None:  # a fill's labels still being copied out of the extension
            await pending
        shares = [_as_ring(z) for z in zs]
        if any(s.shape != shares[0].shape for s in shares):
            raise ValueError(f"{' and '.join(spec.inputs)} differ in length")
        k = shares[0].shape[0]
        # Counted even for k = 0, which the peer counts too.
        nonce, tweak_hi = self._next_chunk()
        if k == 0:
            return spec.empty()
        select = getattr(self.channel, "select", None)
        if select is not None:  # a channel with a bulk path picks it by the public size
            select(k * len(spec.inputs))
        limit = getattr(self.channel, "limit_messages", None)
        if limit is not None:  # and one that can refuse longer messages up front
            bounds = (spec.max_message(k, bytes_per_ot(self.ot)), otx.extension_bound(self.ot))
            limit(max(*bounds, at_least))
        s, r, t = self.channel.bytes_sent, self.channel.bytes_received, time.perf_counter()
        z = shares[0] if len(shares) == 1 else np.concatenate(shares)
        result, and_gates = await self._run(spec, z, k, _At(nonce, tweak_hi, logic))
        self.last_stats = RunStats(
            comparisons=k * len(spec.inputs),
            and_gates=and_gates,
            bytes_sent=self.channel.bytes_sent - s,
            bytes_received=self.channel.bytes_received - r,
            messages=2 + spec.parts(k) - (logic is not None and logic.choices is not None),
            seconds=time.perf_counter() - t,
        )
        return result

    async def _run(self, spec: ChunkCircuit[R], z: U64, k: int, at: _At) -> tuple[R, int]:
        """This side's three messages of one chunk: (result, AND gates)."""
        raise NotImplementedError

    def _next_chunk(self) -> tuple[int, int]:
        """(OT nonce, high tweak word) of the next chunk; both parties count alike."""
        c = self._peek_chunk()
        self._chunk += 1
        return c

    def _peek_chunk(self) -> tuple[int, int]:
        """`_next_chunk` without counting it."""
        c = self._chunk
        if c >= 1 << _CHUNK_BITS:
            raise RuntimeError("chunk counter exhausted; start a new session")
        return c, (self._tag << _CHUNK_BITS) | c

    def _input_wires(self, labels: Iterator[Blocks], width: int) -> WireSource:
        """The evaluator-input wires, one OT-extension batch per lane batch."""
        log = self.input_labels_log

        def source(lo: int, hi: int) -> Blocks:
            batch = next(labels)[: width * (hi - lo)]  # without the padding's spare OTs
            if log is not None:
                log.append(batch.copy())
            return batch.reshape(width, hi - lo, 2)

        return source


@dataclass
class _Prefill:
    """A fill the evaluator plans ahead: its nonce (the extension use it is
    numbered as), width and slots, its side (the random choices drawn), and
    when made in a worker thread its OT message (ready first) and slots."""

    nonce: int
    width: int
    slots: int
    side: millionaire.EvaluatorSide
    message: asyncio.Future[bytes] | None = None
    task: asyncio.Future[millionaire.Slots] | None = None

    def fits(self, nonce: int, width: int, slots: int) -> bool:
        return (self.nonce, self.width, self.slots) == (nonce, width, slots)


def _fill_slots(
    side: millionaire.GarblerSide | millionaire.EvaluatorSide,
    labels: Iterator[Blocks],
    batches: tuple[tuple[int, int], ...],
    h: TweakableHash | native.NativeHash,
    ws: dict[str, Any],
) -> millionaire.Slots:
    """A fill's slots from its OT blocks, one lane batch's blocks from `labels`
    at a time (either side; `ws`: the caller's scratch, kept across fills)."""
    p = side.plan
    logic = np.empty((side.lanes, 2), np.uint64)
    for lo, hi in batches:
        rows = _rows(next(labels), p.fill_planes, hi - lo)
        side.batch(h, lo, rows[: p.planes], ws)
        logic[lo:hi] = rows[p.planes]  # the logic's raw OT blocks (q; the evaluator's t)
    if isinstance(side, millionaire.GarblerSide):
        slots = millionaire.garbler_slots(side)
    else:
        slots = millionaire.evaluator_slots(side)
    slots.arrays["l"] = logic
    return slots


def _random_ring(n: int) -> U64:
    """n uniform ring elements from the CSPRNG."""
    return np.frombuffer(os.urandom(8 * n), dtype="<u8").astype(np.uint64)


def _rows(labels: Blocks, planes: int, lanes: int) -> Blocks:
    """A lane batch's OT blocks as planes × lanes × 2 words (without padding OTs)."""
    return labels[: planes * lanes].reshape(planes, lanes, 2)


def _ot_widths(lanes: int, width: int) -> list[int]:
    """Bytes of packed choice bits per lane batch (w bits per lane, zero-padded)."""
    return [-(-width * (hi - lo) // 8) for lo, hi in lane_batches(lanes)]


class ComparisonGarbler(_Party):
    """The helper's side on the servers: garbles, holds Δ and the first share of every
    input, which needs no labels (free XORs with constants it knows)."""

    #: Tests may set this list to see every tweak.
    tweak_log: list[Blocks] | None = None
    _tables: Blocks | None = None  # reused across chunks: fresh pages cost page faults

    async def setup(self) -> None:
        """Base OTs (the garbler is the base-OT receiver with choice string s = Δ)."""
        s = [secrets.randbits(1) for _ in range(KAPPA)]
        s[0] = 1  # Δ's point-and-permute bit
        keys = await base_ot_receive(self.channel, s, self.session_id)
        self._ext = await extension_sender(self.channel, s, keys, self.ot, self.session_id)
        self.delta = self._ext.delta
        self._ready = True

    async def _fill(self, p: millionaire.Plan, slots: int, background: bool) -> None:
        """Receive the fill's OT message and make the slots: the leaves' masks for
        every entry (x = 0, zero shares: `millionaire.garbler_slots`) and the
        triples.  Inline, the message is read as it arrives (batches made in a
        worker thread as their pieces come); in the background it is read
        whole, and the slots are made in a worker thread once this chunk's
        logic tables are sent (up to `millionaire.MAX_SHIFTED` slots), or, for
        a larger fill, from labels copied out while the chunk goes on."""
        nonce, tweak_hi = self._next_chunk()
        side = millionaire.GarblerSide(
            p, np.zeros(slots, np.uint64), self.delta, tweak_hi, fill=True
        )
        widths = _ot_widths(slots, p.fill_planes)
        await otx.refill(self._ext, self.channel, 8 * sum(widths))
        batches = lane_batches(slots)
        streamed = not background and len(batches) > 1
        q = await ot_labels(self.channel, self._ext, widths, nonce, streamed)
        h, ws = self._fill_hasher, self._fill_ws

        def work() -> millionaire.Slots:
            return _fill_slots(side, q, batches, h, ws)

        if background and slots <= millionaire.MAX_SHIFTED:
            # Held back until this chunk's logic has been garbled and its tables
            # sent (`_open_fill_gate`): made meanwhile, its ≈ 2 hashes per table
            # entry would take the cores from the chunk's flights and its logic;
            # after them, it has the time until the next chunk's tables.
            gate = self._fill_gate = asyncio.Event()

            async def deferred() -> millionaire.Slots:
                await gate.wait()
                return await asyncio.to_thread(work)

            self._background_task(asyncio.ensure_future(deferred()))
        elif background:
            # A large fill: its labels expanded and its slots made in worker
            # threads while the chunk goes on; the chunk's logic waits for the
            # labels before it uses the extension again (`_labels_pending`: the
            # extension reuses its buffers).
            expanded = asyncio.ensure_future(asyncio.to_thread(lambda: [b.copy() for b in q]))
            self._labels_pending = expanded

            async def chained() -> millionaire.Slots:
                nonlocal q
                q = iter(await expanded)
                return await asyncio.to_thread(work)

            self._background_task(asyncio.ensure_future(chained()))
        else:
            self._slots.add(await asyncio.to_thread(work) if streamed else work())

    async def _online(
        self, p: millionaire.Plan, z: U64, slots: millionaire.Slots, ahead: int
    ) -> tuple[Bits, bytes | memoryview | None]:
        """Read the evaluator's d bits, send the tables and the openings as
        `millionaire.schedule` says, read the evaluator's openings (and, after
        the tables, the next fill's OT message); with the YES shares, the
        evaluator's logic choices if they rode its last flight."""
        side = millionaire.GarblerChunk(p, z, slots)
        d = millionaire.parse_d(await self.channel.recv(), p.bits, z.shape[0])
        flights, early = millionaire.schedule(p.depth), None
        for i, (who, levels) in enumerate(flights):
            if who == "G":
                msg = side.pack(levels)
                if i == 0:
                    msg = side.tables(d, self.engine == "native") + side.corrections() + msg
                await self.channel.send(msg)
                if i == 0 and ahead:
                    await self._fill(p, ahead, background=True)
            else:
                got = memoryview(await self.channel.recv())
                if i == len(flights) - 1:  # the evaluator's logic choices ride its last flight
                    cut = side.opening_bytes(levels)
                    got, early = got[:cut], got[cut:]
                side.receive(got, levels)
        return side.yes_share(), early

    async def clamp_reshare(self, share: npt.ArrayLike, bound: int) -> U64:
        a = _as_ring(share)
        r = _random_ring(a.shape[0])
        await self._chunk_flow(clamp_reshare_spec(bound), a, np.uint64(0) - r)
        return r

    def _carry_mask(self, width: int) -> Bits:
        return millionaire.random_bits(carry_bits(width))

    async def field_clamp_reshare(self, share: npt.ArrayLike, bound: int, field: object) -> U64:
        f = prime_field(field)
        a = field_words(share, f)
        r = _random_ring(a.shape[0])
        neg_r = np.zeros_like(a)
        neg_r[:, 0] = np.uint64(0) - r  # −r in word 0 of each coordinate
        spec = field_clamp_reshare_spec(bound, f)
        await self._chunk_flow(spec, a.reshape(-1), neg_r.reshape(-1))
        return r

    async def _run(self, spec: ChunkCircuit[R], z: U64, k: int, at: _At) -> tuple[R, int]:
        """Receive the OT message (Ferret: after any refill) — on the OT path the
        evaluator's logic choices instead (`millionaire.logic_labels`) — garble,
        send all tables + output-decoding bits, receive the decoded result.  A
        chunk of several lane batches is garbled in a worker thread, each
        batch's tables sent as soon as they exist (the same bytes, in
        `spec.parts(k)` messages instead of one)."""
        nonce, tweak_hi, logic = at.nonce, at.tweak_hi, at.logic
        a_bits = bit_planes(z)
        lanes = k * len(spec.inputs)  # the evaluator's input lanes
        if logic is not None:
            e = logic.choices if logic.choices is not None else await self.channel.recv()
            labels = millionaire.logic_labels(e, logic.slots, self.delta)
            q: Iterator[Blocks] = iter([labels[lo:hi] for lo, hi in lane_batches(lanes)])
        else:
            widths, streamed = _ot_widths(lanes, spec.width), spec.parts(k) > 1
            await otx.refill(self._ext, self.channel, 8 * sum(widths))  # Ferret: pool short
            q = await ot_labels(self.channel, self._ext, widths, nonce, streamed)
        # 125 ciphertexts per comparison plus < 6 per lane for the chunk logic.
        capacity = spec.tables_per_lane * lanes + 64
        be = (self._garble_cls if logic is None else self._logic_cls[0])(
            self.delta, self.hasher, tweak_hi, capacity, self._tables, self._workspace
        )
        self._tables = be.buffer
        be.tweak_log = self.tweak_log
        wires = self._input_wires(q, spec.width)
        if spec.parts(k) > 1:
            sends = _OrderedSends(self.channel, asyncio.get_running_loop())
            be.on_batch = sends.submit_threadsafe
            try:
                outs = await asyncio.to_thread(spec.circuit, be, a_bits, wires, k)
            except BaseException:
                sends.cancel()
                raise
        else:
            sends = None
            outs = spec.circuit(be, a_bits, wires, k)
        dec = np.packbits(np.concatenate([be.decoding(w) for w in outs]), bitorder="little")
        if sends is not None:
            sends.submit(be.message(dec))
            await sends.wait()
        else:
            await self.channel.send(be.message(dec))
        self._open_fill_gate()  # an OT-path chunk's logic: its fill may start now
        return spec.parse(await self.channel.recv(), k), be.and_gates


class ComparisonEvaluator(_Party):
    """The leader's side on the servers: obtains its input labels by OT and evaluates."""

    #: Tests may set this list to see every label the evaluator computes.
    label_log: list[Blocks] | None = None
    #: Work the caller gives the next chunk to do while it waits for its
    #: garbled tables (run once, right after this side's last message before
    #: them, at the same point of every run: the servers draw the next chunk's
    #: noise there).
    while_waiting: Callable[[], None] | None = None

    async def setup(self) -> None:
        """Base OTs (the evaluator is the base-OT sender), then the extension's setup."""
        keys = await base_ot_send(self.channel, KAPPA, self.session_id)
        self._ext = await extension_receiver(self.channel, keys, self.ot, self.session_id)
        self._ready = True

    #: The fill made ahead (`_start_prefill`), and the last one made (a later
    #: one waits for it: they share scratch buffers).
    _pre: _Prefill | None = None
    _pre_last: asyncio.Future[Any] | None = None
    _fork: Any = None

    def _plan_prefill(self, p: millionaire.Plan, lanes: int, ahead: int) -> None:
        after = self._slots.available(p.width) + ahead - lanes  # left after the next take
        n = min(lanes, millionaire.MAX_AHEAD) - after
        self._pre_plan = (p, n) if after >= 0 and 0 < n <= millionaire.MAX_SHIFTED else None

    def _start_prefill(self) -> None:
        """Draw the random choices of the fill planned by `_plan_prefill`, as
        the extension's next use numbers it, while this chunk's logic waits for
        its tables; with SoftSpoken on the native core, also make its message
        and slots then, in a worker thread on a fork of the extension (buffers
        of its own), so that the next chunk sends it right behind its d bits
        instead of making it while the garbler makes its tables on the same
        cores.  (The draws are made here on every engine and extension, so
        that both engines draw alike.)  It is sent only by a fill of that
        number, width and size (`_fill`); any other next use of the extension
        drops it unsent, and that use's own message under the same nonce is
        then the only one the garbler ever sees."""
        plan, self._pre_plan = self._pre_plan, None
        if plan is None:
            return
        p, slots = plan
        nonce, tweak_hi = self._peek_chunk()
        side = millionaire.EvaluatorSide(p, _random_ring(slots), tweak_hi)
        if not (isinstance(self._ext, otx.SoftSpokenReceiver) and self.engine == "native"):
            self._pre = _Prefill(nonce, p.width, slots, side)  # made when it is sent
            return
        if self._fork is None:
            self._fork = self._ext.fork()
        fork, before = self._fork, self._pre_last
        h, ws = self._pre_hasher, self._pre_ws

        loop = asyncio.get_running_loop()
        message: asyncio.Future[bytes] = loop.create_future()
        message.add_done_callback(lambda f: f.cancelled() or f.exception())  # maybe never sent

        def ready(msg: bytes) -> None:
            if not message.done():
                message.set_result(msg)

        def work() -> millionaire.Slots:
            batches = lane_batches(slots)
            msg = bytes(fork.u_message([side.choices(lo, hi) for lo, hi in batches], nonce))
            loop.call_soon_threadsafe(ready, msg)  # it may leave while the slots are made
            labels = fork.labels(_ot_widths(slots, p.fill_planes), nonce)
            return _fill_slots(side, labels, batches, h, ws)

        async def run() -> millionaire.Slots:
            if before is not None:
                await asyncio.wait([before])
            try:
                return await asyncio.to_thread(work)
            except BaseException as exc:  # a fill that failed is never sent
                if not message.done():
                    message.set_exception(RuntimeError(f"the fill made ahead failed: {exc!r}"))
                raise

        task = asyncio.ensure_future(run())
        task.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pre = _Prefill(nonce, p.width, slots, side, message, task)
        self._pre_last = task

    async def _fill(self, p: millionaire.Plan, slots: int, background: bool) -> None:
        """Send the fill's OT message (random choices: the leaf bits r and the
        triples') and make the slots from the labels: the masks of the entries
        r addresses and the triples (`millionaire.evaluator_slots`); or send
        the fill made ahead for it (`_start_prefill`)."""
        pre, self._pre = self._pre, None
        if pre is not None and not (background and pre.fits(self._chunk, p.width, slots)):
            pre = None  # dropped unsent
        if pre is not None and pre.task is not None:  # made ahead in a worker thread
            assert pre.message is not None
            self._next_chunk()
            await self.channel.send(await pre.message)
            self._background_task(pre.task)
            return
        nonce, tweak_hi = self._next_chunk()
        side = (
            pre.side
            if pre is not None
            else millionaire.EvaluatorSide(p, _random_ring(slots), tweak_hi)
        )
        widths = _ot_widths(slots, p.fill_planes)
        batches = lane_batches(slots)
        choices = [side.choices(lo, hi) for lo, hi in batches]
        await otx.refill(self._ext, self.channel, 8 * sum(widths))
        await send_ot_message(self.channel, self._ext, choices, nonce, len(choices) > 1)
        t = self._ext.labels(widths, nonce)
        h, ws = self._fill_hasher, self._fill_ws

        def work() -> millionaire.Slots:
            return _fill_slots(side, t, batches, h, ws)

        if background:  # the labels copied out: the extension's buffers are reused
            t = iter([b.copy() for b in t])
            self._background(work)
        else:
            self._slots.add(work())

    async def _online(
        self, p: millionaire.Plan, z: U64, slots: millionaire.Slots, ahead: int
    ) -> tuple[Bits, bytes | None]:
        """Send d = ȳ ⊕ r and the next fill's OT message, read the tables and
        exchange openings as `millionaire.schedule` says.  When the last flight
        is this side's, the tree is done once it is packed: the logic's choices
        (`millionaire.logic_choices`) ride it, and are returned with the YES
        shares (else None)."""
        side = millionaire.EvaluatorChunk(p, z, slots)
        pre = self._pre
        if ahead and pre is not None and pre.message is not None and not pre.message.done():
            # A fill made ahead: its message is ready before the d bits leave
            # (at once in a steady stream), so that it follows them with no
            # wait of its own and the flights' order never depends on a thread.
            await asyncio.wait([pre.message])
        await self.channel.send(side.d_message())
        # The next fill is sent (or made and sent) while the garbler makes its
        # tables: its send runs beside this side's reads, and this side's next send waits
        # for it (a channel's sends go one after another).
        fill = asyncio.ensure_future(self._fill(p, ahead, background=True)) if ahead else None
        lanes = z.shape[0]
        tables, kappa = -(-p.table_bits * lanes // 8), -(-p.pairs * lanes // 8)
        flights, early = millionaire.schedule(p.depth), None
        try:
            for i, (who, levels) in enumerate(flights):
                if who == "E":
                    if fill is not None:
                        await fill
                        fill = None
                    out = side.pack(levels)
                    if i == len(flights) - 1:
                        yes = side.yes_share()
                        early = millionaire.logic_choices(yes, slots)
                        out += early
                    await self.channel.send(out)
                    continue
                msg = memoryview(await self.channel.recv())
                if i == 0:
                    if len(msg) < tables + kappa:
                        raise ValueError("malformed comparison table message")
                    side.read_tables(msg[:tables])
                    side.read_corrections(msg[tables : tables + kappa])
                    msg = msg[tables + kappa :]
                side.receive(msg, levels)
            if fill is not None:
                await fill
        finally:
            if fill is not None and not fill.done():
                fill.cancel()
        return (side.yes_share() if early is None else yes), early

    async def clamp_reshare(self, share: npt.ArrayLike, bound: int) -> U64:
        y = await self._chunk_flow(clamp_reshare_spec(bound), share)
        return y if y is not None else np.zeros(0, dtype=np.uint64)

    async def field_clamp_reshare(self, share: npt.ArrayLike, bound: int, field: object) -> U64:
        f = prime_field(field)
        words = field_words(share, f).reshape(-1)
        y = await self._chunk_flow(field_clamp_reshare_spec(bound, f), words)
        return y if y is not None else np.zeros(0, dtype=np.uint64)

    async def _run(self, spec: ChunkCircuit[R], z: U64, k: int, at: _At) -> tuple[R, int]:
        """Send the OT extension message for this side's input bits — on the OT
        path its logic choices instead (`millionaire.logic_choices`; the labels
        are its slots' logic OTs) — receive the tables, evaluate, decode, send
        the result back (a streamed chunk is evaluated in a worker thread, part
        by part as the parts arrive)."""
        nonce, tweak_hi, logic = at.nonce, at.tweak_hi, at.logic
        lanes = z.shape[0]
        t: Iterator[Blocks]
        if logic is not None:
            if spec.width != 1:
                raise AssertionError("the OT path's logic takes one bit per lane")
            if logic.choices is None:  # else they rode the tree's last flight
                await self.channel.send(millionaire.logic_choices(z, logic.slots))
            t = iter([logic.slots["l"][lo:hi] for lo, hi in lane_batches(lanes)])
        else:
            widths = _ot_widths(lanes, spec.width)
            # OT positions inside a lane batch are bit-plane major, as the wires are.
            choices = [
                np.packbits(bit_planes(z[lo:hi])[: spec.width].reshape(-1), bitorder="little")
                for lo, hi in lane_batches(lanes)
            ]
            await otx.refill(self._ext, self.channel, 8 * sum(widths))
            await send_ot_message(self.channel, self._ext, choices, nonce, spec.parts(k) > 1)
            t = self._ext.labels(widths, nonce)
        self._start_prefill()  # an OT-path chunk's logic: the next fill, while the tables come
        work, self.while_waiting = self.while_waiting, None
        if work is not None:
            work()
        nd = (spec.decoding_bits(k) + 7) // 8
        eval_cls = self._eval_cls if logic is None else self._logic_cls[1]

        wires = self._input_wires(t, spec.width)
        if spec.parts(k) > 1:
            parts = _Parts(self.channel, spec.parts(k), nd)
            be = eval_cls(self.hasher, tweak_hi, b"", self._workspace, more=parts.pull)
            be.label_log = self.label_log
            try:
                outs = await asyncio.to_thread(spec.circuit, be, None, wires, k)
                be.done()
                raw_dec = await parts.finish()
            except BaseException:
                parts.abort()
                raise
        else:
            msg = memoryview(await self.channel.recv())
            if len(msg) < nd or (len(msg) - nd) % 16:
                raise ValueError("malformed garbled-circuit message")
            be = eval_cls(self.hasher, tweak_hi, msg[: len(msg) - nd], self._workspace)
            be.label_log = self.label_log
            outs = spec.circuit(be, None, wires, k)
            be.done()
            raw_dec = msg[len(msg) - nd :]
        dec = np.unpackbits(np.frombuffer(raw_dec, np.uint8), bitorder="little")
        bundles, pos = [], 0
        for w in outs:  # each bundle's decoding bits follow the previous one's
            bundles.append(be.decode(w, dec[pos : pos + w.shape[0]]))
            pos += w.shape[0]
        result = spec.decode(bundles)
        await self.channel.send(spec.encode(result, k))
        return result, be.and_gates


async def connected_pair(
    session_id: bytes | None = None,
    scheme: str = "halfgates",
    ot: str | None = None,
    path: str = "garbled",
) -> tuple[ComparisonGarbler, ComparisonEvaluator]:
    """A garbler and an evaluator joined by a MemoryChannel, their OT setup (`ot`)
    done; `path`: which path first-YES / CTT chunks take (`millionaire.PathRule`)."""
    sid = session_id if session_id is not None else secrets.token_bytes(16)
    cg, ce = MemoryChannel.pair()
    g = ComparisonGarbler(cg, sid, scheme, ot, path)
    e = ComparisonEvaluator(ce, sid, scheme, ot, path)
    await asyncio.gather(g.setup(), e.setup())
    return g, e


async def run_first_yes(
    z_l: npt.ArrayLike, z_h: npt.ArrayLike, scheme: str = "halfgates"
) -> int | None:
    """One-process reference: both parties over a MemoryChannel; returns the
    (agreed) first-YES index."""
    g, e = await connected_pair(scheme=scheme)
    rg, re_ = await asyncio.gather(g.first_yes(z_l), e.first_yes(z_h))
    if rg != re_:
        raise AssertionError("parties disagree")
    return rg


async def run_compare_to_thresholds(
    z_high_l: npt.ArrayLike,
    z_low_l: npt.ArrayLike,
    z_high_h: npt.ArrayLike,
    z_low_h: npt.ArrayLike,
    scheme: str = "halfgates",
) -> list[int]:
    """One-process reference for CompareToThresholds (leader's shares first)."""
    g, e = await connected_pair(scheme=scheme)
    rg, re_ = await asyncio.gather(
        g.compare_to_thresholds(z_high_l, z_low_l), e.compare_to_thresholds(z_high_h, z_low_h)
    )
    if rg != re_:
        raise AssertionError("parties disagree")
    return rg
